"""How far a quantization-aware graph's outputs move when its int8 roundings do: the model's own sensitivity,
against which a .tflite's difference from it is judged.

TFLite's integer kernels round where the rewritten graph rounds, but not always to the same step: fixed-point
rescaling, SOFTMAX's and LOGISTIC's tables and RSQRT's approximation land one step off the float rounding on
some of the values. In most models that stays within a few output steps. In some (an untrained DeiT's class
token, a row of almost one value that each LayerNormalization divides by its spread), one step anywhere moves
the outputs by tens: there the .tflite is as faithful as int8 can be, and a limit in steps alone refuses it.

The envelope is measured, not assumed: the rewritten graph is run again with every activation's FakeQuant
moving FRACTION of its values one step up or down (seeded, TRIALS draws), and the largest move of each output
is its envelope. A .tflite within it differs from the graph by no more than rounding alone moves the graph; a
conversion error (a wrong weight, an op computing something else) is far outside it.
"""

import numpy as np
import tensorflow as tf

from ..rewriting import graph
from ..rewriting.int8 import FAKE_QUANT_OPS
from . import verify

# One step on 5 % of each activation's values: measured on the rewritten graphs of this suite's QAT models,
# it moves GPT-2's outputs 3-5 steps (its .tflite: 1 step from the graph) and DeiT's 21-32 (its .tflite: 32).
FRACTION = 0.05
TRIALS = 3


def _activation_fake_quants(graph_def, nodes):
    """(node, low, high) of each FakeQuant of an activation (a weight's rounding is exact in the .tflite: its
    int8 values are the ones the graph rounds to) whose range is a constant."""
    found = []
    for node in graph_def.node:
        if node.op not in FAKE_QUANT_OPS:
            continue
        source = graph.producer(graph.resolve(graph.data_inputs(node)[0], nodes), nodes)
        if source is None or source.op == "Const":
            continue
        if node.op == "FakeQuantWithMinMaxArgs":
            low, high = graph.attribute(node, "min", -6.0), graph.attribute(node, "max", 6.0)
        else:
            low, high = (graph.constant_value(name, nodes) for name in graph.data_inputs(node)[1:3])
            if low is None or high is None or np.size(low) != 1 or np.size(high) != 1:
                continue
        low, high = float(np.reshape(low, ())), float(np.reshape(high, ()))
        if high > low:  # an empty range ([0, 0]: a constant of zeros) has no step to move by
            found.append((node, low, high))
    return found


def perturbed(graph_def, fraction, seed):
    """A copy of graph_def whose activations' FakeQuants move `fraction` of their values one step up or down
    (each value up with fraction / 2, down with fraction / 2, drawn with `seed`), staying on their grids."""
    perturbed_def = tf.compat.v1.GraphDef()
    perturbed_def.CopyFrom(graph_def)
    nodes = graph.nodes_by_name(perturbed_def)
    fake_quants = _activation_fake_quants(perturbed_def, nodes)
    if not fake_quants:
        return perturbed_def

    def build(*tensors):
        moved = []
        for index, (tensor, (node, low, high)) in enumerate(zip(tensors, fake_quants)):
            bits, narrow = graph.attribute(node, "num_bits", 8), graph.attribute(node, "narrow_range", False)
            step = (high - low) / (2 ** bits - 1 - int(narrow))
            draw = tf.random.stateless_uniform(tf.shape(tensor), seed=[seed, index])
            direction = tf.cast(draw > 1.0 - fraction / 2, tf.float32) - tf.cast(draw < fraction / 2, tf.float32)
            moved.append(tf.quantization.fake_quant_with_min_max_args(
                tensor + direction * step, min=low, max=high, num_bits=bits, narrow_range=narrow))
        return moved

    names = [node.name for node, _, _ in fake_quants]
    moved = graph.splice_many(perturbed_def, build, [(name, tf.float32, None) for name in names],
                              "keras_gelu_rounding_envelope")
    replaced = {graph.canonical(name): tensor for name, tensor in zip(names, moved)}
    added = set(graph.nodes_by_name(perturbed_def)) - set(nodes)
    for node in perturbed_def.node:  # every reader of a FakeQuant reads its moved copy
        if node.name in added:
            continue
        for position, name in enumerate(node.input):
            if not name.startswith("^") and graph.canonical(name) in replaced:
                node.input[position] = replaced[graph.canonical(name)]
    return perturbed_def


def envelope(graph_def, source, arrays, graph_outputs, fraction=FRACTION, trials=TRIALS, run=None):
    """{output name: the largest |moved - graph_outputs| over `trials` perturbed graphs}; `run(runner)` runs a
    runner on the arrays (a static-shape target's parity runs one sample at a time)."""
    run = run or (lambda runner: runner(arrays))
    largest = {info.name: 0.0 for info in source.outputs}
    for trial in range(trials):
        outputs = run(verify.graph_runner(perturbed(graph_def, fraction, trial + 1), source))
        for info in source.outputs:
            moved = np.abs(np.asarray(outputs[info.name], np.float64) - np.asarray(graph_outputs[info.name]))
            finite = moved[np.isfinite(moved)]
            largest[info.name] = max(largest[info.name], float(finite.max()) if finite.size else 0.0)
    return largest
