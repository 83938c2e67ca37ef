"""What calling XLA from a training step costs, whatever the activation computes: the floor under
bench_training.py's ratios.

The FFN stack of bench_training.py, trained with `model.fit` (not compiled
whole), with four activations: ReLU; keras_gelu's exact GELU; and two custom
gradients that only multiply (forward x * 1, backward upstream * x), one as
XLA functions called from the step, as keras_gelu's kernels are, and one as
TensorFlow ops. The first pair's epoch over ReLU's is what keras_gelu's
kernels cost before any GELU arithmetic: the step's other ops run beside
them and share the two threads. Medians of interleaved epochs, each variant
first in turn; a ratio measured in one run, not a test.

    python benchmarks/bench_xla_calls.py [--rounds 11] [--steps 8] [--flavours keras3 tf-keras]
"""

import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import flavours  # noqa: E402


def _multiplying_activations():
    import tensorflow as tf

    def xla(function):
        return tf.function(function, jit_compile=True, autograph=False)

    forward, backward = xla(lambda x: x * 1.0), xla(lambda upstream, x: upstream * x)

    @tf.custom_gradient
    def through_xla(x):
        return forward(x), lambda upstream: backward(upstream, x)

    @tf.custom_gradient
    def through_tensorflow_ops(x):
        return x * 1.0, lambda upstream: upstream * x

    return through_xla, through_tensorflow_ops


def table(rounds, steps):
    import numpy as np

    import bench_training
    import keras_gelu
    import machine
    import timing

    through_xla, through_tensorflow_ops = _multiplying_activations()
    variants = {
        "relu": "relu",
        "keras_gelu.GELU() (exact)": keras_gelu.GELU(),
        "multiply only, as XLA functions": through_xla,
        "multiply only, as TensorFlow ops": through_tensorflow_ops,
    }
    rng = np.random.default_rng(0)
    batch = bench_training.BATCH
    x = rng.normal(size=(batch * steps, bench_training.SEQUENCE, bench_training.WIDTH)).astype(np.float32)
    y = rng.normal(size=(batch * steps, 1)).astype(np.float32)
    models = {name: bench_training.build("FFN stack", activation) for name, activation in variants.items()}
    samples = timing.fit_epoch_seconds(models, x, y, batch, rounds)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print(f"\n## FFN stack, {steps} steps of batch {batch} per epoch, {keras_gelu.KERAS_FLAVOUR}\n")
    print(f"{machine.header()}; {rounds} interleaved epochs\n")
    print("| activation | median s / epoch | vs relu (time) |")
    print("|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.3f} | {seconds / medians['relu']:.3f}x |", flush=True)


def main():
    flavours.main(__doc__, table, rounds=11, steps=8, round_help="interleaved epochs per variant",
                  steps_help="steps per epoch")


if __name__ == "__main__":
    main()
