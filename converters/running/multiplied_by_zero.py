"""The values of a tensor that only ever meet a multiplication by exact zero: what its range need not hold.

A LayerNormalization of a row of zeros (a padded position a mask zeroed; the class and distillation tokens of
Hugging Face's TF DeiT, zeros as initialized, at its first layer) computes rsqrt(0 + epsilon), 1e6 for an epsilon
of 1e-12, and multiplies it by the row's centred values, zeros: the row's output is 0 whatever the factor. But the
factor's calibrated range reached 1e6, on whose int8 grid (steps of 3,922) every other row's factor, 1 to 3,
rounded to 0. Measured on a model that zeroes two of eight rows before a LayerNormalization of epsilon 1e-12: its
int8 model kept a cosine of 0.0 to the float model, and 0.9998 with the ranges taken here.

A value that every op reading it multiplies by an exact zero, directly or through elementwise ops and ops that
place each value at positions of their output (a reshape, a transpose, a sum or mean over axes, a projection of
rows), in the sample at hand, is read by no output: a tensor's range is taken over the values that are read. The
zero must be a factor computed before the value (a constant, an input, an op that ran before it): x * x and
x * relu(x - 2) read x where the factor is 0, since a change of x changes the factor. In the integer model such
a value saturates on that range and is still multiplied by the integer zero (zero is on every int8 grid):
exactly 0.

Hugging Face's TF XLM and Flaubert zero their padded rows after each layer, and attention gives those rows small
values again, which a LayerNormalization and the feed-forward projections carry to the next zeroing: their int8
models kept a cosine of 0.0 to the float model on random ids with padding among them, 0.9999 with these ranges.
"""

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from ..tflite import flatbuffer_model
from ..tflite.operators import op_name

# Ops each of whose output values is computed from the values at the same position of their inputs, broadcast:
# a position of an input is read by an output value exactly where the output's position is.
_ELEMENTWISE = frozenset({
    "ABS", "ADD", "CEIL", "COS", "DEQUANTIZE", "DIV", "ELU", "EXP", "FLOOR", "GELU", "HARD_SWISH", "LEAKY_RELU",
    "LOG", "LOGISTIC", "MAXIMUM", "MINIMUM", "MUL", "NEG", "QUANTIZE", "RELU", "RELU6", "RELU_N1_TO_1", "ROUND",
    "RSQRT", "SIN", "SQRT", "SQUARE", "SQUARED_DIFFERENCE", "SUB", "TANH"})


# Ops that place each value of their first input at positions of their output that tell which it came from: a
# position of that input is read where the output positions it goes to are (`_mapped_back`).
_POSITION_MAPPING = frozenset({"RESHAPE", "TRANSPOSE", "MEAN", "SUM", "FULLY_CONNECTED"})


# Ops that read their input's shape alone, none of its values (Keras 3's Dense on a sequence reads its input's
# shape to reshape it).
_SHAPE_READERS = frozenset({"SHAPE", "RANK"})


def _mapped_back(name, inputs, read_of_output, shape, interpreter):
    """The positions of a position-mapping op's first input (of `shape`) that its output's read positions come
    from; None where the op's shapes are not as its kind has them."""
    if name == "RESHAPE":
        return read_of_output.reshape(shape)
    if name == "TRANSPOSE":
        return read_of_output.transpose(np.argsort(interpreter.get_tensor(inputs[1]).reshape(-1)))
    if name in ("MEAN", "SUM"):  # each output value reads the values its reduced axes hold
        axes = sorted(set(int(axis) % len(shape) for axis in interpreter.get_tensor(inputs[1]).reshape(-1)))
        kept = read_of_output if read_of_output.ndim == len(shape) else np.expand_dims(read_of_output, axes)
        return np.broadcast_to(kept, shape)
    # FULLY_CONNECTED: each output row reads the input row of its position, rows of the input's last axis
    rows = read_of_output.reshape(-1, read_of_output.shape[-1]).any(axis=-1)
    if not shape or rows.size * shape[-1] != int(np.prod(shape)):
        return None
    return np.broadcast_to(rows[:, None], (rows.size, shape[-1])).reshape(shape)


def _onto(mask, shape):
    """`mask` (an output's shape) reduced onto an input of `shape` broadcast to it: a position of the input is
    read where any output position it is broadcast to is."""
    leading = mask.ndim - len(shape)
    axes = tuple(range(leading)) + tuple(leading + axis for axis, size in enumerate(shape)
                                         if size == 1 and mask.shape[leading + axis] != 1)
    return np.any(mask, axis=axes).reshape(shape) if axes else mask.reshape(shape)


class DiscardedValues:
    """Which values of a float model's main-graph tensors no output reads: in a run (`read_in`), and over
    calibration samples (`record` each sample's run, then `ranges` gives the ranges of what is read)."""

    def __init__(self, float_model):
        model = flatbuffer_model.read(float_model)
        subgraph = model.subgraphs[0]
        self._operators = [(op_name(model, operator), list(operator.inputs), list(operator.outputs))
                           for operator in subgraph.operators or ()]
        readers, writer = {}, {}
        for position, (_, inputs, outputs) in enumerate(self._operators):
            for index in set(inputs):
                readers.setdefault(index, []).append(position)
            writer.update((index, position) for index in outputs)
        # A candidate: a float tensor an op writes that no subgraph output is, each of whose readers is a MUL by a
        # factor computed before it (not from it: x * x, x * sigmoid(x) read x wherever the factor is 0), or an
        # elementwise op, or a position-mapping op reading it first, that writes a candidate. Found in reverse
        # order of the ops, which run in order.
        self._candidates = {}  # {tensor index: [(reader op position, the factor a MUL reader multiplies by, or
        # None)]}, in reverse order of their writers
        outputs = set(subgraph.outputs)
        for position in reversed(range(len(self._operators))):
            for index in self._operators[position][2]:
                if index in outputs or subgraph.tensors[index].type != schema.TensorType.FLOAT32:
                    continue
                reading = [(reader, self._factor(reader, index, writer)) for reader in readers.get(index, [])]
                if reading and all(factor is not None or self._passes_on(reader, index) for reader, factor in reading):
                    self._candidates[index] = reading
        self._ranges = {}  # {tensor index: (smallest, largest) of the values read}, over the samples so far
        self._discarding = set()  # tensors some of whose values no output read, in some sample

    def _passes_on(self, reader, index):
        """Whether the op at `reader` reads tensor `index` at the positions its output's are read at, one candidate
        (elementwise; or a position-mapping op, by its first input alone), or reads none of its values."""
        name, inputs, outputs = self._operators[reader]
        if name in _SHAPE_READERS:
            return True
        mapping = name in _ELEMENTWISE or (name in _POSITION_MAPPING and inputs[0] == index
                                           and index not in inputs[1:])
        return mapping and len(outputs) == 1 and outputs[0] in self._candidates

    def _factor(self, reader, index, writer):
        """The other operand of the op at `reader` if it is a MUL of tensor `index` by a value written before
        `index` was (a constant, an input, or an op's output that ran before), else None."""
        name, inputs, _ = self._operators[reader]
        if name != "MUL" or len(inputs) != 2 or inputs[0] == inputs[1]:
            return None
        other = inputs[1] if inputs[0] == index else inputs[0]
        return other if writer.get(other, -1) < writer[index] else None

    def record(self, interpreter):
        """Take in one sample's run (`interpreter` keeping every tensor, just invoked)."""
        for index, values, mask in self._each_read(interpreter):
            if mask is not None and not mask.all():
                self._discarding.add(index)
                values = values[mask]
            if values.size:
                low, high = self._ranges.get(index, (np.inf, -np.inf))
                self._ranges[index] = (min(low, float(values.min())), max(high, float(values.max())))

    def read_in(self, interpreter):
        """{tensor index: the positions of its values some output read in this run (`interpreter` keeping every
        tensor, just invoked), or None for all} of each tensor some of whose values may be read by none."""
        return {index: mask for index, _, mask in self._each_read(interpreter)}

    def _each_read(self, interpreter):
        """(tensor index, its values, the positions of them some output read or None for all) of each candidate
        in this run, in reverse order of their writers: each tensor's values fetched once."""
        read = {}
        for index, reading in self._candidates.items():
            values = interpreter.get_tensor(index)
            read[index] = self._read_in_this_run(values, reading, read, interpreter)
            yield index, values, read[index]

    def _read_in_this_run(self, values, reading, read, interpreter):
        """The positions of a tensor (whose values in this run are `values`, its readers `reading`) that some
        output read in this run; None for all of them."""
        mask = ~np.isfinite(values)  # an infinity or a NaN times zero is NaN: read
        for position, factor in reading:
            name, inputs, outputs = self._operators[position]
            if name in _SHAPE_READERS:
                continue
            read_of_output = read.get(outputs[0])
            if factor is not None:
                nonzero = interpreter.get_tensor(factor) != 0
                if read_of_output is not None:
                    nonzero = nonzero & read_of_output
                elif nonzero.all():
                    return None
                output_shape = np.broadcast_shapes(nonzero.shape, values.shape)
                mask |= _onto(np.broadcast_to(nonzero, output_shape), values.shape)
            elif read_of_output is None:
                return None
            elif name in _ELEMENTWISE:
                mask |= _onto(read_of_output, values.shape)
            else:
                mapped = _mapped_back(name, inputs, read_of_output, values.shape, interpreter)
                if mapped is None:
                    return None
                mask |= mapped
        return mask

    def ranges(self):
        """{tensor index: (smallest, largest) of the values some output read} for each tensor some of whose values
        none read, in some sample."""
        return {index: self._ranges[index] for index in self._discarding if index in self._ranges}
