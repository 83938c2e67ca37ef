"""fine_tune_swapped: the swapped layers train first, alone; then every layer; trainable flags survive."""

import numpy as np
import pytest

import keras_gelu
from conftest import keras
from keras_gelu import fine_tuning

pytestmark = pytest.mark.legs("keras3", "tf_keras", "jax", "torch")  # keras.ops and numpy only


def _relu_model():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", name="fused")(inputs)
    hidden = keras.layers.ReLU(name="stand_alone")(keras.layers.Dense(8, name="feeds_relu")(hidden))
    hidden = keras.layers.Dense(8, activation="tanh", name="untouched")(hidden)
    return keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))


def _data(rng):
    x = rng.normal(size=(64, 6)).astype(np.float32)
    return x, (x[:, :2] > 0).astype(np.float32)


def _weights_by_layer(model):
    return {layer.name: [weight.copy() for weight in layer.get_weights()] for layer in model.layers}


def _changed(before, after):
    return sorted(name for name in before if any(not np.array_equal(old, new)
                                                 for old, new in zip(before[name], after[name])))


def test_swapped_layers_are_the_rebuilt_ones_and_what_feeds_a_new_activation_layer():
    model, swaps = keras_gelu.swap_activations(_relu_model(), {"relu": "gelu"}, return_swaps=True)
    assert sorted(layer.name for layer in fine_tuning.swapped_layers(model, swaps)) == [
        "feeds_relu", "fused", "stand_alone"]


def test_the_first_stage_moves_only_the_swapped_layers_and_the_second_all(rng):
    model, swaps = keras_gelu.swap_activations(_relu_model(), {"relu": "gelu"}, return_swaps=True)
    model.get_layer("head").trainable = False  # a user's own choice, which both stages must keep
    x, y = _data(rng)
    start = _weights_by_layer(model)
    first, _ = keras_gelu.fine_tune_swapped(model, swaps, x, y, loss="mse", swapped_epochs=2, epochs=0, verbose=0)
    after_first = _weights_by_layer(model)
    assert _changed(start, after_first) == ["feeds_relu", "fused"]
    assert len(first.history["loss"]) == 2

    _, second = keras_gelu.fine_tune_swapped(model, swaps, x, y, loss="mse", swapped_epochs=0, epochs=1, verbose=0)
    assert _changed(after_first, _weights_by_layer(model)) == ["feeds_relu", "fused", "untouched"]
    assert len(second.history["loss"]) == 1
    assert [layer.name for layer in model.layers if not layer.trainable] == ["head"]


def test_the_first_stage_runs_at_the_scaled_learning_rate(rng):
    model, swaps = keras_gelu.swap_activations(_relu_model(), {"relu": "gelu"}, return_swaps=True)
    x, y = _data(rng)
    rates = []

    class RecordRate(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
                         if hasattr(keras, "ops") else float(self.model.optimizer.learning_rate.numpy()))

    keras_gelu.fine_tune_swapped(model, swaps, x, y, loss="mse", learning_rate=2e-3, swapped_epochs=1, epochs=1,
                                 swapped_learning_rate_scale=0.25, callbacks=[RecordRate()], verbose=0)
    np.testing.assert_allclose(rates, [5e-4, 2e-3], rtol=1e-6)


@pytest.mark.parametrize("arguments, message", [
    ({"swapped_epochs": -1}, r"non-negative int\. Received: swapped_epochs=-1"),
    ({"epochs": 1.5}, r"non-negative int\. Received: epochs=1.5"),
    ({"swapped_learning_rate_scale": 0}, r"in \(0, 1\]\. Received: swapped_learning_rate_scale=0"),
])
def test_bad_arguments_are_refused_before_training(arguments, message, rng):
    model, swaps = keras_gelu.swap_activations(_relu_model(), {"relu": "gelu"}, return_swaps=True)
    x, y = _data(rng)
    before = _weights_by_layer(model)
    with pytest.raises(ValueError, match=message):
        keras_gelu.fine_tune_swapped(model, swaps, x, y, loss="mse", verbose=0, **arguments)
    assert _changed(before, _weights_by_layer(model)) == []
