"""Float arithmetic on integer values done in int32 for int8 models: keras-hub's causal mask, built in float from
a dynamic sequence length, integer throughout; quantized positions (ALiBi) looked up in int8 tables; any graph
computing the same values after either pass."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from conftest import keras
from conftest import keras3_only
from conversions import QAT_INT8_STEPS
from keras_gelu import converters
from keras_gelu.converters.rewriting import graph
from keras_gelu.converters.rewriting import integer_valued
import keras_gelu.qat

pytestmark = pytest.mark.legs("keras3")  # TensorFlow graphs rewritten before any converter: one leg

_LENGTH = 5


def _traced(build, specs, feeds):
    """(the GraphDef of `build` on placeholders of `specs` (dtype, shape), its output names, {placeholder name:
    feed}, the outputs on `feeds`)."""
    with tf.Graph().as_default() as traced:
        placeholders = [tf.compat.v1.placeholder(dtype, shape) for dtype, shape in specs]
        outputs = [tensor.name for tensor in tf.nest.flatten(build(*placeholders))]
    graph_def = traced.as_graph_def()
    inputs = dict(zip([placeholder.name for placeholder in placeholders], feeds))
    return graph_def, outputs, inputs, _run(graph_def, inputs, outputs)


def _rewritten_outputs(build, specs, feeds, rewrite=integer_valued.integer_arithmetic_in_int32):
    """(the outputs of `build` on placeholders of `specs` (dtype, shape) fed `feeds`, the same after the pass
    `rewrite`, how many sinks it rewrote, the (op, type) pairs of the rewritten graph pruned to its outputs)."""
    graph_def, outputs, inputs, before = _traced(build, specs, feeds)
    rewritten = rewrite(graph_def)
    graph.prune(graph_def, outputs + list(inputs))
    typed_ops = {(node.op, tf.as_dtype(value.type).name) for node in graph_def.node for key, value in node.attr.items()
                 if key in ("T", "dtype", "DstT", "SrcT", "Tidx", "Tparams", "Tindices") and value.HasField("type")}
    return before, _run(graph_def, inputs, outputs), rewritten, typed_ops


def _run(graph_def, feeds, outputs):
    """The outputs of a GraphDef, in a graph of its own (its functions named as the traced function's are)."""
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=scratch) as session:
            return session.run(outputs, feeds)


def _float_ops(typed_ops):
    return sorted(op for op, dtype in typed_ops if dtype == "float32" and op not in ("Placeholder", "Shape"))


def _causal_mask(x, cache_index):
    """keras-hub's compute_causal_mask (transformer_layer_utils), on a dynamic sequence length."""
    length = tf.shape(x)[1]
    i = tf.expand_dims(tf.range(tf.cast(length, tf.float32)) + tf.cast(cache_index, tf.float32), 1)
    j = tf.range(tf.cast(length, tf.float32))
    return tf.expand_dims(i >= j, 0)


def test_the_causal_mask_is_computed_in_int32():
    before, after, rewritten, typed_ops = _rewritten_outputs(
        _causal_mask, [(tf.float32, [None, None]), (tf.int32, [])], [np.zeros([1, 6], np.float32), 2])
    assert rewritten == 1
    assert _float_ops(typed_ops) == []
    np.testing.assert_array_equal(after[0], before[0])


@pytest.mark.parametrize("comparison, bound", [(tf.greater, 0.5), (tf.greater_equal, 0.5), (tf.less, -1.5),
                                               (tf.less_equal, 2.25), (lambda x, c: tf.greater(c, x), 0.5),
                                               (lambda x, c: tf.less_equal(c, x), -0.5)])
def test_an_integer_compared_with_a_fraction_is_compared_with_an_integer(comparison, bound):
    """Keras's Softmax keeps `mask > 0.5`, a float comparison of an integer mask."""
    before, after, rewritten, typed_ops = _rewritten_outputs(lambda mask: comparison(tf.cast(mask, tf.float32), bound),
                                                             [(tf.int32, [None])], [np.arange(-3, 4)])
    assert rewritten == 1 and _float_ops(typed_ops) == []
    np.testing.assert_array_equal(after[0], before[0])


@pytest.mark.parametrize("build", [
    lambda n: tf.cast(tf.cast(n, tf.float32) * 0.5, tf.int32),  # a fraction along the way
    lambda n: tf.cast(tf.cast(n, tf.float32) * 2.0 ** 24, tf.int32),  # a constant float32 is not exact past
    lambda n: tf.cast(n, tf.float32) / 3.0 >= 1.0,  # a division
    lambda n: tf.cast(tf.math.floordiv(7.0, tf.cast(n, tf.float32)), tf.int32),  # 0 it may be
    lambda n: tf.equal(tf.cast(n, tf.float32), 0.5),  # an integer equal to a fraction: left as it is
    lambda n: tf.sqrt(tf.cast(n, tf.float32)) > 1.0,  # an op the pass does not know
], ids=["fraction", "large constant", "division", "dynamic divisor", "equal to a fraction", "unknown op"])
def test_what_may_not_hold_integers_is_left_as_it_is(build):
    before, after, rewritten, _ = _rewritten_outputs(build, [(tf.int32, [])], [3])
    assert rewritten == 0
    np.testing.assert_array_equal(after[0], before[0])


def test_a_float_reader_keeps_the_float_values_and_an_int64_cast_its_type():
    def build(n):
        positions = tf.range(tf.cast(n, tf.float32))
        return tf.cast(positions, tf.int64), positions * 0.5

    before, after, rewritten, typed_ops = _rewritten_outputs(build, [(tf.int32, [])], [4])
    assert rewritten == 1
    assert ("Range", "float32") in typed_ops and ("Range", "int32") in typed_ops
    assert after[0].dtype == np.int64 and after[1].dtype == np.float32
    for value_after, value_before in zip(after, before):
        np.testing.assert_array_equal(value_after, value_before)


def test_a_control_flow_branch_is_rewritten_with_the_graph():
    def build(n, flag):
        return tf.cond(flag, lambda: tf.cast(tf.range(tf.cast(n, tf.float32)) + 1.0, tf.int32),
                       lambda: tf.cast(tf.range(tf.cast(n, tf.float32)) * 0.5, tf.int32))

    function = tf.function(build).get_concrete_function(tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.bool))
    graph_def = graph.with_passes(function.graph.as_graph_def(), [integer_valued.integer_arithmetic_in_int32])
    branches = {function.signature.name: {node.op for node in function.node_def}
                for function in graph_def.library.function}
    assert sorted("Range" in ops and "Mul" not in ops and "Identity" in ops for ops in branches.values()) == [
        False, True]
    for flag in (True, False):
        (after,) = _run(graph_def, {function.inputs[0].name: 5, function.inputs[1].name: flag},
                        [function.outputs[0].name])
        np.testing.assert_array_equal(after, function(tf.constant(5), tf.constant(flag)).numpy())


# Each op of a random graph: (how many operands, the op on float tensors of shape [_LENGTH] or scalars).
_BOUNDED = 1000.0  # every value clipped into +-1000 after each op (Maximum, Minimum): products stay below 2**24
_INTEGER_OPS = {
    "add": (2, tf.add), "sub": (2, tf.subtract), "mul": (2, tf.multiply), "maximum": (2, tf.maximum),
    "minimum": (2, tf.minimum), "neg": (1, tf.negative), "abs": (1, tf.abs), "floor": (1, tf.floor),
    "ceil": (1, tf.math.ceil), "round": (1, tf.round), "rint": (1, tf.math.rint),
    "floordiv": (1, lambda x: tf.math.floordiv(x, -3.0)), "floormod": (1, lambda x: tf.math.floormod(x, 7.0)),
    "select": (2, lambda x, y: tf.where(x > y, x, y)),
    "expand and squeeze": (1, lambda x: tf.squeeze(tf.expand_dims(x, 0), 0)),
    "reshape": (1, lambda x: tf.reshape(tf.reshape(x, [-1, 1]), [-1])),
    "transpose": (1, lambda x: tf.reshape(tf.transpose(tf.reshape(x, [-1, 1])), [-1])),
    "strided slice": (1, lambda x: x[::-1]), "slice": (1, lambda x: tf.slice(tf.tile(x, [2]), [1], [_LENGTH])),
    "concat": (2, lambda x, y: tf.concat([x, y], 0)[_LENGTH // 2:_LENGTH // 2 + _LENGTH]),
    "pack": (2, lambda x, y: tf.stack([x, y])[1]),
    "gather": (1, lambda x: tf.gather(x, [4, 0, 3, 1, 2])),
    "broadcast": (1, lambda x: tf.broadcast_to(tf.expand_dims(x, 0), [2, _LENGTH])[1]),
}
_NON_INTEGER_OPS = {"half": (1, lambda x: x * 0.5), "divided": (1, lambda x: x / 3.0),
                    "square root": (1, lambda x: tf.sqrt(tf.abs(x)))}
_SINKS = {"less": tf.less, "less or equal": tf.less_equal, "greater": tf.greater, "greater or equal": tf.greater_equal,
          "equal": tf.equal, "not equal": tf.not_equal, "int32": lambda x, y: tf.cast(x - y, tf.int32),
          "int64": lambda x, y: tf.cast(x + y, tf.int64), "above a half": lambda x, y: x > 0.5}


@st.composite
def arithmetic_graphs(draw, ops, sinks, sources, now_and_then=None):
    """A random graph over `sources` source tensors, as a list of steps (op name, operand positions), each an op of
    `ops` (or, now and then, of `now_and_then`), and its sinks (name of `sinks`, operand positions)."""
    steps = []
    for count in range(draw(st.integers(1, 8))):
        names = list(ops) + (list(now_and_then) if now_and_then and draw(st.integers(0, 4)) == 0 else [])
        name = draw(st.sampled_from(names))
        arity = {**ops, **(now_and_then or {})}[name][0]
        steps.append((name, [draw(st.integers(0, sources - 1 + count)) for _ in range(arity)]))
    sinks = [(draw(st.sampled_from(sorted(sinks))), [draw(st.integers(0, sources - 1 + len(steps))) for _ in range(2)])
             for _ in range(draw(st.integers(1, 3)))]
    return steps, sinks


def _computed(sources, steps, sinks, ops, sink_ops, bound):
    """The sinks' tensors of a graph `arithmetic_graphs` drew, each step's result clipped into +-`bound`."""
    tensors = list(sources)
    for name, positions in steps:
        tensors.append(tf.minimum(tf.maximum(ops[name][1](*[tensors[position] for position in positions]), -bound),
                                  bound))
    return [sink_ops[name](*[tensors[position] for position in positions]) for name, positions in sinks]


def _float_sources(values, values64, flags, length):
    return [tf.cast(values, tf.float32), tf.cast(values64, tf.float32), tf.cast(flags, tf.float32),
            tf.range(-2.0, tf.cast(length, tf.float32) - 2.0), tf.constant([3.0, -7.0, 0.0, 12.0, -1.0])]


@settings(max_examples=40, deadline=None)
@given(case=arithmetic_graphs(_INTEGER_OPS, _SINKS, 5, _NON_INTEGER_OPS), seed=st.integers(0, 2 ** 16))
def test_random_integer_valued_graphs_compute_the_same_in_int32(case, seed):
    steps, sinks = case
    rng = np.random.default_rng(seed)
    feeds = [rng.integers(-50, 50, _LENGTH), rng.integers(-50, 50, _LENGTH), rng.integers(0, 2, _LENGTH) == 1,
             _LENGTH]
    operations = {**_INTEGER_OPS, **_NON_INTEGER_OPS}
    before, after, rewritten, typed_ops = _rewritten_outputs(
        lambda *inputs: _computed(_float_sources(*inputs), steps, sinks, operations, _SINKS, _BOUNDED),
        [(tf.int32, [None]), (tf.int64, [None]), (tf.bool, [None]), (tf.int32, [])], feeds)
    for value_after, value_before in zip(after, before):
        assert value_after.dtype == value_before.dtype
        np.testing.assert_array_equal(value_after, value_before)
    if not any(name in _NON_INTEGER_OPS for name, _ in steps):
        assert rewritten >= len(sinks)  # (a select's own comparison among them)
        assert _float_ops(typed_ops) == []


# int64 index arithmetic (integer_valued.int64_arithmetic_in_int32): the integer ops, on int64 tensors of shape
# [_LENGTH], with a running sum; sinks reading int64 as GATHER's indices, CAST and comparisons do.
_INT64_OPS = {name: _INTEGER_OPS[name] for name in (
    "add", "sub", "mul", "maximum", "minimum", "neg", "abs", "select", "expand and squeeze", "reshape", "transpose",
    "strided slice", "slice", "concat", "pack", "gather", "broadcast")}
_INT64_OPS["running sum"] = (1, lambda x: tf.math.cumsum(x))
_INT64_SINKS = {"less": tf.less, "equal": tf.equal, "float": lambda x, y: tf.cast(x - y, tf.float32),
                "int32": lambda x, y: tf.cast(x * y, tf.int32),
                # x - y within +-2000 (each operand clipped into +-1000): an index into 4001 entries
                "indices": lambda x, y: tf.gather(tf.range(-4000, 4001, 2, dtype=tf.int64) * 3,
                                                  x - y + 2 * int(_BOUNDED))}


def _int64_sources(values, flags):
    return [tf.cast(values, tf.int64), tf.cast(flags, tf.int64), tf.constant([3, -7, 0, 12, -1], tf.int64),
            tf.cast(values, tf.int64) * tf.constant(-2, tf.int64)]


@settings(max_examples=30, deadline=None)
@given(case=arithmetic_graphs(_INT64_OPS, _INT64_SINKS, 4), seed=st.integers(0, 2 ** 16))
def test_random_int64_index_arithmetic_computes_the_same_in_int32(case, seed):
    steps, sinks = case
    rng = np.random.default_rng(seed)
    bound = np.int64(_BOUNDED)
    before, after, rewritten, typed_ops = _rewritten_outputs(
        lambda *inputs: _computed(_int64_sources(*inputs), steps, sinks, _INT64_OPS, _INT64_SINKS, bound),
        [(tf.int32, [_LENGTH]), (tf.bool, [_LENGTH])],
        [rng.integers(-50, 50, _LENGTH), rng.integers(0, 2, _LENGTH) == 1], integer_valued.int64_arithmetic_in_int32)
    for value_after, value_before in zip(after, before):
        assert value_after.dtype == value_before.dtype
        np.testing.assert_array_equal(value_after, value_before)
    assert rewritten >= len(sinks)  # (a select's own comparison among them)
    # what is left in int64: the table the indices read (a sink's own values, not index arithmetic)
    assert {op for op, dtype in typed_ops if dtype == "int64"} <= {"Range", "Mul", "Const", "GatherV2"}, typed_ops


@keras3_only
def test_a_causal_mask_on_a_dynamic_length_is_integer_in_the_int8_model():
    """keras-hub's decoders' mask, as keras.ops spell it: CAST, RANGE and EXPAND_DIMS stayed float."""
    ops = keras.ops

    class CausalScores(keras.layers.Layer):
        def call(self, h):
            length = ops.shape(h)[1]
            i = ops.expand_dims(ops.arange(length, dtype="float32") + ops.cast(0, "float32"), 1)
            mask = ops.expand_dims(i >= ops.arange(length, dtype="float32"), 0)
            return ops.where(mask, ops.matmul(h, ops.transpose(h, (0, 2, 1))), 0.0)

    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, CausalScores()(keras.layers.Dense(8)(inputs)))
    _, report = converters.convert(model, int8=True, calibration="random:4")
    assert report.float_ops == {}
    assert all(fidelity["passed"] for fidelity in report.fidelity)


def _fake_quant(x, low, high, bits, narrow, with_variables):
    if with_variables:
        return tf.quantization.fake_quant_with_min_max_vars(x, tf.constant(low), tf.constant(high), num_bits=bits,
                                                            narrow_range=narrow)
    return tf.quantization.fake_quant_with_min_max_args(x, min=low, max=high, num_bits=bits, narrow_range=narrow)


@st.composite
def quantized_positions(draw):
    """A FakeQuant's range and settings, and the constant (or None) integer positions are multiplied by first."""
    low = draw(st.floats(-40, 0, width=32))
    high = draw(st.floats(0.5, 40, width=32))
    factor = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.0, 0.5, -0.25, 1.0, -3.0, 0.0625, 1 / 3]),
                                                min_size=1, max_size=4)))
    return low, high, draw(st.integers(4, 8)), draw(st.booleans()), draw(st.booleans()), factor


@settings(max_examples=40, deadline=None)
@given(case=quantized_positions(), seed=st.integers(0, 2 ** 16))
def test_quantized_positions_are_looked_up_to_the_same_values(case, seed):
    """Bloom's ALiBi: FakeQuant(cast(positions)); Falcon's: FakeQuant(slopes * cast(positions)), widened before
    the FakeQuant reads it. Integers far past the range saturate as the FakeQuant does."""
    low, high, bits, narrow, with_variables, factor = case

    def build(positions):
        values = tf.cast(positions, tf.float32)
        if factor is not None:
            values = tf.expand_dims(tf.constant(np.array(factor, np.float32).reshape(-1, 1)) * values, 0)
        return _fake_quant(values, low, high, bits, narrow, with_variables)

    positions = np.random.default_rng(seed).integers(-300, 300, [1, 9])
    positions[0, :3] = [0, -1, 1]
    graph_def, outputs, inputs, before = _traced(build, [(tf.int32, [1, None])], [positions])
    assert integer_valued.quantized_integers_as_lookups(graph_def) == 1
    np.testing.assert_array_equal(_run(graph_def, inputs, outputs)[0], before[0])


@pytest.mark.parametrize("build", [
    lambda n: _fake_quant(tf.sqrt(tf.cast(n, tf.float32)), -1.0, 1.0, 8, False, True),  # no integers
    lambda n: _fake_quant(tf.cast(n, tf.float32), -1e6, 1e6, 8, False, True),  # a table of two million entries
    lambda n: _fake_quant(tf.cast(n, tf.float32) * tf.sqrt(tf.cast(n, tf.float32)), -1.0, 1.0, 8, False, True),
], ids=["no integers", "table too large", "no constant factor"])
def test_what_is_no_lookup_of_integers_is_left_as_it_is(build):
    graph_def, _, _, _ = _traced(build, [(tf.int32, [None])], [np.arange(4)])
    assert integer_valued.quantized_integers_as_lookups(graph_def) == 0


@keras3_only
def test_quantized_position_biases_are_integer_in_the_int8_model():
    """ALiBi as Falcon spells it: integer distances cast to float, times per-head slopes, added to the scores;
    CAST and QUANTIZE stayed float."""
    ops = keras.ops
    slopes = np.array([[0.5], [0.25]], np.float32)

    class PositionBias(keras.layers.Layer):
        def call(self, h):
            length = ops.shape(h)[1]
            bias = ops.cast(ops.expand_dims(ops.arange(length) - length + 1, 0), "float32") * slopes
            scores = ops.matmul(h, ops.transpose(h, (0, 2, 1)))
            return ops.expand_dims(scores, 1) + ops.expand_dims(ops.expand_dims(bias, 0), -1)

    keras.utils.set_random_seed(0)
    inputs = keras.Input((None, 8))
    model = keras.Model(inputs, PositionBias()(keras.layers.Dense(8)(inputs)))
    qat = keras_gelu.qat.quantize_model(model)
    data = np.random.default_rng(0).normal(size=(8, 6, 8)).astype("float32")
    qat.compile("adam", "mse")
    qat.fit(data, model(data), verbose=0, epochs=1)
    _, report = converters.convert(qat, int8=True)
    assert report.float_ops == {}
    assert all(fidelity["passed"] and fidelity["steps"] <= QAT_INT8_STEPS for fidelity in report.fidelity)
