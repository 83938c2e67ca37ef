"""Plot GELU's forms and their errors against exact GELU (the README figure).

    python examples/plot_forms.py --output docs/gelu_forms.png

Left: the forms as keras_gelu computes them in float32. Right: each form's
absolute difference from float64 exact GELU on a log scale, including the
float32 exact form (rounding only) and tf.nn.gelu for comparison.
"""

import argparse
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_gelu  # noqa: E402

FORMS = {"exact": "exact  x·Φ(x)", "tanh": "tanh approximation", "sigmoid": "sigmoid  x·σ(1.702x)"}


def exact_float64(x):
    return np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="docs/gelu_forms.png", help="PNG file to write")
    args = parser.parse_args()

    x64 = np.linspace(-6.0, 6.0, 24_001)
    x32 = x64.astype(np.float32)
    exact = exact_float64(x32.astype(np.float64))

    figure, (curves, errors) = plt.subplots(1, 2, figsize=(12, 4.6))
    curves.plot(x64, np.maximum(x64, 0), color="0.75", lw=1, label="ReLU")
    for form, label in FORMS.items():
        curves.plot(x32, keras_gelu.gelu(x32, form).numpy(), lw=1.6, label=label)
    curves.set_xlim(-4, 3)
    curves.set_ylim(-0.5, 3)
    curves.axhline(0, color="0.85", lw=0.8)
    curves.set_title("GELU forms (keras_gelu, float32)")
    curves.set_xlabel("x")
    curves.legend(loc="upper left")

    floor = 1e-10  # where the difference is exactly 0, plot at the floor
    for form, label in FORMS.items():
        difference = np.abs(keras_gelu.gelu(x32, form).numpy().astype(np.float64) - exact)
        errors.semilogy(x32, np.maximum(difference, floor), lw=1, label=f"{label}: max {difference.max():.2g}")
    nn_gelu = np.abs(tf.nn.gelu(x32, approximate=False).numpy().astype(np.float64) - exact)
    errors.semilogy(x32, np.maximum(nn_gelu, floor), lw=0.6, color="0.6", alpha=0.7,
                    label=f"tf.nn.gelu exact, float32: max {nn_gelu.max():.2g}")
    errors.set_ylim(floor, 1e-1)
    errors.set_title("|form − exact GELU (float64)|")
    errors.set_xlabel("x")
    errors.legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    figure.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
