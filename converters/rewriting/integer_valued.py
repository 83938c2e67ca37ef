"""Float arithmetic on integer values, done in int32: the causal masks of keras-hub's decoders.

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
  operands are both integer-valued, a Cast from float to int32 or int64.

A sink whose whole backward closure is integer-valued reads int32 twins of
that closure; any other sink is left as it is. Float readers that are not
sinks keep reading the original float nodes, so nothing else changes; an
original that nothing reads any more is pruned by the converter.

The twins compute what the float ops compute wherever float32 is exact, that
is where every value along the way is below 2**24 in magnitude, as positions
and lengths are; beyond, the float ops round and the int32 ones do not.

It is one of `int8.GRAPH_PASSES`, not of `tf_ops_as_builtins.TO_BUILTINS`:
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
    if node.op in _MOVING_FIRST:
        return [0]
    return None


def _type_attribute(node):
    return {"GatherV2": "Tparams", "Range": "Tidx", "Const": "dtype", "Cast": "DstT"}.get(node.op, "T")


def _integer_constant(node):
    """Whether a float Const holds integers float32 and int32 both hold exactly."""
    tensor = node.attr["value"].tensor
    if np.prod([dim.size for dim in tensor.tensor_shape.dim]) > _LARGEST_CONSTANT:
        return False
    value = tf.make_ndarray(tensor)
    return bool(np.all(np.isfinite(value)) and np.all(np.abs(value) < _EXACT_BELOW) and np.all(value == np.round(
        value)))


class _IntegerValues:
    """Which float tensors of a graph hold integers, and their int32 twins, made on demand."""

    def __init__(self, graph_def):
        self.graph_def = graph_def
        self.nodes = graph.nodes_by_name(graph_def)
        self.known = {}  # node name -> whether its float output holds integers
        self.twins = {}  # node name -> the int32 tensor that holds its values

    def _operands(self, node):
        """The tensors whose integer values make the node's integer; None where no values of its can be."""
        if graph.attribute(node, _type_attribute(node), None) != _FLOAT32:
            return None
        if node.op == "Const":
            return [] if _integer_constant(node) else None
        if node.op == "Cast":
            return [] if graph.attribute(node, "SrcT", None) in _INTEGER_TYPES else None
        positions = _value_positions(node)
        if positions is None:
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
        twins = iter([bounds[position] if position in bounds else values.twin(operand)
                      for position, operand in enumerate(operands)])
        for position, operand in enumerate(node.input):
            if not operand.startswith("^"):
                node.input[position] = next(twins)
        if node.op in _COMPARISONS:
            node.attr["T"].type = _INT32
        elif node.attr["DstT"].type == _INT32:  # int32 already: the twin itself
            node.op = "Identity"
            for key in list(node.attr):
                del node.attr[key]
            node.attr["T"].CopyFrom(attr_value_pb2.AttrValue(type=_INT32))
        else:
            node.attr["SrcT"].type = _INT32
        rewritten += 1
    return rewritten

