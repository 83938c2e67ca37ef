"""Speed of keras_gelu's forms against tf.nn.gelu and ReLU, as ratios from one run.

This machine is shared and noisy, so every variant is timed in interleaved
rounds within the same process and the table reports medians and ratios
between them, never absolute claims. Not a test: nothing here asserts.

    python benchmarks/bench_layers.py [--size 4096] [--rounds 15]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import keras_gelu  # noqa: E402
import machine  # noqa: E402
import timing  # noqa: E402


def _sigmoid_gelu_reference(x):
    return x * tf.math.sigmoid(1.702 * x)


def _candidates():
    learnable = keras_gelu.LearnableGELU(shared_axes=[1])
    learnable.build((None, None))
    return {
        # name: (function, the stock equivalent it is compared with)
        "relu": (tf.nn.relu, "relu"),
        "tf.nn.gelu exact": (lambda x: tf.nn.gelu(x, approximate=False), "tf.nn.gelu exact"),
        "tf.nn.gelu tanh": (lambda x: tf.nn.gelu(x, approximate=True), "tf.nn.gelu tanh"),
        "x*sigmoid(1.702x) in TF": (_sigmoid_gelu_reference, "x*sigmoid(1.702x) in TF"),
        # The same variables, as a user would write the layer: the learnable's stock equivalent.
        "x*sigmoid(ax+b) in TF": (lambda x: x * tf.math.sigmoid(learnable.alpha * x + learnable.beta),
                                  "x*sigmoid(ax+b) in TF"),
        "keras_gelu exact": (lambda x: keras_gelu.gelu(x, "exact"), "tf.nn.gelu exact"),
        "keras_gelu tanh": (lambda x: keras_gelu.gelu(x, "tanh"), "tf.nn.gelu tanh"),
        "keras_gelu sigmoid": (lambda x: keras_gelu.gelu(x, "sigmoid"), "x*sigmoid(1.702x) in TF"),
        "keras_gelu learnable": (learnable, "x*sigmoid(ax+b) in TF"),
    }


def _compiled(function, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def forward(x):
        return function(x)

    @tf.function(jit_compile=jit_compile)
    def forward_backward(x, upstream):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = function(x)
        # Return y too: training keeps it, and a gradient alone lets TF prune the forward pass.
        return y, tape.gradient(y, x, output_gradients=upstream)

    return forward, forward_backward


def _time_once(function, *args):
    start = time.perf_counter()
    result = function(*args)
    tf.nest.map_structure(lambda t: t.numpy().flat[0], result)  # wait for the result
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=4096, help="the input is size x size float32")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    args = parser.parse_args()

    x = tf.random.stateless_normal([args.size, args.size], seed=[1, 2])
    upstream = tf.random.stateless_normal([args.size, args.size], seed=[3, 4])
    candidates = _candidates()
    timings = {}
    for mode, jit in (("graph", False), ("XLA", True)):
        compiled = {name: _compiled(fn, jit) for name, (fn, _) in candidates.items()}
        for forward, forward_backward in compiled.values():  # warm up: trace and compile
            _time_once(forward, x)
            _time_once(forward_backward, x, upstream)
        samples = {(name, kind): [] for name in compiled for kind in ("fwd", "fwd+bwd")}
        for round_index in range(args.rounds):
            for name in timing.in_turn(compiled, round_index):
                forward, forward_backward = compiled[name]
                samples[(name, "fwd")].append(_time_once(forward, x))
                samples[(name, "fwd+bwd")].append(_time_once(forward_backward, x, upstream))
        for key, values in samples.items():
            timings[(mode,) + key] = statistics.median(values)

    print(f"GELU forms on a {args.size}x{args.size} float32 tensor, median of {args.rounds} interleaved rounds; "
          f"TF {tf.__version__}, {keras_gelu.KERAS_FLAVOUR}")
    print(machine.header())
    print("ratios are time(stock) / time(row): above 1 means the row is faster\n")
    header = ("| mode | function | fwd ms | fwd+bwd ms | fwd+bwd speed-up vs its stock equivalent "
              "| fwd+bwd speed-up vs tf.nn.gelu exact | fwd+bwd time vs relu |")
    print(header)
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode in ("graph", "XLA"):
        for name, (_, stock) in candidates.items():
            fwd = timings[(mode, name, "fwd")]
            both = timings[(mode, name, "fwd+bwd")]
            print(
                f"| {mode} | {name} | {fwd * 1e3:.1f} | {both * 1e3:.1f} "
                f"| {timings[(mode, stock, 'fwd+bwd')] / both:.2f}x "
                f"| {timings[(mode, 'tf.nn.gelu exact', 'fwd+bwd')] / both:.2f}x "
                f"| {both / timings[(mode, 'relu', 'fwd+bwd')]:.2f}x |"
            )
    bound_table(x, upstream, args.rounds)


def bound_table(x, upstream, rounds):
    """What bounds the kernels: single XLA passes against a copy (memory-bound by definition).

    Bytes per element, forward + backward: ReLU reads x and writes y, then
    reads the upstream gradient and y and writes dx (20 bytes); keras_gelu's
    backward reads the upstream gradient and x (20 bytes too) and recomputes
    the gate. A pass that costs more than a copy of the same bytes is bound by
    its arithmetic.
    """
    from keras_gelu import formulas

    def xla(fn):
        return tf.function(fn, jit_compile=True, autograph=False)

    passes = {
        "copy (x * 2)": (xla(lambda x: x * 2.0), (x,)),
        "erf": (xla(tf.math.erf), (x,)),
        "erfc": (xla(tf.math.erfc), (x,)),
        "exp": (xla(tf.exp), (x,)),
        "sigmoid": (xla(tf.math.sigmoid), (x,)),
        "keras_gelu exact forward": (xla(formulas.exact_forward), (x,)),
        "keras_gelu tanh forward": (xla(formulas.tanh_forward), (x,)),
        "2-input copy (u * x)": (xla(lambda u, x: u * x), (upstream, x)),
        "keras_gelu exact backward": (xla(lambda u, x: u * formulas.exact_derivative(x)), (upstream, x)),
        "keras_gelu tanh backward": (xla(lambda u, x: u * formulas.tanh_derivative(x)), (upstream, x)),
        "keras_gelu sigmoid backward": (xla(lambda u, x: u * formulas.sigmoid_derivative(x)), (upstream, x)),
    }
    for function, arguments in passes.values():
        _time_once(function, *arguments)
    samples = {name: [] for name in passes}
    for round_index in range(rounds):
        for name in timing.in_turn(passes, round_index):
            function, arguments = passes[name]
            samples[name].append(_time_once(function, *arguments))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    print("\nWhat bounds it: one XLA pass each, against a copy of the same size\n")
    print("| pass | ms | vs copy |")
    print("|---|---:|---:|")
    for name, median in medians.items():
        copy = medians["2-input copy (u * x)" if "backward" in name or "2-input" in name else "copy (x * 2)"]
        print(f"| {name} | {median * 1e3:.1f} | {median / copy:.2f}x |")


if __name__ == "__main__":
    main()
