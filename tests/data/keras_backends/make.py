"""Makes the models of tests/test_backends.py and tests/test_converter_backends.py: .keras files saved on Keras 3's
JAX and PyTorch backends, with the outputs each computed there as the reference.

Each backend runs in a venv without TensorFlow (`make install-jax install-torch`), plus scikit-learn for the digits:

    .venv-jax/bin/pip install scikit-learn
    KERAS_BACKEND=jax .venv-jax/bin/python tests/data/keras_backends/make.py
    .venv-torch/bin/pip install scikit-learn
    KERAS_BACKEND=torch .venv-torch/bin/python tests/data/keras_backends/make.py

Each run writes `<backend>_float.keras` (every GELU form, a GELU activation of a Dense and a LearnableGELU,
trained a little so that alpha and beta moved), `<backend>_qat.keras` (an MLP on the digits, trained, then
quantization-aware trained by keras_gelu.qat on that backend, jit-compiled) and `<backend>_outputs.npz`.
"""

import os

import keras
import numpy as np
from sklearn.datasets import load_digits

import keras_gelu
from keras_gelu import qat

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = keras.backend.backend()


def float_model():
    inputs = keras.Input((8,))
    x = keras.layers.Dense(16, activation=keras_gelu.gelu_exact)(inputs)
    x = keras_gelu.GELU(approximate="tanh")(keras.layers.Dense(16)(x))
    x = keras_gelu.GELU(approximate="sigmoid")(keras.layers.Dense(16)(x))
    x = keras_gelu.LearnableGELU()(keras.layers.Dense(16)(x))
    return keras.Model(inputs, keras.layers.Dense(4)(x))


def digits_mlp():
    inputs = keras.Input((64,))
    x = keras_gelu.GELU(approximate="exact")(keras.layers.Dense(32)(inputs))
    x = keras_gelu.LearnableGELU()(keras.layers.Dense(32)(x))
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def main():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    references = {}

    model = float_model()
    x = (3.0 * rng.standard_normal((256, 8))).astype(np.float32)  # wide enough to reach both tails of the GELUs
    model.compile("adam", "mse", jit_compile=True)
    model.fit(x, np.sin(x[:, :4]), epochs=5, verbose=0)
    model.save(os.path.join(HERE, f"{BACKEND}_float.keras"))
    references["float/inputs"] = x[:64]
    references["float/outputs"] = keras.ops.convert_to_numpy(model(x[:64]))

    digits = load_digits()
    images, labels = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32)
    order = rng.permutation(len(images))
    train, test = order[:1437], order[1437:]
    model = digits_mlp()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile("adam", loss, metrics=["accuracy"], jit_compile=True)
    model.fit(images[train], labels[train], epochs=30, batch_size=32, verbose=0)
    qat_model = qat.quantize_model(model, calibration_data=images[train[:256]])
    qat_model.compile(keras.optimizers.Adam(1e-4), loss, metrics=["accuracy"], jit_compile=True)
    qat_model.fit(images[train], labels[train], epochs=3, batch_size=32, verbose=0)
    qat_model.save(os.path.join(HERE, f"{BACKEND}_qat.keras"))
    references["qat/inputs"] = images[test]
    references["qat/outputs"] = keras.ops.convert_to_numpy(qat_model(images[test]))
    references["qat/labels"] = labels[test]
    print(BACKEND, "float accuracy", model.evaluate(images[test], labels[test], verbose=0)[1],
          "QAT accuracy", qat_model.evaluate(images[test], labels[test], verbose=0)[1])
    np.savez(os.path.join(HERE, f"{BACKEND}_outputs.npz"), **references)


if __name__ == "__main__":
    main()
