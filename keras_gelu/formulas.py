"""GELU and its approximations as pure math, on TensorFlow, JAX or PyTorch tensors (`array_ops`).

Every form here is a *gated* identity, y = x * g(x), where the gate g rises
from 0 to 1:

=========  ====================================  ==========================
form       gate g(x)                             derivative of the gate
=========  ====================================  ==========================
exact      Phi(x) = 0.5 * erfc(-x / sqrt(2))     phi(x) = exp(-x^2/2)/sqrt(2 pi)
tanh       sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3))  g (1 - g) * that scale * (1 + 3*0.044715 x^2)
sigmoid    sigmoid(1.702 x)                      g (1 - g) * 1.702
=========  ====================================  ==========================

The tanh form is usually written 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)));
since 0.5 (1 + tanh(u)) == sigmoid(2u) exactly, we write it with a sigmoid,
which has no cancellation for negative x and lowers to TFLite's LOGISTIC, an op
every runtime has.

The functions take and return tensors of the *compute* dtype (float32 or
float64); the kernels decide which dtype that is. They are written so that

* -inf maps to 0, +inf to +inf and NaN to NaN (tf.nn.gelu gives NaN at -inf);
* the derivative is finite for every finite input and is 0 at -inf and 1 at
  +inf (tf.nn.gelu's is NaN at +inf).

How: the forward pass clamps -inf to the lowest finite value, which changes no
finite input and turns the NaN of -inf * 0 into -0. The derivative recovers the
gate from the forward output (g = y / x, saving an erfc or exp) and multiplies
x only into factors that have already underflowed to 0 wherever x is huge.
"""

import math

from keras_gelu import array_ops

SQRT_HALF = 1.0 / math.sqrt(2.0)  # 0.70710677 in float32, the constant tf.nn.gelu uses
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # phi(0), the normal density at 0
TANH_SCALE = math.sqrt(2.0 / math.pi)  # 0.7978846 in float32
TANH_CUBIC = 0.044715
SIGMOID_OF_TANH_SCALE = 2.0 * TANH_SCALE  # 1.5957691: 0.5(1+tanh(u)) == sigmoid(2u)
SIGMOID_SLOPE = 1.702  # Hendrycks & Gimpel's fit; it is NOT 1/sqrt(2/pi) (= 1.2533)

# Below this magnitude y / x loses the gate to subnormal rounding; the gate is
# 0.5 + O(1e-30) there, so we use 0.5.
_GATE_AT_ZERO_BELOW = 1e-30
# Beyond this |x| the tanh form's gate slope g(1 - g) is exactly 0 (its
# argument exceeds 1e17), so the polynomial factor may be held here instead
# of overflowing to inf and meeting that 0.
_TANH_POLY_CLIP = 1e6
# XNNPACK's LOGISTIC, which runs a .tflite's sigmoids on LiteRT's CPU, returns NaN for finite inputs
# beyond about +-4.3e26 (tensorflow/tensorflow#119354), so the learnable gate takes x clamped to +-1e20:
# for |alpha| >= 1e-15 the gate is exactly 0 or 1 there already, in float64 too.
LEARNABLE_GATE_X_BOUND = 1e20


def constant_like(value, like):
    """A Python number as a constant of `like`'s dtype."""
    return array_ops.of(like).constant(value, like)


def without_minus_inf(x):
    """x with -inf replaced by the lowest finite value: equal to x for finite x."""
    xp = array_ops.of(x)
    return xp.maximum(x, xp.lowest(x))


def _finite(x):
    """x with +-inf replaced by the largest finite values; NaN stays NaN."""
    xp = array_ops.of(x)
    return xp.clip(x, xp.lowest(x), xp.highest(x))


def _clamped(x, bound):
    """x clamped to [-bound, bound]; NaN stays NaN."""
    return array_ops.of(x).clip(x, constant_like(-bound, x), constant_like(bound, x))


def exact_forward(x):
    """x * Phi(x), spelled 0.5 * x * erfc(-x * 0.70710677) like tf.nn.gelu.

    That spelling keeps full relative accuracy for negative x (erfc, unlike
    1 + erf, does not cancel) and is the one TFLite's converter fuses into its
    builtin GELU op.
    """
    x = without_minus_inf(x)
    return constant_like(0.5, x) * x * array_ops.of(x).erfc(-x * constant_like(SQRT_HALF, x))


def tanh_forward(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as x * sigmoid(2u)."""
    x = without_minus_inf(x)
    inner = x + constant_like(TANH_CUBIC, x) * (x * x * x)
    return x * array_ops.of(x).sigmoid(constant_like(SIGMOID_OF_TANH_SCALE, x) * inner)


def sigmoid_forward(x):
    """x * sigmoid(1.702 x)."""
    x = without_minus_inf(x)
    return x * array_ops.of(x).sigmoid(constant_like(SIGMOID_SLOPE, x) * x)


def _gate_from_output(x, y):
    """g(x) = y / x, with the limits at 0 and +inf of the fixed forms.

    Every fixed form's gate lies in [0, 1], and y / x does too wherever both are finite (each form's |y| rounds to
    at most |x|); at +inf it is inf / the largest float, which the clip takes to 1.
    """
    xp = array_ops.of(x)
    gate = xp.clip(y / _finite(x), constant_like(0.0, x), constant_like(1.0, x))
    return xp.where(xp.abs(x) < constant_like(_GATE_AT_ZERO_BELOW, x), xp.full_like(x, 0.5), gate)


def exact_derivative(x, y):
    """d/dx x Phi(x) = Phi(x) + x phi(x)."""
    x_finite = _finite(x)
    density = constant_like(INV_SQRT_2PI, x) * array_ops.of(x).exp(constant_like(-0.5, x) * x_finite * x_finite)
    return _gate_from_output(x, y) + x_finite * density


def tanh_derivative(x, y):
    """d/dx x g(x) = g + x g (1 - g) 1.5957691 (1 + 3 * 0.044715 x^2)."""
    gate = _gate_from_output(x, y)
    x_poly = array_ops.of(x).clip(x, constant_like(-_TANH_POLY_CLIP, x), constant_like(_TANH_POLY_CLIP, x))
    inner_slope = constant_like(SIGMOID_OF_TANH_SCALE, x) * (
        constant_like(1.0, x) + constant_like(3.0 * TANH_CUBIC, x) * x_poly * x_poly
    )
    return gate + _finite(x) * ((gate * (constant_like(1.0, x) - gate)) * inner_slope)


def sigmoid_derivative(x, y):
    """d/dx x sigmoid(a x) = g + x a g (1 - g)."""
    gate = _gate_from_output(x, y)
    return gate + _finite(x) * (constant_like(SIGMOID_SLOPE, x) * (gate * (constant_like(1.0, x) - gate)))


def learnable_forward(x, alpha, beta):
    """x * sigmoid(alpha x + beta), for any real alpha and beta.

    The gate is computed from finite x; the product is taken as 0 wherever the
    gate is exactly 0, which is the limit of x * sigmoid(alpha x + beta) as the
    exponential decay beats the linear growth (x -> -inf with alpha > 0, or
    x -> +inf with alpha < 0).
    """
    xp = array_ops.of(x)
    gate = xp.sigmoid(alpha * _clamped(x, LEARNABLE_GATE_X_BOUND) + beta)
    return xp.where(xp.equal(gate, constant_like(0.0, x)), xp.zeros_like(x), x * gate)


def learnable_partials(x, alpha, beta):
    """Partial derivatives of x sigmoid(alpha x + beta) by x, alpha and beta.

    Returned at the full broadcast shape; the caller sums them down to the
    parameters' shapes.
    """
    x_finite = _finite(x)
    gate = array_ops.of(x).sigmoid(alpha * x_finite + beta)
    gate_slope = gate * (constant_like(1.0, x) - gate)
    by_beta = x_finite * gate_slope
    return gate + alpha * by_beta, x_finite * by_beta, by_beta
