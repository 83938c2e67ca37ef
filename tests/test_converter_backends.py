"""Models trained and saved on Keras 3's JAX and PyTorch backends, converted: the command loads them under
TensorFlow whatever backend the user's shell names, and the .tflite computes what the model computed on the
backend it was trained on (`tests/data/keras_backends/make.py` recorded those outputs there)."""

import os

import numpy as np
import pytest

import tflite_helpers
from conftest import run_command
from keras_gelu import converters
from test_backends import SAVED_ON
from test_backends import saved_on

pytestmark = pytest.mark.legs("keras3")

# The float model's GELUs in float32 ops (the erf form within 1e-6 of exact GELU, the GELU op), through five
# Dense layers, against another framework's float32: the bound (measured: 6.3e-7 from JAX, 3.0e-7 from PyTorch).
FLOAT_ATOL = 1e-5


def test_the_command_converts_a_jax_model_whatever_backend_the_shell_names(tmp_path):
    """The installed command, in a process of its own: it also prints its own lines only, none of TensorFlow's,
    the converter's or the runtime's start-up chatter (test_converter_cli: with --quiet, nothing at all)."""
    output = tmp_path / "jax_float.tflite"
    model = os.path.join(SAVED_ON, "jax_float.keras")
    code, stderr = run_command(model, "-o", str(output), "--form", "erf", KERAS_BACKEND="jax")
    assert code == 0, stderr
    lines = stderr.splitlines()
    assert lines[0].startswith(model) and lines[-1].startswith("time: "), stderr
    assert not any(marker in stderr for marker in ("I0000", "absl::InitializeLog", "XNNPACK", "cuda", "To enable",
                                                   "Ignored output_format")), stderr
    tflite_model = output.read_bytes()
    assert "GELU" not in tflite_helpers.ops(tflite_model)
    _, recorded = saved_on("jax", "float")
    (actual,) = tflite_helpers.run(tflite_model, recorded["inputs"])
    np.testing.assert_allclose(actual, recorded["outputs"], rtol=0, atol=FLOAT_ATOL)


def test_a_pytorch_model_converts_with_the_gelu_op(tmp_path):
    tflite_model, report = converters.convert(os.path.join(SAVED_ON, "torch_float.keras"), mode="native")
    assert tflite_helpers.ops(tflite_model).get("GELU") == 2  # exact and tanh; the sigmoid form and x sigmoid(ax+b)
    _, recorded = saved_on("torch", "float")
    (actual,) = tflite_helpers.run(tflite_model, recorded["inputs"])
    np.testing.assert_allclose(actual, recorded["outputs"], rtol=0, atol=FLOAT_ATOL)


@pytest.mark.parametrize("source", ["jax", "torch"])
def test_a_qat_model_trained_on_another_backend_converts_to_an_integer_tflite_that_agrees_with_it(source):
    tflite_model, report = converters.convert(os.path.join(SAVED_ON, f"{source}_qat.keras"), int8=True)
    assert report.quantization_aware and report.int8 and report.float_ops == {}, report.op_types
    _, recorded = saved_on(source, "qat")
    (actual,) = tflite_helpers.run(tflite_model, recorded["inputs"])
    assert np.mean(actual.argmax(-1) == recorded["outputs"].argmax(-1)) >= 0.99
