"""Int8 outputs on a grid finer than their op's kernel can rescale to, computed on the finest one it takes
(`made_acceptable`).

LiteRT's int8 ADD, SUB and SQUARED_DIFFERENCE compute in fixed point: each
input shifted left and rescaled to units of 2 max(input scales) / 2^shift,
then the result rescaled to the output's scale by a multiplier that
`QuantizeMultiplierSmallerThanOneExp` takes below 1 only (a TFLITE_CHECK: the
process aborts in the op's Prepare, with no error to catch). Post-training
calibration gives an output that is zero on every sample (x - mean(x) over a
single channel, as a normalization of one channel computes) a scale of about
1e-8, far below that bound, and the model aborts the first interpreter that
allocates it.

The kernel's result is a whole number of its own units, which the output's
grid cannot hold more finely than one unit a step: on the finest grid the
kernel accepts, just above one unit, each value it computes is one step (up
to the clamp at 127 steps, beyond which the tiny grid holds nothing either).
So the op writes a new tensor on that grid, and a QUANTIZE (int8 to int8, a
rescale by any multiplier) puts it back on the grid every reader of the
original tensor expects, a reshape or a concatenation that only moves its
bytes among them: what the op computed is what the tiny grid would have held,
rounded once onto it.
"""

import collections

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from . import flatbuffer_model

# {op: (left shift, power)}: the kernel's output multiplier is (2 max(s1, s2))^power / (2^(shift * power) s_out),
# 2 max(s1, s2) computed in float32 and 2^(shift * power) s_out too (int times float in C++), the division in
# double (tensorflow/lite/kernels/add.cc, sub.cc (PrepareGeneralSubOp), squared_difference.cc; int8 and uint8:
# int16's ADD and SUB rescale so only off their power-of-two path, with a shift of 15)
_RESCALES = {"ADD": (20, 1), "SUB": (20, 1), "SQUARED_DIFFERENCE": (7, 2)}
_EIGHT_BIT = (schema.TensorType.INT8, schema.TensorType.UINT8)


def accepted(numerator, factor, scale):
    """Whether QuantizeMultiplierSmallerThanOneExp takes numerator / float32(factor * scale) (factor a power of
    two): below 1, and below where its 31-bit rounding carries into the exponent (a multiplier within 2^-32 of 1
    rounds to 2^31, which it takes as a shift of 1 and refuses)."""
    multiplier = numerator / float(np.float32(factor) * np.float32(scale))
    return 0.0 < multiplier < 1.0 - 2.0 ** -32


def smallest_scale(op, input_scales):
    """The smallest float32 output scale `op`'s int8 kernel accepts for inputs at `input_scales`."""
    shift, power = _RESCALES[op]
    numerator = float(np.float32(2) * np.float32(max(input_scales))) ** power
    factor = 2 ** (shift * power)
    scale = np.float32(numerator / factor)
    while not accepted(numerator, factor, scale):  # float32's step is 2^-23 of it: one or two steps at most
        scale = np.nextafter(scale, np.float32(np.inf))
    return float(scale)


def _scale_and_zero_point(tensor):
    """(scale, zero point) of an 8-bit tensor quantized per tensor, or None."""
    quantization = tensor.quantization
    if (tensor.type not in _EIGHT_BIT or quantization is None or quantization.scale is None
            or len(quantization.scale) != 1 or not float(quantization.scale[0]) > 0):
        return None
    return float(quantization.scale[0]), int(quantization.zeroPoint[0])


def _tensor_on_grid(subgraph, like, scale, zero_point):
    """A new activation tensor shaped and typed as subgraph.tensors[like], on the grid (scale, zero_point)."""
    original = subgraph.tensors[like]
    tensor = schema.TensorT()
    tensor.shape, tensor.shapeSignature, tensor.type = original.shape, original.shapeSignature, original.type
    tensor.name = flatbuffer_model.tensor_name(original) + "/keras_gelu_kernel_grid"
    tensor.quantization = schema.QuantizationParametersT()
    tensor.quantization.scale, tensor.quantization.zeroPoint = [float(scale)], [int(zero_point)]
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def _requantize(model, source, target):
    """A QUANTIZE from one 8-bit tensor to another of the same type: a rescale onto target's grid."""
    operator = schema.OperatorT()
    operator.opcodeIndex = flatbuffer_model.opcode_index(model, "QUANTIZE")
    operator.builtinOptionsType, operator.builtinOptions = schema.BuiltinOptions.QuantizeOptions, \
        schema.QuantizeOptionsT()
    operator.inputs, operator.outputs = [source], [target]
    return operator


def _widened(model):
    """Each op of _RESCALES whose 8-bit output scale its kernel refuses, writing a tensor on the smallest scale it
    takes, which a QUANTIZE rescales into the original output; {op: count}."""
    codes = {getattr(schema.BuiltinOperator, name): name for name in _RESCALES}
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        rebuilt, changed = [], False
        for operator in subgraph.operators or []:
            rebuilt.append(operator)
            name = codes.get(flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex]))
            if name is None or len(operator.inputs) != 2 or len(operator.outputs) != 1:
                continue
            grids = [_scale_and_zero_point(subgraph.tensors[index]) for index in (*operator.inputs,
                                                                                   *operator.outputs)]
            if any(grid is None for grid in grids):
                continue
            (scale_1, _), (scale_2, _), (scale_out, zero_out) = grids
            shift, power = _RESCALES[name]
            numerator = float(np.float32(2) * np.float32(max(scale_1, scale_2))) ** power
            if accepted(numerator, 2 ** (shift * power), scale_out):
                continue
            (output,) = operator.outputs
            wider = _tensor_on_grid(subgraph, output, smallest_scale(name, (scale_1, scale_2)), zero_out)
            operator.outputs = [wider]
            rebuilt.append(_requantize(model, wider, output))
            made[name] += 1
            changed = True
        if changed:
            subgraph.operators = rebuilt
    return dict(made)


def made_acceptable(tflite_model):
    """(the .tflite with every 8-bit ADD, SUB and SQUARED_DIFFERENCE output its kernel would abort on computed on
    the finest grid the kernel takes, {op: count} of those); the bytes as they were where there is none."""
    model = flatbuffer_model.as_object(tflite_model)
    made = _widened(model)
    if not made:
        return tflite_model, {}
    return flatbuffer_model.as_bytes(model, len(tflite_model)), made
