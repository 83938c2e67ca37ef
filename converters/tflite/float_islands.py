"""Float islands of a quantized .tflite that have an exact integer spelling, made integer (`made_integer`).

The stock converter's post-training int8 leaves an op it has no integer
kernel for in float, between a DEQUANTIZE and a QUANTIZE. Keras 3's
LayerNormalization centres its input with a NEG, and TFLite's NEG has no
int8 kernel, so every LayerNormalization of a stock int8 ViT or BERT is such
an island, which an integer-only target cannot run (Vela places it on the
Cortex-M beside the Ethos-U). x -> -x is a MUL by -1, and -1 is exact in int8
(-127 at scale 1/127): DEQUANTIZE, NEG, QUANTIZE become one int8 MUL, whose
fixed-point rescale is its only rounding (within a step of the float NEG
rounded into the QUANTIZE's output; verification holds the model to it).
"""

import collections
import math

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from . import flatbuffer_model

_INTEGER = (schema.TensorType.INT8, schema.TensorType.INT16)


# How far from a whole step a constant may be, in steps, and still be that grid point written in float32
_OFF_GRID = 1e-3
_COMPARISONS = ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")


def _code(model, operator):
    return flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex])


def _minus_one(model, subgraph, integer_type, name):
    """A constant int8 (or int16) tensor holding -1 exactly: the quantized value -127 (-32767) at scale 1/127."""
    largest = 127 if integer_type == schema.TensorType.INT8 else 32767
    dtype = np.int8 if integer_type == schema.TensorType.INT8 else np.int16
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(np.array([-largest], dtype).tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.buffer = np.array([1], np.int32), integer_type, len(model.buffers) - 1
    tensor.name = name
    tensor.quantization = schema.QuantizationParametersT()
    tensor.quantization.scale, tensor.quantization.zeroPoint = [1.0 / largest], [0]
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def negations_as_integer(tflite_model):
    """(the .tflite with each DEQUANTIZE -> NEG -> QUANTIZE chain, its float tensors used by nothing else, as
    one integer MUL by -1; {"NEG": count} of the islands made integer)."""
    model = flatbuffer_model.as_object(tflite_model)
    dequantize, neg, quantize = schema.BuiltinOperator.DEQUANTIZE, schema.BuiltinOperator.NEG, \
        schema.BuiltinOperator.QUANTIZE
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        operators = subgraph.operators or []
        producer, consumers = {}, collections.defaultdict(list)
        for position, operator in enumerate(operators):
            for index in operator.outputs:
                producer[index] = position
            for index in operator.inputs:
                if index >= 0:
                    consumers[index].append(position)
        outputs = set(subgraph.outputs)
        dropped, replaced = set(), {}
        for position, operator in enumerate(operators):
            if _code(model, operator) != neg:
                continue
            (floats_in,), (floats_out,) = operator.inputs, operator.outputs
            before, after = producer.get(floats_in), consumers[floats_out]
            if (before is None or _code(model, operators[before]) != dequantize or len(after) != 1
                    or _code(model, operators[after[0]]) != quantize or consumers[floats_in] != [position]
                    or {floats_in, floats_out} & outputs):
                continue
            (integer_in,), (integer_out,) = operators[before].inputs, operators[after[0]].outputs
            integer_type = subgraph.tensors[integer_in].type
            if integer_type not in _INTEGER or subgraph.tensors[integer_out].type != integer_type:
                continue
            product = schema.OperatorT()
            product.opcodeIndex = flatbuffer_model.opcode_index(model, "MUL")
            product.builtinOptionsType = schema.BuiltinOptions.MulOptions
            product.builtinOptions = schema.MulOptionsT()
            name = flatbuffer_model.tensor_name(subgraph.tensors[integer_out]) + "/keras_gelu_minus_one"
            minus_one = _minus_one(model, subgraph, integer_type, name)
            product.inputs, product.outputs = [integer_in, minus_one], [integer_out]
            dropped |= {before, position}
            replaced[after[0]] = product
            made["NEG"] += 1
        if replaced:
            subgraph.operators = [replaced.get(position, operator) for position, operator in enumerate(operators)
                                  if position not in dropped]
    if not made:
        return tflite_model, {}
    flatbuffer_model.drop_unused_codes(model)
    return flatbuffer_model.as_bytes(model, len(tflite_model)), dict(made)


def _float_constant(model, tensor):
    """The values of a float32 constant tensor, or None."""
    data = model.buffers[tensor.buffer].data if tensor.buffer < len(model.buffers) else None
    if tensor.type != schema.TensorType.FLOAT32 or data is None or not len(data):
        return None
    return np.frombuffer(bytes(data), np.float32)


def _on_grid(values, scale, zero_point, integer_type):
    """`values` as the integers they are on the grid (scale, zero point), or None where one is off it."""
    info = np.iinfo(np.int8 if integer_type == schema.TensorType.INT8 else np.int16)
    steps = values.astype(np.float64) / scale + zero_point
    # a grid point written in float32 is within float32's rounding of a whole step (1e-5 of one at 127 steps)
    if not np.all(np.isfinite(steps)) or np.max(np.abs(steps - np.round(steps)), initial=0.0) > _OFF_GRID \
            or steps.min(initial=0) < info.min or steps.max(initial=0) > info.max:
        return None
    return np.round(steps).astype(info.dtype)


def comparisons_as_integer(tflite_model):
    """(the .tflite with each comparison of a DEQUANTIZE's output with a float constant on that integer's grid
    made a comparison of the integers, {op: count}). x op c is q op c_q exactly, where x = s (q - z) and c =
    s (c_q - z), s > 0; TFLite compares int8 and int16 (each input at its own scale). The QAT engine masks
    with a float mask != 0 (a mask a layer computed, on a range): the .tflite compared it in float after a
    DEQUANTIZE (keras-hub's XLNet)."""
    model = flatbuffer_model.as_object(tflite_model)
    dequantize = schema.BuiltinOperator.DEQUANTIZE
    comparisons = {getattr(schema.BuiltinOperator, name): name for name in _COMPARISONS}
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        operators = subgraph.operators or []
        producer, consumers = {}, collections.defaultdict(list)
        for position, operator in enumerate(operators):
            for index in operator.outputs:
                producer[index] = position
            for index in operator.inputs:
                if index >= 0:
                    consumers[index].append(position)
        dropped = set()
        for position, operator in enumerate(operators):
            name = comparisons.get(_code(model, operator))
            if name is None or len(operator.inputs) != 2:
                continue
            for side in (0, 1):
                floats, other = operator.inputs[side], operator.inputs[1 - side]
                before = producer.get(floats)
                if before is None or _code(model, operators[before]) != dequantize:
                    continue
                (integers,) = operators[before].inputs
                integer_tensor = subgraph.tensors[integers]
                quantization = integer_tensor.quantization
                values = _float_constant(model, subgraph.tensors[other])
                if (integer_tensor.type not in _INTEGER or values is None or quantization is None
                        or quantization.scale is None or len(quantization.scale) != 1):
                    continue
                scale, zero_point = float(quantization.scale[0]), int(quantization.zeroPoint[0])
                on_grid = _on_grid(values, scale, zero_point, integer_tensor.type)
                if on_grid is None or not math.isfinite(scale) or scale <= 0:
                    continue
                constant = _integer_constant(model, subgraph, on_grid, subgraph.tensors[other], integer_tensor)
                inputs = list(operator.inputs)
                inputs[side], inputs[1 - side] = integers, constant
                operator.inputs = inputs
                consumers[floats].remove(position)
                if not consumers[floats] and floats not in set(subgraph.outputs):
                    dropped.add(before)
                made[name] += 1
                break
        if dropped:
            subgraph.operators = [operator for position, operator in enumerate(operators) if position not in dropped]
    if not made:
        return tflite_model, {}
    flatbuffer_model.drop_unused_codes(model)
    return flatbuffer_model.as_bytes(model, len(tflite_model)), dict(made)


def _integer_constant(model, subgraph, values, float_tensor, integer_tensor):
    """A constant of `values` (integers) shaped as float_tensor, quantized as integer_tensor."""
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(values.tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.buffer = float_tensor.shape, integer_tensor.type, len(model.buffers) - 1
    tensor.name = flatbuffer_model.tensor_name(float_tensor) + "/keras_gelu_on_grid"
    tensor.quantization = schema.QuantizationParametersT()
    tensor.quantization.scale = [float(integer_tensor.quantization.scale[0])]
    tensor.quantization.zeroPoint = [int(integer_tensor.quantization.zeroPoint[0])]
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def made_integer(tflite_model):
    """(the .tflite with every float island above that has an exact integer spelling made integer,
    {op: count} of those made integer)."""
    tflite_model, negations = negations_as_integer(tflite_model)
    tflite_model, comparisons = comparisons_as_integer(tflite_model)
    return tflite_model, {**negations, **comparisons}
