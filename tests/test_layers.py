"""GELU and LearnableGELU as Keras layers: arguments, configs, weights, gradients."""

import numpy as np
import pytest
import tensorflow as tf

import keras_gelu
import references
from conftest import keras

pytestmark = pytest.mark.legs("keras3", "tf_keras")


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_gelu_layer_computes_its_form(function):
    x = np.linspace(-5.0, 5.0, 101, dtype=np.float32).reshape(1, 101)
    np.testing.assert_allclose(
        keras_gelu.GELU(approximate=function)(x).numpy()[0], references.BY_FUNCTION[function](x[0]),
        rtol=2e-6, atol=1e-7,  # the loosest float32 tolerance of test_activations
    )


def test_gelu_layer_booleans_and_default():
    assert keras_gelu.GELU().approximate == "exact"
    assert keras_gelu.GELU(approximate=False).approximate == "exact"
    assert keras_gelu.GELU(approximate="none").approximate == "exact"
    assert keras_gelu.GELU(approximate=True).approximate == "tanh"


@pytest.mark.parametrize("bad", ["gelu", "TANH", 2, None])
def test_gelu_layer_rejects_bad_approximate(bad):
    with pytest.raises(ValueError, match=r"Received: approximate="):
        keras_gelu.GELU(approximate=bad)


def test_gelu_layer_config_round_trip_with_non_default_values():
    layer = keras_gelu.GELU(approximate="sigmoid", name="my_gelu", dtype="float64")
    config = layer.get_config()
    assert config["approximate"] == "sigmoid"
    clone = keras_gelu.GELU.from_config(config)
    assert clone.approximate == "sigmoid"
    assert clone.name == "my_gelu"
    x = np.float64([[-3.0, 0.5, 2.0]])
    np.testing.assert_array_equal(clone(x).numpy(), layer(x).numpy())


def test_gelu_layer_shape_and_masking():
    layer = keras_gelu.GELU("tanh")
    assert layer.supports_masking
    assert tuple(layer.compute_output_shape((None, 7, 3))) == (None, 7, 3)
    assert layer(np.zeros((2, 7, 3), np.float32)).shape == (2, 7, 3)


def test_gelu_layer_has_no_weights():
    layer = keras_gelu.GELU()
    layer(np.zeros((1, 4), np.float32))
    assert layer.weights == []


def test_gelu_as_dense_activation():
    dense = keras.layers.Dense(3, activation=keras_gelu.GELU("tanh"), kernel_initializer="ones")
    x = np.float32([[0.5, -1.0]])
    np.testing.assert_allclose(
        dense(x).numpy(), references.gelu_tanh(np.full((1, 3), -0.5)), rtol=2e-6, atol=1e-7
    )


# --- LearnableGELU -----------------------------------------------------------------


def test_learnable_starts_as_the_sigmoid_form():
    layer = keras_gelu.LearnableGELU()
    x = np.linspace(-6.0, 6.0, 61, dtype=np.float32).reshape(1, 61)
    np.testing.assert_allclose(layer(x).numpy()[0], references.gelu_sigmoid(x[0]), rtol=5e-7, atol=1e-7)
    np.testing.assert_allclose(layer.alpha.numpy(), np.full((61,), 1.702, np.float32))
    np.testing.assert_array_equal(layer.beta.numpy(), np.zeros((61,), np.float32))


def test_learnable_weights_are_named_and_shaped_like_prelu():
    layer = keras_gelu.LearnableGELU(shared_axes=[1, 2])
    layer(np.zeros((2, 5, 6, 3), np.float32))
    names = sorted(w.name.split("/")[-1].split(":")[0] for w in layer.trainable_weights)
    assert names == ["alpha", "beta"]
    assert tuple(layer.alpha.shape) == (1, 1, 3)
    assert tuple(layer.beta.shape) == (1, 1, 3)


def test_learnable_per_channel_parameters_act_per_channel():
    layer = keras_gelu.LearnableGELU(
        alpha_initializer=keras.initializers.Constant([[1.0, 2.0, 3.0]]), shared_axes=1
    )
    x = np.random.default_rng(0).normal(size=(4, 5, 3)).astype(np.float32)
    y = layer(x).numpy()
    alpha = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(y, references.learnable_gelu(x, alpha, 0.0), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bad", [0, -1, [1, 0], "1", [1.5], True])
def test_learnable_rejects_bad_shared_axes(bad):
    with pytest.raises(ValueError, match=r"Received: shared_axes="):
        keras_gelu.LearnableGELU(shared_axes=bad)


def test_learnable_rejects_shared_axis_beyond_rank():
    with pytest.raises(ValueError, match=r"Received: shared_axes=\[3\]"):
        keras_gelu.LearnableGELU(shared_axes=3)(np.zeros((1, 2, 2), np.float32))


def test_learnable_rejects_unknown_unshared_size():
    layer = keras_gelu.LearnableGELU()
    with pytest.raises(ValueError, match=r"Received: input_shape=\(None, None, 4\)"):
        layer.build((None, None, 4))
    shared = keras_gelu.LearnableGELU(shared_axes=1)
    shared.build((None, None, 4))
    assert tuple(shared.alpha.shape) == (1, 4)


def test_learnable_config_round_trip_with_non_default_values():
    layer = keras_gelu.LearnableGELU(
        alpha_initializer=keras.initializers.Constant(1.3),
        beta_initializer=keras.initializers.Constant(-0.2),
        alpha_regularizer=keras.regularizers.L2(0.01),
        beta_regularizer=keras.regularizers.L1(0.02),
        alpha_constraint=keras.constraints.NonNeg(),
        beta_constraint=keras.constraints.MaxNorm(2.0),
        shared_axes=[1],
        name="lg",
    )
    config = layer.get_config()
    clone = keras_gelu.LearnableGELU.from_config(config)
    assert clone.get_config() == config
    assert clone.shared_axes == [1]
    x = np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(clone(x).numpy(), layer(x).numpy())
    np.testing.assert_allclose(
        layer(x).numpy(), references.learnable_gelu(x, 1.3, -0.2), rtol=1e-6, atol=1e-7
    )
    assert isinstance(clone.alpha_regularizer, keras.regularizers.L2)
    assert isinstance(clone.beta_constraint, keras.constraints.MaxNorm)
    # The regularizers are really attached: two loss terms once built.
    assert len(clone.losses) == 2


def test_learnable_parameter_gradients_match_numerical_gradients():
    x = tf.constant(np.linspace(-6.0, 6.0, 25).reshape(1, 25))

    def as_function_of_parameters(alpha, beta):
        return keras_gelu.kernels.learnable(x, alpha, beta)

    alpha = tf.constant(np.linspace(0.5, 2.5, 25).reshape(1, 25))
    beta = tf.constant(np.linspace(-1.0, 1.0, 25).reshape(1, 25))
    theoretical, numerical = tf.test.compute_gradient(as_function_of_parameters, [alpha, beta], delta=1e-5)
    for got, want in zip(theoretical, numerical):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)


def test_learnable_shared_parameter_gradients_sum_over_shared_axes():
    layer = keras_gelu.LearnableGELU(shared_axes=[1], dtype="float64")
    x = tf.constant(np.random.default_rng(2).normal(size=(3, 4, 2)))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(layer(x) ** 2)
    grad_alpha, grad_beta = tape.gradient(y, [layer.alpha, layer.beta])
    # float64 reference by central differences on each shared parameter.
    for variable, grad in ((layer.alpha, grad_alpha), (layer.beta, grad_beta)):
        base = variable.numpy()
        numeric = np.zeros_like(base)
        for channel in range(2):
            for sign in (1, -1):
                shifted = base.copy()
                shifted[0, channel] += sign * 1e-6
                variable.assign(shifted)
                numeric[0, channel] += sign * float(tf.reduce_sum(layer(x) ** 2)) / 2e-6
            variable.assign(base)
        np.testing.assert_allclose(grad.numpy(), numeric, rtol=1e-6)


def test_learnable_input_gradient_matches_numerical_gradient():
    layer = keras_gelu.LearnableGELU(
        alpha_initializer=keras.initializers.Constant(1.1),
        beta_initializer=keras.initializers.Constant(0.3),
        dtype="float64",
    )
    x = tf.constant(np.linspace(-6.0, 6.0, 49).reshape(1, 49))
    layer(x)
    theoretical, numerical = tf.test.compute_gradient(layer, [x], delta=1e-5)
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("alpha, beta, at_minus_inf, at_plus_inf", [
    (1.702, 0.0, 0.0, np.inf),  # the default: GELU-like
    (-0.5, 0.0, -np.inf, 0.0),  # a falling gate: the decay is on the right
    (0.0, 0.7, -np.inf, np.inf),  # no gate slope: a line through 0
])
def test_learnable_limits_at_infinity_for_any_parameters(alpha, beta, at_minus_inf, at_plus_inf):
    x = tf.constant([-np.inf, np.inf, np.nan])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = keras_gelu.kernels.learnable(x, tf.constant(alpha), tf.constant(beta))
    values = y.numpy()
    assert values[0] == at_minus_inf
    assert values[1] == at_plus_inf
    assert np.isnan(values[2])
    assert np.all(np.isfinite(tape.gradient(y, x).numpy()[:2]))
