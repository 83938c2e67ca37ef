"""Float (or int64) arithmetic on integer values, done in int32: the causal masks of keras-hub's decoders.

keras-hub builds a decoder's causal mask in float from the dynamic sequence
length (`compute_causal_mask`: `arange(length, dtype="float32")`, plus the
cache index cast to float, compared with another float arange). In an int8
model those stay float ops (CAST int32 to float32, RANGE, EXPAND_DIMS) before
a comparison that leaves as bool: GPT-2, Bart, Falcon, Bloom... were not
integer throughout for a mask that holds positions. A float tensor whose
values are provably integers is computed in int32 instead where it leaves as
an integer:

* its sources: a Cast from an integer type or bool; a float Const whose
  values are all integers below 2**24 in magnitude; a Range whose start,
  limit and delta are such values;
* ops that keep integer values integer: Add, Sub, Mul, Neg, Abs, Maximum,
  Minimum, Floor, Ceil, Round and Rint (the identity on integers), FloorDiv and
  FloorMod by a constant with no zero (int32 division by zero is an error
  where float's is inf), Select of two integer-valued operands, and ops that
  only move values (Reshape, ExpandDims, StridedSlice, ConcatV2, the params of
  GatherV2...);
* sinks, where the value leaves as an integer: a comparison whose float
  operands are both integer-valued, or one of them and a float constant
  (compared with its integer bound instead: Keras's Softmax keeps
  `mask > 0.5`, which is `mask > 0` on integers), a Cast from float to int32
  or int64.

A sink whose whole backward closure is integer-valued reads int32 twins of
that closure; any other sink is left as it is. Float readers that are not
sinks keep reading the original float nodes, so nothing else changes; an
original that nothing reads any more is pruned by the converter.

The twins compute what the float ops compute wherever float32 is exact, that
is where every value along the way is below 2**24 in magnitude, as positions
and lengths are; beyond, the float ops round and the int32 ones do not.

A second pass, for quantization-aware models, takes integer values where they
leave through a FakeQuant: FakeQuant(x), or FakeQuant(x * c) with c a float
constant (Bloom's ALiBi bias casts integer distances to float and quantizes
them; Falcon's multiplies them by per-head slopes first), becomes a lookup
into a constant table of what that FakeQuant gives each integer, indexed by x
in int32 clipped to the span past which every value saturates. The same values
exactly, bit for bit, at any sequence length: a GATHER of an int8 table, where
the CAST and MUL stayed float before a QUANTIZE.

A third, for any target (`pipeline`'s builtin rewrites where one is named), takes int64 values the same way:
int64 integer arithmetic from narrower integers and int64 constants, with Cumsum among its ops, read as a
GatherV2's indices, cast, or compared, is computed in int32 (ESM counts its positions in int64, which TFLite
Micro's CUMSUM and GATHER's indices do not take).

The first two are `int8.GRAPH_PASSES`, not `tf_ops_as_builtins.TO_BUILTINS`:
a float model is integer nowhere, and a float runtime is what such a model is
for; the GPU delegate, one, runs float ops and leaves int32 arithmetic to the
CPU. An int8 model's bar is integer throughout, which float positions fail.
"""

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import types_pb2

from . import graph

_FLOAT32 = types_pb2.DT_FLOAT
_INT32 = types_pb2.DT_INT32
_INT64 = types_pb2.DT_INT64
# Integers float32 holds exactly, and sums and products of them in range: 2**24 is the first past which an odd
# integer is not a float32.
_EXACT_BELOW = 2 ** 24
# Larger float constants are not read: a mask's constants are scalars, and a weight is no integer.
_LARGEST_CONSTANT = 2 ** 16

_INTEGER_TYPES = (types_pb2.DT_BOOL, types_pb2.DT_INT8, types_pb2.DT_UINT8, types_pb2.DT_INT16,
                  types_pb2.DT_UINT16, types_pb2.DT_INT32, types_pb2.DT_INT64)
# A Cast from float to these keeps every value an int32 holds (a narrower type would wrap an int32 where a
# float's cast saturates).
_CAST_SINK_TYPES = (types_pb2.DT_INT32, types_pb2.DT_INT64)
_COMPARISONS = ("Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual")
# For `x OP c`, x integer and c a constant, the integer that c may be rounded to (x > 0.5 is x > 0, x >= 0.5 is
# x >= 1); for `c OP x`, the other way.
_ROUNDING_OF_A_SECOND_CONSTANT = {"Greater": np.floor, "LessEqual": np.floor, "GreaterEqual": np.ceil,
                                  "Less": np.ceil}
_ROUNDING_OF_A_FIRST_CONSTANT = {"Greater": np.ceil, "LessEqual": np.ceil, "GreaterEqual": np.floor,
                                 "Less": np.floor}
_ELEMENTWISE = ("Add", "AddV2", "Sub", "Mul", "Maximum", "Minimum", "Neg", "Abs")
_IDENTITY_ON_INTEGERS = ("Floor", "Ceil", "Round", "Rint")
_DIVISIONS = ("FloorDiv", "FloorMod")
_SELECTS = ("Select", "SelectV2")
# Ops that move their first input's values and compute none (the others are shapes, indices, axes).
_MOVING_FIRST = ("Identity", "ExpandDims", "Reshape", "Squeeze", "StridedSlice", "Slice", "Tile", "BroadcastTo",
                 "Transpose", "GatherV2")
# Narrower than int64: a Cast of one to int64 is a source of int64 values an int32 holds.
_NARROWER_THAN_INT64 = tuple(dtype for dtype in _INTEGER_TYPES if dtype != _INT64)


def _value_positions(node):
    """The positions of a node's data inputs that carry its values, where its op keeps integers integer; else
    None."""
    count = len(graph.data_inputs(node))
    if node.op in _ELEMENTWISE or node.op in _IDENTITY_ON_INTEGERS or node.op in _DIVISIONS \
            or node.op in ("Pack", "Range"):
        return list(range(count))
    if node.op in _SELECTS:
        return [1, 2]
    if node.op == "ConcatV2":
        return list(range(count - 1))
    if node.op in _MOVING_FIRST or node.op == "Cumsum":  # (a running sum of integers: integers)
        return [0]
    return None


def _type_attribute(node):
    return {"GatherV2": "Tparams", "Range": "Tidx", "Const": "dtype", "Cast": "DstT"}.get(node.op, "T")


def _integer_constant(node):
    """Whether a float or int64 Const holds integers int32 holds (and float32 exactly)."""
    tensor = node.attr["value"].tensor
    if np.prod([dim.size for dim in tensor.tensor_shape.dim]) > _LARGEST_CONSTANT:
        return False
    value = tf.make_ndarray(tensor)
    return bool(np.all(np.isfinite(value)) and np.all(np.abs(value) < _EXACT_BELOW) and np.all(value == np.round(
        value)))


class _IntegerValues:
    """Which tensors of a type (float32, or int64) of a graph hold integers an int32 holds, and their int32
    twins, made on demand."""

    def __init__(self, graph_def, values_type=_FLOAT32):
        self.graph_def = graph_def
        self.values_type = values_type
        self.nodes = graph.nodes_by_name(graph_def)
        self.known = {}  # node name -> whether its output holds integers
        self.twins = {}  # node name -> the int32 tensor that holds its values

    def _operands(self, node):
        """The tensors whose integer values make the node's integer; None where no values of its can be."""
        if graph.attribute(node, _type_attribute(node), None) != self.values_type:
            return None
        if node.op == "Const":
            return [] if _integer_constant(node) else None
        if node.op == "Cast":
            sources = _INTEGER_TYPES if self.values_type == _FLOAT32 else _NARROWER_THAN_INT64
            return [] if graph.attribute(node, "SrcT", None) in sources else None
        positions = _value_positions(node)
        if positions is None or (node.op == "Cumsum" and self.values_type == _FLOAT32):
            # a float running sum stays float: an int32 CUMSUM, which TFLite Micro lacks, is spelled in additions
            # (tf_ops_as_builtins) before the int8 passes make twins
            return None
        operands = graph.data_inputs(node)
        if node.op in _DIVISIONS:
            divisor = graph.constant_value(operands[1], self.nodes)
            if divisor is None or np.any(divisor == 0):
                return None
        return [operands[position] for position in positions]

    def holds_integers(self, tensor):
        """Whether a float tensor's values are all integers, by what computes it (iteratively: a mask's
        closure is shallow, but nothing bounds another graph's)."""
        pending, visiting = [tensor], set()
        while pending:
            name, index = graph.split_tensor_name(pending[-1])
            node = self.nodes.get(name)
            if name in self.known:
                pending.pop()
                continue
            operands = None if node is None or index != 0 else self._operands(node)
            if operands is None:
                self.known[name] = False
                pending.pop()
                continue
            unknown = [operand for operand in operands if graph.split_tensor_name(operand)[0] not in self.known]
            if any(graph.split_tensor_name(operand)[0] in visiting for operand in unknown):
                self.known[name] = False  # a loop (a v1 while's): not a closure the pass can copy
                pending.pop()
                continue
            if unknown:
                visiting.add(name)
                pending.extend(unknown)
                continue
            self.known[name] = all(self.known[graph.split_tensor_name(operand)[0]]
                                   and graph.split_tensor_name(operand)[1] == 0 for operand in operands)
            pending.pop()
        return self.known[graph.split_tensor_name(tensor)[0]] and graph.split_tensor_name(tensor)[1] == 0

    def twin(self, tensor):
        """The int32 tensor holding an integer-valued float tensor's values, its closure's twins made first."""
        pending = [(graph.split_tensor_name(tensor)[0], False)]
        while pending:
            name, operands_made = pending.pop()
            if name in self.twins:
                continue
            if operands_made:
                self.twins[name] = self._made_twin(self.nodes[name])
                continue
            pending.append((name, True))
            pending.extend((graph.split_tensor_name(operand)[0], False)
                           for operand in self._operands(self.nodes[name]))
        return self.twins[graph.split_tensor_name(tensor)[0]]

    def _made_twin(self, node):
        if node.op == "Cast" and graph.attribute(node, "SrcT", None) == _INT32 \
                and len(node.input) == 1:  # an int32 already (a control input would need a node to hang on)
            return node.input[0]
        twin = self.graph_def.node.add()
        twin.CopyFrom(node)
        twin.name = self.free_name(node.name + "/int32")
        self.nodes[twin.name] = twin
        twin.attr.pop("_class", None)  # colocation with the float node: one CPU needs none
        if node.op == "Const":
            value = tf.make_ndarray(node.attr["value"].tensor).astype(np.int32)
            twin.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        elif node.op == "Cast":
            twin.attr["DstT"].type = _INT32
            twin.attr["Truncate"].b = False
        elif node.op in _IDENTITY_ON_INTEGERS:
            twin.op = "Identity"
        if node.op != "Cast":
            twin.attr[_type_attribute(node)].type = _INT32
        positions = set(_value_positions(node) or ())
        data_position = 0
        for position, operand in enumerate(node.input):
            if operand.startswith("^"):
                continue
            if data_position in positions:
                twin.input[position] = self.twins[graph.split_tensor_name(operand)[0]]
            data_position += 1
        return twin.name

    def integer_bound(self, comparison, position):
        """For an ordering comparison of an integer-valued tensor with a float Const at `position`, a new int32
        Const that compares with every integer as the float one does (Keras's Softmax keeps `mask > 0.5`: an
        integer above 0.5 is above 0); else None."""
        rounding = (_ROUNDING_OF_A_FIRST_CONSTANT if position == 0 else _ROUNDING_OF_A_SECOND_CONSTANT).get(
            comparison.op)
        constant = graph.producer(graph.data_inputs(comparison)[position], self.nodes)
        if rounding is None or constant is None or constant.op != "Const" \
                or graph.attribute(constant, "dtype", None) != _FLOAT32:
            return None
        tensor = constant.attr["value"].tensor
        if np.prod([dim.size for dim in tensor.tensor_shape.dim]) > _LARGEST_CONSTANT:
            return None
        value = rounding(tf.make_ndarray(tensor).astype(np.float64))
        if not np.all(np.abs(value) < 2 ** 31 - 1):  # infinities and NaN among them
            return None
        bound = self.graph_def.node.add(name=self.free_name(f"{comparison.name}/integer_bound"), op="Const")
        bound.attr["dtype"].type = _INT32
        bound.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value.astype(np.int32)))
        self.nodes[bound.name] = bound
        return bound.name

    def free_name(self, name):
        candidate, number = name, 0
        while candidate in self.nodes:
            number += 1
            candidate = f"{name}_{number}"
        return candidate


def _sink_operands(node):
    """The float operands a sink reads as integers, or None where the node is no sink."""
    if node.op in _COMPARISONS and graph.attribute(node, "T", None) == _FLOAT32:
        return graph.data_inputs(node)
    if node.op == "Cast" and graph.attribute(node, "SrcT", None) == _FLOAT32 \
            and graph.attribute(node, "DstT", None) in _CAST_SINK_TYPES:
        return graph.data_inputs(node)
    return None


def integer_arithmetic_in_int32(graph_def):
    """Make each comparison of integer-valued float tensors (or of one with a float constant), and each Cast of
    one to int32 or int64, read int32 twins of all that computes them. In place; returns how many such sinks
    were rewritten."""
    values = _IntegerValues(graph_def)
    rewritten = 0
    for node in list(graph_def.node):
        operands = _sink_operands(node)
        if operands is None:
            continue
        integer = [values.holds_integers(operand) for operand in operands]
        bounds = {position: values.integer_bound(node, position) for position, holds in enumerate(integer)
                  if not holds and integer.count(False) == 1}
        if not all(holds or bounds.get(position) for position, holds in enumerate(integer)):
            continue
        _reading_int32(node, [bounds[position] if position in bounds else values.twin(operand)
                              for position, operand in enumerate(operands)])
        rewritten += 1
    return rewritten


def _reading_int32(node, operands):
    """Make a sink read `operands` (for each of its data inputs in order, an int32 tensor, or None to keep it)
    as int32: a comparison's T, a GatherV2's Tindices, a Cast's SrcT (a Cast to int32 becomes the Identity of
    its twin)."""
    operands = iter(operands)
    for position, operand in enumerate(node.input):
        replacement = None if operand.startswith("^") else next(operands)
        if replacement is not None:
            node.input[position] = replacement
    if node.op == "GatherV2":
        node.attr["Tindices"].type = _INT32
    elif node.op in _COMPARISONS:
        node.attr["T"].type = _INT32
    elif node.attr["DstT"].type == _INT32:  # int32 already: the twin itself
        node.op = "Identity"
        for key in list(node.attr):
            del node.attr[key]
        node.attr["T"].CopyFrom(attr_value_pb2.AttrValue(type=_INT32))
    else:
        node.attr["SrcT"].type = _INT32


def _int64_sink_positions(node):
    """The positions of the int64 operands a node reads as integers, where its op takes int32 ones as well: a
    GatherV2's indices, a Cast's operand, a comparison's two; None where the node is no such sink."""
    if node.op == "GatherV2" and graph.attribute(node, "Tindices", None) == _INT64:
        return [1]
    if node.op == "Cast" and graph.attribute(node, "SrcT", None) == _INT64:
        return [0]
    if node.op in _COMPARISONS and graph.attribute(node, "T", None) == _INT64:
        return [0, 1]
    return None


def int64_arithmetic_in_int32(graph_def):
    """Make each GatherV2's int64 indices, Cast of int64 and comparison of int64 values that integer arithmetic
    computes from narrower integers and int64 constants (positions counted along a padding mask: ESM's Cumsum of
    the mask, times it, plus one) read int32 twins of that arithmetic: for the runtimes whose kernels take no
    int64 (TFLite Micro's CUMSUM and GATHER's indices). The twins compute what the int64 ops compute wherever
    every value along the way fits int32, as positions into a tensor do (TFLite's shapes are int32). In place;
    returns how many sinks were rewritten."""
    values = _IntegerValues(graph_def, _INT64)
    rewritten = 0
    for node in list(graph_def.node):
        positions = _int64_sink_positions(node)
        if positions is None:
            continue
        operands = graph.data_inputs(node)
        if not all(values.holds_integers(operands[position]) for position in positions):
            continue
        _reading_int32(node, [values.twin(operand) if position in positions else None
                              for position, operand in enumerate(operands)])
        rewritten += 1
    return rewritten


# A lookup's table, in entries: positions over a context of thousands, per head. Past it, nothing is changed.
_LARGEST_TABLE = 2 ** 16
_FAKE_QUANTS = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs")
# Ops a constant factor may be taken from a constant with (Falcon's slopes, sliced to the heads).
_CONSTANT_MOVING = ("Const",) + _MOVING_FIRST + ("Cast", "Pack", "ConcatV2")


def _fake_quantized(values, node, nodes):
    """What FakeQuant `node` gives float32 `values` (TensorFlow's own kernel, as the graph computes it), or None
    where its range is not one constant pair."""
    bits, narrow = graph.attribute(node, "num_bits", 8), graph.attribute(node, "narrow_range", False)
    if node.op == "FakeQuantWithMinMaxArgs":
        return _evaluated(lambda: tf.quantization.fake_quant_with_min_max_args(
            values, min=graph.attribute(node, "min", -6.0), max=graph.attribute(node, "max", 6.0), num_bits=bits,
            narrow_range=narrow))
    low, high = (graph.constant_value(name, nodes) for name in graph.data_inputs(node)[1:3])
    if low is None or high is None or low.size != 1 or high.size != 1:
        return None
    return _evaluated(lambda: tf.quantization.fake_quant_with_min_max_vars(
        values, np.float32(low.reshape(())), np.float32(high.reshape(())), num_bits=bits, narrow_range=narrow))


def _evaluated(computation):
    """computation()'s value, computed in a graph of its own: the pass also runs on a control-flow body (a
    branch of keras.ops.cond: SAM's prompt encoder) within the default graph that imports the library, where
    an op is symbolic and has no value."""
    with tf.Graph().as_default() as scratch:
        result = computation()
        with tf.compat.v1.Session(graph=scratch) as session:
            return session.run(result)


def _integer_span(nudged_low, nudged_high, factors):
    """(lowest, highest): integers x beyond which FakeQuant(x * factor) is saturated for every factor (x with a
    positive factor saturates below low / factor, with a negative one below high / factor), one to spare for
    the rounding of the division; None where the factors are not all finite."""
    if not np.all(np.isfinite(factors)):
        return None
    lowest, highest = 0, 0
    for factor in factors.reshape(-1).astype(np.float64):
        if factor == 0:
            continue  # 0 whatever x is
        ends = sorted((nudged_low / factor, nudged_high / factor))
        lowest, highest = min(lowest, np.floor(ends[0]) - 1), max(highest, np.ceil(ends[1]) + 1)
    return int(lowest), int(highest)


def _moved(tensor, nodes):
    """(the tensor that ops moving values read, those ops from the FakeQuant's side, outermost first)."""
    chain = []
    while True:
        name, index = graph.split_tensor_name(tensor)
        node = nodes.get(name)
        if node is None or index != 0 or node.op not in _MOVING_FIRST \
                or graph.attribute(node, _type_attribute(node), None) != _FLOAT32:
            return tensor, chain
        chain.append(node)
        tensor = graph.data_inputs(node)[0]


def _lookup(node, values, nodes):
    """(the integer-valued operand, the constant factor or None, the ops moving the product before the FakeQuant
    reads it, the table of FakeQuant(k * factor) for the integers k from the first of the span on, that first,
    the span's last) for FakeQuant `node`, or None."""
    operand = graph.data_inputs(node)[0]
    factor, chain = None, []
    if not values.holds_integers(operand):
        operand, chain = _moved(operand, nodes)  # (Falcon's slopes * positions, widened before the FakeQuant)
        product = nodes.get(graph.split_tensor_name(operand)[0])
        if product is None or product.op != "Mul" or graph.attribute(product, "T", None) != _FLOAT32 \
                or graph.split_tensor_name(operand)[1] != 0:
            return None
        for position, other in ((0, 1), (1, 0)):  # the integers first: evaluating a constant runs a session
            operands = graph.data_inputs(product)
            if not values.holds_integers(operands[other]):
                continue
            factor = graph.constant_subgraph_value(operands[position], values.graph_def, nodes, _CONSTANT_MOVING)
            if factor is not None and factor.size <= _LARGEST_TABLE:
                operand, factor = operands[other], factor.astype(np.float32)
                break
        else:
            return None
    nudged = _fake_quantized(np.array([-3e38, 3e38], np.float32), node, nodes)
    if nudged is None:
        return None
    span = _integer_span(float(nudged[0]), float(nudged[1]), np.ones([], np.float32) if factor is None else factor)
    if span is None or max(abs(span[0]), abs(span[1])) >= _EXACT_BELOW:
        return None
    lowest, highest = span
    integers = np.arange(lowest, highest + 1, dtype=np.float32)
    if integers.size * (1 if factor is None else factor.size) > _LARGEST_TABLE:
        return None
    # float32 products, as the graph's Mul computes them (x * c is c * x in IEEE arithmetic)
    products = integers if factor is None else integers.reshape((-1,) + (1,) * factor.ndim) * factor
    table = _fake_quantized(products.reshape(-1), node, nodes)
    return operand, factor, chain, table, lowest, highest


def quantized_integers_as_lookups(graph_def):
    """Rewrite FakeQuant(x), and FakeQuant(x * c) with c a float constant, x integer-valued (a position cast to
    float: Bloom's and Falcon's ALiBi biases), as a lookup into a constant table of what that FakeQuant gives
    each integer, indexed by x in int32 clipped to the span past which every value saturates: the same values,
    a GATHER of an int8 table in the int8 model, where the float arithmetic stayed float (CAST, MUL) before a
    QUANTIZE. In place; returns how many were rewritten.

    The table holds FakeQuant(k * c) for the integers k of the span, per element of c, in float32 as the graph
    computes it, TensorFlow's own kernel rounding it onto the FakeQuant's grid; an integer beyond the span gives
    the value at its end (the FakeQuant saturates there for every element of c). With c, the table is indexed
    by k's place times c's size plus the element's place in c, which broadcasts as x * c does.
    """
    values = _IntegerValues(graph_def)
    rewritten = 0
    for node in list(graph_def.node):
        if node.op not in _FAKE_QUANTS:
            continue
        lookup = _lookup(node, values, values.nodes)
        if lookup is None:
            continue
        operand, factor, chain, table, lowest, highest = lookup
        places = None if factor is None else np.arange(factor.size, dtype=np.int32).reshape(factor.shape)
        twin = values.twin(operand)

        def build(positions, table=table, lowest=lowest, highest=highest, places=places):
            places_in_table = tf.maximum(tf.minimum(positions, highest), lowest) - lowest
            if places is not None:
                places_in_table = places_in_table * places.size + places
            return [tf.gather(tf.constant(table), places_in_table)]

        prefix = values.free_name(node.name + "/lookup") + "/"
        (looked_up,) = graph.splice_many(graph_def, build, [(twin, tf.int32, None)], prefix, values.nodes)
        for mover in reversed(chain):  # the values moved as the product's were
            copy = graph_def.node.add()
            copy.CopyFrom(mover)
            copy.name = values.free_name(prefix + mover.name.rsplit("/", 1)[-1])
            copy.input[0] = looked_up
            copy.attr.pop("_class", None)
            values.nodes[copy.name] = copy
            looked_up = copy.name
        # The FakeQuant stays, the identity on its own grid's values: the converter takes the int8 scale of the
        # GATHER (and of the table) from it; a FakeQuant on the table alone left both float.
        node.input[0] = looked_up
        rewritten += 1
    return rewritten
