"""TensorFlow ops TFLite has no builtin for: Roll, new axes (after an ellipsis too) and einsums that sum nothing on
dynamic shapes, einsums on operands of no rank, int64 Abs and Sign, integer max pooling, comparisons of narrow
integers, spelled in builtins; orderings of a boolean's cast, which the stock converter folds into an op it has no
kernel for, as the boolean; any other named in one line."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import conversions
import references
import tflite_helpers
from keras_gelu import converters
from keras_gelu.converters import cli
from keras_gelu.converters import errors
from keras_gelu.converters.rewriting import graph
from keras_gelu.converters.rewriting import tf_ops_as_builtins
from keras_gelu.converters.running import verify
from keras_gelu.converters.tflite import operators

pytestmark = pytest.mark.legs("tf_keras")  # TensorFlow graphs rewritten before any converter: one leg (the shorter)


@st.composite
def rolls(draw):
    """A shape, and shifts and axes as tf.roll takes them: any sign, shifts beyond the size, repeated axes."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=4))
    count = draw(st.integers(1, 3))
    axes = draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=count, max_size=count))
    shifts = draw(st.lists(st.integers(-7, 7), min_size=count, max_size=count))
    return shape, shifts, axes


@settings(max_examples=40)
@given(case=rolls())
def test_the_slices_compute_numpys_roll(case):
    shape, shifts, axes = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    function = tf.function(lambda v: tf.roll(v, shift=shifts, axis=axes)).get_concrete_function(
        tf.TensorSpec(shape, tf.float32))
    graph_def = function.graph.as_graph_def()
    assert tf_ops_as_builtins.rolls_as_slices(graph_def) == 1
    output = function.outputs[0].name
    graph.prune(graph_def, [function.inputs[0].name, output])
    assert "Roll" not in {node.op for node in graph_def.node}
    (rolled,) = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
        graph_def, input_map={function.inputs[0].name: tf.constant(x)}, return_elements=[output]), [])()
    np.testing.assert_array_equal(rolled.numpy(), np.roll(x, shifts, axes))


def _pruned_and_run(function, graph_def, *values):
    """The outputs of `function`'s graph as rewritten (`graph_def`), pruned to what they read, run on `values`."""
    inputs, outputs = [tensor.name for tensor in function.inputs], [tensor.name for tensor in function.outputs]
    graph.prune(graph_def, [*inputs, *outputs])
    return [tensor.numpy() for tensor in tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
        graph_def, input_map=dict(zip(inputs, map(tf.constant, values))), return_elements=outputs), [])()]


@st.composite
def slices_with_new_axes(draw):
    """A shape, and an index with at least one new axis (None) among slices and integers, and at most one
    ellipsis (`mask[..., None]`), which may stand for no axis: the Python spellings that become one
    StridedSlice with a new_axis_mask."""
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))

    def entry(size):
        return draw(st.one_of(
            st.integers(-size, size - 1),
            st.builds(slice, st.one_of(st.none(), st.integers(-size, size)), st.one_of(st.none(), st.integers(
                -size, size)), st.sampled_from([None, 1, 2, -1]))))

    leading = draw(st.integers(0, len(shape)))
    index = [entry(size) for size in shape[:leading]]
    if draw(st.booleans()):  # the ellipsis, then entries for the last axes it leaves: x[0, ..., 1:]
        trailing = draw(st.integers(0, len(shape) - leading))
        index += [Ellipsis] + [entry(size) for size in shape[len(shape) - trailing:]]
    for _ in range(draw(st.integers(1, 3))):
        index.insert(draw(st.integers(0, len(index))), None)
    # and, at times, a second such slice of the first one's result (XLNet's mask[:, :, None][..., None])
    then = draw(st.sampled_from([(), ((Ellipsis, None),), ((None, Ellipsis, None),)]))
    return shape, (tuple(index), *then)


@settings(max_examples=80)
@given(case=slices_with_new_axes())
def test_new_axes_become_expand_dims_after_the_slice_and_compute_numpys_indexing(case):
    """On a tensor of dynamic shape (where TFLite's STRIDED_SLICE takes no new axis): numpy's own indexing is
    the reference."""
    shape, indices = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

    def sliced_in_turn(value):
        for index in indices:
            value = value[index]
        return value

    spec = tf.TensorSpec([None] * len(shape), tf.float32)
    function = tf.function(sliced_in_turn).get_concrete_function(spec)
    # a slice of a static shape is left to the converter, which takes new axes there (x[None, 0][..., None])
    static = len(indices) - 1 if tf.function(lambda v: v[indices[0]]).get_concrete_function(
        spec).outputs[0].shape.is_fully_defined() else 0
    graph_def = function.graph.as_graph_def()
    assert tf_ops_as_builtins.new_axes_as_expand_dims(graph_def) == len(indices) - static
    (sliced,) = _pruned_and_run(function, graph_def, x)
    assert sum(node.op == "StridedSlice" and node.attr["new_axis_mask"].i > 0 for node in graph_def.node) == static
    np.testing.assert_array_equal(sliced, sliced_in_turn(x))


def test_new_axes_making_more_than_five_on_a_static_shape_calibrate_where_the_stock_calibrator_stops(tmp_path):
    """keras-hub's SAM 3 widens a label to six axes, `x[:, None, None, None, None, None]`, on a static shape: the
    stock converter writes it as a STRIDED_SLICE of six axes, which its calibrator's interpreter (and TFLite Micro)
    does not run, and every int8 conversion of the model stopped. Written as the slice and EXPAND_DIMS, it
    calibrates, and computes what numpy's indexing does."""
    grid = np.random.default_rng(14).normal(size=(1, 2, 2, 2, 2, 4)).astype(np.float32)

    def widened(x):
        return {"y": tf.reduce_sum(x[:, 0][:, None, None, None, None, None] + grid, [1, 2, 3, 4]) * x}

    path = conversions.saved_function(tmp_path, "six_axes", widened, tf.TensorSpec([1, 4], tf.float32, name="x"))
    x = np.random.default_rng(15).normal(size=(8, 4)).astype(np.float32)
    np.savez(tmp_path / "samples.npz", x=x)
    tflite_model, report = converters.convert(path, int8=True, calibration=str(tmp_path / "samples.npz"))
    assert report.verified and report.budget["passed"], report.budget
    expected = (x[:, :1, None, None, None, None] + grid).sum((1, 2, 3, 4)) * x
    y = np.concatenate([verify.run_signature(tflite_model, "serving_default", {"x": row[None]})["y"] for row in x])
    assert references.cosine(y, expected) >= 0.99, references.cosine(y, expected)  # int8's budget, against numpy


@pytest.mark.parametrize("mode", ["builtin", "native"])
def test_an_attention_mask_widened_with_new_axes_converts_where_the_stock_converter_stops(tmp_path, mode):
    """keras-hub's Gemma, CLIP text, PaliGemma and GPT-OSS widen a (batch, length, length) mask with
    mask[:, None, :, :] on dynamic shapes: the stock converter stops at that StridedSlice."""
    module = tf.Module()
    module.f = tf.function(lambda x: {"y": tf.where(x[:, None, :, :] > 0.0, tf.nn.gelu(x[:, None], False), -1.0)},
                           input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
    path = str(tmp_path / "mask")
    tf.saved_model.save(module, path, signatures={"serving_default": module.f})
    with pytest.raises(Exception, match="StridedSlice"):
        tf.lite.TFLiteConverter.from_saved_model(path).convert()
    _, report = converters.convert(path, mode=mode)
    assert report.verified and not report.flex_ops and report.ops.get("EXPAND_DIMS", 0) >= 1, report.ops
    assert all(comparison["passed"] for comparison in report.fidelity + report.drift), report.drift


_NUMPY_ORDERINGS = {"Less": np.less, "LessEqual": np.less_equal, "Greater": np.greater,
                    "GreaterEqual": np.greater_equal}


@st.composite
def orderings_of_booleans(draw):
    """(an ordering's op, the dtype a boolean is cast to, the constant compared with, whether the cast is first)."""
    dtype = draw(st.sampled_from([tf.int32, tf.int64, tf.float32]))
    values = [-1, 0, 1, 2] + ([-0.5, 0.5, 1.5] if dtype.is_floating else [])
    return (draw(st.sampled_from(sorted(_NUMPY_ORDERINGS))), dtype, draw(st.sampled_from(values)),
            draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(case=orderings_of_booleans())
def test_an_ordering_of_a_booleans_cast_computes_numpys_ordering_without_it(case):
    op, dtype, value, cast_first = case
    condition = np.array([[True, False, True], [False, False, True]])

    def ordered(b):
        cast, constant = tf.cast(b, dtype), tf.constant(value, dtype)
        return getattr(tf.raw_ops, op)(**dict(zip("xy", (cast, constant) if cast_first else (constant, cast))))

    function = tf.function(ordered).get_concrete_function(tf.TensorSpec([None, 3], tf.bool))
    graph_def = function.graph.as_graph_def()
    assert tf_ops_as_builtins.orderings_of_booleans_as_booleans(graph_def) == 1
    (result,) = _pruned_and_run(function, graph_def, condition)
    assert op not in {node.op for node in graph_def.node} and "Cast" not in {node.op for node in graph_def.node}
    operands = (condition.astype(np.float64), value) if cast_first else (value, condition.astype(np.float64))
    np.testing.assert_array_equal(result, _NUMPY_ORDERINGS[op](*operands))


def test_a_lookup_of_labels_cast_to_a_boolean_and_back_converts_where_the_stock_converter_stops(tmp_path):
    """keras-hub's SAM 3 casts its box labels to a boolean and back before its Embedding, whose lookup
    (`keras.ops.take`) compares the ids with 0: the stock converter folds that comparison into a ZEROS_LIKE of
    the boolean, which TFLite has no kernel for, and stops."""
    table = np.random.default_rng(12).normal(size=(2, 4)).astype(np.float32)

    def labelled(labels, x):
        ids = tf.cast(tf.cast(tf.where(labels != 0, 1, 0), tf.bool), tf.int32)
        return {"y": x + tf.gather(table, tf.where(ids < 0, ids + 2, ids))}

    path = conversions.saved_function(tmp_path, "labels", labelled, tf.TensorSpec([None, 1], tf.int32, name="labels"),
                                      tf.TensorSpec([None, 1, 4], tf.float32, name="x"))
    with pytest.raises(Exception, match="'tfl.zeros_like' op operand #0 must be tensor of"):
        tf.lite.TFLiteConverter.from_saved_model(path).convert()
    # select mode rewrites nothing, as the stock converter: its line names the op and keeps the converter's words,
    # where a location of calls within calls took the line's 400 characters before them
    with pytest.raises(errors.ConverterFailed, match=r"the TFLite converter failed: Less: 'tfl\.zeros_like' op "
                                                     r"operand #0 must be tensor of .* but got 'tensor<\?x1xi1>'$"):
        converters.convert(path, mode="select")
    labels = np.array([[0], [3], [-1]], np.int32)
    x = np.random.default_rng(13).normal(size=(3, 1, 4)).astype(np.float32)
    np.savez(tmp_path / "samples.npz", labels=labels, x=x)
    tflite_model, report = converters.convert(path, inputs=str(tmp_path / "samples.npz"))
    assert report.verified and all(comparison["passed"] for comparison in report.fidelity), report.fidelity
    y = verify.run_signature(tflite_model, "serving_default", {"labels": labels, "x": x})["y"]
    np.testing.assert_array_equal(y, x + table[(labels != 0).astype(int)])  # one float32 addition, as numpy's


_RANDOM_INT8 = {"int8": True, "calibration": "random:8"}


def _on_tflite_micro(path, int8):
    """(the .tflite, its report) of `path` converted for TFLite Micro (int8 from random samples, or float), having
    run there."""
    tflite_model, report = converters.convert(path, target="tflm", **(_RANDOM_INT8 if int8 else {}))
    assert report.verified and "TFLite Micro" in report.target["runtime_check"], report.target
    return tflite_model, report


def _saved(tmp_path, body, name):
    return conversions.saved_function(tmp_path, name, lambda x: {"y": body(x)}, tf.TensorSpec([None, 6, 4], tf.float32))


@pytest.mark.parametrize("mode, extra", [("builtin", {}), ("native", {}), ("builtin", {"target": "tflm"})])
def test_a_shifted_window_model_converts_without_roll(tmp_path, mode, extra):
    def shifted_window(x):
        return tf.roll(tf.nn.gelu(tf.roll(x, shift=[-2, 1], axis=[1, 2])), shift=[2, -1], axis=[1, 2])

    tflite_model, report = converters.convert(_saved(tmp_path, shifted_window, "shifted"), mode=mode, **extra)
    assert "ROLL" not in report.ops and not report.flex_ops, report.ops
    assert report.ops.get("CONCATENATION", 0) >= 4 and report.verified
    assert all(comparison["passed"] for comparison in report.fidelity + report.drift), report.drift


@st.composite
def transposes(draw):
    """A shape of five to seven axes and a permutation of them, the runs it keeps together drawn first, so that
    some do merge; the shape's sizes given to the graph or left unknown."""
    rank = draw(st.integers(5, 7))
    cuts = sorted(draw(st.sets(st.integers(1, rank - 1), max_size=rank - 2)))
    runs = [list(range(start, end)) for start, end in zip([0] + cuts, cuts + [rank])]
    permutation = [axis for run in draw(st.permutations(runs)) for axis in run]
    shape = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    return shape, permutation, draw(st.booleans())


@settings(max_examples=40, deadline=None)
@given(case=transposes())
def test_a_transpose_of_many_axes_becomes_one_of_fewer_and_computes_numpys_transpose(case):
    """Numpy's transpose is the reference, exactly (values only move); the transpose left has one axis per run
    of axes the permutation keeps together, and one that keeps none together is left as it is."""
    shape, permutation, known = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    function = tf.function(lambda v: tf.transpose(v, permutation)).get_concrete_function(
        tf.TensorSpec(shape if known else [None] * len(shape), tf.float32))
    graph_def = function.graph.as_graph_def()
    runs = 1 + sum(after != before + 1 for before, after in zip(permutation, permutation[1:]))
    assert tf_ops_as_builtins.transposes_of_fewer_axes(graph_def) == int(runs < len(permutation))
    output = function.outputs[0].name
    graph.prune(graph_def, [function.inputs[0].name, output])
    (transposed,) = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
        graph_def, input_map={function.inputs[0].name: tf.constant(x)}, return_elements=[output]), [])()
    np.testing.assert_array_equal(transposed.numpy(), np.transpose(x, permutation))
    nodes = graph.nodes_by_name(graph_def)
    ranks = [graph.constant_value(graph.data_inputs(node)[1], nodes).size for node in graph_def.node
             if node.op == "Transpose"]
    assert ranks == [runs], (ranks, permutation)


def test_swins_window_partition_of_six_axes_runs_on_tflite_micro(tmp_path):
    """Hugging Face Swin splits a feature map into windows with a transpose of six axes; TFLite Micro transposes
    five at most, and refused it. As a transpose of four, it runs there, integer throughout."""
    def windows(x):  # (1, 8, 8, 6) into 4x4 windows, Swin's window_partition
        blocks = tf.reshape(x, [1, 2, 4, 2, 4, 6])
        return tf.nn.gelu(tf.reshape(tf.transpose(blocks, [0, 1, 3, 2, 4, 5]), [4, 16, 6]), approximate=False)

    path = conversions.saved_function(tmp_path, "windows", lambda x: {"y": windows(x)},
                                      tf.TensorSpec([1, 8, 8, 6], tf.float32))
    _, report = _on_tflite_micro(path, int8=True)
    assert report.float_ops == {}, report.op_types


@st.composite
def cumsums(draw):
    """A shape of one to four axes, an axis (either sign) and int32 values, exclusive or reversed at times."""
    shape = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4).filter(lambda sizes: np.prod(sizes) <= 4096))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return shape, axis, draw(st.booleans()), draw(st.sampled_from([(False, False), (True, False), (False, True)]))


@settings(max_examples=40, deadline=None)
@given(case=cumsums())
def test_an_int32_cumsum_becomes_pads_and_adds_and_computes_numpys_cumsum(case):
    """Numpy's cumsum is the reference, exactly; an exclusive or reversed one is left to the converter."""
    shape, axis, negative, (exclusive, reverse) = case
    x = np.random.default_rng(len(shape)).integers(-1000 if negative else 0, 1000, shape).astype(np.int32)
    function = tf.function(lambda v: tf.math.cumsum(v, axis=axis, exclusive=exclusive, reverse=reverse)) \
        .get_concrete_function(tf.TensorSpec(shape, tf.int32))
    graph_def = function.graph.as_graph_def()
    plain = not exclusive and not reverse
    assert tf_ops_as_builtins.int32_cumsums_as_additions(graph_def) == int(plain)
    if plain:
        output = function.outputs[0].name
        graph.prune(graph_def, [function.inputs[0].name, output])
        assert "Cumsum" not in {node.op for node in graph_def.node}
        (summed,) = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
            graph_def, input_map={function.inputs[0].name: tf.constant(x)}, return_elements=[output]), [])()
        np.testing.assert_array_equal(summed.numpy(), np.cumsum(x, axis=axis))


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("positions", [tf.int32, tf.int64], ids=["RoBERTa's int32", "ESM's int64"])
def test_positions_counted_along_the_padding_mask_run_on_tflite_micro(tmp_path, int8, positions):
    """Hugging Face's RoBERTa family numbers its positions with an int32 cumsum of the padding mask, which TFLite
    Micro's CUMSUM does not take (it refused the model as it prepared it); for it, the count becomes PADs and
    ADDs. ESM counts in int64, which neither its CUMSUM nor its GATHER's indices take (refused before running):
    for a target, that arithmetic is int32 (integer_valued.int64_arithmetic_in_int32). Without a target, the
    CUMSUM and its type stay."""
    table = tf.constant(np.random.default_rng(3).normal(size=(20, 8)).astype(np.float32))

    def positions_embedded(ids):  # create_position_ids_from_input_ids, padding id 1
        mask = tf.cast(tf.math.not_equal(ids, 1), positions)
        return {"y": tf.nn.gelu(tf.gather(table, tf.math.cumsum(mask, axis=1) * mask + 1), approximate=False)}

    path = conversions.saved_function(tmp_path, "positions", positions_embedded,
                                      tf.TensorSpec([1, 16], tf.int32, name="ids"))
    on_micro, report = _on_tflite_micro(path, int8)
    assert "CUMSUM" not in report.ops
    assert not any("int64" in types for types in operators.typed_op_histogram(on_micro).values())
    tflite_model, _ = converters.convert(path, **(_RANDOM_INT8 if int8 else {}))
    assert operators.typed_op_histogram(tflite_model)["CUMSUM"] == {positions.name: 1}


@st.composite
def tiles(draw):
    """A shape of one to four axes and how often each is repeated: at times an axis of size above 1 repeated too,
    which no broadcast computes."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    times = [draw(st.integers(1, 3)) if size == 1 or draw(st.integers(0, 4)) == 0 else 1 for size in shape]
    return shape, times


@settings(max_examples=40, deadline=None)
@given(case=tiles())
def test_a_tile_of_axes_of_size_one_becomes_a_broadcast_and_computes_numpys_tile(case):
    """Numpy's tile is the reference, exactly; a tile that repeats an axis of size above 1 is left as it is."""
    shape, times = case
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    function = tf.function(lambda v: tf.tile(v, times)).get_concrete_function(tf.TensorSpec(shape, tf.float32))
    graph_def = function.graph.as_graph_def()
    broadcast = all(count == 1 or size == 1 for size, count in zip(shape, times))
    assert tf_ops_as_builtins.tiles_as_broadcasts(graph_def) == int(broadcast)
    output = function.outputs[0].name
    graph.prune(graph_def, [function.inputs[0].name, output])
    assert ("Tile" in {node.op for node in graph_def.node}) != broadcast
    (tiled,) = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
        graph_def, input_map={function.inputs[0].name: tf.constant(x)}, return_elements=[output]), [])()
    np.testing.assert_array_equal(tiled.numpy(), np.tile(x, times))


@pytest.mark.parametrize("int8", [False, True])
def test_funnels_tiles_and_repeats_run_on_tflite_micro_as_broadcasts(tmp_path, int8):
    """Hugging Face's Funnel widens masks with tf.tile and upsamples with tf.repeat (a Tile whose multiples
    constants compute), on axes of size 1; TFLite Micro has no TILE, and refused it. There, they become the
    broadcasts they are."""
    def widened(x):  # (1, 4, 8): a mask tiled over two heads, each position repeated twice
        mask = tf.tile(tf.reshape(tf.sigmoid(x[:, :, :4]), [1, 1, 4, 4]), [1, 2, 1, 1])
        upsampled = tf.repeat(x, repeats=2, axis=1)
        return {"mask": mask, "y": tf.nn.gelu(upsampled, approximate=False)}

    path = conversions.saved_function(tmp_path, "widened", widened, tf.TensorSpec([1, 4, 8], tf.float32, name="x"))
    assert "TILE" not in _on_tflite_micro(path, int8)[1].ops


@st.composite
def integer_max_pools(draw):
    """An NHWC shape, a window and strides over height and width (windows that overlap, skip and overhang), a
    padding, and integers anywhere in their dtype's range, its extremes among them."""
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    shape = [draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 7)), draw(st.integers(1, 3))]
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    window = [draw(st.integers(1, 3 if padding == "SAME" else size)) for size in shape[1:3]]
    strides = [draw(st.integers(1, 3)) for _ in range(2)]
    limits = np.iinfo(dtype)
    values = draw(st.lists(st.one_of(st.integers(int(limits.min), int(limits.max)), st.sampled_from(
        [int(limits.min), int(limits.max), -1, 0, 1, 2 ** 24 + 1])), min_size=int(np.prod(shape)),
        max_size=int(np.prod(shape))))
    return np.array(values, dtype).reshape(shape), window, strides, padding


def _max_pooled_by_loops(x, window, strides, padding):
    """Max pooling as TensorFlow documents it, window by window: SAME pads below the lowest value, the odd row
    or column after."""
    (height, width), counts = x.shape[1:3], []
    pads = []
    for size, length, stride in zip(window, (height, width), strides):
        count = -(-length // stride) if padding == "SAME" else (length - size) // stride + 1
        total = max((count - 1) * stride + size - length, 0) if padding == "SAME" else 0
        counts.append(count)
        pads.append((total // 2, total - total // 2))
    padded = np.pad(x.astype(object), [(0, 0), *pads, (0, 0)], constant_values=-np.inf)
    pooled = np.empty((x.shape[0], *counts, x.shape[3]), x.dtype)
    for row in range(counts[0]):
        for column in range(counts[1]):
            pooled[:, row, column] = padded[:, row * strides[0]:row * strides[0] + window[0],
                                            column * strides[1]:column * strides[1] + window[1]].max(axis=(1, 2))
    return pooled


@settings(max_examples=60, deadline=None)
@given(case=integer_max_pools())
def test_an_integer_max_pool_becomes_maxima_of_slices_and_computes_every_window_exactly(case):
    """Funnel Transformer pools its int32 mask with tf.nn.max_pool1d, which TFLite's MAX_POOL_2D (float32 and 8-
    and 16-bit integers) does not take. The loops above are the reference, exactly, on shapes the graph learns
    only when it runs; TensorFlow's own int32 pooling agrees."""
    x, window, strides, padding = case
    function = tf.function(lambda v: tf.nn.max_pool2d(v, window, strides, padding)).get_concrete_function(
        tf.TensorSpec([None] * 4, tf.as_dtype(x.dtype)))
    graph_def = function.graph.as_graph_def()
    assert tf_ops_as_builtins.integer_max_pools_as_maxima(graph_def) == 1
    (pooled,) = _pruned_and_run(function, graph_def, x)
    assert "MaxPool" not in {node.op for node in graph_def.node}
    expected = _max_pooled_by_loops(x, window, strides, padding)
    np.testing.assert_array_equal(pooled, expected)
    if x.dtype == np.int32:  # TensorFlow's CPU kernel pools int32 (not int64)
        np.testing.assert_array_equal(tf.nn.max_pool2d(tf.constant(x), window, strides, padding).numpy(), expected)


def test_a_float_max_pool_is_left_to_tflites_own():
    function = tf.function(lambda v: tf.nn.max_pool2d(v, 2, 2, "SAME")).get_concrete_function(
        tf.TensorSpec([None] * 4, tf.float32))
    assert tf_ops_as_builtins.integer_max_pools_as_maxima(function.graph.as_graph_def()) == 0


@pytest.mark.parametrize("mode", ["builtin", "native"])
def test_funnels_pooled_mask_converts_where_the_stock_converter_stops(tmp_path, mode):
    """Funnel's encoder halves its sequence and, with it, its int32 attention mask (max_pool1d of the negated
    mask, SAME); the stock converter stops at the int32 MaxPool. An odd length takes the padded last window."""
    def pooled(x, mask):
        halved_mask = -tf.nn.max_pool1d(-mask[:, :, None], 2, strides=2, padding="SAME")[:, :, 0]
        halved = tf.nn.avg_pool1d(tf.nn.gelu(x, approximate=False), 2, strides=2, padding="SAME")
        return {"y": halved * tf.cast(halved_mask, tf.float32)[:, :, None]}

    path = conversions.saved_function(tmp_path, "funnel_pooling", pooled,
                                      tf.TensorSpec([None, None, 4], tf.float32, name="x"),
                                      tf.TensorSpec([None, None], tf.int32, name="mask"))
    mask = np.ones((2, 7), np.int32)
    mask[0, 4:] = 0  # the first sample's last three positions are padding
    np.savez(tmp_path / "inputs.npz", x=np.random.default_rng(5).normal(size=(2, 7, 4)).astype(np.float32), mask=mask)
    _, report = converters.convert(path, mode=mode, inputs=str(tmp_path / "inputs.npz"))
    assert report.verified and "MAX_POOL_2D" not in report.ops and not report.flex_ops, report.ops
    assert report.ops["MAXIMUM"] >= 1 and report.gelus, report.ops


@pytest.mark.parametrize("use_window", [True, False], ids=["window", "whole"])
def test_an_einsum_in_a_branch_on_a_tensor_of_no_rank_converts_where_the_stock_converter_stops(tmp_path,
                                                                                                 use_window):
    """Longformer's sliding-window attention: a conditional whose branches differ in rank gives a tensor of no
    rank, and a second conditional's branch slices its chunks from it and multiplies them in an einsum. TensorFlow
    knows the slice's rank, the stock converter does not, and stopped at the einsum; given the rank its equation
    says, it is a BATCH_MATMUL, and computes what TensorFlow does on either branch."""
    def attended(probabilities, values, use_window):
        unranked = tf.cond(use_window, lambda: probabilities, lambda: probabilities[:, :, :, 0])
        return {"y": tf.cond(use_window, lambda: tf.einsum("blhs,bshd->blhd", unranked[:, :, :, :4], values),
                             lambda: tf.nn.gelu(values, approximate=False))}

    path = conversions.saved_function(tmp_path, "sliding_window", attended,
                                      tf.TensorSpec([None, None, 2, None], tf.float32, name="probabilities"),
                                      tf.TensorSpec([None, 4, 2, 3], tf.float32, name="values"),
                                      tf.TensorSpec([], tf.bool, name="use_window"))
    rng = np.random.default_rng(6)
    np.savez(tmp_path / "inputs.npz", probabilities=rng.uniform(size=(2, 5, 2, 6)).astype(np.float32),
             values=rng.normal(size=(2, 4, 2, 3)).astype(np.float32), use_window=np.array(use_window))
    _, report = converters.convert(path, inputs=str(tmp_path / "inputs.npz"))
    assert report.verified and not report.flex_ops and report.ops["BATCH_MATMUL"] >= 1, report.ops


@st.composite
def narrow_integer_comparisons(draw):
    dtype = draw(st.sampled_from([np.int8, np.uint8, np.int16, np.uint16]))
    limits = np.iinfo(dtype)
    values = st.one_of(st.integers(int(limits.min), int(limits.max)), st.sampled_from(
        [int(limits.min), int(limits.max), 0, 1]))
    pairs = draw(st.lists(st.tuples(values, values), min_size=1, max_size=12))
    return dtype, np.array(pairs, dtype).T


@settings(max_examples=40, deadline=None)
@given(case=narrow_integer_comparisons())
def test_comparisons_of_narrow_integers_become_int32_comparisons_and_compute_numpys(case):
    """LED compares its int8 mask with 0; TFLite's LESS and GREATER take 8- and 16-bit integers only as quantized
    values. Numpy's comparisons of the same integers are the reference, every order, extremes included."""
    dtype, (left, right) = case
    orders = (tf.math.less, tf.math.less_equal, tf.math.greater, tf.math.greater_equal)
    spec = tf.TensorSpec([None], tf.as_dtype(dtype))
    function = tf.function(lambda x, y: [order(x, y) for order in orders]).get_concrete_function(spec, spec)
    graph_def = function.graph.as_graph_def()
    assert tf_ops_as_builtins.narrow_integer_orderings_in_int32(graph_def) == 4
    results = _pruned_and_run(function, graph_def, left, right)
    compared = {node.attr["T"].type for node in graph_def.node if node.op in ("Less", "LessEqual", "Greater",
                                                                              "GreaterEqual")}
    assert compared == {tf.int32.as_datatype_enum}, compared
    expected = (left < right, left <= right, left > right, left >= right)
    for result, reference in zip(results, expected):
        np.testing.assert_array_equal(result, reference)


def test_leds_int8_mask_compared_with_zero_converts_where_the_stock_converter_stops(tmp_path):
    """LED's encoder casts its attention mask (0 padding, 1 local, 2 global) to int8 and compares it with 0."""
    def masked(x, mask):
        small = tf.cast(mask, tf.int8)
        is_padding, is_global = tf.math.less(small, 1), tf.math.greater(small, 1)
        return {"y": tf.where(is_padding[:, :, None], 0.0, tf.nn.gelu(x, approximate=False)),
                "global": tf.cast(is_global, tf.float32)}

    path = conversions.saved_function(tmp_path, "led_mask", masked,
                                      tf.TensorSpec([None, None, 4], tf.float32, name="x"),
                                      tf.TensorSpec([None, None], tf.int32, name="mask"))
    np.savez(tmp_path / "inputs.npz", x=np.random.default_rng(7).normal(size=(2, 5, 4)).astype(np.float32),
             mask=np.array([[2, 1, 1, 0, 0], [1, 1, 1, 1, 2]], np.int32))
    _, report = converters.convert(path, inputs=str(tmp_path / "inputs.npz"))
    assert report.verified and not report.flex_ops and report.gelus, report.ops


def test_a_roll_along_an_axis_of_unknown_size_is_left_and_named(tmp_path, capsys):
    path = _saved(tmp_path, lambda x: tf.roll(x, shift=1, axis=0), "batch_roll")  # the batch axis: size unknown
    code = cli.main([path, "-o", str(tmp_path / "m.tflite")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == errors.ConverterFailed.exit_code
    assert line.endswith("TFLite has no builtin op for TensorFlow op(s) Roll; --mode select keeps them as "
                         "TensorFlow ops (Flex), which the runtime must then link"), line


def test_any_other_op_tflite_lacks_is_named_in_one_line(tmp_path, capsys):
    path = _saved(tmp_path, lambda x: tf.math.bessel_i1(x) + tf.math.bessel_i0(x), "special")
    code = cli.main([path, "-o", str(tmp_path / "m.tflite")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == errors.ConverterFailed.exit_code
    assert "TFLite has no builtin op for TensorFlow op(s) BesselI0, BesselI1; --mode select keeps them" in line
    assert "loc(" not in line and "MLIR" not in line


def _lookups(tmp_path, name, computed):
    """A Keras 3 Embedding on the model's ids; with `computed`, also keras.ops.take at ids - 1 (id 0 reads the
    last row, by the wrap); exported with static shapes, and ids 0-7 to check it on."""
    import keras

    keras.utils.set_random_seed(2)
    ids = keras.Input((8,), batch_size=1, dtype="int32", name="ids")
    outputs = {"rows": keras.layers.Embedding(20, 4, name="table")(ids)}
    if computed:
        outputs["previous"] = keras.ops.take(keras.ops.arange(20, dtype="float32") * 0.5, ids - 1, axis=0)
    path = str(tmp_path / name)
    keras.Model(ids, outputs).export(path, verbose=False)
    np.savez(tmp_path / "ids.npz", ids=np.arange(8, dtype=np.int32)[None])
    return path, str(tmp_path / "ids.npz")


def test_an_embedding_gathers_the_models_ids_directly_and_computed_ids_keep_their_wrap(tmp_path):
    """keras.ops.take wraps negative ids first (LESS, ADD and an int32 SELECT_V2); the ids a model is given
    index the table directly; ids it computes keep the wrap, checked on an id whose computed index is -1."""
    path, inputs = _lookups(tmp_path, "lookups", computed=True)
    _, report = converters.convert(path, inputs=inputs)
    assert report.ops.get("GATHER") == 2 and report.ops.get("SELECT_V2") == 1 and report.ops.get("LESS") == 1, \
        report.ops
    assert report.verified and all(comparison["passed"] for comparison in report.fidelity), report.fidelity


def test_an_embedding_of_the_models_ids_runs_on_tflite_micro(tmp_path):
    """Refused before ("lacks 1 x SELECT_V2 (int32)"): now one GATHER, which TFLite Micro runs."""
    path, inputs = _lookups(tmp_path, "table", computed=False)
    _, report = converters.convert(path, target="tflm", inputs=inputs)
    assert set(report.ops) == {"GATHER"}, report.ops
    if report.target.get("agreement"):  # where tflite-micro is installed: run there, as LiteRT runs it
        assert all(agreement["max_abs"] == 0.0 for agreement in report.target["agreement"])


@st.composite
def products(draw):
    """Two operands' shapes and an einsum equation that sums no index: each operand's indices distinct, in any
    order, every one of them in the output (the output's order drawn too)."""
    letters = "abcde"[:draw(st.integers(1, 4))]
    sizes = dict(zip(letters, draw(st.lists(st.integers(1, 4), min_size=len(letters), max_size=len(letters)))))
    output = "".join(draw(st.permutations(letters)))
    first = "".join(draw(st.permutations(sorted(draw(st.sets(st.sampled_from(letters), min_size=1))))))
    rest = [letter for letter in letters if letter not in first]  # the second holds what the first lacks
    second = "".join(draw(st.permutations(rest + draw(st.lists(st.sampled_from(first), unique=True)))))
    if not second:
        second = first[0]
    return f"{first},{second}->{output}", [[sizes[letter] for letter in first], [sizes[letter] for letter in second]]


@settings(max_examples=40)
@given(case=products())
def test_an_einsum_that_sums_nothing_becomes_a_broadcast_mul_and_computes_numpys_einsum(case):
    """On operands of dynamic shape (where the stock converter's reshape to BATCH_MATMUL stops): numpy's own
    einsum is the reference, exactly (each output element is one product, as before)."""
    equation, shapes = case
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(shape).astype(np.float32) for shape in shapes)
    function = tf.function(lambda x, y: tf.einsum(equation, x, y)).get_concrete_function(
        *(tf.TensorSpec([None] * len(shape), tf.float32) for shape in shapes))
    graph_def = function.graph.as_graph_def()
    assert tf_ops_as_builtins.products_as_mul(graph_def) == 1
    output = function.outputs[0].name
    graph.prune(graph_def, [tensor.name for tensor in function.inputs] + [output])
    assert "Einsum" not in {node.op for node in graph_def.node}
    (product,) = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
        graph_def, input_map={function.inputs[0].name: tf.constant(a), function.inputs[1].name: tf.constant(b)},
        return_elements=[output]), [])()
    np.testing.assert_array_equal(product.numpy(), np.einsum(equation, a, b))


def test_an_einsum_that_sums_an_index_or_has_static_shapes_is_left_to_the_converter():
    """The stock converter lowers those itself (a contraction as BATCH_MATMUL; a static product)."""
    for equation, shapes in [("abc,cd->abd", ([None, None, 3], [3, 4])), ("ab,c->abc", ([2, 3], [4]))]:
        function = tf.function(lambda x, y, equation=equation: tf.einsum(equation, x, y)).get_concrete_function(
            *(tf.TensorSpec(shape, tf.float32) for shape in shapes))
        assert tf_ops_as_builtins.products_as_mul(function.graph.as_graph_def()) == 0, equation


@pytest.mark.parametrize("int8", [False, True])
def test_a_rotary_outer_product_on_dynamic_shapes_converts_where_the_stock_converter_stops(tmp_path, int8):
    """positions (batch, length) times frequencies (4,) as einsum("ab,c->abc"), as Gemma 4's rotary embedding
    spells it: the stock converter stops at the Einsum; ours is one MUL, compared with TensorFlow by the
    converter's own parity check (float: 1e-5 as every float conversion; int8: the default step bound)."""
    frequencies = tf.constant([1.0, 0.5, 0.25, 0.125])
    module = tf.Module()
    module.f = tf.function(lambda x: {"y": tf.sin(tf.einsum("ab,c->abc", x, frequencies))},
                           input_signature=[tf.TensorSpec([None, None], tf.float32)])
    path = str(tmp_path / "rotary")
    tf.saved_model.save(module, path, signatures={"serving_default": module.f})
    with pytest.raises(Exception, match="Einsum"):
        tf.lite.TFLiteConverter.from_saved_model(path).convert()
    positions = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.savez(tmp_path / "positions.npz", x=positions)
    extra = {"int8": True, "calibration": str(tmp_path / "positions.npz")} if int8 else {}
    tflite_model, report = converters.convert(path, inputs=str(tmp_path / "positions.npz"), **extra)
    assert "BATCH_MATMUL" not in report.ops and not report.flex_ops and report.ops.get("MUL", 0) >= 1, report.ops
    assert report.verified and all(comparison["passed"] for comparison in report.fidelity + report.drift)
    if not int8:  # an independent reference: numpy's outer product, through the .tflite itself
        (y,) = tflite_helpers.run(tflite_model, positions)
        expected = np.sin(np.einsum("ab,c->abc", positions.astype(np.float64), frequencies.numpy()))
        np.testing.assert_allclose(y, expected, atol=1e-5)  # float32 SIN of arguments up to 11: ~1e-6


def test_int64_abs_and_sign_become_min_max_and_compute_numpys_for_every_int64():
    """numpy's abs and sign are the reference, on the int64 extremes too (abs(-2**63) wraps in both)."""
    values = np.array([-2**63, -2**63 + 1, -2**40, -7, -1, 0, 1, 5, 2**40, 2**63 - 1], np.int64)
    function = tf.function(lambda v: (tf.abs(v), tf.sign(v))).get_concrete_function(tf.TensorSpec([None], tf.int64))
    graph_def = function.graph.as_graph_def()
    assert tf_ops_as_builtins.int64_abs_and_sign_as_min_max(graph_def) == 2
    outputs = [tensor.name for tensor in function.outputs]
    graph.prune(graph_def, [function.inputs[0].name] + outputs)
    assert not {"Abs", "Sign"} & {node.op for node in graph_def.node}
    absolute, sign = tf.compat.v1.wrap_function(lambda: tf.compat.v1.import_graph_def(
        graph_def, input_map={function.inputs[0].name: tf.constant(values)}, return_elements=outputs), [])()
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(absolute.numpy(), np.abs(values))
    np.testing.assert_array_equal(sign.numpy(), np.sign(values))


def test_relative_position_buckets_in_int64_convert_where_the_stock_converter_stops(tmp_path):
    """DeBERTa's buckets: the int64 distance between positions, its sign and magnitude (a log bucket past 2),
    on a dynamic length; the stock converter stops at int64 ABS and SIGN. The .tflite is compared with numpy's
    own buckets, exactly: every op on the way is integer or a float whose result is rounded to an integer."""
    def buckets(x):
        positions = tf.range(tf.shape(x, out_type=tf.int64)[1])
        distance = positions[:, None] - positions[None, :]
        magnitude = tf.abs(distance)
        logged = 2 + tf.cast(tf.math.floor(tf.math.log(tf.cast(tf.maximum(magnitude, 1), tf.float32))), tf.int64)
        bucket = tf.sign(distance) * tf.where(magnitude <= 2, magnitude, logged)
        return tf.cast(bucket, tf.float32)[None] * x[:, :1, None]

    module = tf.Module()
    module.f = tf.function(lambda x: {"y": buckets(x)}, input_signature=[tf.TensorSpec([None, None], tf.float32)])
    path = str(tmp_path / "buckets")
    tf.saved_model.save(module, path, signatures={"serving_default": module.f})
    with pytest.raises(Exception, match="Abs|Sign"):
        tf.lite.TFLiteConverter.from_saved_model(path).convert()
    x = np.ones((1, 9), np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    tflite_model, report = converters.convert(path, inputs=str(tmp_path / "x.npz"))
    assert not {"ABS", "SIGN"} & set(report.ops) and report.ops.get("MAXIMUM", 0) >= 2 and "MINIMUM" in report.ops, \
        report.ops
    distance = np.arange(9)[:, None] - np.arange(9)[None, :]
    magnitude = np.abs(distance)
    expected = np.sign(distance) * np.where(magnitude <= 2, magnitude,
                                            2 + np.floor(np.log(np.maximum(magnitude, 1))).astype(np.int64))
    (y,) = tflite_helpers.run(tflite_model, x)
    np.testing.assert_array_equal(y[0], expected.astype(np.float32))


def test_a_square_root_of_an_int8_tensor_is_a_lookup_on_tflite_micro(tmp_path):
    """ConvNeXt V2's global response normalization takes the square root of a sum of squares: TFLite Micro's
    SQRT computes float32 alone (it refused the int8 model as it ran it). For it, the SQRT is kept float, and that
    float function of one int8 tensor becomes a lookup in a table of its results; other targets keep an int8
    SQRT."""
    def normalized(x):
        norms = tf.sqrt(tf.reduce_sum(x * x, axis=-1, keepdims=True))
        return {"y": tf.nn.gelu(x, approximate=False) * norms}

    path = conversions.saved_function(tmp_path, "norms", normalized, tf.TensorSpec([1, 4, 8], tf.float32, name="x"))
    _, on_micro = _on_tflite_micro(path, int8=True)  # an int8 model's report holds its ops' output types
    assert "SQRT" not in on_micro.ops and on_micro.islands_made_integer == {"SQRT": 1}, on_micro.op_types
    assert set(on_micro.op_types) - {"QUANTIZE", "DEQUANTIZE"} and not any(
        "float32" in types for op, types in on_micro.op_types.items() if op not in ("QUANTIZE", "DEQUANTIZE"))
    tflite_model, _ = converters.convert(path, **_RANDOM_INT8)
    assert operators.typed_op_histogram(tflite_model)["SQRT"] == {"int8": 1}
