"""The GELU patterns the converter recognises, declared as data.

A *spelling* is how a model writes GELU; a *pattern* is a row below, which
recognises a whole family of spellings. Every pattern is
y = x * (offset + scale * gate(linear*alpha*x + cubic*alpha^3*x^3)): the
matcher (rewrite.py) reduces any arrangement of Mul/Add/Sub/Neg/Div/Pow around
one gate op to that normal form, with numeric coefficients, and then looks the
coefficients up here. So operand order, nesting, division by sqrt(2) versus
multiplication by 1/sqrt(2), and x*x*x versus pow(x, 3) all reduce to the same
row. `alpha` is the input scale of x*Phi(alpha*x) and its tanh twin; it is 1
for the textbook spellings.
"""

import dataclasses

from keras_gelu import formulas


@dataclasses.dataclass(frozen=True)
class Pattern:
    name: str  # how the report names it
    function: str  # the GELU it computes (keras_gelu.vocabulary.FUNCTIONS)
    gate: str  # the TF op type of the gate
    offset: float
    scale: float
    linear: float  # coefficient of alpha*x in the gate's argument
    cubic: float  # coefficient of (alpha*x)^3 in the gate's argument
    scalable: bool  # whether alpha may differ from 1


PATTERNS = (
    # 0.5 x (1 + erf(x / sqrt 2)), x (0.5 + 0.5 erf(..)), x (1 + erf) * 0.5, ...
    # and 0.5 x erfc(-x / sqrt 2), which match() first rewrites as 1 - erf.
    Pattern("erf", "exact", "Erf", 0.5, 0.5, formulas.SQRT_HALF, 0.0, True),
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) and the coefficient-first spellings.
    Pattern("tanh", "tanh", "Tanh", 0.5, 0.5, formulas.TANH_SCALE,
            formulas.TANH_SCALE * formulas.TANH_CUBIC, True),
    # x sigmoid(1.5957691 (x + 0.044715 x^3)): the tanh form as keras_gelu writes it.
    Pattern("tanh via sigmoid", "tanh", "Sigmoid", 0.0, 1.0, formulas.SIGMOID_OF_TANH_SCALE,
            formulas.SIGMOID_OF_TANH_SCALE * formulas.TANH_CUBIC, True),
    # x sigmoid(1.702 x). Not scalable: x sigmoid(c x) for other c is SiLU's family, not GELU.
    Pattern("sigmoid", "sigmoid", "Sigmoid", 0.0, 1.0, formulas.SIGMOID_SLOPE, 0.0, False),
)

GATE_OPS = ("Erf", "Erfc", "Tanh", "Sigmoid")
# Gates that are odd about 0, so gate(-t) = -gate(t) lets a negative slope flip sign.
ODD_GATES = ("Erf", "Tanh")
# erfc(t) = 1 - erf(t): the matcher normalises Erfc gates to Erf with these.
ERFC_AS_ERF = ("Erf", 1.0, -1.0)

# Offsets and scales are exact small constants (0.5, 1) in every spelling we
# know of: float32 rounding is all we allow. The argument's coefficients are
# often typed from papers with 7-8 digits (0.0356774, 0.7978845608): 1e-5.
COEFFICIENT_RTOL = 1e-6
ARGUMENT_RTOL = 1e-5
# alpha within float32 rounding of 1 is taken as 1 (the textbook GELU).
UNIT_ALPHA_RTOL = 1e-6

# The operations the matcher reduces; anything else ends a GELU's region.
ARITHMETIC_OPS = ("Mul", "AddV2", "Add", "Sub", "Neg", "RealDiv", "Div", "Pow", "Square")


def close(value, target, rtol):
    return abs(value - target) <= rtol * max(abs(target), 1e-30)


def match(gate_op, offset, scale, linear, cubic):
    """The (Pattern, alpha) that y = x (offset + scale gate(linear x + cubic x^3)) is, or None."""
    if gate_op == "Erfc":
        gate_op, base, sign = ERFC_AS_ERF
        offset, scale = offset + base * scale, sign * scale
    if gate_op in ODD_GATES and linear < 0:
        linear, cubic, scale = -linear, -cubic, -scale
    for pattern in PATTERNS:
        if pattern.gate != gate_op or linear <= 0:
            continue
        if not (close(offset, pattern.offset, COEFFICIENT_RTOL) or (pattern.offset == 0 and abs(offset) <= 1e-7)):
            continue
        if not close(scale, pattern.scale, COEFFICIENT_RTOL):
            continue
        alpha = linear / pattern.linear
        if close(alpha, 1.0, UNIT_ALPHA_RTOL):
            alpha = 1.0
        if not pattern.scalable and alpha != 1.0:
            continue
        if pattern.cubic == 0.0:
            if cubic != 0.0:
                continue
        elif not close(cubic, pattern.cubic * alpha**3, ARGUMENT_RTOL):
            continue
        return pattern, alpha
    return None
