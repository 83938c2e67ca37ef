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
finite input and turns the NaN of -inf * 0 into -0. The derivative is
computed from x alone, so the backward pass reads two tensors (the incoming
gradient and x), as ReLU's does; it multiplies x, held to +-1000, only into
factors that have already underflowed to 0 wherever x is that large.

The exact derivative needs Phi(x) again. Compiled (XLA, torch.compile), in
float32, it takes it from a cheap normal tail, Q(t) = Phi(-t) =
exp(-t^2/2) R(t) with R a polynomial (`NORMAL_TAIL_POLYNOMIAL`), whose
exponential is the density's too: one exp, no division, against XLA's erfc
with one exp and two divisions besides. Its error is within the float32 GELU
bound (2e-7 |y| + 1e-7 as the gate of x Phi(x)), so compiled forward passes on
JAX and PyTorch use it too (under torch.compile, 1.5 against 5.2 ms for erfc
on 2048 x 2048); TensorFlow's keeps erfc, the spelling converters recognise.
Float64, and each op run by itself, keep erfc.
"""

import math

from keras_gelu import array_ops

SQRT_HALF = 1.0 / math.sqrt(2.0)  # 0.70710677 in float32, the constant tf.nn.gelu uses
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)  # phi(0), the normal density at 0
TANH_SCALE = math.sqrt(2.0 / math.pi)  # 0.7978846 in float32
TANH_CUBIC = 0.044715
SIGMOID_OF_TANH_SCALE = 2.0 * TANH_SCALE  # 1.5957691: 0.5(1+tanh(u)) == sigmoid(2u)
SIGMOID_SLOPE = 1.702  # Hendrycks & Gimpel's fit; it is NOT 1/sqrt(2/pi) (= 1.2533)

# Beyond this |x| each fixed form's gate is exactly 0 or 1 and its slope exactly 0, in float64 too (exact:
# exp(-x^2/2) underflows past |x| = 38.6; the sigmoid form's g (1 - g) past 438; the tanh form's past 22). The
# derivatives multiply x, held here, into those slopes: +-inf and huge x meet a 0 and give 0, not NaN or inf * 0.
_SLOPE_VANISHES_BEYOND = 1e3
# XNNPACK's LOGISTIC, which runs a .tflite's sigmoids on LiteRT's CPU, returns NaN for finite inputs
# beyond about +-4.3e26 (tensorflow/tensorflow#119354), so the learnable gate takes x clamped to +-1e20:
# for |alpha| >= 1e-15 the gate is exactly 0 or 1 there already, in float64 too.
LEARNABLE_GATE_X_BOUND = 1e20
# The normal tail Q(t) = exp(-t^2/2) R(min(t, NORMAL_TAIL_T_MAX)) in float32: R(t) = 0.5 erfcx(t/sqrt 2) as a
# polynomial of degree 12 in u = 2t/NORMAL_TAIL_T_MAX - 1, constant first, minimax-fitted to Phi's error in the
# derivative (3e-8) and in x Phi(x) (the float32 GELU bound), whichever is smaller: 0.14 of that before float32
# rounding (`python benchmarks/fit_normal_tail.py` refits it). Past t = 5, R(5) keeps Q within 2e-8 of its value.
NORMAL_TAIL_T_MAX = 5.0
NORMAL_TAIL_POLYNOMIAL = (0.14133136000182908, -0.11403323549590187, 0.0853072949631167, -0.0599108418299157,
                          0.03949459124253904, -0.025118556762917923, 0.01698511087525875, -0.0066217894684883925,
                          0.002282048413625489, -0.009445704118614826, -0.00013276833449421175, 0.00397301674395564,
                          0.003575247659533651)


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
    """x * Phi(x), spelled 0.5 * x * erfc(-x * 0.70710677) like tf.nn.gelu where converters read it.

    That spelling keeps full relative accuracy for negative x (erfc, unlike
    1 + erf, does not cancel) and is the one TFLite's converter fuses into its
    builtin GELU op. Compiled on JAX and PyTorch, Phi is the normal tail's.
    """
    x = without_minus_inf(x)
    xp = array_ops.of(x)
    if _normal_tail_serves(x, in_forward_pass=True):
        return x * _normal_cdf_from_tail(x, xp.exp(constant_like(-0.5, x) * x * x))
    return constant_like(0.5, x) * x * xp.erfc(-x * constant_like(SQRT_HALF, x))


def _tanh_gate(x):
    """The tanh form's gate, sigmoid(1.5957691 (x + 0.044715 x^3))."""
    inner = x + constant_like(TANH_CUBIC, x) * (x * x * x)
    return array_ops.of(x).sigmoid(constant_like(SIGMOID_OF_TANH_SCALE, x) * inner)


def tanh_forward(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as x * sigmoid(2u)."""
    x = without_minus_inf(x)
    return x * _tanh_gate(x)


def sigmoid_forward(x):
    """x * sigmoid(1.702 x)."""
    x = without_minus_inf(x)
    return x * array_ops.of(x).sigmoid(constant_like(SIGMOID_SLOPE, x) * x)


def _normal_tail_serves(x, in_forward_pass=False):
    """Whether Phi(x) comes from the normal tail rather than erfc: below float64, compiled into one loop (where its
    dozen cheap operations cost less than erfc; op by op, each is a pass over memory), and not in a forward pass
    whose spelling converters read."""
    xp = array_ops.of(x)
    if xp.is_float64(x) or not xp.fuses(x):
        return False
    return not (in_forward_pass and xp.converters_read_the_spelling)


def _normal_cdf_from_tail(x, exponential):
    """Phi(x) from the normal tail, given exp(-x^2/2) (the density's exponential, shared)."""
    xp = array_ops.of(x)
    t_max = constant_like(NORMAL_TAIL_T_MAX, x)
    u = xp.minimum(xp.abs(x), t_max) * constant_like(2.0 / NORMAL_TAIL_T_MAX, x) - constant_like(1.0, x)
    ratio = constant_like(NORMAL_TAIL_POLYNOMIAL[-1], x)
    for coefficient in reversed(NORMAL_TAIL_POLYNOMIAL[:-1]):
        ratio = ratio * u + constant_like(coefficient, x)
    tail = exponential * ratio
    return xp.where(x < constant_like(0.0, x), tail, constant_like(1.0, x) - tail)


def _sigmoid_slope(gate):
    """g (1 - g): the derivative of a sigmoid from its output."""
    return gate * (constant_like(1.0, gate) - gate)


def _held(x):
    """x held to +-_SLOPE_VANISHES_BEYOND by min and max.

    Not the NaN-keeping `clip`: its selects cost XLA's backward fusion as much
    as a pass over memory (4096 x 4096 float32 on an AMD EPYC, the sigmoid
    form's forward and backward: 1.15x ReLU's time with them, 1.01x without).
    No derivative needs them: a NaN reaches each through its gate, which is
    computed from x itself, whatever min and max make of it.
    """
    xp = array_ops.of(x)
    bound = constant_like(_SLOPE_VANISHES_BEYOND, x)
    return xp.minimum(xp.maximum(x, -bound), bound)


def exact_derivative(x):
    """d/dx x Phi(x) = Phi(x) + x phi(x)."""
    xp = array_ops.of(x)
    exponential = xp.exp(constant_like(-0.5, x) * x * x)
    if _normal_tail_serves(x):
        gate = _normal_cdf_from_tail(x, exponential)
    else:
        gate = constant_like(0.5, x) * xp.erfc(-x * constant_like(SQRT_HALF, x))
    return gate + _held(x) * (constant_like(INV_SQRT_2PI, x) * exponential)


def tanh_derivative(x):
    """d/dx x g(x) = g + x g (1 - g) 1.5957691 (1 + 3 * 0.044715 x^2), g = sigmoid(1.5957691 (x + 0.044715 x^3))."""
    gate = _tanh_gate(x)
    x_held = _held(x)
    inner_slope = constant_like(SIGMOID_OF_TANH_SCALE, x) * (
        constant_like(1.0, x) + constant_like(3.0 * TANH_CUBIC, x) * x_held * x_held)
    return gate + x_held * (_sigmoid_slope(gate) * inner_slope)


def sigmoid_derivative(x):
    """d/dx x sigmoid(a x) = g + x a g (1 - g)."""
    gate = array_ops.of(x).sigmoid(constant_like(SIGMOID_SLOPE, x) * x)
    return gate + _held(x) * (constant_like(SIGMOID_SLOPE, x) * _sigmoid_slope(gate))


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
    by_beta = x_finite * _sigmoid_slope(gate)
    return gate + alpha * by_beta, x_finite * by_beta, by_beta
