""".tflite in, .tflite out: GELU ops from other tools replaced with builtin ops, checked against the GELU op.

The sources are made here: the stock TFLite converter on tf.nn.gelu (float and
full-integer int8) and Keras 3's own LiteRT export. The references are the
original .tflite (its GELU op runs in LiteRT) and float64 math.erf.
"""

import importlib.util
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import tflite_helpers
from conftest import keras
from conftest import run_command
from keras_gelu.converters import cli
from keras_gelu.converters import errors
from keras_gelu.converters.tflite import flatbuffer_model
from keras_gelu.converters.tflite import tflite_gelus

# Flavour-independent (tf.Module sources, .tflite files): in one leg, the tf-keras one; what Keras 3 makes (its
# LiteRT export, keras-hub's models) in the Keras 3 leg.
pytestmark = pytest.mark.legs("tf_keras")

# float32 against float64 math.erf: the erf form's fit (6.5e-7) plus float32 rounding, on |x| <= 8.
ERF_FORM_ATOL = 2e-6
# The tanh form computes tanh GELU itself (Horner's form): float32 rounding only.
TANH_FORM_ATOL = 2e-6
# x sigmoid(1.702 x) against exact GELU: the approximation's own error, 0.0203 at |x| = 2.
SIGMOID_FORM_ATOL = 0.021
# One int8 output step, measured on dequantized outputs: float32 rounds a whole step to (1 +- 1e-6) steps.
ONE_STEP = 1.0 + 1e-3


def _gelu64(x, approximate):
    if approximate:
        return [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x]
    return [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x]


def stock_gelu(approximate, int8=False, low=-6.0, high=6.0, width=256, int16=False):
    """The stock converter's .tflite of tf.nn.gelu on a (1, width) float input; int8: full-integer, inputs and
    outputs int8, calibrated on [low, high]; int16: the same with 16x8 (int16 activations)."""
    module = tf.Module()
    module.gelu = tf.function(lambda x: tf.nn.gelu(x, approximate=approximate),
                              input_signature=[tf.TensorSpec([1, width], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.gelu.get_concrete_function()], module)
    if int8 or int16:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([np.linspace(low, high, width, dtype=np.float32)[None]]
                                                     for _ in range(2))
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8 if int16
            else tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = converter.inference_output_type = tf.int16 if int16 else tf.int8
    return converter.convert()


def _run_integer(tflite_model, values):
    interpreter_type, _ = tflite_helpers.verify.interpreter_class()
    interpreter = interpreter_type(model_content=tflite_model)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], values)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"]).astype(np.int64)


@pytest.mark.parametrize("approximate", [False, True], ids=["exact", "tanh"])
@pytest.mark.parametrize("form", ["sigmoid", "tanh", "erf"])
def test_float_gelu_ops_become_the_builtin_form_asked_for(approximate, form):
    original = stock_gelu(approximate)
    assert tflite_helpers.ops(original) == {"GELU": 1}
    rewritten = tflite_gelus.rewrite(original, "builtin", form)
    assert "GELU" not in tflite_helpers.ops(rewritten.tflite_model)
    x = np.linspace(-8, 8, 256, dtype=np.float32)[None]
    (actual,) = tflite_helpers.run(rewritten.tflite_model, x)
    # tanh GELU has one builtin form whatever --form says (RULES): the tanh form
    atol = TANH_FORM_ATOL if approximate else {"sigmoid": SIGMOID_FORM_ATOL, "tanh": 5e-4, "erf": ERF_FORM_ATOL}[form]
    np.testing.assert_allclose(actual[0], _gelu64(x[0].astype(np.float64), approximate), atol=atol)


@settings(max_examples=4, deadline=None)
@given(low=st.floats(-12.0, -0.5), high=st.floats(0.5, 12.0), approximate=st.booleans())
def test_an_int8_gelu_op_becomes_a_form_within_a_step_or_else_its_own_table(low, high, approximate):
    """Every value an int8 GELU's input takes, for input ranges drawn at random (the stock converter's
    calibration on [low, high]): the RULES form where it is within a step of the op, else CAST, ADD and GATHER
    of the op's own outputs, step for step. The table is the op's kernel, whichever is chosen."""
    original = stock_gelu(approximate, int8=True, low=low, high=high)
    assert tflite_helpers.ops(original) == {"GELU": 1}
    rewritten = tflite_gelus.rewrite(original, "builtin", "tanh").tflite_model
    values = np.arange(-128, 128, dtype=np.int8)[None]
    expected = _run_integer(original, values)
    steps = np.abs(_run_integer(rewritten, values) - expected)
    if set(tflite_helpers.ops(rewritten)) == tflite_gelus.TABLE_OPS:
        assert steps.max() == 0
    else:
        assert steps.max() <= 1 and set(tflite_helpers.ops(rewritten)) <= {"MUL", "ADD", "LOGISTIC"}
    table = tflite_gelus.gelu_table(approximate, _quantization(original, "input"), _quantization(original, "output"))
    np.testing.assert_array_equal(table[values[0].astype(np.int64) + 128], expected[0])


def test_a_form_more_than_a_step_from_the_op_gives_way_to_the_table():
    """Input calibrated on [-11, 1], output on GELU's [-0.17, 1]: LOGISTIC's k/256 grid puts the form steps
    away (|x| / 512 against an output step of 1/255), so the op's own table replaces it, exact."""
    original = stock_gelu(False, int8=True, low=-11.0, high=1.0)
    rewritten = tflite_gelus.rewrite(original, "builtin", "sigmoid")
    (entry,) = rewritten.gelus
    steps = re.search(r"is (\d+) steps from it", entry["became"])
    assert entry["became"].startswith(tflite_gelus.TABLE_DESCRIPTION) and steps and int(steps.group(1)) > 1
    values = np.arange(-128, 128, dtype=np.int8)[None]
    np.testing.assert_array_equal(_run_integer(rewritten.tflite_model, values), _run_integer(original, values))


def test_without_gather_an_int8_gelu_becomes_logistic_mul_add_within_a_step_on_a_symmetric_range():
    """For runtimes without GATHER (Ethos-U's NPU): the RULES form in int8, its intermediate ranges from the
    256 input values. Input calibrated on [-6, 6], all 256 inputs. LOGISTIC's output sits on TFLite's fixed
    k/256 grid, so x * sigmoid(...) is off by up to |x| / 512: within a step while the input's range is no
    wider than the output's (measured elsewhere: 2 steps at [-3, 1], 8 at [-11, 1], where the table is exact)."""
    values = np.arange(-128, 128, dtype=np.int8)[None]
    worst = {}
    for approximate in (False, True):
        original = stock_gelu(approximate, int8=True)
        for form in ("sigmoid", "tanh"):
            rewritten = tflite_gelus.rewrite(original, "builtin", form, table=False).tflite_model
            assert set(tflite_helpers.ops(rewritten)) <= {"MUL", "ADD", "LOGISTIC"}
            steps = np.abs(_run_integer(rewritten, values) - _run_integer(original, values))
            worst[("tanh" if approximate else "exact", form)] = (int(steps.max()), int((steps > 0).sum()))
    assert all(maximum <= 1 for maximum, _ in worst.values()), worst


def _quantization(tflite_model, which):
    details = tflite_helpers.verify.interpreter_class()[0](model_content=tflite_model)
    (detail,) = details.get_input_details() if which == "input" else details.get_output_details()
    return detail["quantization"]


@settings(max_examples=3, deadline=None)
@given(low=st.floats(-12.0, -0.5), high=st.floats(0.5, 12.0), approximate=st.booleans())
@example(low=-11.0, high=1.0, approximate=False)  # input range much wider than the output's
def test_an_int16_gelu_op_becomes_its_float_form_in_16x8_close_to_gelu_rounded_once(low, high, approximate):
    """All 65,536 int16 inputs (16x8, the stock converter's). The erf form (exact GELU) and the tanh form
    (tanh GELU) against float64 GELU rounded into the op's output: within 2 steps plus the relative rounding
    of the gate, 2^-16 of max|x|, in output steps (measured 1.4 at [-6, 6], 3.1 at [-3, 1], 13 at [-11, 1])."""
    width = 65536
    original = stock_gelu(approximate, low=low, high=high, width=width, int16=True)
    assert tflite_helpers.ops(original) == {"GELU": 1}
    rewritten = tflite_gelus.rewrite(original, "builtin", "erf")
    assert rewritten.int16 and "GELU" not in tflite_helpers.ops(rewritten.tflite_model)
    (input_scale, _), (output_scale, output_zero) = (_quantization(original, "input"),
                                                     _quantization(original, "output"))
    values = np.arange(-32768, 32768, dtype=np.int16)[None]
    x = values[0].astype(np.float64) * input_scale
    ideal = np.clip(np.round(np.array(_gelu64(x, approximate)) / output_scale) + output_zero, -32768, 32767)
    steps = np.abs(_run_integer(rewritten.tflite_model, values)[0] - ideal)
    assert steps.max() <= 2 + 2 * np.abs(x).max() / (65536 * output_scale), steps.max()
    # the verification reference: the op in float32, rounded once, within a step of float64 (float32 rounding)
    reference = _run_integer(tflite_gelus.with_float_gelus(original), values)[0]
    assert np.abs(reference - ideal).max() <= 1


@pytest.mark.legs("keras3")
def test_keras_litert_export_converts_with_the_cli(tmp_path, capsys):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="gelu"), keras.layers.Dense(4)])
    path = str(tmp_path / "dense_gelu.tflite")
    model.export(path, format="litert", verbose=False)
    with open(path, "rb") as file:
        assert "GELU" in tflite_helpers.ops(file.read())
    output = tmp_path / "dense_gelu_builtin.tflite"
    assert cli.main([path, "--form", "erf"]) == 0  # the default output: beside it, named for the mode
    report = capsys.readouterr().err
    assert "1 x GELU op (exact, float32) -> exact, polynomial in LOGISTIC from builtins" in report
    rewritten = output.read_bytes()
    assert "GELU" not in tflite_helpers.ops(rewritten)
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    np.testing.assert_allclose(tflite_helpers.run(rewritten, x)[0], model(x).numpy(), atol=1e-5)


def test_a_quiet_conversion_of_a_tflite_prints_nothing(tmp_path):
    """The stock converter builds every replacement spliced into a .tflite, and prints its own notices each time
    ("Ignored output_format", at TensorFlow's default log level): the command drops them, as it does for its main
    conversion. A process of its own, at that log level (the suite's is quieter)."""
    code, stderr = run_command(os.path.join(LITERT_TORCH, "gelu_exact.tflite"), "-o", str(tmp_path / "out.tflite"),
                               "--target", "tflm", "-q")
    assert code == 0 and stderr == "", stderr


# x * 0.5 * (1 + erf(0.7071 x)): the inexact constant keeps the stock converter from fusing a GELU op, so with
# SELECT_TF_OPS its erf ships as FlexErf (the seeds' advice for variant spellings).
FLEX_CONSTANT = 0.7071
# TensorFlow 2.18's tf.lite.Interpreter runs Flex ops; LiteRT and later TensorFlows do not.
FLEX_RUNS = tf.__version__.startswith(("2.18", "2.17"))


@pytest.mark.legs("tf_keras", "tf218")
def test_a_flex_erf_becomes_builtin_and_the_model_drops_flex(tmp_path, capsys):
    module = tf.Module()
    module.f = tf.function(lambda x: x * 0.5 * (1.0 + tf.math.erf(x * FLEX_CONSTANT)),
                           input_signature=[tf.TensorSpec([1, 256], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    path, output = tmp_path / "flex.tflite", tmp_path / "out.tflite"
    path.write_bytes(converter.convert())
    assert tflite_helpers.ops(path.read_bytes())["FlexErf"] == 1

    assert cli.main([str(path), "-o", str(output), "--target", "tflm"]) == 0
    report = capsys.readouterr().err
    assert "Flex erf ops: 1 x FlexErf (rewritten as a builtin erf polynomial)" in report
    rewritten = output.read_bytes()
    assert not [op for op in tflite_helpers.ops(rewritten) if op.startswith("Flex")]
    assert not [code for code in flatbuffer_model.as_object(rewritten).operatorCodes if code.customCode]
    x = np.linspace(-8, 8, 256, dtype=np.float32)
    (actual,) = tflite_helpers.run(rewritten, x[None])
    reference = [0.5 * v * (1 + math.erf(v * float(np.float32(FLEX_CONSTANT)))) for v in x.astype(np.float64)]
    # the builtin erf is within 1.5e-7 (A&S 7.1.26), times |x|/2 <= 4, plus float32 rounding
    np.testing.assert_allclose(actual[0], reference, atol=ERF_FORM_ATOL)
    if FLEX_RUNS:  # held to the original, Flex and all
        assert re.search(r"fidelity output_0: max abs \S+, max rel \S+, cosine \S+ ok", report), report
    else:
        assert "not verified: the rewritten .tflite runs, but ai-edge-litert cannot run the original, which " \
               "needs Flex (FlexErf)" in report
        if importlib.util.find_spec("tflite_micro") is not None:  # TFLM held to the rewritten .tflite in LiteRT
            assert re.search(r"output_0 on the target vs ai-edge-litert: max abs \S+ ok", report), report


LITERT_TORCH = os.path.join(os.path.dirname(__file__), "data", "litert_torch")  # made by its make.py


@pytest.mark.parametrize("name, form, atol", [
    # the erf form (9.6e-7 of GELU) and float32 sums in another order than PyTorch's: measured <= 7.2e-7
    ("gelu_exact", "erf", 5e-6),
    ("gelu_tanh", "tanh", 5e-6),
    ("transformer_layer", "erf", 5e-6),  # LayerNorm and softmax on top
    # x sigmoid(1.702 x) is within 0.0203 of exact GELU, carried through the second Linear (measured 0.011)
    ("gelu_exact", "sigmoid", 0.02),
    ("transformer_layer", "sigmoid", 0.02),
])
def test_litert_torch_models_convert_for_tflite_micro_and_match_pytorch(name, form, atol):
    """PyTorch's nn.GELU through litert-torch (checked in: no TensorFlow beside it), rewritten for TFLite Micro,
    held to PyTorch's own outputs (the reference the .tflite files never saw)."""
    from keras_gelu import converters

    with open(os.path.join(LITERT_TORCH, f"{name}.tflite"), "rb") as file:
        original = file.read()
    assert tflite_helpers.ops(original)["GELU"] == 1
    rewritten, report = converters.convert(original, exact_as=form, target="tflm")
    assert "GELU" not in report.ops and report.verified
    assert report.signature == "serving_default"  # litert-torch's, kept
    if importlib.util.find_spec("tflite_micro") is not None:
        assert report.target["figures"]["arena_bytes"] > 0 and all(c["passed"] for c in report.target["fidelity"])
    references = np.load(os.path.join(LITERT_TORCH, "torch_outputs.npz"))
    inputs, expected = references[f"{name}/inputs"], references[f"{name}/outputs"]
    actual = np.concatenate([tflite_helpers.run(rewritten, sample[None])[0] for sample in inputs])
    np.testing.assert_allclose(actual, expected, atol=atol)


@pytest.mark.skipif(importlib.util.find_spec("tflite_micro") is None, reason="needs keras-gelu[tflm]")
def test_the_worked_example_s_report_is_what_the_converter_prints(tmp_path, capsys):
    """docs/converter.md quotes the report of the PyTorch model through TFLite Micro: each quoted line but the
    first (the paths) is printed as it stands, arena size included; the errors only to their exponent
    (XNNPACK's kernels differ by CPU in the last bits)."""
    page = open(os.path.join(os.path.dirname(LITERT_TORCH), "..", "..", "docs", "converter.md")).read()
    quoted = page[page.index("### From PyTorch to TFLite Micro"):]
    quoted = quoted[quoted.index("```text\n") + len("```text\n"):]
    quoted = quoted[:quoted.index("```")].splitlines()[1:]
    output = tmp_path / "out.tflite"
    assert cli.main([os.path.join(LITERT_TORCH, "gelu_exact.tflite"), "-o", str(output), "--target", "tflm",
                     "--form", "erf"]) == 0
    def exponents_only(lines):
        return [re.sub(r"\d\.\d+e(-\d+)", r"_e\1", line) for line in lines]

    printed = exponents_only(capsys.readouterr().err.splitlines())
    assert [line for line in exponents_only(quoted) if line not in printed] == []


# keras-hub families, as Keras's LiteRT export and the stock converter's PTQ make them (Keras 3 models).
IMAGE = (1, 32, 32, 3)


@pytest.fixture(scope="module")
def keras_hub_vit(tmp_path_factory):
    """A tiny random keras-hub ViT: the model, its LiteRT export at a fixed input shape, and the stock
    converter's full-integer PTQ of its SavedModel export."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(1)
    model = keras_hub.models.ViTBackbone(image_shape=IMAGE[1:], patch_size=8, mlp_dim=64, num_layers=2, num_heads=2,
                                         hidden_dim=32)
    folder = tmp_path_factory.mktemp("keras_hub_vit")
    signature = [keras.InputSpec(shape=IMAGE, dtype="float32")]
    model.export(str(folder / "vit.tflite"), format="litert", verbose=False, input_signature=signature)
    model.export(str(folder / "saved_model"), verbose=False, input_signature=signature)
    rng = np.random.default_rng(2)
    converter = tf.lite.TFLiteConverter.from_saved_model(str(folder / "saved_model"))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([rng.normal(size=IMAGE).astype(np.float32)] for _ in range(16))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    (folder / "vit_int8.tflite").write_bytes(converter.convert())
    return model, folder


@pytest.mark.legs("keras3")
@pytest.mark.parametrize("form, atol", [("erf", 2e-5), ("sigmoid", None)])
def test_a_keras_hub_vit_from_keras_s_litert_export_runs_on_tflite_micro(keras_hub_vit, form, atol):
    """Both GELU ops rewritten; TFLite Micro runs the file; the erf form matches the Keras model itself (float32
    through LayerNormalization and attention: measured 3.0e-6, the original GELU-op file 1.6e-6)."""
    from keras_gelu import converters

    model, folder = keras_hub_vit
    path = str(folder / "vit.tflite")
    with open(path, "rb") as file:
        assert tflite_helpers.ops(file.read())["GELU"] == 2
    rewritten, report = converters.convert(path, exact_as=form, target="tflm")
    assert "GELU" not in report.ops and report.verified and report.gelus[0]["count"] == 2
    if importlib.util.find_spec("tflite_micro") is not None:
        assert report.target["figures"]["arena_bytes"] > 0
    if atol is not None:
        x = np.random.default_rng(3).normal(size=IMAGE).astype(np.float32)
        np.testing.assert_allclose(tflite_helpers.run(rewritten, x)[0], np.asarray(model(x)), atol=atol)


@pytest.mark.legs("keras3")
def test_a_dynamic_shape_export_is_refused_for_tflite_micro_saying_how_to_fix_it(keras_hub_vit, tmp_path, capsys):
    model, _ = keras_hub_vit
    path = str(tmp_path / "dynamic.tflite")
    model.export(path, format="litert", verbose=False)  # the batch dimension left dynamic
    assert cli.main([path, "--target", "tflm", "-o", str(tmp_path / "out.tflite")]) == errors.DoesNotFitTarget.exit_code
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "lacks" in line and "REDUCE_PROD" in line and "export it with fixed input shapes" in line


@pytest.mark.legs("keras3")
def test_a_real_int8_model_s_gelus_are_rewritten_within_a_step(keras_hub_vit):
    """The stock converter's PTQ of the ViT: each int8 GELU op becomes the sigmoid form where that is within
    a step of the op on its 256 inputs, else its table. TFLite Micro's own int8 kernels (MEAN, RSQRT, SOFTMAX)
    round otherwise than LiteRT's: it is held to LiteRT on the same file within the steps measured (5). The
    stock converter left each LayerNormalization's NEG in float; as int8 MULs, the whole model runs on the
    Ethos-U55's NPU (measured: 202 operators in native mode, 206 in builtin mode, none on the CPU)."""
    from keras_gelu import converters

    _, folder = keras_hub_vit
    original = (folder / "vit_int8.tflite").read_bytes()
    assert tflite_helpers.ops(original)["GELU"] == 2
    _, report = converters.convert(original, target="tflm", max_steps=8)
    assert "GELU" not in report.ops and report.fidelity[0]["steps"] <= ONE_STEP and report.gelus[0]["count"] == 2
    assert report.islands_made_integer == {"NEG": 5} and report.float_ops == {}
    if importlib.util.find_spec("tflite_micro") is not None:
        assert all(c["passed"] for c in report.target["agreement"])
    if importlib.util.find_spec("ethosu") is not None:  # the GELU op itself (native), or the form (builtin)
        for mode in ("native", "builtin"):
            _, report = converters.convert(original, target="ethos-u55", mode=mode, max_steps=8)
            assert report.target["figures"]["cpu_operators"] == 0 < report.target["figures"]["npu_operators"]


def test_gelu_ops_in_every_subgraph_are_rewritten():
    """A tf.cond the stock converter keeps as an IF op: each branch a subgraph with its own GELU (exact in one,
    tanh in the other). Both branches, against the original: the erf and tanh forms compute the ops' own
    functions, to float32 rounding."""
    from keras_gelu import converters

    weights = tf.constant(np.random.default_rng(5).normal(size=(8, 8)).astype(np.float32))
    module = tf.Module()
    module.f = tf.function(lambda x: tf.cond(tf.reduce_sum(x) > 0,
                                             lambda: tf.nn.gelu(tf.matmul(x, weights), approximate=False),
                                             lambda: tf.nn.gelu(x, approximate=True) * 2.0),
                           input_signature=[tf.TensorSpec([1, 8], tf.float32)])
    original = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module).convert()
    assert sorted(op.subgraph for op in tflite_gelus.gelu_ops(flatbuffer_model.as_object(original))) == [1, 2]
    rewritten, report = converters.convert(original, exact_as="erf")
    assert tflite_gelus.gelu_ops(flatbuffer_model.as_object(rewritten)) == []
    assert sorted(entry["pattern"] for entry in report.gelus) == ["GELU op (approximate, float32)",
                                                                  "GELU op (exact, float32)"]
    x = np.random.default_rng(6).normal(size=(1, 8)).astype(np.float32)
    for branch in (x, -x):
        np.testing.assert_allclose(tflite_helpers.run(rewritten, branch)[0], tflite_helpers.run(original, branch)[0],
                                   atol=ERF_FORM_ATOL * 8)  # through the 8-wide matmul's output range


def test_a_float16_weight_tflite_s_gelu_becomes_builtin():
    """float16 weights (DEQUANTIZE to float32 before the matmul): the GELU computes in float32 as before.
    TFLite Micro's DEQUANTIZE takes integers only: refused from its op table, before TFLM fails to prepare."""
    from keras_gelu import converters

    weights = tf.constant(np.random.default_rng(7).normal(size=(8, 16)).astype(np.float32))
    module = tf.Module()
    module.f = tf.function(lambda x: tf.nn.gelu(tf.matmul(x, weights), approximate=False),
                           input_signature=[tf.TensorSpec([1, 8], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.target_spec.supported_types = [tf.float16]
    original = converter.convert()
    assert {"DEQUANTIZE", "GELU"} <= set(tflite_helpers.ops(original))
    rewritten, report = converters.convert(original, exact_as="erf")
    assert "GELU" not in report.ops and report.verified and not report.int8
    with pytest.raises(errors.DoesNotFitTarget, match=r"lacks 1 x DEQUANTIZE \(float16 in\)"):
        converters.convert(original, exact_as="erf", target="tflm")


def _dense_gelu(weights, buffers_after=False):
    """The stock converter's .tflite of gelu(x @ weights), exact; buffers_after: in the form it writes past 2 GB
    (each weight buffer after the flatbuffer, at Buffer.offset), which its experimental flag asks for at any size."""
    module = tf.Module()
    module.f = tf.function(lambda x: tf.nn.gelu(tf.matmul(x, tf.constant(weights)), approximate=False),
                           input_signature=[tf.TensorSpec([1, weights.shape[0]], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module)
    converter._experimental_use_buffer_offset = buffers_after
    return converter.convert()


def _buffers_after_the_flatbuffer(tflite_model):
    """The offsets of the buffers a .tflite keeps after its flatbuffer, and whether its metadata names that form."""
    model = flatbuffer_model.schema.Model.GetRootAsModel(tflite_model, 0)
    offsets = [model.Buffers(index).Offset() for index in range(model.BuffersLength())
               if model.Buffers(index).Offset() > 1]
    names = {model.Metadata(index).Name() for index in range(model.MetadataLength())}
    return offsets, b"buffer_location" in names


def test_the_readers_of_one_tflite_share_one_unpacking_and_a_writer_gets_its_own():
    """A conversion's checks and reports each read its .tflite (flatbuffer_model.read): the same bytes are
    unpacked once, into the model each reader sees; a writer's model (as_object) is its own, so that an edit
    never shows to a reader; and a mutable buffer, whose content may change under the same object, is unpacked
    at every read."""
    tflite_model = _dense_gelu(np.eye(8, dtype=np.float32))
    shared = flatbuffer_model.read(tflite_model)
    assert flatbuffer_model.read(tflite_model) is shared
    own = flatbuffer_model.as_object(tflite_model)
    assert own is not shared
    own.subgraphs[0].tensors[0].name = b"edited"
    assert flatbuffer_model.read(tflite_model).subgraphs[0].tensors[0].name != b"edited"
    mutable = bytearray(tflite_model)
    assert flatbuffer_model.read(mutable) is not flatbuffer_model.read(mutable)


@pytest.mark.parametrize("options, atol", [
    ({"exact_as": "erf"}, ERF_FORM_ATOL),
    ({"mode": "native"}, ERF_FORM_ATOL),  # LiteRT's GELU op against float64: float32 rounding of erf
    ({"exact_as": "tanh", "target": "tflm"}, 5e-4),  # the tanh form of exact GELU: 4.7e-4 at |x| = 2.2
], ids=["builtin", "native", "tflm"])
def test_a_tflite_with_its_weights_after_the_flatbuffer_converts_and_is_written_whole(options, atol):
    """The form a .tflite takes past 2 GB (weights after the flatbuffer), asked of the stock converter for a
    small model: read as any .tflite, and written whole, as a model that fits is, where TFLite Micro reads it
    too (it reads no buffer after the flatbuffer: NaN). The output computes gelu(x @ w) as float64 does."""
    from keras_gelu import converters

    rng = np.random.default_rng(11)
    weights = (rng.normal(size=(64, 64)) / 8).astype(np.float32)
    original = _dense_gelu(weights, buffers_after=True)
    assert _buffers_after_the_flatbuffer(original)[0] and _buffers_after_the_flatbuffer(original)[1]
    rewritten, report = converters.convert(original, **options)
    assert _buffers_after_the_flatbuffer(rewritten) == ([], False) and report.verified
    assert ("GELU" in tflite_helpers.ops(rewritten)) == (options.get("mode") == "native")
    x = rng.normal(size=(1, 64)).astype(np.float32)
    (actual,) = tflite_helpers.run(rewritten, x)
    np.testing.assert_allclose(actual[0], _gelu64(x[0].astype(np.float64) @ weights.astype(np.float64), False),
                               atol=atol)


def test_every_edit_of_a_tflite_past_2_gb_keeps_its_weights_after_the_flatbuffer(monkeypatch):
    """Past 2 GB of weights the stock converter writes them after the flatbuffer; so does every path that edits a
    .tflite (GELU ops rewritten, a signature given, the round trip itself), each buffer on 16 bytes. The limit
    lowered to this model's weights stands in for 2 GB (the real size: benchmarks/bench_scale.py). LiteRT runs
    each as float64 computes gelu(x @ w), and a model written whole exactly as the one split."""
    from keras_gelu.converters.tflite import signatures
    from keras_gelu.converters.tflite import validation

    rng = np.random.default_rng(12)
    weights = (rng.normal(size=(64, 64)) / 8).astype(np.float32)
    whole = _dense_gelu(weights)
    monkeypatch.setattr(flatbuffer_model, "_INLINE_WEIGHTS_LIMIT", weights.nbytes - 1)
    edits = {
        "round trip": flatbuffer_model.as_bytes(flatbuffer_model.as_object(whole), len(whole)),
        "GELU ops": tflite_gelus.rewrite(whole, "builtin", "erf").tflite_model,
        "signature": signatures.with_signature(whole, "serving_default", ["x"], ["y"]),
    }
    x = rng.normal(size=(1, 64)).astype(np.float32)
    expected = _gelu64(x[0].astype(np.float64) @ weights.astype(np.float64), False)
    for edit, split in edits.items():
        offsets, named = _buffers_after_the_flatbuffer(split)
        assert named and offsets and all(offset % 16 == 0 for offset in offsets), edit
        assert validation.problem(split) is None, edit
        np.testing.assert_allclose(tflite_helpers.run(split, x)[0][0], expected, atol=ERF_FORM_ATOL, err_msg=edit)
    np.testing.assert_array_equal(tflite_helpers.run(edits["round trip"], x)[0], tflite_helpers.run(whole, x)[0])
    monkeypatch.undo()
    rejoined = flatbuffer_model.as_bytes(flatbuffer_model.as_object(edits["GELU ops"]), len(whole))
    assert _buffers_after_the_flatbuffer(rejoined) == ([], False), "written whole again where the weights fit"


def test_a_tflite_is_known_by_its_content_and_taken_as_bytes(tmp_path):
    from keras_gelu import converters

    original = stock_gelu(approximate=False)
    path = tmp_path / "model.bin"
    path.write_bytes(original)
    from_file, report = converters.convert(str(path), exact_as="tanh")
    from_bytes, _ = converters.convert(original, exact_as="tanh")
    assert from_file == from_bytes and report.kind == ".tflite" and report.verified


def test_a_tflite_without_gelu_is_written_as_it_was(tmp_path, capsys):
    module = tf.Module()
    module.f = tf.function(lambda x: tf.nn.relu(x) * 2.0, input_signature=[tf.TensorSpec([1, 4], tf.float32)])
    original = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module).convert()
    (tmp_path / "relu.tflite").write_bytes(original)
    assert cli.main([str(tmp_path / "relu.tflite"), "-o", str(tmp_path / "out.tflite"), "--target", "tflm"]) == 0
    assert "warning: no GELU found: the .tflite is written as it was" in capsys.readouterr().err
    assert tflite_helpers.ops((tmp_path / "out.tflite").read_bytes()) == tflite_helpers.ops(original)


@pytest.mark.parametrize("case, exit_code, message", [
    ("truncated", errors.CorruptModel.exit_code, "not a valid .tflite"),
    ("not a flatbuffer", errors.CorruptModel.exit_code, "not a .tflite (no TFL3 flatbuffer identifier)"),
    ("--trust-model", errors.BadInputs.exit_code, "--trust-model does not apply to a .tflite"),
    ("--calibration", errors.BadInputs.exit_code, "--calibration does not apply to a .tflite"),
    ("--int8", errors.BadInputs.exit_code, "--int8 on a float .tflite: requantizing a .tflite is not in scope"),
])
def test_bad_tflite_input_is_one_line_and_writes_nothing(case, exit_code, message, tmp_path, capsys):
    original = stock_gelu(approximate=False)
    path = tmp_path / "model.tflite"
    path.write_bytes({"truncated": original[: len(original) // 2], "not a flatbuffer": b"\x00" * 64}.get(
        case, original))
    flags = {"--trust-model": ["--trust-model"], "--calibration": ["--int8", "--calibration", "random:4"],
             "--int8": ["--int8"]}.get(case, [])
    assert cli.main([str(path), "-o", str(tmp_path / "out.tflite"), *flags]) == exit_code
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("keras-gelu-convert")]
    assert message in line
    assert not (tmp_path / "out.tflite").exists()


def _stock_integer_model(op_set=tf.lite.OpsSet.TFLITE_BUILTINS_INT8):
    """A small model the stock converter quantizes in full (integer inputs and outputs): Dense, GELU, Dense; int8,
    or with the 16x8 op set, int16 activations."""
    module = tf.Module()
    rng = np.random.default_rng(3)
    first, second = (tf.constant(rng.normal(0, 0.5, size=shape).astype(np.float32)) for shape in ((8, 32), (32, 4)))
    module.f = tf.function(lambda x: tf.matmul(tf.nn.gelu(tf.matmul(x, first), approximate=False), second),
                           input_signature=[tf.TensorSpec([1, 8], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([rng.normal(0, 1, size=(1, 8)).astype(np.float32)] for _ in range(64))
    converter.target_spec.supported_ops = [op_set]
    converter.inference_input_type = converter.inference_output_type = (
        tf.int8 if op_set == tf.lite.OpsSet.TFLITE_BUILTINS_INT8 else tf.int16)
    return converter.convert()


def test_a_layer_normalization_s_float_neg_becomes_one_integer_mul(tmp_path):
    """Keras 3's LayerNormalization spelling (x * inv - mean * inv, the mean negated): the stock converter's
    int8 leaves its NEG float between DEQUANTIZE and QUANTIZE. It becomes one int8 MUL by -1, held to the
    original within a step on inputs whose means sweep the int8 range."""
    from keras_gelu import converters

    def layer_normalization(x):
        mean, variance = tf.nn.moments(x, [-1], keepdims=True)
        inverse = tf.math.rsqrt(variance + 1e-3)
        return x * inverse + tf.negative(mean) * inverse

    rng = np.random.default_rng(4)
    offsets = np.linspace(-4, 4, 64, dtype=np.float32)[:, None, None]  # the means sweep the input's range
    samples = rng.normal(0, 1, (64, 1, 64)).astype(np.float32) + offsets
    module = tf.Module()
    module.f = tf.function(layer_normalization, input_signature=[tf.TensorSpec([1, 64], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.f.get_concrete_function()], module)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([sample] for sample in samples)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    original = converter.convert()
    assert tflite_helpers.ops(original)["NEG"] == 1  # the island this is about
    rewritten, report = converters.convert(original)
    assert report.islands_made_integer == {"NEG": 1} and report.float_ops == {}
    assert not {"NEG", "DEQUANTIZE", "QUANTIZE"} & set(report.ops)
    scale, zero_point = _quantization(original, "input")
    worst = 0
    for sample in samples:
        quantized = np.clip(np.round(sample / scale) + zero_point, -128, 127).astype(np.int8)
        worst = max(worst, np.abs(_run_integer(rewritten, quantized) - _run_integer(original, quantized)).max())
    assert worst <= 1


def test_a_16x8_model_converts_for_tflite_micro_held_to_its_gelus_in_float(tmp_path, capsys):
    """The stock converter's 16x8 PTQ of Dense, GELU, Dense: the rewrite is held to the original with its GELU
    computed in float32 and rounded once; its drift from TFLite's int16 GELU kernel is reported."""
    original = _stock_integer_model(tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8)
    path, output = tmp_path / "int16.tflite", tmp_path / "out.tflite"
    path.write_bytes(original)
    assert cli.main([str(path), "-o", str(output), "--form", "erf", "--target", "tflm", "-v"]) == 0
    report = capsys.readouterr().err
    assert "1 x GELU op (exact, int16) -> exact, polynomial in LOGISTIC from builtins, int16x8" in report
    assert "integer throughout" in report and "'reference': 'the original with its int16 GELUs" in report
    assert re.search(r"fidelity output_0: max abs \S+ \(\d+\.\d+ int16 steps\).* ok", report), report
    assert set(tflite_helpers.ops(output.read_bytes())) <= {"FULLY_CONNECTED", "LOGISTIC", "MUL", "ADD", "MINIMUM",
                                                             "MAXIMUM", "QUANTIZE"}


def test_an_int8_model_converts_within_a_step_and_runs_on_tflite_micro_and_the_ethos_u_npu(tmp_path):
    """The stock converter's PTQ model: its GELU becomes the sigmoid form where that is within a step of the
    op (else its table, exact). The Ethos-U55 (Vela 5.2) runs the GELU op itself; in builtin mode, as its NPU
    has no GATHER, LOGISTIC/MUL."""
    from keras_gelu import converters

    original = _stock_integer_model()
    assert tflite_helpers.ops(original)["GELU"] == 1
    rewritten, report = converters.convert(original, target="tflm")
    assert "GELU" not in report.ops and report.float_ops == {} and report.fidelity[0]["steps"] <= ONE_STEP
    if importlib.util.find_spec("tflite_micro") is not None:
        assert report.target["figures"]["arena_bytes"] > 0 and report.target["fidelity"][0]["steps"] <= ONE_STEP
    if importlib.util.find_spec("ethosu") is not None:
        for mode, became in (("native", "kept: GELU op"), ("builtin", "x*sigmoid(1.702x) from LOGISTIC/MUL")):
            _, report = converters.convert(original, target="ethos-u55", mode=mode, max_steps=1)
            assert report.gelus[0]["became"] == became  # Vela 5.2 runs the GELU op; builtin: no GATHER there
            figures = report.target["figures"]
            assert figures["cpu_operators"] == 0 < figures["npu_operators"], report.target
