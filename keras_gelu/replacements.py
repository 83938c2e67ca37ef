"""What each GELU becomes in a .tflite: the replacements, the table that picks one, and their int8 intermediates.

The converter splices these into a model's graph; quantization-aware training
computes the same functions with fake quantization between their ops. Both
read the table below, so QAT trains against exactly the ops a conversion
produces.

Every replacement is `build(x, alpha, mark=None)`, returning x * Phi(alpha x)
(or its tanh or sigmoid twin) from the ops its description names. Float
replacements (mark None) guard the edges: GELU(-inf) is 0 in the .tflite too,
and no LOGISTIC sees an input XNNPACK turns into NaN (see GATE_INPUT_BOUND).
An int8 replacement gets a `mark`, applied to every intermediate tensor that
needs an int8 range of its own and, with logistic=True, to sigmoid outputs,
whose int8 grid TFLite fixes; it skips the clamp, as int8 tensors are finite.

Builtin GELU replacements use only LOGISTIC, MUL, ADD, MINIMUM and MAXIMUM,
which LiteRT's CPU runtime, TFLite Micro and NNAPI all have; a bare Erf or
Erfc (not part of a GELU) also takes SUB, DIV, EXP, ABS, LESS and SELECT_V2.
Narrower runtimes are the business of `keras-gelu-convert --target`. The
GELU-op replacements are tf.nn.gelu's own spelling, which the TFLite
converter fuses into its GELU op.
"""

import dataclasses
import functools
import math

import numpy as np

from keras_gelu import array_ops
from keras_gelu import formulas
from keras_gelu import vocabulary
from keras_gelu.formulas import constant_like
from keras_gelu.formulas import without_minus_inf

# TFLite's int8 LOGISTIC always outputs on the grid k/256, k = 0..255 (scale
# 1/256, zero point -128), whatever range its consumer would like.
LOGISTIC_INT8_GRID_MAX = 255.0 / 256.0

# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t (a1 + t (a2 + ...)) exp(-z^2),
# t = 1 / (1 + p z), for z >= 0, |error| <= 1.5e-7. Used for a bare Erf or Erfc
# only: erfc(z) must stay accurate relative to its own tiny tail values, which
# the GELU gate's polynomial, accurate in absolute terms, is not.
AS_P = 0.3275911
AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


# Exact GELU from builtins: Phi(u) = sigmoid(u q(min(u^2, 30))), q of degree 5,
# minimax-fitted to logit(Phi) weighted by each point's effect on x Phi(x)
# (`python benchmarks/bench_forms.py --fit` refits it and prints the
# alternatives). Max abs error against float64 GELU: 6.5e-7 in float64 and
# 9.6e-7 evaluated in float32. The clamp holds the polynomial where it was
# fitted; past |u| = sqrt(30) the gate is within 2e-8 of 0 or 1 and only has to
# stay there. Degree 4 without the clamp (one op fewer) misses 2e-6 (3.3e-6);
# degree 6 without it is as cheap but its 3.9e-9 leading coefficient is 0 in
# float16, and --float16-weights stores every constant as float16: q would
# turn negative and GELU(10) become 0. Here the smallest, -1.1e-7, stays
# nonzero and inside [0, 30] the rounding moves the gate by under 1e-4.
EXACT_GATE_SQUARE_CLAMP = 30.0
EXACT_GATE_POLYNOMIAL = (1.5957464616171189, 0.0727290507858573, -0.00011452878152178668,
                         -9.481426470736393e-05, 5.625665990560874e-06, -1.1416382503555812e-07)


def on_logistic_int8_grid(gate):
    """A sigmoid's output rounded as TFLite's int8 LOGISTIC rounds it (straight-through gradient)."""
    return array_ops.of(gate).fake_quant(gate, 0.0, LOGISTIC_INT8_GRID_MAX)


def unmarked(tensor, logistic=False):
    """The `mark` that leaves every tensor as it is (an int8 replacement whose ranges come from calibration)."""
    return tensor


def marking(quantizers):
    """A `mark` applying the i-th of `quantizers` to the i-th intermediate and TFLite's
    fixed LOGISTIC grid to sigmoid outputs: the replacement as the int8 model computes it."""
    remaining = iter(quantizers)

    def mark(tensor, logistic=False):
        return on_logistic_int8_grid(tensor) if logistic else next(remaining)(tensor)

    return mark


def erfc_of_nonnegative(z):
    """erfc(z) for z >= 0 from builtin ops (A&S 7.1.26): relative accuracy, no cancellation."""
    t = constant_like(1.0, z) / (constant_like(1.0, z) + constant_like(AS_P, z) * z)
    polynomial = constant_like(AS_A[-1], z)
    for coefficient in reversed(AS_A[:-1]):
        polynomial = constant_like(coefficient, z) + t * polynomial
    return t * polynomial * array_ops.of(z).exp(-(z * z))


def erf(t):
    """erf from builtin ops, for a bare Erf op; |error| <= 1.5e-7 plus float32 rounding."""
    xp = array_ops.of(t)
    tail = erfc_of_nonnegative(xp.abs(t))
    one = constant_like(1.0, t)
    return xp.where(t < constant_like(0.0, t), tail - one, one - tail)


def erfc(t):
    """erfc from builtin ops, for a bare Erfc op; accurate in relative terms for t >= 0."""
    xp = array_ops.of(t)
    tail = erfc_of_nonnegative(xp.abs(t))
    return xp.where(t < constant_like(0.0, t), constant_like(2.0, t) - tail, tail)


# erf(t) is +-1 within 2.2e-5 past |t| = 3, far below an int8 step: the bare erf's int8 form bounds
# u = sqrt(2) t there, so that the int8 grid of the LOGISTIC's argument spans what matters. Unbounded, a Dense
# output of +-13 gave that argument a range of +-470 and a step of 3.7: erf's values from -0.95 to 0.95 one grid
# point. (u, not t: MINIMUM and MAXIMUM keep their input's grid, and t's is its other readers' too.)
ERF_SATURATES = 3.0


def _logistic_of_tanh_form(t, sign=1.0):
    """sigmoid(1.5957691 u (1 + 0.044715 u^2)), u = sign sqrt(2) t bounded at +-sqrt(2) ERF_SATURATES: the tanh
    form's Phi(u), within 1.8e-4.

    The sign rides on the constant: a NEG op would stay float in an int8 model.
    """
    xp, bound = array_ops.of(t), math.sqrt(2.0) * ERF_SATURATES
    u = t * constant_like(sign * math.sqrt(2.0), t)
    u = xp.minimum(xp.maximum(u, constant_like(-bound, t)), constant_like(bound, t))
    linear = constant_like(formulas.SIGMOID_OF_TANH_SCALE, t)
    cubic = constant_like(formulas.SIGMOID_OF_TANH_SCALE * formulas.TANH_CUBIC, t)
    return xp.sigmoid(u * (linear + cubic * (u * u)))


def erf_from_logistic(t):
    """erf(t) = 2 Phi(sqrt(2) t) - 1 from LOGISTIC/MUL/ADD/SUB, for int8: within 3.6e-4, far below a 1/128 step."""
    return constant_like(2.0, t) * _logistic_of_tanh_form(t) - constant_like(1.0, t)


def erfc_from_logistic(t):
    """erfc(t) = 2 (1 - Phi(sqrt(2) t)) = 2 Phi(-sqrt(2) t), for int8."""
    return constant_like(2.0, t) * _logistic_of_tanh_form(t, sign=-1.0)


# A bare Erf/Erfc op (not part of a GELU) -> its replacement; the int8 ones avoid DIV and EXP, as
# TANH_FORM_FOR_ERF does.
BARE_ERF = {"Erf": erf, "Erfc": erfc}
BARE_ERF_INT8 = {"Erf": erf_from_logistic, "Erfc": erfc_from_logistic}


# XNNPACK's LOGISTIC, LiteRT's default CPU kernel, returns NaN for finite
# inputs beyond about +-4.3e26 (measured; tensorflow/tensorflow#119354), so a
# float replacement bounds its gate's input u to [-64, 64], where every form's
# gate is exactly 0 or 1 in float32. The lower bound is the -inf guard too: the
# product takes x clamped at -64/alpha, where the gate is 0, so GELU(-inf) = -0.
GATE_INPUT_BOUND = 64.0


def gate_inputs(x, alpha, mark, scaled=True):
    """(x for the product, u = alpha x for the gate, mark): bounded as above when float (mark None).

    Unless `scaled`, u is left in units of x (bounded at +-64/alpha all the
    same), for a form that folds alpha into a constant of its own.
    """
    scale = alpha if scaled else 1.0
    if mark is not None:  # int8: finite tensors, each intermediate with its own range
        return x, x if scale == 1.0 else mark(x * constant_like(scale, x)), mark
    xp = array_ops.of(x)
    bound = GATE_INPUT_BOUND / alpha
    x = xp.maximum(x, constant_like(-bound, x))
    u = xp.minimum(x, constant_like(bound, x))
    return x, u if scale == 1.0 else u * constant_like(scale, x), unmarked


def gate_polynomial_form(coefficients, square_clamp=None):
    """build(x, alpha, mark) of x sigmoid(u q(u^2)), u = alpha x, q with `coefficients` (lowest first),
    u^2 clamped at `square_clamp` unless None: 2 ops per degree, 4 more, 1 for the clamp, 2 for the bounds."""

    def build(x, alpha, mark=None):
        xp = array_ops.of(x)
        x, u, mark = gate_inputs(x, alpha, mark)
        square = mark(u * u)
        if square_clamp is not None:
            square = mark(xp.minimum(square, constant_like(square_clamp, x)))
        polynomial = constant_like(coefficients[-1], x)
        for coefficient in reversed(coefficients[:-1]):
            polynomial = mark(constant_like(coefficient, x) + mark(square * polynomial))
        return x * mark(xp.sigmoid(mark(u * polynomial)), logistic=True)

    return build


exact_from_builtins = gate_polynomial_form(EXACT_GATE_POLYNOMIAL, EXACT_GATE_SQUARE_CLAMP)
"""x Phi(alpha x) within 1e-6 of float64 GELU in float32, from LOGISTIC, MUL, ADD and MINIMUM: 15 ops,
17 with the bounds (the A&S erfc took 24, with DIV and EXP); see EXACT_GATE_POLYNOMIAL for the fit."""


def tanh_from_builtins(x, alpha, mark=None):
    """x Phi_tanh(alpha x) as x sigmoid(u (1.5957691 + 0.0713548 u^2)), u = alpha x: the same function.

    Horner's form of 1.5957691 (u + 0.044715 u^3) saves two ops (elementwise
    passes over memory) against the textbook nesting: 6 ops, 8 with the bounds.
    """
    sigmoid = array_ops.of(x).sigmoid
    x, u, mark = gate_inputs(x, alpha, mark)
    linear = constant_like(formulas.SIGMOID_OF_TANH_SCALE, x)
    cubic = constant_like(formulas.SIGMOID_OF_TANH_SCALE * formulas.TANH_CUBIC, x)
    return x * mark(sigmoid(mark(u * mark(linear + mark(cubic * mark(u * u))))), logistic=True)


def sigmoid_from_builtins(x, alpha, mark=None):
    """x sigmoid(1.702 alpha x): the sigmoid approximation of x Phi(alpha x); 3 ops, 5 with the bounds."""
    sigmoid = array_ops.of(x).sigmoid
    x, u, mark = gate_inputs(x, alpha, mark, scaled=False)
    return x * mark(sigmoid(mark(constant_like(formulas.SIGMOID_SLOPE * alpha, x) * u)), logistic=True)


def _tanh_gelu_the_converter_fuses(x):
    """x (0.5 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), which the TFLite converter fuses into its GELU op.

    tf.nn.gelu(approximate=True) spells it 0.5 x (1 + tanh(...)), which fuses
    too, but its 0.5 x is also the first product of the exact GELU's
    spelling: where an exact and a tanh GELU read one tensor, the converter's
    common-subexpression pass merges the two products, and the exact one then
    no longer fuses (it needs its product to itself), so the conversion fails
    on an Erfc (TF 2.21, and the stock converter on tf.nn.gelu alike).
    """
    tf = array_ops.of(x).tf  # the converter's graphs only: spelled in TensorFlow's ops, for its fusion
    cube = tf.pow(x, constant_like(3.0, x))
    gate = tf.math.tanh(constant_like(formulas.TANH_SCALE, x) * (x + constant_like(formulas.TANH_CUBIC, x) * cube))
    return x * (constant_like(0.5, x) * (constant_like(1.0, x) + gate))


def _exact_gelu_the_converter_fuses(x):
    return array_ops.of(x).tf.nn.gelu(x, approximate=False)


def _gelu_op(approximate):
    spelled = _tanh_gelu_the_converter_fuses if approximate else _exact_gelu_the_converter_fuses

    def gelu_op(x, alpha, mark=None):
        x, mark = (without_minus_inf(x), unmarked) if mark is None else (x, mark)
        y = spelled(x if alpha == 1.0 else mark(x * constant_like(alpha, x)))
        return y if alpha == 1.0 else mark(y) * constant_like(1.0 / alpha, x)

    return gelu_op


@dataclasses.dataclass(frozen=True)
class Replacement:
    build: object  # build(x, alpha, mark=None) -> the replacement tensor
    description: str  # how the report says what a GELU became
    fused: bool = False  # the TFLite converter fuses its ops into one op, which keeps no constants


SIGMOID_FORM = Replacement(sigmoid_from_builtins, "x*sigmoid(1.702x) from LOGISTIC/MUL")
TANH_FORM = Replacement(tanh_from_builtins, "tanh form from LOGISTIC/MUL/ADD")
ERF_FORM = Replacement(exact_from_builtins, "exact, polynomial in LOGISTIC from builtins")
# In int8 each of the exact form's 13 intermediates would need a range and
# add a rounding, which the tanh form's 4 do not: it is within 4.7e-4 of exact
# GELU, far below an int8 step, and runs where LOGISTIC/MUL/ADD do.
TANH_FORM_FOR_ERF = Replacement(tanh_from_builtins, TANH_FORM.description + " (the erf form's int8 replacement)")
GELU_OP = Replacement(_gelu_op(approximate=False), "GELU op", fused=True)
GELU_OP_APPROXIMATE = Replacement(_gelu_op(approximate=True), "GELU op (approximate)", fused=True)

ANY = "any"

# (function, mode, exact_as, int8) -> Replacement. Exactly one row matches each
# combination of a rewriting mode; every GELU is rewritten, if only for the bounds.
RULES = (
    # function  mode       exact_as   int8   replacement
    ("sigmoid", ANY,       ANY,       ANY,   SIGMOID_FORM),  # LOGISTIC/MUL already, but bounded, and int8 ranged
    ("tanh",    "builtin", ANY,       ANY,   TANH_FORM),
    ("tanh",    "native",  ANY,       ANY,   GELU_OP_APPROXIMATE),
    ("exact",   "native",  ANY,       ANY,   GELU_OP),
    ("exact",   "builtin", "sigmoid", ANY,   SIGMOID_FORM),
    ("exact",   "builtin", "tanh",    ANY,   TANH_FORM),
    ("exact",   "builtin", "erf",     False, ERF_FORM),
    ("exact",   "builtin", "erf",     True,  TANH_FORM_FOR_ERF),
)  # fmt: skip


def replacement_for(function, mode, exact_as, int8):
    """The Replacement of a GELU computing `function` in a conversion, or None to keep it.

    `mode` is the Mode the conversion rewrites as (vocabulary.conversion_mode).
    """
    key = (function, mode.name, exact_as, int8)
    matches = [row[-1] for row in RULES if all(want in (ANY, have) for want, have in zip(row, key))]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} replacement rules match {key}")
    return matches[0]


def intermediate_ranges(build, alpha, grid):
    """[(min, max)] of each intermediate `build` marks, evaluated eagerly on `grid`, in marking order.

    `grid` is an eager tensor or a NumPy array, evaluated in its own framework's ops. Sigmoid outputs are left
    out: TFLite fixes their grid.
    """
    ranges = []

    def record(tensor, logistic=False):
        if not logistic:
            values = np.asarray(tensor, np.float64)
            low, high = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
            ranges.append((low, high if high > low else low + 1e-6))
        return tensor

    build(grid, alpha, mark=record)
    return ranges


def int8_replacement(function, mode_name, exact_as):
    """The Replacement an int8 conversion in mode `mode_name` computes a GELU(function) with."""
    return replacement_for(function, vocabulary.conversion_mode(mode_name, int8=True), exact_as, int8=True)


@functools.lru_cache(maxsize=None)
def intermediate_count(function, mode_name, exact_as):
    """How many intermediate tensors of a GELU(function)'s int8 replacement get a range (0: one op).

    Counted once, in NumPy: a QuantizeWrapper asks while its backend traces the model, whose graph must not
    gain the counting ops.
    """
    replacement = int8_replacement(function, mode_name, exact_as)
    if replacement.fused:  # one op (spelled in TensorFlow's ops, for the converter to fuse)
        return 0
    return len(intermediate_ranges(replacement.build, 1.0, np.zeros(1, np.float32)))
