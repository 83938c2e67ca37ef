"""TensorFlow ops that TFLite has no builtin op for, spelled in builtin ops before converting.

A model that uses one cannot convert in builtin or native mode (the converter
stops at it), while --mode select would carry it as a Flex op, which the
runtimes this package targets do not link. Each spelling computes the same
values from the same inputs, so parity and int8 ranges are unaffected:

* Roll (`tf.roll`, e.g. the shifted windows of Swin Transformers), with a
  constant shift and axis on an axis of known size: along each axis, the last
  `shift` entries and the rest, swapped (two STRIDED_SLICEs and a
  CONCATENATION, which every runtime and target profile has).

`TO_BUILTINS` lists the graph passes; each rewrites a graph in place and
returns how many ops it rewrote.
"""

import tensorflow as tf

from . import graph

_SCOPE = "/keras_gelu_builtins/"


def _static_shapes(graph_def, tensors):
    """{tensor name: tf.TensorShape} from TensorFlow's own shape inference over the graph."""
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(graph_def, name="")
    return {name: scratch.get_tensor_by_name(graph.canonical(name)).shape for name in tensors}


def _rolled(x, rolls):
    """x rolled by each (shift, axis) in turn; 0 <= shift < the axis's size, axis >= 0."""
    for shift, axis, size in rolls:
        if shift:
            leading = (slice(None),) * axis
            x = tf.concat([x[leading + (slice(size - shift, size),)], x[leading + (slice(0, size - shift),)]],
                          axis=axis)
    return x


def rolls_as_slices(graph_def):
    """Rewrite Roll(x, shift, axis) with constant shift and axis, on axes of known size, as slices and a concat."""
    found = [node for node in graph_def.node if node.op == "Roll"]
    if not found:
        return 0
    nodes = graph.nodes_by_name(graph_def)
    shapes = _static_shapes(graph_def, [graph.data_inputs(node)[0] for node in found])
    rewritten = 0
    for node in found:
        x, shift, axis = graph.data_inputs(node)
        shifts, axes, shape = graph.constant_value(shift, nodes), graph.constant_value(axis, nodes), shapes[x]
        if shifts is None or axes is None or shape.rank is None:
            continue
        rolls = []
        for one_shift, one_axis in zip(shifts.reshape(-1).tolist(), axes.reshape(-1).tolist()):
            one_axis %= shape.rank
            size = shape[one_axis]
            if size is None:
                break
            rolls.append((one_shift % size, one_axis, size))
        else:
            dtype = tf.as_dtype(node.attr["T"].type)
            new = graph.splice(graph_def, lambda value: _rolled(value, rolls), x, dtype, node.name + _SCOPE, nodes)
            graph.redirect(graph_def, node.name, new)
            rewritten += 1
    return rewritten


TO_BUILTINS = (rolls_as_slices,)
