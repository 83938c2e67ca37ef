"""Models exported from JAX, whose SavedModels hold StableHLO in XlaCallModule ops, converted: Keras 3 models
trained on JAX and exported with `model.export`, and pure-JAX functions through jax2tf
(`tests/data/stablehlo/make.py`, run on JAX in a process of its own). They convert without --trust-model,
their GELUs found by what they compute, in every mode and for TFLite Micro, and the .tflite computes what
JAX computed."""

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from conftest import todays_share
import tflite_helpers
from keras_gelu import converters
from keras_gelu.converters import errors
from keras_gelu.converters.rewriting import stablehlo_gelus

# The exports are SavedModels, which no Keras flavour of this process changes: the leg that balances the cores.
pytestmark = pytest.mark.legs("tf_keras")

MAKE = os.path.join(os.path.dirname(__file__), "data", "stablehlo", "make.py")
# The GELUs each model computes: two GELU layers in each Dense model, and in the convolutional one (Keras's
# exact GELU, keras_gelu's tanh GELU); LearnableGELU's x sigmoid(alpha x + beta) with trained alpha and beta
# is no fixed GELU, and stays the ops it is.
GELUS = {"keras_gelu_exact": 2, "keras_gelu_tanh": 2, "keras_gelu_sigmoid": 2, "learnable_gelu": 0,
         "keras_exact": 2, "keras_tanh": 2, "conv": 2, "pure_jax": 2}
# TFLite's GELU op computes the exact and the tanh GELU; x sigmoid(1.702 x) is LOGISTIC and MUL in every mode.
GELU_OPS_IN_NATIVE_MODE = {**GELUS, "keras_gelu_sigmoid": 0}
# Against JAX's own float32 outputs: exact GELU in builtins is the erf form (within 1e-6 of exact GELU), and
# the rest float32 arithmetic in another order, through three layers: the bound.
FLOAT_ATOL = 1e-5


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stablehlo")
    result = subprocess.run([sys.executable, MAKE, str(folder)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "KERAS_BACKEND": "jax", "TF_USE_LEGACY_KERAS": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def _converted(exported, name, **options):
    return converters.convert(str(exported / name), **options)


def _agrees_with_jax(exported, name, tflite_model, one_sample_at_a_time=False):
    inputs, outputs = (np.load(exported / name / f"{kind}.npy") for kind in ("inputs", "outputs"))
    if one_sample_at_a_time:  # a static-shape target fixed the batch at 1
        actual = np.concatenate([tflite_helpers.run(tflite_model, inputs[i:i + 1])[0] for i in range(len(inputs))])
    else:
        (actual,) = tflite_helpers.run(tflite_model, inputs)
    np.testing.assert_allclose(actual, outputs, rtol=0, atol=FLOAT_ATOL)


# Today's share of each model in each mode (conftest.todays_share: every case within two days); the export
# of every model, which the fixture makes in one JAX process, is what a version of JAX changes.
CONVERSIONS_TODAY = todays_share([(name, mode) for name in sorted(GELUS) for mode in ("builtin", "native")], 8)


@pytest.mark.parametrize("name, mode", CONVERSIONS_TODAY, ids=[f"{name}-{mode}" for name, mode in CONVERSIONS_TODAY])
def test_a_jax_export_converts_with_its_gelus_found_and_made_what_the_mode_says(exported, name, mode):
    tflite_model, report = _converted(exported, name, mode=mode, **({"exact_as": "erf"} if mode == "builtin" else {}))
    assert sum(entry["count"] for entry in report.gelus) == GELUS[name], report.gelus
    ops = tflite_helpers.ops(tflite_model)
    assert ops.get("GELU", 0) == (GELU_OPS_IN_NATIVE_MODE[name] if mode == "native" else 0), ops
    # The erf approximation JAX writes (ABS, EXP, DIV, SELECT) is gone with the GELU it was part of, and with
    # it the shape machinery of a polymorphic batch beside elementwise operations.
    assert not {"ABS", "EXP", "BROADCAST_TO", "UNSORTED_SEGMENT_PROD"} & set(ops) or name in ("learnable_gelu",
                                                                                                "conv"), ops
    assert report.verified
    _agrees_with_jax(exported, name, tflite_model)


@pytest.mark.parametrize("name", sorted(GELUS))
def test_a_jax_export_runs_in_tflite_micro(exported, name):
    """TFLite Micro has no dynamic shapes: fixed at batch 1, a polymorphic batch's shape operations fold away."""
    tflite_model, report = _converted(exported, name, target="tflm", exact_as="erf")
    assert report.target["fidelity"] and all(check["passed"] for check in report.target["fidelity"])
    ops = tflite_helpers.ops(tflite_model)
    assert not {"SHAPE", "BROADCAST_TO", "GELU"} & set(ops), ops
    _agrees_with_jax(exported, name, tflite_model, one_sample_at_a_time=True)


def test_a_module_that_runs_native_code_is_refused_unless_trusted_and_then_named(exported):
    with pytest.raises(errors.UntrustedModel, match="custom call 'some_native_kernel'"):
        _converted(exported, "native_call")
    with pytest.raises(errors.ConverterFailed, match="some_native_kernel.*has no TensorFlow translation"):
        _converted(exported, "native_call", trust_model=True)


def test_an_operation_without_a_translation_stops_the_conversion_in_one_line_naming_it(exported):
    with pytest.raises(errors.ConverterFailed) as raised:
        _converted(exported, "sorting")
    message = raised.value.message
    assert message.startswith(str(exported / "sorting")) and "stablehlo.sort" in message and "\n" not in message


# The probe that finds GELU regions, against the float64 functions it must tell apart.

def _on_grid(function):
    return np.array([function(float(x)) for x in stablehlo_gelus._GRID])


def _phi(t):
    return 0.5 * math.erfc(-t / math.sqrt(2.0))


@settings(max_examples=30, deadline=None)
@given(alpha=st.floats(0.3, 3.0))
def test_the_probe_names_each_gelu_with_its_input_scale(alpha):
    exact = _on_grid(lambda x: x * _phi(alpha * x))
    tanh = _on_grid(lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (alpha * x + 0.044715 *
                                                                                   (alpha * x) ** 3))))
    for values, function in ((exact, "exact"), (tanh, "tanh")):
        found, found_alpha = stablehlo_gelus.identify(values)
        assert found == function and found_alpha == pytest.approx(alpha, rel=1e-4)


def test_the_probe_tells_gelus_from_their_neighbours():
    assert stablehlo_gelus.identify(_on_grid(lambda x: x / (1 + math.exp(-1.702 * x)))) == ("sigmoid", 1.0)
    neighbours = {
        "SiLU, x sigmoid(x)": lambda x: x / (1 + math.exp(-x)),
        "x sigmoid(1.702 x) of another slope": lambda x: x / (1 + math.exp(-1.8 * x)),
        "exact GELU, off by 1e-4 where it matters": lambda x: x * _phi(x) + 1e-4 * math.exp(-x * x),
        "softplus": lambda x: math.log1p(math.exp(x)) if x < 30 else x,
        "Phi alone": _phi,
    }
    for name, function in neighbours.items():
        assert stablehlo_gelus.identify(_on_grid(function)) is None, name


def test_every_field_of_a_gather_s_dimension_numbers_is_read():
    """keras-hub's ViT exported on JAX failed with KeyError 'start_index_map': the reader kept only the fields
    whose names end in "dims"."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo as mlir_stablehlo

    from keras_gelu.converters.reading import stablehlo

    context = ir.Context()
    mlir_stablehlo.register_dialect(context)
    with context:
        numbers = mlir_stablehlo.GatherDimensionNumbers.get(
            offset_dims=[1], collapsed_slice_dims=[0], operand_batching_dims=[], start_indices_batching_dims=[],
            start_index_map=[0], index_vector_dim=1)
        assert stablehlo.attribute_value(numbers) == {
            "offset_dims": [1], "collapsed_slice_dims": [0], "operand_batching_dims": [],
            "start_indices_batching_dims": [], "start_index_map": [0], "index_vector_dim": 1}
