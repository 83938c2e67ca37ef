"""Independent float64 references, written from the formulas, not from keras_gelu.

Exact GELU uses Python's math.erfc (correctly rounded to ~1 ulp in float64).
The tanh form is evaluated through the identity 0.5 (1 + tanh(u)) = 1/(1 + exp(-2u)),
which test_references_agree checks against the tanh spelling itself; in float64 the
tanh spelling loses all relative accuracy below x ~ -6 (1 + tanh cancels), the
identity does not.
"""

import math

import numpy as np

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TANH_CUBIC = 0.044715
SIGMOID_SLOPE = 1.702


def _map(function, x):
    x = np.asarray(x, dtype=np.float64)
    return np.vectorize(function, otypes=[np.float64])(x)


def _with_limits(finite_function):
    """GELU's values at NaN and +-inf around a function of finite x."""

    def scalar(x):
        if math.isnan(x):
            return math.nan
        if math.isinf(x):
            return 0.0 if x < 0 else math.inf
        return finite_function(x)

    return scalar


@_with_limits
def _exact_scalar(x):
    return 0.5 * x * math.erfc(-x / math.sqrt(2.0))


def _gated_scalar(x, gate_argument):
    def finite(v):
        z = gate_argument(v)
        if z < -700.0:  # exp would overflow; the gate is below 1e-304
            return v * math.exp(z)
        return v / (1.0 + math.exp(-z))

    return _with_limits(finite)(x)


def gelu_exact(x):
    """x * Phi(x) in float64."""
    return _map(_exact_scalar, x)


def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))) in float64."""
    return _map(
        lambda v: _gated_scalar(v, lambda t: 2.0 * SQRT_2_OVER_PI * (t + TANH_CUBIC * t**3)), x
    )


def gelu_tanh_spelled_with_tanh(x):
    """The textbook spelling, for checking the identity above where it is accurate."""
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + TANH_CUBIC * x**3)))


def gelu_sigmoid(x):
    """x * sigmoid(1.702 x) in float64."""
    return _map(lambda v: _gated_scalar(v, lambda t: SIGMOID_SLOPE * t), x)


def learnable_gelu(x, alpha, beta):
    """x * sigmoid(alpha x + beta) in float64, broadcasting alpha and beta."""
    x, alpha, beta = np.broadcast_arrays(
        np.asarray(x, np.float64), np.asarray(alpha, np.float64), np.asarray(beta, np.float64)
    )
    return np.vectorize(
        lambda v, a, b: _gated_scalar(v, lambda t: a * t + b), otypes=[np.float64]
    )(x, alpha, beta)


BY_FUNCTION = {"exact": gelu_exact, "tanh": gelu_tanh, "sigmoid": gelu_sigmoid}
FUNCTIONS = tuple(BY_FUNCTION)

# Float32 tolerances against each form's own float64 formula, per form:
# - exact: the bound; erfc is relatively accurate, so only rounding remains.
# - tanh: float32 rounding of the cubic argument z is amplified by the gate's
#   slope (|x g'(x) z| reaches ~10 near x = 4.7); measured worst 5.2e-7 abs there.
# - sigmoid: one sigmoid and two products, measured worst 7.4e-7 at x = 8.6 (~2 ulp).
FLOAT32_TOLERANCE = {
    "exact": dict(rtol=2e-7, atol=1e-7),
    "tanh": dict(rtol=2e-6, atol=1e-7),
    "sigmoid": dict(rtol=5e-7, atol=1e-7),
}

def derivative(function, x, step=1e-4):
    """d/dx of a float64 reference (`BY_FUNCTION[function]`) by central differences: within
    step^2 max|f^(3)| / 6 + 1e-16 / step, under 1e-8 for every form."""
    x = np.asarray(x, np.float64)
    reference = BY_FUNCTION[function]
    return (reference(x + step) - reference(x - step)) / (2.0 * step)


# Float32 derivatives against `derivative`, absolute, per form:
# - exact: Phi(x) and x phi(x), each rounded (measured worst 1.2e-7, and 1.7e-7 from the gate y / x before).
# - tanh, sigmoid: g (1 - g) for a gate g near 1 holds 1 - g only to float32's ulp(1), which x times the
#   argument's slope magnifies: measured worst 2.0e-6 near x = 5 (tanh), 9.8e-7 near x = 9.8 (sigmoid).
FLOAT32_DERIVATIVE_ATOL = {"exact": 3e-7, "tanh": 3e-6, "sigmoid": 1.5e-6}


def ulp_distance(a, b):
    """Distance in representable steps between equal-dtype float arrays (NaN == NaN is 0)."""
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    int_type = {2: np.int16, 4: np.int32, 8: np.int64}[a.dtype.itemsize]

    def ordered(v):
        bits = v.view(int_type).astype(np.int64)
        # Negative floats sort backwards as integers; fold them so order matches value.
        return np.where(bits < 0, np.iinfo(int_type).min - bits, bits)

    distance = np.abs(ordered(a) - ordered(b))
    both_nan = np.isnan(a.astype(np.float32)) & np.isnan(b.astype(np.float32))
    return np.where(both_nan, 0, distance)


def fake_quant(x, low, high, bits=8):
    """TensorFlow's FakeQuantWithMinMaxVars (what TFLite's int8 QUANTIZE then DEQUANTIZE compute) in float64,
    from its documented algorithm: the range [low, high] nudged so that 0 is on the grid of 2^bits - 1 steps,
    x clamped to it and rounded to the nearest step (halves up)."""
    steps = 2**bits - 1
    scale = (high - low) / steps
    zero_point = min(max(-low / scale, 0.0), float(steps))
    zero_point = math.floor(zero_point + 0.5)
    nudged_low, nudged_high = -zero_point * scale, (steps - zero_point) * scale
    clamped = np.clip(np.asarray(x, np.float64), nudged_low, nudged_high)
    return np.floor((clamped - nudged_low) / scale + 0.5) * scale + nudged_low, scale


def cosine(actual, expected):
    """The cosine of two arrays' values, flattened, in float64: how a test judges a quantized model's outputs
    against the float model's."""
    actual, expected = (np.asarray(array, np.float64).ravel() for array in (actual, expected))
    return float(actual @ expected / (np.linalg.norm(actual) * np.linalg.norm(expected)))
