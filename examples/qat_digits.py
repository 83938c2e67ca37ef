"""Int8 GELU classifiers on scikit-learn's digits: float, post-training int8, QAT and QAT int8.

For each GELU function (exact, tanh, sigmoid, learnable) it trains a float MLP
with the GELU as `Dense(..., activation=...)`, then

1. post-training quantization (PTQ): keras-gelu-convert --int8 --calibration
   on training samples;
2. quantization-aware training (QAT): keras_gelu.quantization.quantize_model
   with its int8 ranges started from the same calibration samples, a few
   more epochs, then keras-gelu-convert --int8;

and evaluates the float model, the PTQ .tflite, the QAT model and the QAT
.tflite on the held-out split. It prints a table and writes one int8 .tflite
per GELU function. Digits ships inside scikit-learn: nothing is downloaded.

    python examples/qat_digits.py [--functions exact,learnable] [--mode native] [--output-dir qat_digits_output]

QAT needs tf-keras: the script sets TF_USE_LEGACY_KERAS=1 itself.
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


def main(argv=None):
    parser = int8_recipe.argument_parser(__doc__, "qat_digits_output", epochs=30, qat_epochs=5,
                                         qat_learning_rate=1e-4, width=64)
    args = int8_recipe.parse_arguments(parser, argv, "digits")
    data = load_digits_split(args.seed)
    print(f"digits: {len(data[0])} train / {len(data[2])} test samples; {int8_recipe.describe(args)}")
    results = [int8_recipe.compare_float_ptq_qat(function, lambda f: build_model(f, args.width), data, args, "pixels",
                                                 learning_rate=1e-3) for function in args.functions]
    int8_recipe.print_results(results, args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
