"""The layers' guarantees on every Keras 3 backend: TensorFlow, JAX and PyTorch, tested on each.

Written in `keras.ops` and numpy only, so the very same tests run in the
Keras 3 leg (TensorFlow's XLA kernels) and in the JAX and PyTorch legs
(`portable_kernels`), the latter in environments without TensorFlow. The
references are the float64 formulas of `references.py`.
"""

import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import keras_gelu
import references
from conftest import BACKEND
from conftest import keras

pytestmark = pytest.mark.legs("keras3", "jax", "torch")

DENSE_GRID = np.linspace(-10.0, 10.0, 20_001, dtype=np.float32)
# JAX computes float64 only with jax_enable_x64, which the JAX leg leaves off (as most JAX users do).
FLOAT64 = BACKEND != "jax"
DTYPES = ["float16", "bfloat16", "float32"] + (["float64"] if FLOAT64 else [])
HALF_TYPES = {"float16": (np.float16, np.int16), "bfloat16": (ml_dtypes.bfloat16, np.int16)}


def _numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _value_and_gradient(function, x):
    """function(x) and d sum(function(x)) / dx, on the active backend's own autodiff."""
    x = keras.ops.convert_to_tensor(x)
    if BACKEND == "jax":
        import jax

        return _numpy(function(x)), _numpy(jax.grad(lambda v: keras.ops.sum(function(v)))(x))
    if BACKEND == "torch":
        x = x.detach().requires_grad_(True)
        y = function(x)
        keras.ops.sum(y).backward()
        return _numpy(y.detach()), _numpy(x.grad)
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(x)
        y = function(x)
    return _numpy(y), _numpy(tape.gradient(y, x))


def _as(values, dtype):
    """`values` as a tensor of `dtype` (through float64: float64's largest value does not fit float32)."""
    return keras.ops.convert_to_tensor(np.asarray(values, np.float64).astype(ml_dtypes.finfo(dtype).dtype))


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_float32_accuracy_on_a_dense_grid(function):
    actual = _numpy(keras_gelu.gelu(DENSE_GRID, approximate=function))
    assert actual.dtype == np.float32
    expected = references.BY_FUNCTION[function](DENSE_GRID)
    tolerance = references.FLOAT32_TOLERANCE[function]
    excess = np.abs(actual.astype(np.float64) - expected) - (tolerance["atol"] + tolerance["rtol"] * np.abs(expected))
    assert excess.max() <= 0, DENSE_GRID[np.argmax(excess)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_infinities_nan_and_huge_inputs_with_finite_gradients(function, dtype):
    largest = float(ml_dtypes.finfo(dtype).max) if dtype != "float64" else float(np.finfo(np.float64).max)
    finite = [v for v in (-largest, -1e30, -1e4, 1e4, 1e30, largest) if abs(v) <= largest]
    values, grads = _value_and_gradient(lambda v: keras_gelu.gelu(v, function),
                                        _as([-np.inf, np.inf, *finite], dtype))
    values, grads = values.astype(np.float64), grads.astype(np.float64)
    assert values[0] == 0.0 and values[1] == np.inf  # tf.nn.gelu gives NaN at -inf
    assert grads[0] == 0.0 and grads[1] == 1.0  # and a NaN gradient at +inf
    np.testing.assert_array_equal(grads[2:], np.where(np.array(finite) < 0, 0.0, 1.0))
    (nan,) = _numpy(keras_gelu.gelu(_as([np.nan], dtype), function)).astype(np.float64)
    assert np.isnan(nan)


def test_exact_gradient_matches_the_float64_derivative():
    _, grads = _value_and_gradient(keras_gelu.gelu_exact, DENSE_GRID)
    # The gate is recovered as y / x (1 ulp) and x phi(x) adds a few more: 1e-6 abs.
    np.testing.assert_allclose(grads, references.gelu_exact_derivative(DENSE_GRID), rtol=0, atol=1e-6)


def _every_half_value(dtype, low=-20.0, high=20.0):
    numpy_type, int_type = HALF_TYPES[dtype]
    every = np.arange(np.iinfo(int_type).min, np.iinfo(int_type).max + 1).astype(int_type).view(numpy_type)
    as_float = every.astype(np.float32)
    return every[(as_float >= low) & (as_float <= high)]


@pytest.mark.parametrize("dtype", sorted(HALF_TYPES))
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_half_precision_is_computed_wide_and_rounded_once(function, dtype):
    """Every float16/bfloat16 value in [-20, 20] within 1 ulp of the float64 reference rounded to the type.
    Where the input, the gate y / x or the output is below float32's normal range (bfloat16 only), a float32
    computation meets subnormals, which XLA and TensorFlow flush to zero: there the result is within float32's
    smallest normal number (times |x|, for the gate) of GELU, the most float32 can promise."""
    values = _every_half_value(dtype)
    got = _numpy(keras_gelu.gelu(keras.ops.convert_to_tensor(values), function)).astype(np.float64)
    numpy_type = HALF_TYPES[dtype][0]
    x = values.astype(np.float64)
    exact = references.BY_FUNCTION[function](x)
    distance = references.ulp_distance(got.astype(numpy_type), exact.astype(np.float32).astype(numpy_type))
    reach = np.finfo(np.float32).tiny * np.maximum(1.0, np.abs(x))
    subnormal = (np.abs(x) < np.finfo(np.float32).tiny) | (np.abs(exact) < reach)
    assert distance[~subnormal].max() <= 1
    assert np.all(np.abs(got - exact)[subnormal] <= reach[subnormal])


@pytest.mark.parametrize("approximate, function", [("none", "exact"), (False, "exact"), (True, "tanh"),
                                                   ("tanh", "tanh"), ("sigmoid", "sigmoid")])
def test_approximate_names(approximate, function):
    np.testing.assert_array_equal(_numpy(keras_gelu.gelu(DENSE_GRID, approximate)),
                                  _numpy(keras_gelu.gelu(DENSE_GRID, function)))
    with pytest.raises(ValueError, match="Received: approximate="):
        keras_gelu.gelu(DENSE_GRID, "fast")


def _model():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation=keras_gelu.gelu_tanh),
                             keras_gelu.GELU(), keras.layers.Dense(16), keras_gelu.LearnableGELU(),
                             keras.layers.Dense(1)])


def test_a_model_trains_under_jit_compile_and_its_learnable_gelu_moves(rng):
    """fit() compiled whole (XLA on TensorFlow and JAX, torch.compile on PyTorch): the loss falls, alpha moves."""
    keras.utils.set_random_seed(3)
    model = _model()
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=True)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (np.maximum(x[:, :1], 0.0) + 0.5 * x[:, 1:2]).astype(np.float32)
    learnable = model.layers[3]
    before = float(np.mean((_numpy(model(x)) - y) ** 2))  # eager: only the training step is compiled
    alpha_before = _numpy(learnable.alpha).copy()
    losses = model.fit(x, y, epochs=4, batch_size=32, verbose=0).history["loss"]
    assert losses[-1] < 0.7 * before, (before, losses)
    assert np.abs(_numpy(learnable.alpha) - alpha_before).max() > 1e-3


def test_a_model_round_trips_through_keras_files(tmp_path, rng):
    model = _model()
    x = rng.normal(size=(4, 8)).astype(np.float32)
    expected = _numpy(model(x))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(_numpy(loaded(x)), expected)
    assert [type(layer).__name__ for layer in loaded.layers] == [type(layer).__name__ for layer in model.layers]


@pytest.mark.skipif(BACKEND == "tensorflow", reason="on TensorFlow, Keras itself imports TensorFlow")
def test_keras_gelu_imports_no_tensorflow():
    code = ("import sys, keras_gelu, keras_gelu.layers; "
            "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)[:5]")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KERAS_BACKEND": BACKEND},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(BACKEND != "jax", reason="one leg suffices, and the JAX one imports no TensorFlow")
def test_another_keras_backend_is_refused_naming_the_three():
    result = subprocess.run([sys.executable, "-c", "import keras_gelu"], env={**os.environ, "KERAS_BACKEND": "numpy"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert ("keras_gelu runs on Keras 3's TensorFlow, JAX and PyTorch backends. Set KERAS_BACKEND to one of them. "
            "Received: backend=numpy") in result.stderr
