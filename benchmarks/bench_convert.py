"""The converter's cost, and what each GELU form costs at run time in TFLite.

1. Conversion time of plain TFLite (`TFLiteConverter.from_saved_model`) vs
   keras-gelu-convert (load + rewrite + convert, verification off) for
   Transformer encoders of 1, 4 and 12 layers at BERT-base width (hidden 768,
   FFN 3072, 12 heads), with peak memory. Each conversion runs in its own
   process so peak RSS is its own.
2. TFLite single-thread latency of each GELU form vs the GELU op, for the
   activation alone (262,144 elements) and for an FFN block (128 x 768 ->
   3072 -> 768), timed in interleaved rounds.

Ratios measured in one run on a shared, noisy machine; not a test.

    python benchmarks/bench_convert.py [--layers 1 4 12] [--rounds 200]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HIDDEN, FFN, HEADS, SEQUENCE = 768, 3072, 12, 128


def build_encoder(layers, directory):
    import keras_gelu
    from keras_gelu.flavour import keras

    keras.utils.set_random_seed(0)
    tokens = keras.Input((SEQUENCE, HIDDEN), name="tokens")
    h = tokens
    for _ in range(layers):
        attention = keras.layers.MultiHeadAttention(HEADS, HIDDEN // HEADS)(h, h)
        h = keras.layers.LayerNormalization()(h + attention)
        ffn = keras.layers.Dense(HIDDEN)(keras.layers.Dense(FFN, activation=keras_gelu.GELU())(h))
        h = keras.layers.LayerNormalization()(h + ffn)
    model = keras.Model(tokens, h)
    if keras_gelu.KERAS_FLAVOUR == "keras3":
        model.export(directory, verbose=False)
    else:
        model.save(directory)


def child(kind, directory):
    """One conversion in this process; prints seconds and peak RSS as JSON."""
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    started = time.perf_counter()
    if kind == "plain":
        tflite_model = tf.lite.TFLiteConverter.from_saved_model(directory).convert()
    else:
        # The pipeline in this process, as the stock converter runs in its: the sandbox's own cost is
        # bench_sandbox's subject.
        from keras_gelu.converters.options import Options
        from keras_gelu.converters.running import pipeline

        tflite_model, _ = pipeline.convert(directory, Options(mode=kind, verify=False), kind="SavedModel")
    seconds = time.perf_counter() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mib": peak_mib, "bytes": len(tflite_model)}))


def _run_child(kind, directory):
    result = subprocess.run([sys.executable, __file__, "--child", kind, directory],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def conversion_table(layer_counts):
    print("## Conversion: plain TFLite vs keras-gelu-convert (verification off)\n")
    print("| encoder layers | plain s | ours builtin s | ours native s | builtin / plain | native / plain "
          "| plain peak MiB | ours peak MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers in layer_counts:
        with tempfile.TemporaryDirectory() as directory:
            build_encoder(layers, directory)
            plain = _run_child("plain", directory)
            builtin = _run_child("builtin", directory)
            native = _run_child("native", directory)
        print(f"| {layers} | {plain['seconds']:.1f} | {builtin['seconds']:.1f} | {native['seconds']:.1f} "
              f"| {builtin['seconds'] / plain['seconds']:.2f}x | {native['seconds'] / plain['seconds']:.2f}x "
              f"| {plain['peak_mib']:.0f} | {max(builtin['peak_mib'], native['peak_mib']):.0f} |", flush=True)


def latency_models():
    """(block name, spelling) -> .tflite bytes, each spelling of the same exact-GELU graph."""
    import numpy as np
    import tensorflow as tf

    from keras_gelu import converters
    from keras_gelu import vocabulary

    rng = np.random.default_rng(0)
    w1 = tf.constant(rng.normal(0, 0.03, (HIDDEN, FFN)).astype(np.float32))
    w2 = tf.constant(rng.normal(0, 0.03, (FFN, HIDDEN)).astype(np.float32))

    class Alone(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([512, 512], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.nn.gelu(x, approximate=False)}

    class FeedForward(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([SEQUENCE, HIDDEN], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.matmul(tf.nn.gelu(tf.matmul(x, w1), approximate=False), w2)}

    models = {}
    for block_name, module in (("activation alone (512x512)", Alone()), ("FFN block (128x768, 3072)", FeedForward())):
        with tempfile.TemporaryDirectory() as directory:
            tf.saved_model.save(module, directory, signatures={"serving_default": module.__call__})
            models[(block_name, "GELU op (native)")], _ = converters.convert(directory, mode="native", verify=False)
            for exact_as in vocabulary.EXACT_AS:
                models[(block_name, f"{exact_as} (builtin)")], _ = converters.convert(
                    directory, mode="builtin", exact_as=exact_as, verify=False)
    return models


def latency_table(rounds):
    import numpy as np

    import timing

    models = latency_models()
    interpreters = {}
    for key, tflite_model in models.items():
        shape = (512, 512) if key[0].startswith("activation") else (SEQUENCE, HIDDEN)
        interpreters[key] = timing.interpreter(
            tflite_model, [np.random.default_rng(1).normal(0, 2, shape).astype(np.float32)])
    medians = timing.interleaved_medians(interpreters, rounds)
    print(f"\n## TFLite latency, one thread ({timing.runtime_name()}), median of {rounds} interleaved rounds\n")
    print("| block | form | ms | vs GELU op |")
    print("|---|---|---:|---:|")
    for (block, form), median in medians.items():
        reference = medians[(block, "GELU op (native)")]
        print(f"| {block} | {form} | {median * 1e3:.3f} | {median / reference:.2f}x |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 4, 12])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    import machine

    print(machine.header() + "\n")
    conversion_table(args.layers)
    latency_table(args.rounds)


if __name__ == "__main__":
    main()
