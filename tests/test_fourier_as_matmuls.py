"""The Fourier transform of a real tensor (FNet's token mixing) spelled as products with cosine and sine matrices."""

import numpy as np
import pytest
import tensorflow as tf

import conversions
import tflite_helpers
from keras_gelu import converters
from keras_gelu.converters.rewriting import fourier_as_matmuls
from keras_gelu.converters.rewriting import graph

pytestmark = pytest.mark.legs("keras3")  # TensorFlow graphs rewritten before any converter: one leg

_TRANSFORMS = {1: tf.signal.fft, 2: tf.signal.fft2d, 3: tf.signal.fft3d}
_NUMPY = {1: np.fft.fft, 2: np.fft.fft2, 3: lambda x: np.fft.fftn(x, axes=(-3, -2, -1))}
_PARTS = {"real": (tf.math.real, np.real), "imag": (tf.math.imag, np.imag), "abs": (tf.abs, np.abs)}
_MADE_COMPLEX = {  # the spellings of a real tensor made complex
    "zeros_like": lambda x: tf.complex(x, tf.zeros_like(x)),
    "constant_zeros": lambda x: tf.complex(x, tf.zeros([2, 3, 5, 6], tf.float32)),
    "cast": lambda x: tf.cast(x, tf.complex64),
}


def _rewritten_and_run(body, spec, x):
    """(rewritten op types, the rewritten graph's output on x)."""
    function = tf.function(body).get_concrete_function(spec)
    graph_def = function.graph.as_graph_def()
    assert fourier_as_matmuls.real_transforms_as_matmuls(graph_def) == 1
    output = function.outputs[0].name
    graph.prune(graph_def, [function.inputs[0].name, output])
    (value,) = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
        graph_def, input_map={function.inputs[0].name: tf.constant(x)}, return_elements=[output]), [])()
    return {node.op for node in graph_def.node}, value.numpy()


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("made", sorted(_MADE_COMPLEX))
@pytest.mark.parametrize("part", sorted(_PARTS))
@pytest.mark.parametrize("axes", [1, 2, 3])
def test_each_part_of_the_transform_of_a_real_tensor_computes_numpys_fft(axes, part, made, dynamic):
    """numpy's FFT in float64 is the reference: atol 1e-4 for float32 sums of at most 3 x 5 x 6 products of
    N(0, 1) values (magnitudes ~ 10, float32's rounding ~ 1e-6 each)."""
    x = np.random.default_rng(axes).standard_normal([2, 3, 5, 6]).astype(np.float32)
    spec = tf.TensorSpec([None] * x.ndim if dynamic else x.shape, tf.float32)
    tf_part, numpy_part = _PARTS[part]
    ops, value = _rewritten_and_run(lambda v: tf_part(_TRANSFORMS[axes](_MADE_COMPLEX[made](v))), spec, x)
    assert not {"FFT", "FFT2D", "FFT3D", "Complex", "Real", "Imag", "ComplexAbs"} & ops, ops
    assert {"MatMul", "BatchMatMulV2"} & ops and ("Range" in ops) == dynamic, ops  # constants where static
    np.testing.assert_allclose(value, numpy_part(_NUMPY[axes](x.astype(np.float64))), atol=1e-4)


@pytest.mark.parametrize("body", [
    lambda v: tf.math.real(tf.signal.fft2d(tf.complex(v, v))),  # a complex input: not a real one's transform
    lambda v: tf.math.real(tf.signal.ifft2d(tf.signal.fft2d(tf.cast(v, tf.complex64)))),  # its complex value read
], ids=["complex_input", "complex_value_read"])
def test_a_transform_that_is_not_of_a_real_tensor_or_whose_complex_value_is_read_is_left(body):
    function = tf.function(body).get_concrete_function(tf.TensorSpec([None, 4, 4], tf.float32))
    assert fourier_as_matmuls.real_transforms_as_matmuls(function.graph.as_graph_def()) == 0


def _fnet_mixing(tmp_path, shape):
    """FNet's mixing, real(fft2(complex(x, 0))) over sequence and hidden, between two GELU layers; saved, and
    inputs to check it on."""
    weights = tf.constant(np.random.default_rng(1).standard_normal([8, 8]) / 3, tf.float32)

    def mixing(x):
        h = tf.nn.gelu(tf.matmul(x, weights), approximate=True)
        return {"y": tf.nn.gelu(tf.math.real(tf.signal.fft2d(tf.complex(h, tf.zeros_like(h)))) / 8.0, True)}

    path = conversions.saved_function(tmp_path, "fnet", mixing, tf.TensorSpec(shape, tf.float32))
    x = np.random.default_rng(2).standard_normal([1, 6, 8]).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    h = x.astype(np.float64) @ weights.numpy()
    gelu = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))  # noqa: E731
    return path, str(tmp_path / "x.npz"), x, gelu(np.real(np.fft.fft2(gelu(h))) / 8.0)


def test_fnets_mixing_on_a_dynamic_sequence_converts_where_the_stock_converter_stops(tmp_path):
    """The stock converter stops at Complex and FFT2D; here, matrix products, compared with numpy's FFT:
    atol 1e-4 for float32 sums of 48 products (the tanh GELU is builtin mode's own TANH form, exact)."""
    path, inputs, x, expected = _fnet_mixing(tmp_path, [None, None, 8])
    with pytest.raises(Exception, match="FFT2D"):
        tf.lite.TFLiteConverter.from_saved_model(path).convert()
    tflite_model, report = converters.convert(path, inputs=inputs)
    assert not {"RFFT2D", "CUSTOM"} & set(report.ops) and not report.flex_ops, report.ops
    assert report.ops.get("BATCH_MATMUL", 0) >= 2 and {"COS", "SIN", "RANGE"} <= set(report.ops), report.ops
    assert report.verified and all(comparison["passed"] for comparison in report.fidelity + report.drift)
    (y,) = tflite_helpers.run(tflite_model, x)
    np.testing.assert_allclose(y, expected, atol=1e-4)


def test_fnets_mixing_quantizes_to_int8_and_runs_on_tflite_micro(tmp_path):
    """Static shapes (TFLite Micro's): the matrices are constants, every matrix product int8 (TFLite Micro's
    BATCH_MATMUL and FULLY_CONNECTED); against numpy's
    FFT within 0.1 (the output's range is ~4 wide: some 6 int8 steps, the steps of the mixing's and GELUs'
    inputs added)."""
    path, inputs, x, expected = _fnet_mixing(tmp_path, [1, 6, 8])
    tflite_model, report = converters.convert(path, target="tflm", int8=True, calibration=inputs, inputs=inputs)
    assert {"COS", "SIN", "RANGE"}.isdisjoint(report.ops), report.ops  # constants where the sizes are known
    matmuls = {name: types for name, types in report.op_types.items() if name in ("BATCH_MATMUL", "FULLY_CONNECTED")}
    assert matmuls and all(set(types) == {"int8"} for types in matmuls.values()), report.op_types
    assert report.verified and all(comparison["passed"] for comparison in report.fidelity), report.fidelity
    if report.target.get("agreement"):  # where tflite-micro is installed: run there, as LiteRT runs it
        assert all(agreement["steps"] <= 1 for agreement in report.target["agreement"]), report.target["agreement"]
    (y,) = tflite_helpers.run(tflite_model, x)
    np.testing.assert_allclose(y, expected, atol=0.1)


def test_a_quantization_aware_graph_keeps_its_transform_to_be_named():
    """QAT's ranges cover none of the products the spelling adds: a FULLY_CONNECTED of an int8 input and float
    weights would follow, which LiteRT cannot prepare; refused in one line instead."""
    def body(v):
        v = tf.quantization.fake_quant_with_min_max_vars(v, tf.constant(-3.0), tf.constant(3.0))
        return tf.math.real(tf.signal.fft2d(tf.complex(v, tf.zeros_like(v))))

    function = tf.function(body).get_concrete_function(tf.TensorSpec([None, 4, 4], tf.float32))
    assert fourier_as_matmuls.real_transforms_as_matmuls(function.graph.as_graph_def()) == 0
