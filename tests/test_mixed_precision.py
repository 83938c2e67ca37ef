"""Mixed precision: every float16/bfloat16 value in [-20, 20] within 1 ulp."""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import keras_gelu
import references
from conftest import keras

pytestmark = pytest.mark.legs("keras3", "tf_keras")

HALF_TYPES = {
    "mixed_float16": (np.float16, np.int16, tf.float16),
    "mixed_bfloat16": (ml_dtypes.bfloat16, np.int16, tf.bfloat16),
}


def _every_value_in(policy, low=-20.0, high=20.0):
    """All finite values of the half type in [low, high], plus the edges."""
    numpy_type, int_type, _ = HALF_TYPES[policy]
    every = np.arange(np.iinfo(int_type).min, np.iinfo(int_type).max + 1).astype(int_type).view(numpy_type)
    as_float = every.astype(np.float32)
    in_range = every[(as_float >= low) & (as_float <= high)]
    info = ml_dtypes.finfo(numpy_type)
    edges = np.array(
        [-np.inf, np.inf, np.nan, float(info.max), -float(info.max), float(info.smallest_subnormal),
         -float(info.smallest_subnormal), float(info.smallest_normal), -float(info.smallest_normal), 0.0, -0.0],
        np.float32,
    ).astype(numpy_type)
    return np.concatenate([in_range, edges])


FLOAT32_SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def _flush_to_zero(values):
    return np.where(np.abs(values) < FLOAT32_SMALLEST_NORMAL, np.copysign(0.0, values), values)


def _reference_rounded(function, values, numpy_type):
    """The float64 reference rounded to the half type, with TensorFlow's flush-to-zero.

    TensorFlow runs its CPU kernels with flush-to-zero and denormals-are-zero,
    so no float32 (or bfloat16, which shares float32's exponent range) input
    or result below 1.18e-38 survives any op, tf.nn.gelu's included. The
    reference gets the same treatment; float16's subnormals (>= 6e-8) are
    normal float32 numbers and are unaffected.
    """
    inputs = _flush_to_zero(values.astype(np.float64))
    exact = references.BY_FUNCTION[function](inputs)
    return _flush_to_zero(exact).astype(np.float32).astype(numpy_type)


@pytest.mark.parametrize("policy", sorted(HALF_TYPES))
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_layer_within_one_ulp_of_rounded_float64(policy, function):
    keras.mixed_precision.set_global_policy(policy)
    numpy_type, _, tf_type = HALF_TYPES[policy]
    values = _every_value_in(policy)
    layer = keras_gelu.GELU(approximate=function)
    output = layer(tf.constant(values.astype(np.float32), dtype=tf_type))
    assert output.dtype == tf_type
    got = output.numpy().astype(numpy_type)
    # Our float32 result is rounded once to the half type, so it lands on the
    # float64 value's rounding or its neighbour (the float64 -> float32 -> half
    # double rounding of the reference can differ by that one step too).
    distance = references.ulp_distance(got, _reference_rounded(function, values, numpy_type))
    worst = int(np.argmax(distance))
    assert distance[worst] <= 1, f"x={values[worst]} got={got[worst]} distance={distance[worst]}"


@pytest.mark.parametrize("policy", sorted(HALF_TYPES))
def test_learnable_weights_stay_float32_and_output_is_half(policy):
    keras.mixed_precision.set_global_policy(policy)
    _, _, tf_type = HALF_TYPES[policy]
    layer = keras_gelu.LearnableGELU(shared_axes=[1])
    values = _every_value_in(policy, -8.0, 8.0)
    output = layer(tf.constant(values.astype(np.float32).reshape(-1, 1), dtype=tf_type))
    assert output.dtype == tf_type
    assert layer.alpha.dtype in ("float32", tf.float32)
    assert layer.beta.dtype in ("float32", tf.float32)
    got = output.numpy().reshape(-1)
    numpy_type = HALF_TYPES[policy][0]
    distance = references.ulp_distance(got.astype(numpy_type), _reference_rounded("sigmoid", values, numpy_type))
    assert distance.max() <= 1


@pytest.mark.parametrize("policy", sorted(HALF_TYPES))
def test_dense_with_gelu_trains_under_mixed_precision(policy):
    keras.mixed_precision.set_global_policy(policy)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (x[:, :1] ** 2 - x[:, 1:2]).astype(np.float32)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(32, activation=keras_gelu.GELU("exact")),
        keras.layers.Dense(32, activation=keras_gelu.LearnableGELU()),
        keras.layers.Dense(1, dtype="float32"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    history = model.fit(x, y, epochs=5, batch_size=32, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["loss"][-1] < 0.5 * before
