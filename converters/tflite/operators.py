"""What a .tflite holds, operator by operator: names, output types, int8 scales, the float ops left in an
integer model. Read through the flatbuffer's object API, for the report and the target checks."""

import collections
import dataclasses

from tensorflow.lite.python import schema_py_generated as schema

from . import flatbuffer_model

_BUILTIN_NAMES = {
    value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")
}
BUILTIN_OP_NAMES = frozenset(_BUILTIN_NAMES.values()) - {"CUSTOM"}


_TYPE_NAMES = {value: name.lower() for name, value in vars(schema.TensorType).items() if not name.startswith("_")}

# Ops that only change representation: at the model's edges they are the
# float interface of an int8 model, inside it they mark a float island.
_CONVERSION_OPS = ("QUANTIZE", "DEQUANTIZE")


@dataclasses.dataclass(frozen=True)
class Operator:
    name: str  # builtin name, or the custom code (Flex*)
    output_type: str  # "int8", "float32", ...
    reads_model_input: bool
    writes_model_output: bool
    input_type: str = "none"  # of the first input


def op_name(model, operator):
    """The builtin op's name, or a custom op's (Flex*) custom code."""
    code = model.operatorCodes[operator.opcodeIndex]
    builtin = flatbuffer_model.builtin_code(code)
    if builtin == schema.BuiltinOperator.CUSTOM:
        return str(flatbuffer_model.custom_code(code))
    return _BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}")


def operators(tflite_model):
    """Every operator of every subgraph with the type of its first output."""
    model = flatbuffer_model.read(tflite_model)
    result = []
    for subgraph in model.subgraphs:
        graph_inputs, graph_outputs = set(subgraph.inputs), set(subgraph.outputs)
        for operator in subgraph.operators:
            name = op_name(model, operator)
            outputs = list(operator.outputs)
            output_type = _TYPE_NAMES.get(subgraph.tensors[outputs[0]].type, "?") if outputs else "none"
            inputs = [index for index in operator.inputs if index >= 0]
            input_type = _TYPE_NAMES.get(subgraph.tensors[inputs[0]].type, "?") if inputs else "none"
            result.append(Operator(name, output_type, bool(graph_inputs & set(operator.inputs)),
                                   bool(graph_outputs & set(outputs)), input_type))
    return result


def per_tensor_grid(tensor, types=(schema.TensorType.INT8,)):
    """(scale, zero point) of a tensor (a TensorT) of one of `types` quantized per tensor, or None."""
    quantization = tensor.quantization
    if (tensor.type not in types or quantization is None or quantization.scale is None
            or len(quantization.scale) != 1 or not float(quantization.scale[0]) > 0):
        return None
    return float(quantization.scale[0]), int(quantization.zeroPoint[0])


def output_scales(tflite_model):
    """The int8 scale of each output of the main subgraph (read before a final DEQUANTIZE), or None."""
    model = flatbuffer_model.read(tflite_model)
    subgraph = model.subgraphs[0]
    producers = {output: operator for operator in subgraph.operators for output in operator.outputs}

    scales = []
    for index in subgraph.outputs:
        scale = flatbuffer_model.per_tensor_scale(subgraph.tensors[index])
        producer = producers.get(index)
        if scale is None and producer is not None and op_name(model, producer) == "DEQUANTIZE":
            scale = flatbuffer_model.per_tensor_scale(subgraph.tensors[producer.inputs[0]])
        scales.append(scale)
    return scales


def op_histogram(tflite_model):
    """{op name: count} over all subgraphs; custom ops (Flex*) by their custom code."""
    counts = collections.Counter(operator.name for operator in operators(tflite_model))
    return dict(sorted(counts.items()))


def typed_op_histogram(tflite_model):
    """{op name: {output type: count}}."""
    counts = collections.defaultdict(collections.Counter)
    for operator in operators(tflite_model):
        counts[operator.name][operator.output_type] += 1
    return {name: dict(sorted(types.items())) for name, types in sorted(counts.items())}


def float_islands(tflite_model):
    """{op name: count} of what still computes in float in an integer model.

    Float-output ops other than QUANTIZE/DEQUANTIZE, plus QUANTIZE/DEQUANTIZE
    that are not the model's float interface (a QUANTIZE of a model input, a
    DEQUANTIZE into a model output). A QUANTIZE of an integer tensor is a
    requantization onto another int8 grid (before a SELECT_V2, say), integer.
    """
    counts = collections.Counter()
    for operator in operators(tflite_model):
        if operator.name == "QUANTIZE" and (operator.reads_model_input or operator.input_type.startswith("int")):
            continue
        if operator.name == "DEQUANTIZE" and operator.writes_model_output:
            continue
        if operator.name in _CONVERSION_OPS or operator.output_type.startswith("float"):
            counts[operator.name] += 1
    return dict(sorted(counts.items()))
