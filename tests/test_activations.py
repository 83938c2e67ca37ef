"""The functional forms against float64 references: values, edges, gradients."""

import contextlib
import importlib
import logging
import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_gelu
import references
from keras_gelu import kernels

pytestmark = pytest.mark.legs("keras3", "tf218")

F32_EPS = float(np.finfo(np.float32).eps)

# Max abs error of each float64 formula vs exact GELU over the reals (the README
# table); the bound is the published value rounded up in its last digit.
DOCUMENTED_DISTANCE_FROM_EXACT = {"tanh": 4.74e-4, "sigmoid": 2.04e-2}

DENSE_GRID = np.linspace(-10.0, 10.0, 200_001, dtype=np.float32)


def _assert_within(actual, expected, rtol, atol):
    actual = np.asarray(actual, np.float64)
    excess = np.abs(actual - expected) - (atol + rtol * np.abs(expected))
    worst = int(np.argmax(excess))
    assert excess[worst] <= 0, (
        f"at x index {worst}: got {actual[worst]!r}, want {expected[worst]!r} "
        f"(rtol={rtol}, atol={atol})"
    )


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_float32_accuracy_on_dense_grid(function):
    actual = keras_gelu.gelu(DENSE_GRID, approximate=function).numpy()
    assert actual.dtype == np.float32
    _assert_within(actual, references.BY_FUNCTION[function](DENSE_GRID),
                   **references.FLOAT32_TOLERANCE[function])


def test_float64_exact_keeps_float64_precision():
    x = np.linspace(-8.0, 8.0, 4001)
    # XLA's float64 erfc is a rational fit good to ~1e-14 relative (measured
    # 1.2e-14 at x = -8), far beyond what float32 could give (1e-7).
    _assert_within(keras_gelu.gelu(x).numpy(), references.gelu_exact(x), rtol=3e-14, atol=1e-300)


def test_tanh_reference_identity_holds():
    x = np.linspace(-5.0, 5.0, 10_001)
    np.testing.assert_allclose(
        references.gelu_tanh(x), references.gelu_tanh_spelled_with_tanh(x), rtol=0, atol=1e-14
    )


def test_tanh_form_matches_tf_nn_gelu_within_float32_rounding():
    ours = keras_gelu.gelu(DENSE_GRID, approximate="tanh").numpy().astype(np.float64)
    theirs = tf.nn.gelu(DENSE_GRID, approximate=True).numpy().astype(np.float64)
    # Both round the same real function; tf.nn.gelu's 1 + tanh(u) cancels to
    # within ulp(1) * |x| / 2, so allow a few float32 eps scaled by max(|x|, 1).
    tolerance = 4 * F32_EPS * np.maximum(np.abs(DENSE_GRID), 1.0)
    assert np.all(np.abs(ours - theirs) <= tolerance)


def test_exact_form_matches_tf_nn_gelu():
    ours = keras_gelu.gelu(DENSE_GRID).numpy().astype(np.float64)
    theirs = tf.nn.gelu(DENSE_GRID, approximate=False).numpy().astype(np.float64)
    # Since TF 2.19 the same spelling, 0.5 x erfc(-x / sqrt 2), with XLA's and
    # Eigen's erfc as different rational fits, each within 1e-7 + 2e-7 |y| of
    # the truth. TF 2.18 spells 0.5 x (1 + erf(..)), which cancels to within
    # to within 2 ulp(1) |x| / 2 = 1.2e-7 |x| for negative x (erf is good to 2 ulp).
    tolerance = 2 * (1e-7 + 2e-7 * np.abs(theirs)) + 1.2e-7 * np.abs(DENSE_GRID)
    assert np.all(np.abs(ours - theirs) <= tolerance)


@pytest.mark.parametrize("function", ["tanh", "sigmoid"])
def test_approximation_distance_from_exact_is_as_documented(function):
    x = np.linspace(-12.0, 12.0, 240_001)
    distance = np.abs(references.BY_FUNCTION[function](x) - references.gelu_exact(x))
    assert distance.max() <= DOCUMENTED_DISTANCE_FROM_EXACT[function]
    # ...and the bound is tight: the documented number is not a loose overestimate.
    assert distance.max() >= 0.99 * DOCUMENTED_DISTANCE_FROM_EXACT[function]


def test_sigmoid_slope_is_not_the_reciprocal_of_sqrt_2_over_pi():
    # A folk claim; 1/sqrt(2/pi) = 1.2533, nowhere near the 1.702 the form uses.
    assert abs(1.0 / math.sqrt(2.0 / math.pi) - 1.702) > 0.4


@pytest.mark.parametrize(
    "approximate, function",
    [("exact", "exact"), ("none", "exact"), (False, "exact"), ("tanh", "tanh"), (True, "tanh"),
     ("sigmoid", "sigmoid")],
)
def test_approximate_accepts_strings_and_keras_booleans(approximate, function):
    x = np.linspace(-4.0, 4.0, 81, dtype=np.float32)
    _assert_within(
        keras_gelu.gelu(x, approximate=approximate).numpy(),
        references.BY_FUNCTION[function](x),
        **references.FLOAT32_TOLERANCE[function],
    )


def test_default_is_exact():
    x = np.float32([-2.0, -0.5, 0.5, 2.0])
    np.testing.assert_array_equal(keras_gelu.gelu(x).numpy(), keras_gelu.gelu(x, "exact").numpy())
    assert not np.allclose(keras_gelu.gelu(x).numpy(), keras_gelu.gelu(x, "tanh").numpy(), atol=1e-5)


@pytest.mark.parametrize("bad", ["Exact", "Tanh", "erf", None, 1, 0.5, "none "])
def test_bad_approximate_names_the_valid_values(bad):
    with pytest.raises(ValueError, match=r'"exact" \(or "none"\), "tanh", "sigmoid".*Received: approximate='):
        keras_gelu.gelu(np.float32([1.0]), approximate=bad)


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_fixed_form_activations_equal_gelu(function):
    activation = {"exact": keras_gelu.gelu_exact, "tanh": keras_gelu.gelu_tanh,
                  "sigmoid": keras_gelu.gelu_sigmoid}[function]
    x = np.linspace(-6.0, 6.0, 121, dtype=np.float32)
    np.testing.assert_array_equal(activation(x).numpy(), keras_gelu.gelu(x, function).numpy())
    assert activation == keras_gelu.GELUActivation(function)
    assert activation != keras_gelu.GELUActivation("sigmoid" if function != "sigmoid" else "exact")


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_same_result_eager_in_tf_function_and_under_xla(function):
    x = tf.constant(np.linspace(-9.0, 9.0, 1001, dtype=np.float32))
    eager = keras_gelu.gelu(x, function).numpy()
    graph = tf.function(lambda t: keras_gelu.gelu(t, function))(x).numpy()
    compiled = tf.function(lambda t: keras_gelu.gelu(t, function), jit_compile=True)(x).numpy()
    np.testing.assert_array_equal(eager, graph)
    # Inlined into a bigger XLA cluster the compiler may reassociate: ~1 ulp.
    np.testing.assert_allclose(eager, compiled, rtol=2 * F32_EPS, atol=1e-30)


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_kernels_traced_without_xla_are_the_same_ops_uncompiled(function):
    """xla_kernels.compile_with_xla(False), as the converter's worker traces them: the same ops, in a function
    XLA need not compile, and the same values within what TensorFlow's and XLA's kernels differ by."""
    from keras_gelu import xla_kernels

    x = tf.constant(np.linspace(-9.0, 9.0, 1001, dtype=np.float32))

    def traced():
        traced_function = tf.function(lambda t: keras_gelu.gelu(t, function))
        library = traced_function.get_concrete_function(tf.TensorSpec(None)).graph.as_graph_def().library.function
        ops = sorted(node.op for kernel in library for node in kernel.node_def)
        return ops, [kernel.attr["_XlaMustCompile"].b for kernel in library], traced_function(x).numpy()

    compiled_ops, compiled_flags, compiled = traced()
    xla_kernels.compile_with_xla(False)
    try:
        plain_ops, plain_flags, plain = traced()
    finally:
        xla_kernels.compile_with_xla(True)
    assert compiled_flags and all(compiled_flags) and not any(plain_flags)
    assert plain_ops == compiled_ops
    # TensorFlow's own kernels (Eigen's erfc, tanh, exp) against XLA's: up to 8e-6 relative in the far negative
    # tail, where GELU is below 1e-17 (measured: exact 2e-6, tanh 7.8e-6); the converter's parity tolerances are 1e-4
    np.testing.assert_allclose(plain, compiled, rtol=1e-5, atol=1e-30)
    assert traced()[1] == compiled_flags  # back to XLA


def test_integer_inputs_are_computed_in_float32():
    y = keras_gelu.gelu(tf.constant([-1, 0, 2]))
    assert y.dtype == tf.float32
    np.testing.assert_allclose(y.numpy(), references.gelu_exact([-1, 0, 2]), rtol=1e-6)


# --- Non-finite inputs and extreme values --------------------------------------

ALL_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]


def _value_and_gradient(x, function):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = keras_gelu.gelu(x, function)
    return y, tape.gradient(y, x)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_infinities_and_nan(function, dtype):
    x = tf.cast(tf.constant([-np.inf, np.inf, np.nan]), dtype)
    y, grad = _value_and_gradient(x, function)
    y = y.numpy().astype(np.float64)
    grad = grad.numpy().astype(np.float64)
    assert y[0] == 0.0  # tf.nn.gelu gives NaN here
    assert y[1] == np.inf
    assert np.isnan(y[2])
    assert grad[0] == 0.0
    assert grad[1] == 1.0  # tf.nn.gelu's gradient is NaN here
    assert np.isnan(grad[2])  # not a bound: the guards clip, and XLA before TF 2.19 lets min/max drop NaN


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_gradient_is_finite_at_extreme_finite_inputs(function, dtype):
    largest = float(dtype.max)
    candidates = [-largest, -1e30, -1e4, -1e3, 1e3, 1e4, 1e30, largest, 65504.0, -65504.0]
    representable = [v for v in candidates if abs(v) <= largest]
    x = tf.cast(tf.constant(representable, tf.float64), dtype)
    y, grad = _value_and_gradient(x, function)
    grad = grad.numpy().astype(np.float64)
    assert np.all(np.isfinite(grad)), dict(zip(representable, grad))
    # Far from 0 the derivative is 0 on the left and 1 on the right.
    np.testing.assert_array_equal(grad, np.where(np.array(representable) < 0, 0.0, 1.0))
    np.testing.assert_array_equal(
        y.numpy().astype(np.float64),
        np.where(np.array(representable) < 0, 0.0, x.numpy().astype(np.float64)),
    )


# --- Gradients -----------------------------------------------------------------


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_gradient_matches_numerical_gradient(function):
    x = tf.constant(np.linspace(-6.0, 6.0, 97))  # float64 for a precise numeric Jacobian
    # A central difference with step 1e-5 in float64 is exact to ~1e-10 here
    # (truncation h^2 |f'''| / 6 plus rounding 1e-16 / h).
    theoretical, numerical = tf.test.compute_gradient(
        lambda t: keras_gelu.gelu(t, function), [x], delta=1e-5
    )
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_float32_gradient_matches_float64_derivative(function):
    x = np.linspace(-10.0, 10.0, 20_001, dtype=np.float32)
    _, grad = _value_and_gradient(x, function)
    np.testing.assert_allclose(grad.numpy(), references.derivative(function, x), rtol=0,
                               atol=references.FLOAT32_DERIVATIVE_ATOL[function])


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_left_and_right_derivatives_at_zero_agree(function):
    step = 1e-6
    x = tf.constant([-step, 0.0, step], tf.float64)
    y = keras_gelu.gelu(x, function).numpy()
    left = (y[1] - y[0]) / step
    right = (y[2] - y[1]) / step
    assert abs(left - right) <= 1e-5
    _, grad = _value_and_gradient(tf.constant([-1e-35, 0.0, 1e-35], tf.float32), function)
    np.testing.assert_allclose(grad.numpy(), 0.5, rtol=0, atol=1e-7)
    assert abs(left - 0.5) <= 1e-5


# --- Properties ------------------------------------------------------------------

finite_floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@pytest.mark.parametrize("function", references.FUNCTIONS)
@given(x=finite_floats)
def test_odd_part_is_identity(function, x):
    # Every form is x g(x) with g(x) + g(-x) = 1, so f(x) - f(-x) = x.
    y = keras_gelu.gelu(tf.constant([x, -x], tf.float64), function).numpy()
    assert abs((y[0] - y[1]) - x) <= 1e-12 * max(1.0, abs(x))


@given(x=finite_floats)
def test_exact_minimum_and_bounds(x):
    y = float(keras_gelu.gelu(tf.constant(x, tf.float32)).numpy())
    assert y >= -0.16997  # the global minimum, GELU(-0.7518) = -0.169971
    assert y <= max(x, 0.0) + 1e-6  # below ReLU
    assert y >= min(x, 0.0) - 1e-6  # above the identity on the left


def test_exact_minimum_location_and_value():
    x = np.linspace(-1.5, 0.0, 150_001)
    y = keras_gelu.gelu(x).numpy()
    assert abs(x[np.argmin(y)] - (-0.751791)) < 1e-4
    assert abs(y.min() - (-0.169971)) < 1e-6


@pytest.mark.parametrize("function", references.FUNCTIONS)
@given(x=st.floats(min_value=-0.75, max_value=1e4, allow_nan=False))
def test_monotone_right_of_minimum(function, x):
    # Each form falls to a single minimum near -0.75 to -0.9 and rises after it.
    y = keras_gelu.gelu(tf.constant([x, x + 1e-3 + 1e-6 * abs(x)], tf.float64), function).numpy()
    if x >= -0.5:
        assert y[1] > y[0]


@pytest.mark.parametrize("function", references.FUNCTIONS)
@given(x=st.floats(min_value=8.0, max_value=1e30, allow_nan=False))
def test_asymptotes(function, x):
    y = keras_gelu.gelu(tf.constant([x, -x], tf.float64), function).numpy()
    # Right: the identity, left: zero; the sigmoid form's tail is the slowest
    # (x e^{-1.702 x} < 1e-5 beyond x = 8).
    assert abs(y[0] - x) <= 1e-5 * max(1.0, 1e-15 * x) + 1e-15 * x
    assert -1e-5 <= y[1] <= 0.0


class _RetracingWarnings(logging.Handler):
    """TensorFlow's retracing warnings, as a user sees them: records on tf.get_logger()."""

    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        if "retracing" in record.getMessage():
            self.messages.append(record.getMessage())


@contextlib.contextmanager
def _retracing_warnings():
    """The retracing warnings logged within the block, at TensorFlow's default level (keras-gelu-convert, run in
    this process by other tests, raises it to ERROR)."""
    handler, logger = _RetracingWarnings(), tf.get_logger()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


_CALLS = st.lists(st.tuples(st.sampled_from(["exact", "tanh", "sigmoid", "learnable"]),
                            st.sampled_from([tf.float32, tf.float16, tf.bfloat16, tf.float64]),
                            st.lists(st.integers(1, 5), min_size=1, max_size=3), st.booleans()),
                  min_size=1, max_size=8)


# Five mixes, each up to eight calls: a kernel that retraced per shape or dtype warns within one mix (TensorFlow
# warns where five of a function's last ten calls traced it); each mix traces and compiles every kernel afresh
# (ten mixes took 6-14 s).
@given(calls=_CALLS)
@settings(max_examples=5)
def test_no_retracing_warnings_whatever_mix_of_eager_calls(calls):
    """Eager calls in any order of forms, dtypes, shapes, with or without gradients, in this process.

    The kernels module is reloaded first, so its XLA functions trace afresh here (other tests have traced the
    originals) and the traces this test makes are the ones TensorFlow's detector would count.
    """
    fresh = importlib.reload(kernels)
    forms = {"exact": fresh.exact, "tanh": fresh.tanh, "sigmoid": fresh.sigmoid,
             "learnable": lambda x: fresh.learnable(x, tf.constant(1.702), tf.constant(0.25))}
    with _retracing_warnings() as messages:
        for form, dtype, shape, with_gradient in calls:
            x = tf.cast(tf.random.stateless_normal(shape, seed=[len(shape), shape[0]]), dtype)
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = forms[form](x)
            if with_gradient:
                assert tape.gradient(y, x).dtype == dtype
    assert messages == []


def test_the_retracing_check_sees_a_warning_when_there_is_one():
    """The handler above catches TensorFlow's warning: one Python function retraced on new shapes."""
    with _retracing_warnings() as messages:
        retraced = tf.function(lambda x: x * 2.0)
        for size in range(1, 9):
            retraced(tf.ones([size]))
    assert messages and "triggered tf.function retracing" in messages[0]
