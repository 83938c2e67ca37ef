"""Integer outputs on a grid finer than their op's kernel can rescale to, computed on the finest one it takes
(`made_acceptable`). Two kernels bound the rescale: LiteRT's own (ADD, SUB, SQUARED_DIFFERENCE; at 16x8 ADD and
SUB) and XNNPACK's, which LiteRT applies by default (FULLY_CONNECTED and the convolutions, 8-bit).

LiteRT's int8 ADD, SUB and SQUARED_DIFFERENCE compute in fixed point: each
input shifted left and rescaled to units of 2 max(input scales) / 2^shift,
then the result rescaled to the output's scale by a multiplier that
`QuantizeMultiplierSmallerThanOneExp` takes below 1 only (a TFLITE_CHECK: the
process aborts in the op's Prepare, with no error to catch). Post-training
calibration gives an output that is zero on every sample (x - mean(x) over a
single channel, as a normalization of one channel computes) a scale of about
1e-8, far below that bound, and the model aborts the first interpreter that
allocates it.

At 16x8 the same multiplier bounds int16's ADD, with a shift of 15 where int8's is 20: an output scale must be
more than 2^-14 of the larger input's (int8: 2^-19), on grids 256 times finer. Hugging Face's OpenAI GPT, its
added attention mask written as a selection (rewriting/int8.py), adds the mask's other values (zeros, calibrated
on scale 1e-9) to a 0/1 factor's product on scale 3e-5: a multiplier of 1.84, and LiteRT's ADD aborted. Its
int16 SUB computes the same multiplier (sub.cc), and TFLite Micro's ADD and SUB do (add_common.cc,
sub_common.cc): each aborts below the bound.

The kernel's result is a whole number of its own units, which the output's
grid cannot hold more finely than one unit a step: on the finest grid the
kernel accepts, just above one unit, each value it computes is one step (up
to the clamp at 127 steps, beyond which the tiny grid holds nothing either).
So the op writes a new tensor on that grid, and a QUANTIZE (int8 to int8, a
rescale by any multiplier) puts it back on the grid every reader of the
original tensor expects, a reshape or a concatenation that only moves its
bytes among them: what the op computed is what the tiny grid would have held,
rounded once onto it.

XNNPACK's FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D (a convolution of one group per channel there) and
TRANSPOSE_CONV refuse a requantization scale s_in s_w / s_out of 256 or more (per output channel), and LiteRT's
delegate, which does not check it, fails to create its runtime: an error in a small model, a double free in
xnn_delete_subgraph (an abort) in D-FINE's decoder. D-FINE's box integral, a
softmax times a symmetric projection, about 1e-6 in a tiny random model, calibrates to an output scale of 8e-9,
a requantization scale of 15,600. The accumulator counts whole units of s_in s_w: on a grid of 256 steps a unit
or more, every unit but 0 is past the clamp at 127 steps, so the finest grid XNNPACK takes (just under 256 steps
a unit) holds what the tiny grid does, and its QUANTIZE gives the same bytes (with per-channel weight scales, a
channel whose scale is under half the largest is rounded twice: within a step of the grid the op writes).
"""

import collections

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from . import flatbuffer_model
from .operators import per_tensor_grid

# {op: (left shift, power)}: the kernel's output multiplier is (2 max(s1, s2))^power / (2^(shift * power) s_out),
# 2 max(s1, s2) computed in float32 and 2^(shift * power) s_out too (int times float in C++), the division in
# double (tensorflow/lite/kernels/add.cc, sub.cc (PrepareGeneralSubOp), squared_difference.cc; int8 and uint8)
_RESCALES = {"ADD": (20, 1), "SUB": (20, 1), "SQUARED_DIFFERENCE": (7, 2)}
# {op: left shift} at int16, off the power-of-two path a 16x8 model's ops take (its quantizer sets their
# pot_scale_int16 false; TFLite Micro has no other); the power is 1
_INT16_SHIFTS = {"ADD": 15, "SUB": 15}
# {op: (index of its activation input, of its weights)}: XNNPACK computes float32(s_in * s_w) / s_out in float32
# and refuses 256 or more (src/operators/fully-connected-nc.c, setup_scale_params_qs8 and _qx8_qcyw;
# convolution-nhwc.c, init_requantization_scale_qu8 and _qx8_qc8w, depthwise included; deconvolution-nhwc.c);
# LiteRT's delegate checks the scales of ADD, SUB, MUL and QUANTIZE itself and leaves those it would refuse to
# LiteRT's kernels, and its int8 BATCH_MATMUL, whose XNNPACK bounds at 255, ran at every scale (ai-edge-litert 2.3)
_XNNPACK_REQUANTIZED = {"FULLY_CONNECTED": (0, 1), "CONV_2D": (0, 1), "DEPTHWISE_CONV_2D": (0, 1),
                        "TRANSPOSE_CONV": (2, 1)}
_XNNPACK_BOUND = np.float32(256)
_EIGHT_BIT = (schema.TensorType.INT8, schema.TensorType.UINT8)
_SIXTEEN_BIT = (schema.TensorType.INT16,)


def accepted(numerator, factor, scale):
    """Whether QuantizeMultiplierSmallerThanOneExp takes numerator / float32(factor * scale) (factor a power of
    two): below 1, and below where its 31-bit rounding carries into the exponent (a multiplier within 2^-32 of 1
    rounds to 2^31, which it takes as a shift of 1 and refuses)."""
    multiplier = numerator / float(np.float32(factor) * np.float32(scale))
    return 0.0 < multiplier < 1.0 - 2.0 ** -32


def accepted_by_xnnpack(product, scale):
    """Whether XNNPACK takes a requantization scale of float32 `product` (s_in times the largest s_w) over
    `scale`: below 256, in float32 as it computes it."""
    return bool(np.float32(product) / np.float32(scale) < _XNNPACK_BOUND)


def _product(input_scale, weight_scales):
    return np.float32(input_scale) * np.float32(max(weight_scales))


def _rescale(op, int16):
    """(left shift, power) of `op`'s kernel at int16 (`int16`) or 8 bits."""
    return (_INT16_SHIFTS[op], 1) if int16 else _RESCALES[op]


def smallest_scale(op, input_scales, int16=False):
    """The smallest float32 output scale `op`'s int8 kernel (its int16 one: `int16`) accepts for inputs at
    `input_scales` (for the ops XNNPACK bounds: the activation's scale, then the weights' scales)."""
    if op in _XNNPACK_REQUANTIZED:
        input_scale, *weight_scales = input_scales
        product = _product(input_scale, weight_scales)
        scale = np.float32(product / _XNNPACK_BOUND)
        while not accepted_by_xnnpack(product, scale):  # one or two float32 steps at most
            scale = np.nextafter(scale, np.float32(np.inf))
        return float(scale)
    shift, power = _rescale(op, int16)
    numerator = float(np.float32(2) * np.float32(max(input_scales))) ** power
    factor = 2 ** (shift * power)
    scale = np.float32(numerator / factor)
    while not accepted(numerator, factor, scale):  # float32's step is 2^-23 of it: one or two steps at most
        scale = np.nextafter(scale, np.float32(np.inf))
    return float(scale)


def _tensor_on_grid(subgraph, like, scale, zero_point):
    """A new activation tensor shaped and typed as subgraph.tensors[like], on the grid (scale, zero_point)."""
    quantization = schema.QuantizationParametersT()
    quantization.scale, quantization.zeroPoint = [float(scale)], [int(zero_point)]
    return flatbuffer_model.tensor_like(subgraph, like, "/keras_gelu_kernel_grid", quantization=quantization)


def _weight_scales(tensor):
    """The scales of an 8-bit weight tensor, per tensor or per channel, or None."""
    quantization = tensor.quantization
    if tensor.type not in _EIGHT_BIT or quantization is None or quantization.scale is None \
            or not len(quantization.scale) or not all(float(scale) > 0 for scale in quantization.scale):
        return None
    return [float(scale) for scale in quantization.scale]


def _refused_scales(name, operator, subgraph):
    """(the scales `smallest_scale` takes, the output's (scale, zero point), whether it is int16) where `name`'s
    kernel refuses the operator's integer output scale; else None."""
    if len(operator.outputs) != 1:
        return None
    int16 = subgraph.tensors[operator.outputs[0]].type in _SIXTEEN_BIT
    if int16 and name not in _INT16_SHIFTS:
        return None
    types = _SIXTEEN_BIT if int16 else _EIGHT_BIT
    output = per_tensor_grid(subgraph.tensors[operator.outputs[0]], types)
    if output is None:
        return None
    if name in _XNNPACK_REQUANTIZED:
        activation, weights = (operator.inputs[position] if position < len(operator.inputs) else -1
                               for position in _XNNPACK_REQUANTIZED[name])
        if activation < 0 or weights < 0:
            return None
        grid, weight_scales = per_tensor_grid(subgraph.tensors[activation], _EIGHT_BIT), \
            _weight_scales(subgraph.tensors[weights])
        if grid is None or weight_scales is None or accepted_by_xnnpack(_product(grid[0], weight_scales),
                                                                        output[0]):
            return None
        return (grid[0], *weight_scales), output, False
    if len(operator.inputs) != 2:
        return None
    grids = [per_tensor_grid(subgraph.tensors[index], types) for index in operator.inputs]
    if any(grid is None for grid in grids):
        return None
    (scale_1, _), (scale_2, _) = grids
    shift, power = _rescale(name, int16)
    numerator = float(np.float32(2) * np.float32(max(scale_1, scale_2))) ** power
    if accepted(numerator, 2 ** (shift * power), output[0]):
        return None
    return (scale_1, scale_2), output, int16


def _widened(model):
    """Each op of _RESCALES or _XNNPACK_REQUANTIZED whose integer output scale its kernel refuses, writing a tensor
    on the smallest scale it takes, which a QUANTIZE rescales into the original output; {op: count}."""
    codes = {getattr(schema.BuiltinOperator, name): name for name in (*_RESCALES, *_XNNPACK_REQUANTIZED)}
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        rebuilt, changed = [], False
        for operator in subgraph.operators or []:
            rebuilt.append(operator)
            name = codes.get(flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex]))
            refused = None if name is None else _refused_scales(name, operator, subgraph)
            if refused is None:
                continue
            input_scales, (_, zero_out), int16 = refused
            (output,) = operator.outputs
            wider = _tensor_on_grid(subgraph, output, smallest_scale(name, input_scales, int16), zero_out)
            operator.outputs = [wider]
            rebuilt.append(flatbuffer_model.conversion_operator(model, "QUANTIZE", wider, output))
            made[name] += 1
            changed = True
        if changed:
            subgraph.operators = rebuilt
    return dict(made)


def made_acceptable(tflite_model):
    """(the .tflite with every integer output its kernel would refuse (an ADD, SUB or SQUARED_DIFFERENCE LiteRT's
    kernel or TFLite Micro's would abort on, a FULLY_CONNECTED or convolution XNNPACK would not run) computed on
    the finest grid the kernel takes, {op: count} of those); the bytes as they were where there is none."""
    model = flatbuffer_model.as_object(tflite_model)
    made = _widened(model)
    if not made:
        return tflite_model, {}
    return flatbuffer_model.as_bytes(model, len(tflite_model)), made
