"""Training paths: fit, whole-model XLA, and TFLite conversion (tf.distribute: test_distribute.py)."""

import numpy as np
import pytest
import tensorflow as tf

import keras_gelu
import tflite_helpers
from keras_gelu import converters
from conftest import IS_KERAS3
from conftest import keras


def _regression_data(n=256, seed=5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (np.sin(x[:, :1]) + x[:, 1:2] * x[:, 2:3]).astype(np.float32)
    return x, y


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16, activation=keras_gelu.GELU("exact")),
        keras.layers.Dense(16, activation=keras_gelu.gelu_tanh),
        keras_gelu.LearnableGELU(),
        keras.layers.Dense(16, activation=keras_gelu.GELU("sigmoid")),
        keras.layers.Dense(1),
    ])


def _learnable(model):
    return next(layer for layer in model.layers if isinstance(layer, keras_gelu.LearnableGELU))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_fit_reduces_loss_and_moves_learnable_parameters(jit_compile):
    x, y = _regression_data()
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=jit_compile)
    alpha_before = _learnable(model).alpha.numpy().copy()
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=8, batch_size=32, verbose=0)
    assert model.evaluate(x, y, verbose=0) < 0.5 * before
    assert not np.allclose(_learnable(model).alpha.numpy(), alpha_before)


def test_whole_model_xla_matches_graph_mode():
    x, _ = _regression_data(64)
    model = _model()
    graph = tf.function(model)(x).numpy()
    compiled = tf.function(model, jit_compile=True)(x).numpy()
    # XLA may fuse across layers and reassociate; float32 rounding only.
    np.testing.assert_allclose(compiled, graph, rtol=1e-5, atol=1e-6)


def _saved_model(model, path):
    if IS_KERAS3:
        model.export(path)
    else:
        model.save(path)
    return path


@pytest.mark.parametrize(
    "layer, expected_ops",
    [
        # Our exact form keeps tf.nn.gelu's spelling, so the stock converter fuses it.
        (lambda: keras_gelu.GELU("exact"), {"GELU"}),
        (lambda: keras_gelu.GELU("tanh"), {"LOGISTIC", "MUL", "ADD"}),
        (lambda: keras_gelu.GELU("sigmoid"), {"LOGISTIC", "MUL"}),
        # beta = 0 freezes to a constant and its ADD folds away.
        (lambda: keras_gelu.LearnableGELU(), {"LOGISTIC", "MUL"}),
    ],
    ids=["exact", "tanh", "sigmoid", "learnable"],
)
def test_saved_model_converts_to_builtin_tflite_ops(tmp_path, layer, expected_ops):
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(12), layer()])
    x = np.random.default_rng(3).normal(scale=3.0, size=(4, 12)).astype(np.float32)
    path = _saved_model(model, str(tmp_path / "sm"))
    converter = tf.lite.TFLiteConverter.from_saved_model(path)
    if "GELU" in expected_ops and tf.__version__.startswith("2.18"):
        # TF 2.18's converter does not fuse the erfc spelling (2.19+ does): the
        # stock route fails, and keras_gelu.converters is the way there.
        with pytest.raises(Exception, match="Erfc"):
            converter.convert()
        tflite_model, _ = converters.convert(path, mode="native")
    else:
        tflite_model = converter.convert()
    ops = set(tflite_helpers.ops(tflite_model))
    (output,) = tflite_helpers.run(tflite_model, x)
    assert expected_ops <= ops, ops
    assert not any(op.startswith("Flex") or op == "CUSTOM" for op in ops), ops
    # Same math in TFLite's kernels: float32 rounding (its GELU op is ~1e-6 from exact).
    np.testing.assert_allclose(output, model(x).numpy(), rtol=1e-5, atol=2e-6)
