"""Float islands of a quantized .tflite that have an exact integer spelling, made integer.

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

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from . import flatbuffer_model

_INTEGER = (schema.TensorType.INT8, schema.TensorType.INT16)


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
