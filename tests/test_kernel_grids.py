"""Int8 outputs calibrated finer than their kernel rescales to (`converters/tflite/kernel_grids.py`).

The model: the squared difference of a one-channel tensor and its mean over channels, as a normalization of
one channel computes its variance (keras-hub's SAM normalizes its one-channel mask so), which is 0 on every
sample: the stock converter's calibration gives the SQUARED_DIFFERENCE a scale of about 1e-8, which LiteRT's
kernel refuses with an abort. Each interpreter that may abort runs in a process of its own: an abort is a
signal, not an exception.
"""

import subprocess
import sys

import numpy as np
import pytest

from conftest import keras

pytest.importorskip("ai_edge_litert")
tf = pytest.importorskip("tensorflow")

from keras_gelu import converters  # noqa: E402
from keras_gelu.converters.tflite import flatbuffer_model  # noqa: E402
from keras_gelu.converters.tflite import kernel_grids  # noqa: E402
from keras_gelu.converters.tflite import operators  # noqa: E402
import tflite_helpers  # noqa: E402

pytestmark = pytest.mark.legs("keras3")

# allocate_tensors is where each kernel's Prepare runs; LiteRT alone, without TensorFlow's import (~1 s)
_ALLOCATES = ("import sys\nfrom ai_edge_litert.interpreter import Interpreter\n"
              "Interpreter(model_content=sys.stdin.buffer.read()).allocate_tensors()\n")


def _allocates(tflite_model):
    """The return code of a fresh process preparing every op of the model: 0, or -6 where a kernel aborts."""
    return subprocess.run([sys.executable, "-c", _ALLOCATES], input=tflite_model, capture_output=True,
                          timeout=120).returncode


@pytest.fixture(scope="module")
def one_channel():
    """(float model, samples, the stock converter's post-training int8 .tflite of it)."""
    class Variance(keras.layers.Layer):
        def call(self, x):  # x + (x - mean(x))^2: x, the variance of one channel being 0
            return x + tf.math.squared_difference(x, keras.ops.mean(x, axis=-1, keepdims=True))

    inputs = keras.Input((4, 4, 1))
    model = keras.Model(inputs, Variance()(inputs))
    samples = np.random.default_rng(31).normal(size=(8, 4, 4, 1)).astype(np.float32)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([samples[index:index + 1]] for index in range(len(samples)))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return model, samples, converter.convert()


def _output_scales(tflite_model, op):
    """The output scale of each `op` in the main subgraph, in graph order."""
    model = flatbuffer_model.as_object(tflite_model)
    subgraph = model.subgraphs[0]
    return [float(subgraph.tensors[operator.outputs[0]].quantization.scale[0]) for operator in subgraph.operators
            if operators.op_name(model, operator) == op]


def _with_output_scale(tflite_model, op, position, scale):
    """The .tflite with the output scale of the `position`-th `op` set to `scale`."""
    model = flatbuffer_model.as_object(tflite_model)
    subgraph = model.subgraphs[0]
    found = [operator for operator in subgraph.operators if operators.op_name(model, operator) == op]
    subgraph.tensors[found[position].outputs[0]].quantization.scale = [float(scale)]
    return flatbuffer_model.as_bytes(model, len(tflite_model))


def test_an_output_calibrated_finer_than_its_kernel_takes_runs_on_the_finest_grid_it_takes(one_channel):
    model, samples, stock = one_channel
    (tiny,) = _output_scales(stock, "SQUARED_DIFFERENCE")
    assert tiny < 1e-7, tiny  # the calibration of an output that is 0 on every sample
    assert _allocates(stock) == -6  # SIGABRT: the stock converter's .tflite aborts any interpreter
    widened, made = kernel_grids.made_acceptable(stock)
    assert made == {"SQUARED_DIFFERENCE": 1}
    assert _allocates(widened) == 0
    # the op writes on the finest grid its kernel takes, which a QUANTIZE rescales onto the grid its readers read
    assert tflite_helpers.ops(widened)["QUANTIZE"] == tflite_helpers.ops(stock)["QUANTIZE"] + 1
    (output_scale,) = operators.output_scales(widened)
    # within one output step of the float model (x): x rounded onto its input grid, then onto the ADD's
    difference = np.abs(tflite_helpers.run(widened, samples)[0] - model(samples).numpy())
    assert np.max(difference) <= output_scale, np.max(difference) / output_scale
    assert kernel_grids.made_acceptable(widened) == (widened, {})  # nothing left to widen


@pytest.mark.parametrize("op", ["SQUARED_DIFFERENCE", "ADD"])
def test_the_smallest_scale_is_the_kernels_own_bound(one_channel, op):
    """The bound is the kernel's: its smallest scale prepares, the float32 below it aborts (the ADD, far from its
    bound, has the bound set on it)."""
    _, _, stock = one_channel
    widened, _ = kernel_grids.made_acceptable(stock)
    model = flatbuffer_model.as_object(widened)
    subgraph = model.subgraphs[0]
    (first, *_) = [operator for operator in subgraph.operators if operators.op_name(model, operator) == op]
    input_scales = [float(subgraph.tensors[index].quantization.scale[0]) for index in first.inputs]
    smallest = kernel_grids.smallest_scale(op, input_scales)
    below = float(np.nextafter(np.float32(smallest), np.float32(0)))
    assert _allocates(_with_output_scale(widened, op, 0, smallest)) == 0
    assert _allocates(_with_output_scale(widened, op, 0, below)) == -6


def test_the_converter_computes_such_an_output_on_its_kernels_grid_and_says_so(one_channel, tmp_path):
    model, samples, _ = one_channel
    np.savez(tmp_path / "samples.npz", samples)
    samples_path = str(tmp_path / "samples.npz")
    tflite_model, report = converters.convert(model, int8=True, calibration=samples_path, inputs=samples_path)
    assert report.kernel_grids == {"SQUARED_DIFFERENCE": 1}
    assert report.verified and "finest grid their kernel takes" in report.to_text()
