"""What a recognised GELU (or a bare erf) becomes, as plain TensorFlow functions.

Each function takes the GELU's input x and returns the replacement tensor; the
rewrite traces it and splices its ops into the graph. Builtin spellings use
only ops every TFLite runtime has (LOGISTIC, MUL, ADD, SUB, DIV, EXP, ABS,
LESS, SELECT_V2, MAXIMUM). Native spellings are tf.nn.gelu's own, which the
TFLite converter fuses into its GELU op.

Every float spelling first clamps -inf to the lowest finite value, so
GELU(-inf) is 0 in the .tflite too (a MAXIMUM op; it changes no finite value).

For int8 models, the spellings take `mark`, applied to every intermediate
tensor that needs an int8 range of its own and, with logistic=True, to
sigmoid outputs, whose int8 grid TFLite fixes (not to the result).
`int8.py` passes a function that records the ranges and then one that
fake-quantizes to them; int8 spellings skip the clamp, as int8 tensors are
finite.
"""

import tensorflow as tf

from . import patterns
from keras_gelu import formulas
from keras_gelu.formulas import constant_like
from keras_gelu.formulas import without_minus_inf


def erfc_of_nonnegative(z):
    """erfc(z) for z >= 0 from builtin ops (A&S 7.1.26): relative accuracy, no cancellation."""
    t = constant_like(1.0, z) / (constant_like(1.0, z) + constant_like(patterns.AS_P, z) * z)
    polynomial = constant_like(patterns.AS_A[-1], z)
    for coefficient in reversed(patterns.AS_A[:-1]):
        polynomial = constant_like(coefficient, z) + t * polynomial
    return t * polynomial * tf.exp(-(z * z))


def erf(t):
    """erf from builtin ops; |error| <= 1.5e-7 plus float32 rounding."""
    tail = erfc_of_nonnegative(tf.abs(t))
    one = constant_like(1.0, t)
    return tf.where(t < constant_like(0.0, t), tail - one, one - tail)


def erfc(t):
    """erfc from builtin ops, accurate in relative terms for t >= 0."""
    tail = erfc_of_nonnegative(tf.abs(t))
    return tf.where(t < constant_like(0.0, t), constant_like(2.0, t) - tail, tail)


def unmarked(tensor, logistic=False):
    """The `mark` that leaves every tensor as it is (an int8 spelling whose ranges come from calibration)."""
    return tensor


def marking(quantizers):
    """A `mark` applying the i-th of `quantizers` to the i-th intermediate and TFLite's
    fixed LOGISTIC grid to sigmoid outputs: the spelling as the int8 model computes it."""
    remaining = iter(quantizers)

    def mark(tensor, logistic=False):
        return formulas.on_logistic_int8_grid(tensor) if logistic else next(remaining)(tensor)

    return mark


def _scaled(x, alpha, mark):
    return x if alpha == 1.0 else mark(x * constant_like(alpha, x))


def _prepared(x, mark):
    """(x, mark) to compute with: a float spelling (mark None) clamps -inf and marks nothing."""
    if mark is None:
        return without_minus_inf(x), unmarked
    return x, mark


def exact_from_builtins(x, alpha):
    """x Phi(alpha x) with Phi from the erfc above: within 2e-6 of float64 GELU."""
    x = without_minus_inf(x)
    u = _scaled(x, alpha, unmarked)
    half_tail = constant_like(0.5, x) * erfc_of_nonnegative(tf.abs(u) * constant_like(formulas.SQRT_HALF, x))
    cdf = tf.where(u < constant_like(0.0, x), half_tail, constant_like(1.0, x) - half_tail)
    return x * cdf


def tanh_from_builtins(x, alpha, mark=None):
    """x Phi_tanh(alpha x) as x sigmoid(u (1.5957691 + 0.0713548 u^2)), u = alpha x: the same function.

    Horner's form of 1.5957691 (u + 0.044715 u^3) saves two ops (elementwise
    passes over memory) against the textbook nesting.
    """
    x, mark = _prepared(x, mark)
    u = _scaled(x, alpha, mark)
    linear = constant_like(formulas.SIGMOID_OF_TANH_SCALE, x)
    cubic = constant_like(formulas.SIGMOID_OF_TANH_SCALE * formulas.TANH_CUBIC, x)
    return x * mark(tf.math.sigmoid(mark(u * mark(linear + mark(cubic * mark(u * u))))), logistic=True)


def sigmoid_from_builtins(x, alpha, mark=None):
    """x sigmoid(1.702 alpha x): the sigmoid approximation of x Phi(alpha x)."""
    x, mark = _prepared(x, mark)
    return x * mark(tf.math.sigmoid(mark(constant_like(formulas.SIGMOID_SLOPE * alpha, x) * x)), logistic=True)


def _native(approximate):
    def spelling(x, alpha, mark=None):
        x, mark = _prepared(x, mark)
        y = tf.nn.gelu(_scaled(x, alpha, mark), approximate=approximate)
        return y if alpha == 1.0 else mark(y) * constant_like(1.0 / alpha, x)

    return spelling


BUILTIN_FORMS = {
    "sigmoid": sigmoid_from_builtins,
    "tanh": tanh_from_builtins,
    "erf": exact_from_builtins,
}


def replacement(function, mode, form, int8=False):
    """(spelling function, description) for a GELU computing `function`, or None to keep it.

    The requested --form only decides how *exact* GELU is approximated in
    builtin mode; a tanh-form GELU keeps its function in every mode, and the
    sigmoid form is already made of builtin ops, so it is left alone, except
    in int8, where its intermediate needs a range.

    In int8, the erf form is spelled as the tanh form: its erf polynomial
    divides, and TFLite's DIV has no int8 kernel, while the tanh form is
    within 4.7e-4 of exact GELU, far below an int8 step.
    """
    if function == "sigmoid":
        return (sigmoid_from_builtins, "x*sigmoid(1.702x) from LOGISTIC/MUL") if int8 else None
    if mode == "native":
        return _native(function == "tanh"), "GELU op" + (" (approximate)" if function == "tanh" else "")
    if function == "tanh":
        return tanh_from_builtins, "tanh form from LOGISTIC/MUL/ADD"
    descriptions = {
        "sigmoid": "x*sigmoid(1.702x) from LOGISTIC/MUL",
        "tanh": "tanh form from LOGISTIC/MUL/ADD",
        "erf": "exact, erf polynomial from builtins",
    }
    if int8 and form == "erf":
        return tanh_from_builtins, "tanh form from LOGISTIC/MUL/ADD (the erf form's int8 spelling)"
    return BUILTIN_FORMS[form], descriptions[form]
