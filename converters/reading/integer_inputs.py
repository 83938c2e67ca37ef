"""Which values an integer input may take, read off the graph, for seeded random inputs.

Random token ids, segment ids or masks must be valid for the model, or the
parity check and random calibration fail deep inside TensorFlow or TFLite
("gather index out of bounds"). An integer input's valid values show where it
is used:

* as the indices of a gather from a table, constant or variable (an embedding: its rows)
  or of a one-hot (its depth): an index, below the tightest such bound;
* otherwise, cast to bool or compared (mask > 0), or, with no telling use,
  named "...mask" (Hugging Face multiplies its attention_mask in as a float):
  a padding mask, drawn as ones then zeros along the last axis, as a padded
  batch has them.

We follow the input through ops that pass its values on (casts, reshapes,
slices, pads, selects such as Keras's wrap of negative indices, a mask's min
with a causal mask); shape queries say nothing. An input whose values nothing
reads takes zeros; one read otherwise, with neither kind of use, gets None,
and the caller asks for real samples.
"""

import dataclasses

import numpy as np

from ..rewriting import graph

# Ops through which the input's values reach their use unchanged (or a subset of them).
_VALUE_PRESERVING = graph.PASS_THROUGH_OPS + (
    "Cast", "Reshape", "ExpandDims", "Squeeze", "StridedSlice", "Slice", "Transpose", "Tile", "BroadcastTo",
    "ConcatV2", "Pack", "Minimum", "Maximum", "Select", "SelectV2")
_GATHERS = ("Gather", "GatherV2", "ResourceGather")
_COMPARISONS = ("Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual")
_DT_BOOL = 10


@dataclasses.dataclass(frozen=True)
class IntegerValues:
    upper: int  # values are 0 .. upper - 1
    mask: bool  # a 0/1 padding mask

    def sample(self, rng, shape, dtype):
        if not self.mask:
            return rng.integers(0, self.upper, size=shape).astype(dtype)
        positions = np.arange(shape[-1]) if shape else np.zeros(0)
        lengths = rng.integers(1, max(shape[-1], 1) + 1, size=tuple(shape[:-1]) + (1,)) if shape else 1
        return (positions < lengths).astype(dtype)


def _table_shape(operand, nodes, variable_shapes):
    """The shape of a gather's table: a constant's, or a variable's (read, or a ResourceGather's handle)."""
    table = graph.constant_value(operand, nodes)
    if table is not None:
        return table.shape
    node = graph.producer(operand, nodes)
    handle = node.input[0] if node is not None and node.op == "ReadVariableOp" else operand
    return variable_shapes.get(graph.split_tensor_name(graph.resolve(handle, nodes))[0])


def _index_bound(node, position, nodes, variable_shapes):
    """The number of valid indices a use allows its operand, or None if it is no indexing use."""
    operands = graph.data_inputs(node)
    if node.op in _GATHERS and position == 1:
        shape = _table_shape(operands[0], nodes, variable_shapes)
        axis = graph.constant_value(operands[2], nodes) if len(operands) > 2 else None
        return None if shape is None else shape[int(axis) if axis is not None else 0]
    if node.op == "OneHot" and position == 0:
        depth = graph.constant_value(operands[1], nodes)
        return None if depth is None else int(depth)
    return None


def _passes_values_on(node, position):
    if node.op in ("Select", "SelectV2"):
        return position > 0  # the condition is not passed on
    if node.op in ("Pad", "PadV2", "MirrorPad"):  # Longformer pads its ids to a multiple of its window
        return position == 0  # the paddings and the pad value are not the input's
    return node.op in _VALUE_PRESERVING


def integer_values(graph_def, tensor, name, variable_shapes=None):
    """IntegerValues for the integer signature input `name` (tensor `tensor`), or None if nothing tells them.
    `variable_shapes`: {resource placeholder's name: its variable's shape}, for a graph whose weights are
    variables."""
    variable_shapes = variable_shapes or {}
    nodes = graph.nodes_by_name(graph_def)
    consumer_map = graph.consumers(graph_def)
    bounds, masked, read_otherwise = [], False, False
    pending, seen = [graph.canonical(tensor)], set()
    while pending:
        reached = pending.pop()
        if reached in seen:
            continue
        seen.add(reached)
        for node, position in consumer_map.get(reached, []):
            bound = _index_bound(node, position, nodes, variable_shapes)
            if bound is not None:
                bounds.append(bound)
            elif node.op in _COMPARISONS or (node.op == "Cast" and node.attr["DstT"].type == _DT_BOOL):
                masked = True
            elif _passes_values_on(node, position):
                pending.append(f"{node.name}:0")
            elif node.op not in graph.SHAPE_READERS:
                read_otherwise = True
    if bounds:
        return IntegerValues(min(bounds), mask=False)
    if masked or name.lower().endswith("mask"):
        return IntegerValues(2, mask=True)
    # values nothing reads (DeBERTa's token types where it has no token-type table): any will do, zeros
    return None if read_otherwise else IntegerValues(1, mask=False)
