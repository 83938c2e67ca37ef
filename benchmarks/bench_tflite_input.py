"""What a .tflite's GELU op costs once keras-gelu-convert has rewritten it: latency against the original.

The originals are the stock TFLite converter's, as another tool hands them
over: tf.nn.gelu (exact) alone on 512 x 512, and an FFN block (128 x 768 ->
3072 -> 768), in float32 (the GELU op) and full-integer int8 post-training
(the int8 GELU op). Each is rewritten as `keras-gelu-convert model.tflite`
would (`tflite_gelus.rewrite`): float32 into each builtin form, int8 into its
own table (CAST/ADD/GATHER) and, as for a runtime without GATHER, the int8
sigmoid form (LOGISTIC/MUL). Single-threaded LiteRT, interleaved rounds.

Ratios measured in one run on a shared, noisy machine; not a test.

    python benchmarks/bench_tflite_input.py [--rounds 100]
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import machine  # noqa: E402
import timing  # noqa: E402

from keras_gelu import vocabulary  # noqa: E402
from keras_gelu.converters.tflite import tflite_gelus  # noqa: E402

HIDDEN, FFN, SEQUENCE = 768, 3072, 128
ALONE = (512, 512)


def blocks():
    """{block name: (tf.function of one float32 input, its shape)}."""
    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.normal(0, 0.03, (HIDDEN, FFN)).astype(np.float32))
    w2 = tf.constant(rng.normal(0, 0.03, (FFN, HIDDEN)).astype(np.float32))
    return {
        "activation alone (512x512)": (lambda x: tf.nn.gelu(x, approximate=False), ALONE),
        "FFN block (128x768, 3072)": (lambda x: tf.matmul(tf.nn.gelu(tf.matmul(x, w1), approximate=False), w2),
                                      (SEQUENCE, HIDDEN)),
    }


def stock_tflite(function, shape, int8):
    """The stock converter's .tflite of `function`: float32, or int8 throughout (inputs and outputs too)."""
    module = tf.Module()
    module.f = tf.function(function, input_signature=[tf.TensorSpec(shape, tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module)
    if int8:
        rng = np.random.default_rng(1)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([rng.normal(0, 2, shape).astype(np.float32)] for _ in range(8))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int8
    return converter.convert()


def models():
    """(block, precision, what) -> .tflite bytes; "GELU op (original)" is each pair's reference."""
    built = {}
    for block, (function, shape) in blocks().items():
        for precision in ("float32", "int8"):
            original = stock_tflite(function, shape, precision == "int8")
            built[(block, precision, "GELU op (original)")] = original
            if precision == "float32":
                for form in vocabulary.EXACT_AS:
                    built[(block, precision, f"{form} form")] = rewritten(original, form)
            else:  # the sigmoid form where it is within a step of the op, as here; its own table, as elsewhere
                built[(block, precision, "sigmoid form")] = rewritten(original, "sigmoid")
                built[(block, precision, "its table")] = rewritten(original, "table")
    return built


def rewritten(original, form):
    """`original` with its GELU op rewritten in builtin mode as `form`, or ("table") as its int8 table."""
    if form == "table":  # a form is taken only within -1 steps of the op: never
        return tflite_gelus.rewrite(original, "builtin", "sigmoid", form_steps=-1).tflite_model
    return tflite_gelus.rewrite(original, "builtin", form).tflite_model


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100, help="interleaved timing rounds (default 100)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    shapes = {block: shape for block, (_, shape) in blocks().items()}
    interpreters = {key: timing.interpreter(model, [np.random.default_rng(2).normal(0, 2, shapes[key[0]])
                                                    .astype(np.float32)])
                    for key, model in models().items()}
    medians = timing.interleaved_medians(interpreters, args.rounds)
    print(f"{machine.header(threads=1)}; {timing.runtime_name()}; median of {args.rounds} interleaved rounds\n")
    print("| block | precision | the GELU as | ms | vs the original GELU op |")
    print("|---|---|---|---:|---:|")
    for (block, precision, what), median in medians.items():
        reference = medians[(block, precision, "GELU op (original)")]
        print(f"| {block} | {precision} | {what} | {median * 1e3:.3f} | {median / reference:.2f}x |")


if __name__ == "__main__":
    main()
