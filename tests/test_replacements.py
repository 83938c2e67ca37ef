"""keras_gelu.replacements: the table is total and unambiguous, and builtin mode splices only ops TFLM has."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from keras_gelu import replacements
from keras_gelu import vocabulary

REWRITING_MODES = [mode for mode in vocabulary.MODES.values() if mode.rewrites]
CASES = [(function, mode, exact_as, int8)
         for function, mode, int8 in itertools.product(vocabulary.FUNCTIONS, REWRITING_MODES, (False, True))
         for exact_as in mode.exact_as or (None,)]

# TF ops that lower to TFLite builtins both LiteRT's CPU runtime and TFLite Micro run (LOGISTIC, MUL,
# ADD, SUB, DIV, EXP, ABS, LESS, SELECT_V2, MAXIMUM, NEG), plus the graph's plumbing.
CPU_AND_TFLM_HAVE = {"Placeholder", "Const", "Identity", "Sigmoid", "Mul", "AddV2", "Sub", "RealDiv", "Exp", "Abs",
                     "Less", "SelectV2", "Maximum", "Neg"}


def _op_types(build, int8):
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None])
        build(x, 1.0, mark=replacements.unmarked if int8 else None)
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("function, mode, exact_as, int8", CASES,
                         ids=[f"{f}-{m.name}-{e}-{'int8' if i else 'float'}" for f, m, e, i in CASES])
def test_every_conversion_has_one_rule_and_builtin_mode_uses_builtin_ops(function, mode, exact_as, int8):
    replacement = replacements.replacement_for(function, mode, exact_as, int8)  # LookupError unless one row
    if replacement is None:
        assert function == "sigmoid" and not int8  # only a GELU already made of LOGISTIC/MUL is kept
        return
    ops = _op_types(replacement.build, int8)
    if mode.name == "builtin" or function == "sigmoid":
        assert ops <= CPU_AND_TFLM_HAVE, ops - CPU_AND_TFLM_HAVE
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
    import math

    t = np.linspace(-6.0, 6.0, 24001)
    erf = np.array([math.erf(value) for value in t])
    assert np.abs(replacements.erf_from_logistic(tf.constant(t)).numpy() - erf).max() <= 3.6e-4
    assert np.abs(replacements.erfc_from_logistic(tf.constant(t)).numpy() - (1.0 - erf)).max() <= 3.6e-4 + 1e-15
    for bare in (replacements.erf_from_logistic, replacements.erfc_from_logistic):
        ops = _op_types(lambda x, alpha, mark=None, bare=bare: bare(x), int8=True)
        # No DIV or EXP (no int8 kernel in TF 2.18's converter, TFLM or the NPUs), no NEG (left float).
        assert ops <= CPU_AND_TFLM_HAVE - {"RealDiv", "Exp", "Neg"}, ops
