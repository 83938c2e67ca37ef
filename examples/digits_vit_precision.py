"""A small ViT trained on scikit-learn's digits, quantized by ours, the stock converter and AI Edge Quantizer.

The model: each 8x8 digit cut into 4x4 patches (a strided Conv2D, as ViT embeds patches), a learned position
embedding, two pre-LayerNormalization Transformer blocks (2-head self-attention, then an MLP 4x as wide with
keras_gelu's exact GELU), LayerNormalization, average pooling and a 10-class head; width 32. It trains for a
few tens of seconds on a CPU, is exported with fixed shapes, and every way of `benchmarks/head_to_head.py`
makes its .tflite of it from the same training samples (ours --int8, --int16 and --int8 --mixed-precision;
the stock converter's int8 and 16x8; AI Edge Quantizer's static_wi8_ai8 and static_wi8_ai16 on the stock
float .tflite). The table gives each one's top-1 accuracy on the held-out split, its agreement with the
float model's top-1, the logits' cosine against the float model's, its size and what stayed float. Digits
ships inside scikit-learn: nothing is downloaded.

    python examples/digits_vit_precision.py [--epochs 40] [--width 32] [--patch 4] [--function exact]

Keras 3 (the export is Keras's `model.export`); AI Edge Quantizer comes with `pip install -e ".[bench]"`.
"""

import argparse
import os
import sys
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "0"  # Keras 3: set before int8_recipe imports TensorFlow
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "benchmarks"))

import int8_recipe  # noqa: E402
from int8_recipe import keras  # noqa: E402
import numpy as np  # noqa: E402

import head_to_head  # noqa: E402
import keras_gelu  # noqa: E402
import machine  # noqa: E402
from qat_cnn_digits import load_images  # noqa: E402
from tables import print_table  # noqa: E402


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned vector per patch position."""

    def build(self, input_shape):
        self.positions = self.add_weight(shape=tuple(input_shape[1:]), initializer="random_normal", name="positions")

    def call(self, patches):
        return patches + self.positions


def build_vit(function, width, patch, heads=2, blocks=2):
    images = keras.Input((8, 8, 1), name="image")
    patches = keras.layers.Conv2D(width, patch, strides=patch, name="patches")(images)
    hidden = PositionEmbedding(name="position")(keras.layers.Reshape(((8 // patch) ** 2, width))(patches))
    for block in range(1, blocks + 1):
        normed = keras.layers.LayerNormalization(name=f"norm_{block}a")(hidden)
        attended = keras.layers.MultiHeadAttention(heads, width // heads, name=f"attention_{block}")(normed, normed)
        hidden = keras.layers.Add(name=f"residual_{block}a")([hidden, attended])
        normed = keras.layers.LayerNormalization(name=f"norm_{block}b")(hidden)
        expanded = keras.layers.Dense(4 * width, activation=keras_gelu.gelu_layer(function),
                                      name=f"mlp_{block}")(normed)
        hidden = keras.layers.Add(name=f"residual_{block}b")([hidden, keras.layers.Dense(width)(expanded)])
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(keras.layers.LayerNormalization(name="norm")(hidden))
    return keras.Model(images, keras.layers.Dense(10, name="logits")(pooled), name=f"digits_vit_{function}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--function", choices=keras_gelu.GELU_LAYER_FUNCTIONS, default="exact",
                        help="the MLPs' GELU (default exact)")
    parser.add_argument("--epochs", type=int, default=40, help="training epochs (default 40)")
    parser.add_argument("--width", type=int, default=32, help="model width, split over 2 heads (default 32)")
    parser.add_argument("--patch", type=int, choices=(1, 2, 4), default=4, help="patch side in pixels (default 4)")
    parser.add_argument("--calibration-samples", type=int, default=256,
                        help="training samples that calibrate every method (default 256)")
    parser.add_argument("--ours-mode", choices=("builtin", "native", "select"),
                        help="ours' --mode (default: the command's own, builtin)")
    parser.add_argument("--mixed-min-cosine", type=float, default=head_to_head.MIXED_MIN_COSINE,
                        help=f"the budget ours' --mixed-precision climbs to (default {head_to_head.MIXED_MIN_COSINE})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for flag in ("epochs", "width", "calibration_samples"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.width % 2:
        parser.error(f"--width is split over 2 heads; got {args.width}")

    x_train, y_train, x_test, y_test = load_images(args.seed)
    int8_recipe.set_seed(args.seed)
    model = int8_recipe.train(build_vit(args.function, args.width, args.patch), x_train, y_train, args.epochs,
                              3e-3, f"ViT ({args.function} GELU)")
    print(f"digits: {len(x_train)} train / {len(x_test)} held-out; ViT width {args.width}, {args.patch}x{args.patch} "
          f"patches, {model.count_params():,} parameters; {args.calibration_samples} calibration samples; ours in "
          f"{args.ours_mode or 'builtin'} mode\n{machine.header()}")
    rows = [["Keras (float)", f"{int8_recipe.accuracy(model.predict(x_test, verbose=0), y_test):.4f}", "", "", "",
             "(the float model)"]]
    with tempfile.TemporaryDirectory(prefix="digits_vit_") as folder:
        subject = head_to_head.exported_subject(model, list(x_train[:args.calibration_samples, None]),
                                                list(x_test[:, None]), folder, logits=True)
        for method, make in head_to_head.methods(args.ours_mode, args.mixed_min_cosine).items():
            try:
                tflite_model = make(subject)
                logits = head_to_head.outputs(tflite_model, subject.held_out)[subject.logits[0]]
            except Exception as error:  # noqa: BLE001 - a method that fails is a row saying how
                rows.append([method, "failed", "", "", "", head_to_head.failure_line(error, subject)])
                continue
            judged = head_to_head.judged(tflite_model, {subject.logits[0]: logits}, subject)
            rows.append([method, f"{int8_recipe.accuracy(logits, y_test):.4f}", f"{judged['top1']:.4f}",
                         f"{judged['cosine']:.6f}", f"{judged['bytes']:,}",
                         "(the float model)" if method.startswith("float") else
                         ", ".join(f"{op} {count}" for op, count in judged["float_ops"].items()) or "none"])
    print()
    print_table(["method", "top-1 accuracy", "top-1 = float's", "logits' cosine", "bytes",
                 "still float, or how it failed"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
