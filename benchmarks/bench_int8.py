"""Int8 against float32 TFLite, for every GELU function: latency, size and accuracy.

1. FFN block (128 tokens x 768 -> 3072 -> 768, the BERT-base feed-forward):
   float32 .tflite vs post-training int8 .tflite (keras-gelu-convert --int8,
   calibrated on 64 random samples), single-thread latency in interleaved
   rounds, file size, and the int8 output's error as a share of the float
   output's range.
2. Digits MLP (64 -> 64 -> 64 -> 10): float32 .tflite of the trained model vs
   the int8 .tflite of its quantization-aware fine-tune
   (keras_gelu.qat.quantize_model, ranges started from 256
   training samples), latency on one sample and on the 360-sample test
   split, size, and test accuracy.

The GELU functions: exact and tanh use TFLite's GELU op (--mode native); sigmoid
and learnable are LOGISTIC/MUL ops in every mode. Ratios measured in one run
on a shared, noisy machine; not a test.

    python benchmarks/bench_int8.py [--rounds 40] [--functions exact,tanh,sigmoid,learnable]
"""

import argparse
import os
import sys
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tfmot (QAT) works only with tf-keras
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

import machine  # noqa: E402
import timing  # noqa: E402

import keras_gelu  # noqa: E402
from keras_gelu import converters  # noqa: E402
import keras_gelu.qat  # noqa: E402
from keras_gelu.converters.running import verify  # noqa: E402
from keras_gelu.flavour import keras  # noqa: E402

FUNCTIONS = keras_gelu.GELU_LAYER_FUNCTIONS
SEQUENCE, HIDDEN, FFN = 128, 768, 3072


def _convert(model, directory, name, **options):
    path = os.path.join(directory, name)
    tf.saved_model.save(model, path)
    tflite_model, _ = converters.convert(path, mode="native", verify=False, **options)
    return tflite_model


def ffn_table(functions, rounds):
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, (1, SEQUENCE, HIDDEN)).astype(np.float32)
    rows, interpreters = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for function in functions:
            keras.utils.set_random_seed(0)
            tokens = keras.Input((SEQUENCE, HIDDEN), name="tokens")
            hidden = keras.layers.Dense(FFN, activation=keras_gelu.gelu_layer(function))(tokens)
            model = keras.Model(tokens, keras.layers.Dense(HIDDEN)(hidden))
            float_model = _convert(model, directory, f"ffn_{function}")
            int8_model = _convert(model, directory, f"ffn_{function}_q", int8=True, calibration="random:64")
            reference = model(x).numpy()
            error = np.max(np.abs(verify.invoke(int8_model, [x])[0] - reference)) / np.ptp(reference)
            rows[function] = (len(float_model), len(int8_model), error)
            interpreters[function, "float32"] = timing.interpreter(float_model, [x])
            interpreters[function, "int8"] = timing.interpreter(int8_model, [x])
    medians = timing.interleaved_medians(interpreters, rounds)
    print(f"\n## FFN block {SEQUENCE}x{HIDDEN} -> {FFN} -> {HIDDEN}: float32 vs post-training int8, one thread "
          f"({timing.runtime_name()}), median of {rounds} interleaved rounds\n")
    print("| function | float32 ms | int8 ms | int8 speed-up | float32 KiB | int8 KiB | size "
          "| int8 max error / output range |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for function, (float_size, int8_size, error) in rows.items():
        float_ms, int8_ms = medians[function, "float32"] * 1e3, medians[function, "int8"] * 1e3
        print(f"| {function} | {float_ms:.2f} | {int8_ms:.2f} | {float_ms / int8_ms:.2f}x | {float_size / 1024:.0f} "
              f"| {int8_size / 1024:.0f} | {int8_size / float_size:.2f}x | {error:.4f} |", flush=True)


def digits_table(functions, rounds):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.2, random_state=0,
                                                        stratify=digits.target)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rows, interpreters = {}, {}
    with tempfile.TemporaryDirectory() as directory:
        for function in functions:
            keras.utils.set_random_seed(0)
            pixels = keras.Input((64,), name="pixels")
            hidden = keras.layers.Dense(64, activation=keras_gelu.gelu_layer(function))(pixels)
            hidden = keras.layers.Dense(64, activation=keras_gelu.gelu_layer(function))(hidden)
            model = keras.Model(pixels, keras.layers.Dense(10)(hidden))
            model.compile(keras.optimizers.Adam(1e-3), loss)
            model.fit(x_train, y_train, epochs=30, batch_size=32, verbose=0)
            qat = keras_gelu.qat.quantize_model(model, mode="native", calibration_data=x_train[:256])
            qat.compile(keras.optimizers.Adam(1e-4), loss)
            qat.fit(x_train, y_train, epochs=5, batch_size=32, verbose=0)
            float_model = _convert(model, directory, f"digits_{function}")
            int8_model = _convert(qat, directory, f"digits_{function}_q", int8=True)
            accuracies = [float(np.mean(np.argmax(verify.invoke(m, [x_test])[0], -1) == y_test))
                          for m in (float_model, int8_model)]
            rows[function] = (len(float_model), len(int8_model), *accuracies)
            for precision, tflite_model in (("float32", float_model), ("int8", int8_model)):
                interpreters[function, precision, "1"] = timing.interpreter(tflite_model, [x_test[:1]])
                interpreters[function, precision, "360"] = timing.interpreter(tflite_model, [x_test])
            print(f"  trained and converted {function}", file=sys.stderr, flush=True)
    medians = timing.interleaved_medians(interpreters, rounds)
    print(f"\n## Digits MLP: float32 vs QAT int8, one thread ({timing.runtime_name()}), median of {rounds} "
          "interleaved rounds\n")
    print("| function | float32 acc | int8 acc | speed-up, 1 sample | speed-up, 360 samples | float32 KiB | int8 KiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for function, (float_size, int8_size, float_accuracy, int8_accuracy) in rows.items():
        one = medians[function, "float32", "1"] / medians[function, "int8", "1"]
        batch = medians[function, "float32", "360"] / medians[function, "int8", "360"]
        print(f"| {function} | {float_accuracy:.4f} | {int8_accuracy:.4f} | {one:.2f}x | {batch:.2f}x "
              f"| {float_size / 1024:.1f} | {int8_size / 1024:.1f} |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="interleaved timing rounds (default 40)")
    parser.add_argument("--functions", default=",".join(FUNCTIONS), help=f"comma-separated, of {', '.join(FUNCTIONS)}")
    args = parser.parse_args()
    functions = args.functions.split(",")
    unknown = [function for function in functions if function not in FUNCTIONS]
    if unknown:
        parser.error(f"unknown GELU function(s) {', '.join(unknown)}; choose from {', '.join(FUNCTIONS)}")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    print(machine.header(threads=1))
    ffn_table(functions, args.rounds)
    digits_table(functions, args.rounds * 10)


if __name__ == "__main__":
    main()
