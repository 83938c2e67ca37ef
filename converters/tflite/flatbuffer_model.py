"""A .tflite read into and written back from the flatbuffer object API (schema's ModelT)."""

import flatbuffers
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

from .. import paths


def as_object(tflite_model):
    """The model as the flatbuffer object API's ModelT.

    Unpacked straight from the bytes, without the copy flatbuffer_utils
    makes: weight buffers stay numpy views of `tflite_model`. Models over
    2 GB keep their weights after the flatbuffer (buffer offsets), which only
    flatbuffer_utils reads back.
    """
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(tflite_model, 0))
    if any(buffer.offset for buffer in model.buffers or ()):
        return flatbuffer_utils.read_model_from_bytearray(bytearray(tflite_model))
    return model


def as_bytes(model, size_hint):
    """Serialize a ModelT: the builder is sized for the model up front and its bytes copied out once."""
    builder = flatbuffers.Builder(size_hint + (1 << 20))
    builder.Finish(model.Pack(builder), file_identifier=paths.TFLITE_FILE_IDENTIFIER)
    return bytes(memoryview(builder.Bytes)[builder.Head():])


def builtin_code(operator_code):
    """An OperatorCodeT's builtin op (the schema keeps codes below 127 in a deprecated byte too)."""
    return max(operator_code.builtinCode, operator_code.deprecatedBuiltinCode)


def custom_code(operator_code):
    """An OperatorCodeT's custom op name (a Flex op's "Flex..."), as text; None for a builtin op."""
    code = operator_code.customCode
    return code.decode() if isinstance(code, bytes) else code


def opcode_index(model, name):
    """The index of builtin op `name`'s operator code in a ModelT, added (version 1) where it has none."""
    code = getattr(schema.BuiltinOperator, name)
    for index, operator_code in enumerate(model.operatorCodes):
        if builtin_code(operator_code) == code:
            return index
    operator_code = schema.OperatorCodeT()
    operator_code.builtinCode, operator_code.deprecatedBuiltinCode, operator_code.version = code, min(code, 127), 1
    model.operatorCodes.append(operator_code)
    return len(model.operatorCodes) - 1


def drop_unused_codes(model):
    """Keep only the operator codes an operator uses: a replaced op's code (FlexErf above all) would otherwise
    still name an op the runtime must resolve."""
    used = sorted({operator.opcodeIndex for subgraph in model.subgraphs or () for operator in subgraph.operators or ()})
    renumbered = {old: new for new, old in enumerate(used)}
    model.operatorCodes = [model.operatorCodes[index] for index in used]
    for subgraph in model.subgraphs or ():
        for operator in subgraph.operators or ():
            operator.opcodeIndex = renumbered[operator.opcodeIndex]


def tensor_name(tensor):
    return tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)
