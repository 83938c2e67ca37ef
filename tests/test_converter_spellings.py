"""Every GELU spelling x every mode: what it becomes, the op set, and parity.

Cases come in pairs, as in pyupgrade's tests: GELU spellings that must be
rewritten, and look-alikes (SiLU, 2*x*Phi(x), bare erf) whose function must
survive untouched apart from erf's builtin polynomial.
"""

import numpy as np
import pytest
import tensorflow as tf

import conversions
from conftest import LEG
from conftest import todays_share
import references
import spelling_models
import tflite_helpers
from keras_gelu import converters
from keras_gelu.converters.running import verify

pytestmark = pytest.mark.legs("keras3", "tf_keras", "tf218")

# Only TF <= 2.18's interpreter runs Flex ops; TF >= 2.19's converter fuses erfc-spelled GELUs.
FLEX_RUNS = tf.__version__.startswith(("2.18", "2.17"))
FUSES_ERFC_SPELLINGS = not FLEX_RUNS
# TF 2.18's tf.lite.Interpreter (the TF 2.18 leg's runtime) computes MAXIMUM(NaN, bound) as the bound, so
# GELU(NaN) is 0 there, as for any model with a MAXIMUM; LiteRT's MAXIMUM propagates NaN.
NAN_PASSES_MAXIMUM = verify.interpreter_class()[1] == "ai-edge-litert"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("spellings")
    return {name: spelling_models.save(name, str(root / name)) for name in sorted({case[0] for case in CASES_HERE})}


def _expected_drift_bound(function, mode, exact_as):
    """How far the .tflite may be from the original model, by construction.

    Where the function is kept exactly (native mode, erf form, tanh sources,
    sigmoid sources, no-op cases): float32 rounding through two 16-wide
    matmuls plus the erf polynomial's 1.5e-7, so 1e-4. Where exact GELU is
    replaced by an approximation, its per-activation error (2.0e-2 sigmoid,
    4.7e-4 tanh) times the second matmul's row norm (~2 here).
    """
    if function == "exact" and mode == "builtin" and exact_as == "sigmoid":
        return 0.1
    if function == "exact" and mode == "builtin" and exact_as == "tanh":
        return 3e-3
    return 1e-4


# On TensorFlow 2.18, what its converter and runtime do differently: select mode (Flex runs there) and native
# mode (its converter fuses fewer spellings into the GELU op); builtin mode's forms are our rewrite's arithmetic,
# which is TensorFlow's version's no more than it is the spelling's.
MODES_HERE = [conversion for conversion in conversions.EVERY if LEG != "tf218" or conversion[0] != "builtin"]


def _cases_here():
    """(spelling, mode, exact_as): on TF 2.18 (where select mode's Flex ops run) today's share of the spellings
    in each mode there; in the two main legs today's share of every spelling in every mode, a quarter in each
    (conftest.todays_share: the legs take different quarters, so each oneDNN setting meets every case within
    four days, and the two together within two). Each case is one conversion of one small model: which spelling
    meets which mode is what varies, not the mechanism."""
    spellings = sorted(spelling_models.SPELLINGS)
    if LEG == "tf218":
        return [(name, *conversion) for name in todays_share(spellings, 11) for conversion in MODES_HERE]
    cases = [(name, *conversion) for name in spellings for conversion in MODES_HERE]
    return todays_share(cases, -(-len(cases) // 4))


CASES_HERE = _cases_here()


@pytest.mark.parametrize("name, mode, exact_as", CASES_HERE,
                         ids=[f"{name}-{conversions.ids([conversion])[0]}" for name, *conversion in CASES_HERE])
def test_spelling(saved, name, mode, exact_as):
    _, function, alpha = spelling_models.SPELLINGS[name]
    try:
        tflite_model, report = converters.convert(saved[name], mode=mode, exact_as=exact_as)
    except converters.errors.ConverterFailed as error:
        # Unfused Erfc has no Flex kernel either (TF 2.19+ fuses erfc-spelled GELUs,
        # 2.18 does not); select mode does not rewrite, so it must say so.
        assert mode == "select" and "erfc" in name, error.message
        assert "Erfc has no Flex kernel" in error.message
        return
    found = {(g["pattern"], round(g["alpha"], 4)) for g in report.gelus}
    if function is None:
        assert report.gelus == [], f"{name} is not a GELU"
    else:
        assert sum(g["count"] for g in report.gelus) == 1
        (spelling_function,) = {s.function for s in converters.patterns.PATTERNS
                                if (s.name, round(alpha, 4)) in found}
        assert spelling_function == function

    ops = report.ops
    if mode == "builtin":
        assert "GELU" not in ops and not report.flex_ops, ops
    if mode in ("builtin", "native"):
        assert not any(op.startswith("Flex") or op in ("CUSTOM",) for op in ops), ops
        assert report.verified, report.not_verified_reason
        assert all(c["passed"] for c in report.fidelity)
        assert max(c["max_abs"] for c in report.drift) <= _expected_drift_bound(function, mode, exact_as)
    if mode == "native" and function in ("exact", "tanh"):
        assert ops.get("GELU") == 1, ops
    if mode == "native" and function in (None, "sigmoid"):
        assert "GELU" not in ops
    if mode == "select":
        if FUSES_ERFC_SPELLINGS:
            # What TF 2.21's converter fuses by itself; the rest needs Flex Erf.
            flex_expected = "Erf" in report.leftover_erf or (
                function == "exact" and name not in ("half_x_one_plus_erf_div_sqrt2", "x_half_one_plus_erf_mul",
                                                     "half_x_erfc_neg", "tf_nn_gelu", "nested_tf_function",
                                                     "tutorial_tf_sqrt"))
            assert bool(report.flex_ops) == flex_expected, ops
        if report.flex_ops:
            assert any("Flex delegate" in warning for warning in report.warnings)
            assert report.verified == FLEX_RUNS
            if FLEX_RUNS:
                assert all(c["passed"] for c in report.fidelity)
            else:
                assert "cannot run" in report.not_verified_reason


# Where the forms are checked at the edges: the largest floats, subnormals, zeros and the tails.
LARGEST = float(np.finfo(np.float32).max)
TINIEST = float(np.finfo(np.float32).smallest_subnormal)
EDGES = np.float32([LARGEST, -LARGEST, 1e30, -1e30, 1e4, -1e4, TINIEST, -TINIEST, 1e-39, -1e-39, 0.0, -0.0])


@pytest.mark.legs("keras3", "tf218")  # the rewrite itself: each oneDNN setting, each TensorFlow version once
@pytest.mark.parametrize("mode, exact_as", [("builtin", "sigmoid"), ("builtin", "erf"), ("native", None)])
def test_rewritten_exact_gelu_accuracy_and_edges(tmp_path, mode, exact_as):
    """The rewritten GELU alone, against float64 math.erfc, through the .tflite: a dense grid, the edges
    (largest floats, subnormals, signed zeros), -inf -> 0, +inf -> +inf and NaN -> NaN."""
    import math

    class Alone(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))}

    module = Alone()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.__call__})
    tflite_model, _ = converters.convert(str(tmp_path), mode=mode, exact_as=exact_as)
    finite = np.concatenate([np.linspace(-10, 10, 20001, dtype=np.float32), EDGES])
    (y,) = tflite_helpers.run(tflite_model, np.concatenate([finite, np.float32([-np.inf, np.inf, np.nan])]))
    exact = references.gelu_exact(finite)
    # erf form: the fitted gate's 6.5e-7 plus float32 rounding, measured 9.6e-7 in TF: the 2e-6.
    # native: TFLite's GELU kernel, ~1e-6. sigmoid: the approximation's 2.03e-2.
    bound = {"erf": 2e-6, "sigmoid": 2.04e-2}[exact_as] if mode == "builtin" else 2e-6
    assert np.max(np.abs(y[:len(finite)].astype(np.float64) - exact)) <= bound
    assert y[-3] == 0.0 and y[-2] == np.inf  # the rewrite clamps -inf: no NaN
    assert np.isnan(y[-1]) if NAN_PASSES_MAXIMUM else y[-1] == 0.0



@pytest.mark.legs("keras3", "tf218")  # the rewrite itself: each oneDNN setting, each TensorFlow version once
def test_float16_reference_rounds_the_bare_erf_polynomial_but_not_the_fused_gelu(tmp_path):
    """--float16-weights, native mode: TFLite stores the bare erf polynomial's constants as float16, while
    the fused GELU op keeps none; the fidelity reference must round exactly the former (keeping the
    polynomial's constants unrounded moved this model's reference 2e-3 from the .tflite)."""

    class ErfAndGELU(tf.Module):
        def __init__(self):
            self.w = tf.Variable(np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": 3.0 * tf.math.erf(tf.matmul(x, self.w)) + tf.nn.gelu(x, approximate=False)}

    module = ErfAndGELU()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.__call__})
    _, report = converters.convert(str(tmp_path), mode="native", float16_weights=True)
    assert report.ops["GELU"] == 1 and report.leftover_erf == {"Erf": 1}
    # Kernel rounding only, as without float16 weights: measured 6.3e-7.
    assert report.fidelity[0]["max_abs"] <= 1e-5


@pytest.mark.legs("keras3", "tf218")  # the rewrite itself: each oneDNN setting, each TensorFlow version once
def test_builtin_erf_for_bare_erf_is_within_2e6(tmp_path):
    import math

    class BareErf(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def __call__(self, x):
            return {"erf": tf.math.erf(x), "erfc": tf.math.erfc(x)}

    module = BareErf()
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.__call__})
    tflite_model, report = converters.convert(str(tmp_path), mode="builtin")
    assert report.leftover_erf == {"Erf": 1, "Erfc": 1}
    x = np.linspace(-6, 6, 12001, dtype=np.float32)
    erf_out, erfc_out = tflite_helpers.run(tflite_model, x)  # outputs in sorted name order
    x64 = x.astype(np.float64)
    assert np.max(np.abs(erf_out - np.vectorize(math.erf)(x64))) <= 2e-6
    assert np.max(np.abs(erfc_out - np.vectorize(math.erfc)(x64))) <= 2e-6
