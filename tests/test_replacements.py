"""keras_gelu.replacements: the table is total and unambiguous, and builtin mode splices only ops TFLM has."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

import references
from keras_gelu import replacements
from keras_gelu import vocabulary

pytestmark = pytest.mark.legs("keras3", "tf218")

REWRITING_MODES = [mode for mode in vocabulary.MODES.values() if mode.rewrites]
CASES = [(function, mode, exact_as, int8)
         for function, mode, int8 in itertools.product(vocabulary.FUNCTIONS, REWRITING_MODES, (False, True))
         for exact_as in mode.exact_as or (None,)]

# TF ops that lower to TFLite builtins both LiteRT's CPU runtime and TFLite Micro run (LOGISTIC, MUL,
# ADD, SUB, DIV, EXP, ABS, LESS, SELECT_V2, MAXIMUM, MINIMUM, NEG), plus the graph's plumbing.
CPU_AND_TFLM_HAVE = {"Placeholder", "Const", "Identity", "Sigmoid", "Mul", "AddV2", "Sub", "RealDiv", "Exp", "Abs",
                     "Less", "SelectV2", "Maximum", "Minimum", "Neg"}
# What a builtin GELU replacement may use: ops NNAPI, TFLM and LiteRT's CPU runtime all have (no DIV, EXP,
# SELECT_V2), so that exact GELU runs on NNAPI too.
GELU_REPLACEMENT_OPS = {"Placeholder", "Const", "Identity", "Sigmoid", "Mul", "AddV2", "Maximum", "Minimum"}


def _op_types(build, int8):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None])
        build(x, 1.0, mark=replacements.unmarked if int8 else None)
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("function, mode, exact_as, int8", CASES,
                         ids=[f"{f}-{m.name}-{e}-{'int8' if i else 'float'}" for f, m, e, i in CASES])
def test_every_conversion_has_one_rule_and_builtin_mode_uses_builtin_ops(function, mode, exact_as, int8):
    replacement = replacements.replacement_for(function, mode, exact_as, int8)  # LookupError unless one row
    assert replacement is not None  # every GELU is rewritten: even LOGISTIC/MUL needs the gate's bounds
    ops = _op_types(replacement.build, int8)
    if mode.name == "builtin" or function == "sigmoid":
        assert ops <= GELU_REPLACEMENT_OPS, ops - GELU_REPLACEMENT_OPS
        assert not replacement.fused
    else:
        assert replacement.fused and ("Erf" in ops or "Tanh" in ops or "Erfc" in ops)  # tf.nn.gelu's spelling
    if int8 and not replacement.fused:
        assert "RealDiv" not in ops  # TF 2.18 leaves an int8 DIV float; NPUs lack DIV (a fused GELU op keeps none)


@pytest.mark.parametrize("function, mode_name, exact_as, count", [
    ("exact", "native", None, 0), ("sigmoid", "builtin", "sigmoid", 1), ("exact", "builtin", "tanh", 4),
])
def test_intermediate_count_is_the_number_of_marked_tensors(function, mode_name, exact_as, count):
    replacement = replacements.int8_replacement(function, mode_name, exact_as)
    marked = []
    replacement.build(tf.constant(np.linspace(-3, 3, 7, dtype=np.float32)), 1.0,
                      mark=lambda tensor, logistic=False: marked.append(logistic) or tensor)
    assert marked.count(False) == count == replacements.intermediate_count(function, mode_name, exact_as)


def test_int8_bare_erf_replacements_are_within_their_documented_bound():
    """erf = 2 Phi(sqrt2 t) - 1 with the tanh form's Phi (max 1.8e-4 off): 3.6e-4, measured 3.58e-4."""
    t = np.linspace(-6.0, 6.0, 24001)
    erf = np.array([math.erf(value) for value in t])
    assert np.abs(replacements.erf_from_logistic(tf.constant(t)).numpy() - erf).max() <= 3.6e-4
    assert np.abs(replacements.erfc_from_logistic(tf.constant(t)).numpy() - (1.0 - erf)).max() <= 3.6e-4 + 1e-15
    for bare in (replacements.erf_from_logistic, replacements.erfc_from_logistic):
        ops = _op_types(lambda x, alpha, mark=None, bare=bare: bare(x), int8=True)
        # No DIV or EXP (no int8 kernel in TF 2.18's converter, TFLM or the NPUs), no NEG (left float).
        assert ops <= CPU_AND_TFLM_HAVE - {"RealDiv", "Exp", "Neg"}, ops


def _float64_gelu(x, alpha=1.0):
    """x Phi(alpha x) = (alpha x) Phi(alpha x) / alpha, from the float64 reference."""
    u = alpha * np.asarray(x, np.float64)
    return references.gelu_exact(u) / alpha


# Tolerances of the exact form (exact_from_builtins) against float64 math.erfc: the fit's 6.5e-7 in float64
# (minimax over the fitted grid, so a denser grid may show a hair more); in float32 plus the rounding of
# 16 ops, measured 9.6e-7; with alpha != 1 the gate's error is multiplied by |x| = |u| / alpha.
EXACT_FORM_TOLERANCE = {np.float64: 7e-7, np.float32: 1e-6}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_exact_form_is_within_its_bound_on_a_dense_grid_and_the_far_tails(dtype):
    x = np.concatenate([np.linspace(-12.0, 12.0, 96001), np.geomspace(12.0, 1e30, 500), -np.geomspace(12.0, 1e30, 500)])
    x = x.astype(dtype)
    y = replacements.exact_from_builtins(tf.constant(x), 1.0).numpy().astype(np.float64)
    assert np.max(np.abs(y - _float64_gelu(x))) <= EXACT_FORM_TOLERANCE[dtype]


@pytest.mark.parametrize("alpha", [0.5, 1 / math.sqrt(2.0), 1.702])
def test_exact_form_with_a_scaled_input(alpha):
    x = np.linspace(-30.0, 30.0, 60001).astype(np.float32)
    y = replacements.exact_from_builtins(tf.constant(x), alpha).numpy().astype(np.float64)
    assert np.max(np.abs(y - _float64_gelu(x, alpha))) <= EXACT_FORM_TOLERANCE[np.float32] * max(1.0, 1.0 / alpha)


LARGEST = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("alpha", [1.0, 0.5], ids=["alpha1", "alpha0.5"])
@pytest.mark.parametrize("replacement", [replacements.ERF_FORM, replacements.TANH_FORM, replacements.SIGMOID_FORM],
                         ids=["erf", "tanh", "sigmoid"])
def test_float_forms_at_the_edges_and_their_gate_input_is_bounded(replacement, alpha):
    """-inf -> 0, +inf -> +inf, NaN -> NaN, the largest floats, subnormals and signed zeros, for x Phi(x)
    and a scaled x Phi(x/2); and every LOGISTIC input stays within +-1e26, below where XNNPACK's LOGISTIC
    turns finite inputs into NaN."""
    x = np.float32([-np.inf, np.inf, np.nan, LARGEST, -LARGEST, 1e30, -1e30, 1e-45, -1e-45, 1e-39, 0.0, -0.0])
    with tf.Graph().as_default() as graph:
        y = replacement.build(tf.constant(x), alpha)
        sigmoid_inputs = [op.inputs[0] for op in graph.get_operations() if op.type == "Sigmoid"]
    with tf.compat.v1.Session(graph=graph) as session:
        y, gate_inputs = session.run([y, sigmoid_inputs])
    assert y[0] == 0.0 and y[1] == np.inf and np.isnan(y[2])
    assert y[3] == LARGEST and y[4] == 0.0 and y[5] == np.float32(1e30) and y[6] == 0.0
    tiny = y[7:]  # x / 2, or 0 where the CPU flushes subnormals
    assert np.all((tiny == 0.0) | (np.abs(tiny - x[7:] / 2) <= 1e-45))
    assert len(gate_inputs) == 1 and np.nanmax(np.abs(gate_inputs[0])) <= 1e26


def test_exact_form_survives_float16_constants():
    """--float16-weights stores the polynomial's constants as float16: the smallest becomes -1.19e-7, and the
    form stays within 1e-5 of GELU (measured 4.9e-6), with no sign flip far out."""
    x = np.concatenate([np.linspace(-12.0, 12.0, 24001), np.float32([1e4, -1e4])]).astype(np.float32)
    rounded = tuple(float(np.float16(c)) for c in replacements.EXACT_GATE_POLYNOMIAL)
    assert all(c != 0.0 for c in rounded)
    build = replacements.gate_polynomial_form(rounded, replacements.EXACT_GATE_SQUARE_CLAMP)
    y = build(tf.constant(x), 1.0).numpy().astype(np.float64)
    assert np.max(np.abs(y - _float64_gelu(x))) <= 1e-5
