"""Int8 GELU classifiers on scikit-learn's digits: float, post-training int8, QAT and QAT int8.

For each GELU function (exact, tanh, sigmoid, learnable) it trains a float MLP
with the GELU as `Dense(..., activation=...)`, then

1. post-training quantization (PTQ): keras-gelu-convert --int8 --calibration
   on training samples;
2. quantization-aware training (QAT): keras_gelu.qat.quantize_model
   with its int8 ranges started from the same calibration samples, a few
   more epochs, then keras-gelu-convert --int8;

and evaluates the float model, the PTQ .tflite, the QAT model and the QAT
.tflite on the held-out split. It prints a table and writes one int8 .tflite
per GELU function. Digits ships inside scikit-learn: nothing is downloaded.

    python examples/qat_digits.py [--functions exact,learnable] [--mode native] [--output-dir qat_digits_output]

QAT runs on tf-keras with tfmot unless TF_USE_LEGACY_KERAS=0 is set, which
runs it on Keras 3 with keras_gelu's own engine (no tfmot).
"""

import sys

import int8_recipe
from int8_recipe import keras

import keras_gelu
from tasks import load_digits_split


def build_model(function, width):
    inputs = keras.Input((64,), name="pixels")
    hidden = keras.layers.Dense(width, activation=keras_gelu.gelu_layer(function), name="hidden_1")(inputs)
    hidden = keras.layers.Dense(width, activation=keras_gelu.gelu_layer(function), name="hidden_2")(hidden)
    logits = keras.layers.Dense(10, name="logits")(hidden)
    return keras.Model(inputs, logits, name=f"digits_{function}")


def run(argv, description, output_dir, file_prefix, width, load, build, input_name, learning_rate, what):
    """A digits recipe: flags, data, the float/PTQ/QAT/int8 comparison per GELU function, the table."""
    parser = int8_recipe.argument_parser(description, output_dir, epochs=30, qat_epochs=5,
                                         qat_learning_rate=1e-4, width=width)
    args = int8_recipe.parse_arguments(parser, argv, file_prefix)
    data = load(args.seed)
    print(f"{what}: {len(data[0])} train / {len(data[2])} test samples; {int8_recipe.describe(args)}")
    results = [int8_recipe.compare_float_ptq_qat(function, lambda f: build(f, args.width), data, args, input_name,
                                                 learning_rate=learning_rate) for function in args.functions]
    int8_recipe.print_results(results, args.output_dir)
    return 0


def main(argv=None):
    return run(argv, __doc__, "qat_digits_output", "digits", width=64, load=load_digits_split, build=build_model,
               input_name="pixels", learning_rate=1e-3, what="digits")


if __name__ == "__main__":
    sys.exit(main())
