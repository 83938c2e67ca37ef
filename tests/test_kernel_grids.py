"""Int8 outputs calibrated finer than their kernel rescales to (`converters/tflite/kernel_grids.py`).

LiteRT's kernel. The model: the squared difference of a one-channel tensor and its mean over channels, as a
normalization of one channel computes its variance (keras-hub's SAM normalizes its one-channel mask so), which is
0 on every sample: the stock converter's calibration gives the SQUARED_DIFFERENCE a scale of about 1e-8, which
LiteRT's kernel refuses with an abort.

XNNPACK's, which LiteRT applies by default. The model: x plus a softmax over nine bins of almost equal logits
times a symmetric projection, as D-FINE's box integral computes, about 1e-7 here: the stock converter's
calibration gives the projection's FULLY_CONNECTED an output scale of about 1e-8, a requantization scale
s_in s_w / s_out in the thousands, which XNNPACK refuses (256 or more), and LiteRT's delegate fails to create
its runtime: an error here (a RuntimeError, which the converter reports as "not verified"), a double free and an
abort in D-FINE's decoder (tests/test_every_family.py), whose subgraph a small model did not reproduce.

Each interpreter that may abort runs in a process of its own: an abort is a signal, not an exception.
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
    """The return code of a fresh process preparing every op of the model: 0, -6 where a kernel aborts, 1 where
    it raises (XNNPACK's delegate failing to create its runtime)."""
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
    return model, samples, tflite_helpers.stock_int8(tf.lite.TFLiteConverter.from_keras_model(model),
                                                     samples[:, None])


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


def test_the_converter_gives_such_an_output_a_grid_its_kernel_takes_and_says_so(one_channel, tmp_path):
    """The output 0 on every sample gets its range widened before quantizing (tflite/quantizer.py: the calibrator's
    [0, FLT_MIN]), so its grid is no longer finer than its kernel takes: the .tflite runs, within a step of the
    float model."""
    model, samples, _ = one_channel
    np.savez(tmp_path / "samples.npz", samples)
    samples_path = str(tmp_path / "samples.npz")
    tflite_model, report = converters.convert(model, int8=True, calibration=samples_path, inputs=samples_path)
    assert any("SquaredDifference" in name for name in report.ranges_repaired["widened"]), report.ranges_repaired
    assert report.kernel_grids == {} and _allocates(tflite_model) == 0
    assert report.verified and "too narrow for a grid" in report.to_text()
    (output_scale,) = operators.output_scales(tflite_model)
    difference = np.abs(tflite_helpers.run(tflite_model, samples)[0] - model(samples).numpy())
    assert np.max(difference) <= output_scale, np.max(difference) / output_scale


_BINS = 9


@pytest.fixture(scope="module")
def box_integral():
    """(float model, samples, the stock converter's post-training int8 .tflite of it)."""
    rng = np.random.default_rng(7)
    inputs = keras.Input((8,))
    logits = keras.layers.Dense(_BINS)
    integral = keras.layers.Dense(1, use_bias=False)  # a symmetric projection: 0 for a uniform softmax
    outputs = inputs + integral(keras.ops.softmax(logits(inputs), axis=-1))
    model = keras.Model(inputs, outputs)
    logits.set_weights([rng.normal(scale=1e-6, size=(8, _BINS)).astype(np.float32), np.zeros(_BINS, np.float32)])
    integral.set_weights([np.linspace(-1, 1, _BINS, dtype=np.float32)[:, None]])
    samples = rng.normal(size=(8, 8)).astype(np.float32)
    return model, samples, tflite_helpers.stock_int8(tf.lite.TFLiteConverter.from_keras_model(model),
                                                     samples[:, None])


def _requantization_scales(tflite_model, op):
    """XNNPACK's requantization scale of each `op` in the main subgraph (activation, weights: its first two
    inputs), in graph order, as it computes it: s_in times the largest s_w, over s_out, in float32."""
    model = flatbuffer_model.as_object(tflite_model)
    subgraph = model.subgraphs[0]
    found = []
    for operator in subgraph.operators:
        if operators.op_name(model, operator) == op:
            activation, weights = (subgraph.tensors[index].quantization.scale for index in operator.inputs[:2])
            output = subgraph.tensors[operator.outputs[0]].quantization.scale[0]
            found.append(float(np.float32(activation[0]) * np.float32(max(weights)) / np.float32(output)))
    return found


def _without_delegates(tflite_model, samples):
    """The int8 bytes of the model's output before its DEQUANTIZE, on LiteRT's own kernels (no XNNPACK)."""
    interpreter = tflite_helpers.invoked_keeping_every_tensor(tflite_model, samples,
                                                              "BUILTIN_WITHOUT_DEFAULT_DELEGATES")
    model = flatbuffer_model.as_object(tflite_model)
    subgraph = model.subgraphs[0]
    (dequantize,) = [operator for operator in subgraph.operators if operators.op_name(model, operator) == "DEQUANTIZE"]
    return interpreter.get_tensor(dequantize.inputs[0])


def test_a_fully_connected_output_finer_than_xnnpack_takes_runs_on_the_finest_grid_it_takes(box_integral):
    model, samples, stock = box_integral
    _, projection = _requantization_scales(stock, "FULLY_CONNECTED")  # the logits', then the projection's
    assert projection >= 256, projection  # the calibration of an output that is almost 0 on every sample
    assert _allocates(stock) != 0  # XNNPACK's delegate cannot create its runtime
    widened, made = kernel_grids.made_acceptable(stock)
    assert made == {"FULLY_CONNECTED": 1}
    assert _allocates(widened) == 0
    assert 255 < _requantization_scales(widened, "FULLY_CONNECTED")[1] < 256
    assert tflite_helpers.ops(widened)["QUANTIZE"] == tflite_helpers.ops(stock)["QUANTIZE"] + 1
    # every accumulator unit but 0 is past the clamp on both grids, and the projection has one weight scale:
    # on LiteRT's kernels, which take both, the bytes are the stock model's
    np.testing.assert_array_equal(_without_delegates(widened, samples), _without_delegates(stock, samples))
    (output_scale,) = operators.output_scales(widened)
    # within one output step of the float model (x plus about 1e-7): x rounded onto its input grid, then onto the
    # ADD's, with XNNPACK's kernels
    difference = np.abs(tflite_helpers.run(widened, samples)[0] - model(samples).numpy())
    assert np.max(difference) <= output_scale, np.max(difference) / output_scale
    assert kernel_grids.made_acceptable(widened) == (widened, {})


@pytest.fixture(scope="module")
def convolutions():
    """The stock converter's post-training int8 .tflite of a CONV_2D, a DEPTHWISE_CONV_2D and a TRANSPOSE_CONV,
    each with weights per output channel (a fixed batch: XNNPACK takes a TRANSPOSE_CONV of a constant shape)."""
    inputs = keras.Input((6, 6, 3), batch_size=1)
    hidden = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    hidden = keras.layers.DepthwiseConv2D(3, padding="same")(hidden)
    model = keras.Model(inputs, keras.layers.Conv2DTranspose(4, 3, padding="same")(hidden))
    samples = np.random.default_rng(5).normal(size=(8, 1, 6, 6, 3)).astype(np.float32)
    return tflite_helpers.stock_int8(tf.lite.TFLiteConverter.from_keras_model(model), samples)


@pytest.mark.parametrize("op", ["FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV"])
def test_the_smallest_scale_is_xnnpacks_own_bound(box_integral, convolutions, op):
    """XNNPACK's smallest scale prepares, the float32 below it does not (each op's scales set on it; the
    convolutions' weights per channel: the largest channel's scale bounds it)."""
    tflite_model = kernel_grids.made_acceptable(box_integral[2])[0] if op == "FULLY_CONNECTED" else convolutions
    model = flatbuffer_model.as_object(tflite_model)
    subgraph = model.subgraphs[0]
    (*_, last) = [operator for operator in subgraph.operators if operators.op_name(model, operator) == op]
    activation, weights = (last.inputs[2], last.inputs[1]) if op == "TRANSPOSE_CONV" else last.inputs[:2]
    weight_scales = [float(scale) for scale in subgraph.tensors[weights].quantization.scale]
    assert op == "FULLY_CONNECTED" or len(set(weight_scales)) > 1
    smallest = kernel_grids.smallest_scale(op, [float(subgraph.tensors[activation].quantization.scale[0]),
                                                *weight_scales])
    below = float(np.nextafter(np.float32(smallest), np.float32(0)))
    position = -1 if op == "FULLY_CONNECTED" else 0
    assert _allocates(_with_output_scale(tflite_model, op, position, smallest)) == 0
    assert _allocates(_with_output_scale(tflite_model, op, position, below)) != 0
    assert kernel_grids.made_acceptable(_with_output_scale(tflite_model, op, position, below))[1] == {op: 1}


def test_the_converter_computes_a_box_integral_on_xnnpacks_grid_and_says_so(box_integral, tmp_path):
    model, samples, _ = box_integral
    np.savez(tmp_path / "samples.npz", samples)
    samples_path = str(tmp_path / "samples.npz")
    _, report = converters.convert(model, int8=True, calibration=samples_path, inputs=samples_path)
    assert report.kernel_grids == {"FULLY_CONNECTED": 1}
    assert report.verified


# TFLite Micro prepares every op as it builds its interpreter
_TFLM_ALLOCATES = ("import sys\nfrom tflite_micro.python.tflite_micro import runtime\n"
                   "runtime.Interpreter.from_bytes(sys.stdin.buffer.read())\n")


def _tflm_allocates(tflite_model):
    return subprocess.run([sys.executable, "-c", _TFLM_ALLOCATES], input=tflite_model, capture_output=True,
                          timeout=120).returncode


# Each 0 on every sample, so calibrated on a grid of about 1e-43, far finer than its int16 kernel takes: a tensor
# plus its product by -1 (ADD), and a tensor of two equal channels less their mean, plus that tensor (SUB).
_CANCELLED = {"ADD": lambda twice: twice + twice * -1.0,
              "SUB": lambda twice: twice + (twice - keras.ops.mean(twice, axis=-1, keepdims=True))}


@pytest.fixture(scope="module", params=sorted(_CANCELLED))
def sixteen_bit(request):
    """(the op, the float model, samples, the stock converter's 16x8 .tflite of it): `_CANCELLED`'s."""
    class Cancelled(keras.layers.Layer):
        def call(self, x):
            return _CANCELLED[request.param](keras.ops.concatenate([x, x], axis=-1))

    inputs = keras.Input((4, 4, 1))
    model = keras.Model(inputs, Cancelled()(inputs))
    samples = np.random.default_rng(37).normal(size=(8, 4, 4, 1)).astype(np.float32)
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([sample[None]] for sample in samples)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    return request.param, model, samples, converter.convert()


def test_a_16x8_sum_or_difference_finer_than_its_kernel_takes_runs_on_the_finest_grid_it_takes(sixteen_bit):
    """TFLite Micro's int16 ADD and SUB abort below their bound, and LiteRT's ADD (its SUB just below the bound
    too, though not on the stock converter's grid of 1e-43): each is computed on the finest grid its kernel
    takes, with a shift of 15 where int8's is 20, and both runtimes prepare the model; the result within an
    output step of the float model."""
    pytest.importorskip("tflite_micro")
    op, model, samples, stock = sixteen_bit
    assert _tflm_allocates(stock) == -6 and (op != "ADD" or _allocates(stock) == -6)
    widened, made = kernel_grids.made_acceptable(stock)
    assert made == {op: 1}
    assert _allocates(widened) == 0 and _tflm_allocates(widened) == 0
    assert tflite_helpers.ops(widened)["QUANTIZE"] == tflite_helpers.ops(stock)["QUANTIZE"] + 1
    # x rounded onto its input grid, then the ADD's result onto the output's: within a step of the output
    difference = np.abs(tflite_helpers.run(widened, samples)[0] - model(samples).numpy())
    (output_scale,) = _output_scales(widened, "ADD")[-1:]
    assert np.max(difference) <= output_scale, np.max(difference) / output_scale
    assert kernel_grids.made_acceptable(widened) == (widened, {})


def test_the_smallest_16x8_scale_is_the_kernels_own_bound(sixteen_bit):
    """The smallest scale prepares on both runtimes, the float32 below it aborts both."""
    pytest.importorskip("tflite_micro")
    op, _, _, stock = sixteen_bit
    widened, _ = kernel_grids.made_acceptable(stock)
    model = flatbuffer_model.as_object(widened)
    subgraph = model.subgraphs[0]
    (first, *_) = [operator for operator in subgraph.operators if operators.op_name(model, operator) == op]
    input_scales = [float(subgraph.tensors[index].quantization.scale[0]) for index in first.inputs]
    smallest = kernel_grids.smallest_scale(op, input_scales, int16=True)
    assert smallest > max(input_scales) * 2.0 ** -14 * (1 - 1e-6)  # the multiplier's bound at a shift of 15
    at, below = (_with_output_scale(widened, op, 0, scale)
                 for scale in (smallest, float(np.nextafter(np.float32(smallest), np.float32(0)))))
    assert _allocates(at) == 0 and _tflm_allocates(at) == 0
    assert _allocates(below) == -6 and _tflm_allocates(below) == -6
