"""Save/load round trips with non-default arguments, in each flavour's formats."""

import numpy as np
import pytest
import tensorflow as tf

import keras_gelu
from conftest import keras
from conftest import keras3_only
from conftest import tf_keras_only

pytestmark = pytest.mark.legs("keras3", "tf_keras")


def _model_with_every_spelling():
    inputs = keras.Input((6,))
    h = keras.layers.Dense(8, activation=keras_gelu.GELU(approximate="tanh"), name="d_tanh")(inputs)
    h = keras.layers.Dense(8, activation=keras_gelu.gelu_sigmoid, name="d_fn_sigmoid")(h)
    h = keras.layers.Dense(8, activation=keras_gelu.gelu_exact, name="d_fn_exact")(h)
    h = keras.layers.Dense(8, activation=keras_gelu.gelu_tanh, name="d_fn_tanh")(h)
    h = keras.layers.Dense(
        8,
        activation=keras_gelu.LearnableGELU(
            alpha_initializer=keras.initializers.Constant(1.4),
            beta_initializer=keras.initializers.Constant(0.1),
        ),
        name="d_learnable",
    )(h)
    h = keras_gelu.GELU(approximate="sigmoid", name="standalone_sigmoid")(h)
    h = keras_gelu.LearnableGELU(
        alpha_initializer=keras.initializers.RandomUniform(1.0, 2.0, seed=3),
        beta_regularizer=keras.regularizers.L2(1e-3),
        alpha_constraint=keras.constraints.NonNeg(),
        name="standalone_learnable",
    )(h)
    outputs = keras_gelu.GELU(name="standalone_exact")(h)
    return keras.Model(inputs, outputs)


def _inputs():
    return np.random.default_rng(7).normal(scale=2.0, size=(5, 6)).astype(np.float32)


def _assert_same_layers(original, restored):
    assert restored.get_layer("d_tanh").activation.approximate == "tanh"
    assert restored.get_layer("d_fn_sigmoid").activation == keras_gelu.gelu_sigmoid
    assert restored.get_layer("d_fn_exact").activation == keras_gelu.gelu_exact
    assert isinstance(restored.get_layer("d_learnable").activation, keras_gelu.LearnableGELU)
    assert restored.get_layer("standalone_sigmoid").approximate == "sigmoid"
    assert restored.get_layer("standalone_learnable").get_config() == (
        original.get_layer("standalone_learnable").get_config()
    )


@keras3_only
def test_keras_file_round_trip(tmp_path):
    model = _model_with_every_spelling()
    x = _inputs()
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    _assert_same_layers(model, restored)
    np.testing.assert_array_equal(restored(x).numpy(), model(x).numpy())


@keras3_only
def test_exported_saved_model_serves_identical_outputs(tmp_path):
    model = _model_with_every_spelling()
    x = _inputs()
    model.export(str(tmp_path / "exported"))
    served = tf.saved_model.load(str(tmp_path / "exported"))
    np.testing.assert_array_equal(served.serve(x).numpy(), model(x).numpy())


@tf_keras_only
@pytest.mark.parametrize("file_format", ["h5", "savedmodel"])
def test_tf_keras_round_trip(tmp_path, file_format):
    model = _model_with_every_spelling()
    x = _inputs()
    path = str(tmp_path / ("model.h5" if file_format == "h5" else "model_dir"))
    model.save(path)
    restored = keras.models.load_model(path)
    _assert_same_layers(model, restored)
    np.testing.assert_array_equal(restored(x).numpy(), model(x).numpy())
    if file_format == "savedmodel":
        served = tf.saved_model.load(path).signatures["serving_default"]
        (output,) = served(tf.constant(x)).values()
        np.testing.assert_array_equal(output.numpy(), model(x).numpy())


def test_sequential_config_round_trip_keeps_outputs():
    model = keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(5, activation=keras_gelu.GELU(approximate=True)),
        keras_gelu.LearnableGELU(shared_axes=None),
        keras.layers.Dense(3, activation=keras_gelu.gelu_sigmoid),
    ])
    clone = keras.Sequential.from_config(model.get_config())
    clone.set_weights(model.get_weights())
    x = np.random.default_rng(8).normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_array_equal(clone(x).numpy(), model(x).numpy())
    assert clone.layers[0].activation.approximate == "tanh"


def test_registered_names():
    get_name = keras.saving.get_registered_name
    assert get_name(keras_gelu.GELU) == "keras_gelu>GELU"
    assert get_name(keras_gelu.LearnableGELU) == "keras_gelu>LearnableGELU"
    assert get_name(keras_gelu.GELUActivation) == "keras_gelu>GELUActivation"
