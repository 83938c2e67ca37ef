"""A small int8 GELU CNN on scikit-learn's digits as 8x8 images: float, post-training int8, QAT and QAT int8.

The same flow as qat_digits.py (see it), with a convolutional model:
Conv2D(16, 3x3, GELU) -> MaxPooling2D -> Conv2D(32, 3x3, GELU) ->
GlobalAveragePooling2D -> Dense(10). Each GELU is the Conv2D's `activation=`,
which quantize_model splits into a layer of its own (int8 TFLite never fuses
a GELU into CONV_2D); the convolution kernels are quantized per output channel.

    python examples/qat_cnn_digits.py [--functions exact,learnable] [--mode native] [--output-dir qat_cnn_digits_output]

QAT runs on tf-keras with tfmot unless TF_USE_LEGACY_KERAS=0 is set, which
runs it on Keras 3 with keras_gelu's own engine (no tfmot).
"""

import sys

import qat_digits
from int8_recipe import keras

import keras_gelu
from tasks import load_digits_split


def build_model(function, width):
    inputs = keras.Input((8, 8, 1), name="image")
    hidden = keras.layers.Conv2D(width, 3, padding="same", activation=keras_gelu.gelu_layer(function),
                                 name="conv_1")(inputs)
    hidden = keras.layers.MaxPooling2D(name="pool")(hidden)
    hidden = keras.layers.Conv2D(2 * width, 3, padding="same", activation=keras_gelu.gelu_layer(function),
                                 name="conv_2")(hidden)
    hidden = keras.layers.GlobalAveragePooling2D(name="average")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(hidden), name=f"digits_cnn_{function}")


def load_images(seed):
    x_train, y_train, x_test, y_test = load_digits_split(seed)
    return x_train.reshape(-1, 8, 8, 1), y_train, x_test.reshape(-1, 8, 8, 1), y_test


def main(argv=None):
    return qat_digits.run(argv, __doc__, "qat_cnn_digits_output", "digits_cnn", width=16, load=load_images,
                          build=build_model, input_name="image", learning_rate=3e-3, what="digits as 8x8 images")


if __name__ == "__main__":
    sys.exit(main())
