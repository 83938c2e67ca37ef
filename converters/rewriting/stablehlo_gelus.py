"""GELUs in a StableHLO function, found by what they compute rather than by how they are spelled.

JAX writes erf as a rational approximation of a dozen operations with a branch on |x|, keras_gelu's exact
form on JAX is the normal tail's polynomial, and the tanh form arrives as a logistic, as 1 / (1 + exp(-u)) or
as tanh: no list of spellings keeps up. What every spelling shares is its shape: y computed from one tensor x
by elementwise operations whose other operands are scalar constants. So a region is a GELU when it has that
shape and its float64 values on a grid are x Phi(alpha x), the tanh form of alpha x, or x sigmoid(1.702 x),
within what float32 formulas differ by. The translation then writes each such region as the canonical
TensorFlow GELU, which the rewrite reads like any other.
"""

import dataclasses
import math

import numpy as np

from keras_gelu import formulas

_erfc = np.vectorize(math.erfc, otypes=[np.float64])
# Elementwise operations, as float64 NumPy functions of their operands.
_UNARY = {
    "stablehlo.negate": np.negative, "stablehlo.abs": np.abs, "stablehlo.exponential": np.exp,
    "stablehlo.exponential_minus_one": np.expm1, "stablehlo.log": np.log, "stablehlo.log_plus_one": np.log1p,
    "stablehlo.tanh": np.tanh, "stablehlo.logistic": lambda x: 1.0 / (1.0 + np.exp(-x)), "stablehlo.sqrt": np.sqrt,
    "stablehlo.rsqrt": lambda x: 1.0 / np.sqrt(x), "stablehlo.sign": np.sign, "stablehlo.floor": np.floor,
    "stablehlo.ceil": np.ceil, "stablehlo.not": np.logical_not, "stablehlo.is_finite": np.isfinite,
    "stablehlo.convert": lambda x: x, "chlo.erf": np.vectorize(math.erf, otypes=[np.float64]),
    "chlo.erfc": _erfc, "stablehlo.cbrt": np.cbrt,
}
_BINARY = {
    "stablehlo.add": np.add, "stablehlo.subtract": np.subtract, "stablehlo.multiply": np.multiply,
    "stablehlo.divide": np.divide, "stablehlo.maximum": np.maximum, "stablehlo.minimum": np.minimum,
    "stablehlo.power": np.power, "stablehlo.and": np.logical_and, "stablehlo.or": np.logical_or,
}
_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
            "GE": np.greater_equal}
ELEMENTWISE = frozenset(_UNARY) | frozenset(_BINARY) | {"stablehlo.compare", "stablehlo.select", "stablehlo.clamp"}
# A GELU's gate is transcendental: a region without one of these is arithmetic, never a GELU.
_TRANSCENDENTAL = frozenset({"stablehlo.exponential", "stablehlo.exponential_minus_one", "stablehlo.tanh",
                             "stablehlo.logistic", "chlo.erf", "chlo.erfc"})
# Operations that make a constant of a constant: its value broadcast, reshaped or retyped.
_CONSTANT_PRESERVING = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.dynamic_broadcast_in_dim",
                                  "stablehlo.reshape", "stablehlo.convert"})
# The largest region looked at: JAX's erf is about 40 operations, keras_gelu's exact form about 60.
_MAX_REGION = 400
# The grid: where GELUs differ from one another (|x| < 4) densely, and their tails.
_GRID = np.concatenate([np.linspace(-8.0, 8.0, 1601), [-30.0, -15.0, -10.0, 10.0, 15.0, 30.0]])
# float32 formulas of one function agree within a few float32 ulps (JAX's erf, keras_gelu's normal tail, the
# textbook erf form); the nearest other function is 4e-4 away at |x| = 3 (exact against tanh). The absolute
# part scales with |x| because y = x * gate: the gate's own error, 1e-6, times x.
_RTOL, _ATOL_PER_X = 1e-5, 1e-6


@dataclasses.dataclass(frozen=True)
class Gelu:
    x: int  # the value id of the GELU's input
    function: str  # keras_gelu.vocabulary.FUNCTIONS
    alpha: float  # y = x * gate(alpha x): 1 for the textbook GELUs


def _normal_cdf(t):
    return 0.5 * _erfc(-t / math.sqrt(2.0))


def _exact(x, alpha):
    return x * _normal_cdf(alpha * x)


def _tanh(x, alpha):
    a = alpha * x
    return 0.5 * x * (1.0 + np.tanh(formulas.TANH_SCALE * (a + formulas.TANH_CUBIC * a ** 3)))


def _sigmoid(x, alpha):
    return x / (1.0 + np.exp(-formulas.SIGMOID_SLOPE * alpha * x))


# (function, the family's y(x, alpha), whether alpha may differ from 1), as rewriting.patterns has them.
_FAMILIES = (("exact", _exact, True), ("tanh", _tanh, True), ("sigmoid", _sigmoid, False))


def _alpha_from(y_at_one, family):
    """The alpha for which the family's y(1, alpha) is y_at_one, by bisection (y(1, alpha) rises with alpha)."""
    low, high = 1e-3, 1e3
    if not family(1.0, low) <= y_at_one <= family(1.0, high):
        return None
    for _ in range(100):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if family(1.0, middle) < y_at_one else (low, middle)
    return math.sqrt(low * high)


def identify(values):
    """(function, alpha) if `values` (y on _GRID) are a GELU's, else None."""
    if not np.all(np.isfinite(values)):
        return None
    y_at_one = float(values[np.argmin(np.abs(_GRID - 1.0))])
    for function, family, scalable in _FAMILIES:
        alphas = [1.0] + ([_alpha_from(y_at_one, family)] if scalable else [])
        for alpha in alphas:
            if alpha is None:
                continue
            expected = family(_GRID, alpha)
            if np.all(np.abs(values - expected) <= _RTOL * np.abs(expected) + _ATOL_PER_X * np.abs(_GRID)):
                return function, (1.0 if abs(alpha - 1.0) <= 1e-6 else alpha)
    return None


class _Block:
    """One block's operations, indexed for the search."""

    def __init__(self, block, value_types):
        self.types = value_types
        self.producer = {}
        self.position = {value: -1 for value in block.arguments}
        for position, operation in enumerate(block.operations):
            for value in operation.results:
                self.producer[value] = operation
                self.position[value] = position
        self.constants = {}  # value id -> its scalar value, for splat constants and what preserves them
        for operation in block.operations:
            if operation.name == "stablehlo.constant":
                array = np.asarray(operation.attributes["value"])
                if array.size and np.all(array == array.flat[0]):
                    self.constants[operation.results[0]] = float(array.flat[0])
            elif operation.name in _CONSTANT_PRESERVING and operation.operands[0] in self.constants:
                self.constants[operation.results[0]] = self.constants[operation.operands[0]]

    def region(self, y):
        """(x, the region's operations in order) for y's elementwise region, or None: x is the one value every
        non-constant path back from y passes through."""
        frontier, operations = {y}, []
        while True:
            live = [value for value in frontier if value not in self.constants]
            if len(live) == 1 and operations:
                x = live[0]
                break
            if not live:
                return None
            latest = max(live, key=lambda value: self.position.get(value, -2))
            operation = self.producer.get(latest)
            if operation is None or operation.name not in ELEMENTWISE or len(operations) >= _MAX_REGION:
                return None
            if latest != y and self.types[latest] is not None and self.types[y] is not None \
                    and self.types[latest].shape != self.types[y].shape:
                return None
            operations.append(operation)
            frontier.discard(latest)
            frontier.update(operation.operands)
        if self.types[x] is None or not self.types[x].is_float or self.types[x].shape != self.types[y].shape:
            return None
        return x, sorted(operations, key=lambda op: self.position[op.results[0]])

    def evaluate(self, x, operations):
        """The region's output for each point of _GRID as x, in float64."""
        values = {x: _GRID}

        def value(operand):
            return values[operand] if operand in values else self.constants[operand]

        for operation in operations:
            operands = [value(operand) for operand in operation.operands]
            with np.errstate(all="ignore"):
                if operation.name in _UNARY:
                    result = _UNARY[operation.name](np.asarray(operands[0], dtype=np.float64))
                elif operation.name in _BINARY:
                    result = _BINARY[operation.name](*operands)
                elif operation.name == "stablehlo.compare":
                    result = _COMPARE[operation.attributes["comparison_direction"]](*operands)
                elif operation.name == "stablehlo.select":
                    result = np.where(*operands)
                else:  # clamp(min, x, max)
                    result = np.minimum(np.maximum(operands[1], operands[0]), operands[2])
            values[operation.results[0]] = np.broadcast_to(result, _GRID.shape)
        return values[operations[-1].results[0]]


def find(block, value_types):
    """{y value id: Gelu} for the GELUs the block computes, the outermost where regions nest."""
    indexed = _Block(block, value_types)
    found, inside = {}, set()
    for operation in reversed(block.operations):
        if operation.name not in ELEMENTWISE or len(operation.results) != 1:
            continue
        y = operation.results[0]
        if y in inside or value_types[y] is None or not value_types[y].is_float:
            continue
        region = indexed.region(y)
        if region is None:
            continue
        x, operations = region
        if not any(op.name in _TRANSCENDENTAL for op in operations):
            continue
        identified = identify(indexed.evaluate(x, operations))
        if identified is not None:
            found[y] = Gelu(x, *identified)
            inside.update(value for op in operations for value in op.results)
    return found
