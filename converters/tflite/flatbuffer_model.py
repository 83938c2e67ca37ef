"""A .tflite read into and written back from the flatbuffer object API (schema's ModelT)."""

import flatbuffers
import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from .. import paths


# A flatbuffer's offsets are 32-bit: past 2 GB, the stock converter writes each weight buffer after the
# flatbuffer (Buffer.offset and .size, from the file's start) and names that form in a metadata entry.
# The weights a flatbuffer holds, leaving 64 MB of its 2 GB to the graph.
_INLINE_WEIGHTS_LIMIT = 2 ** 31 - 2 ** 26
_BUFFER_LOCATION = b"buffer_location"
_BUFFER_LOCATION_VALUE = b"outside flatbuffers"
_BUFFER_ALIGNMENT = 16  # the stock converter's: each buffer after the flatbuffer starts on 16 bytes


def as_object(tflite_model):
    """The model as the flatbuffer object API's ModelT.

    Unpacked straight from the bytes, without the copy flatbuffer_utils
    makes: weight buffers stay numpy views of `tflite_model`, wherever they
    lie (inside the flatbuffer, or after it in a model past 2 GB).
    """
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(tflite_model, 0))
    whole = None
    for buffer in model.buffers or ():
        if buffer.offset > 1:  # the schema's rule: offsets 0 and 1 mean the data, if any, is inside
            whole = np.frombuffer(tflite_model, np.uint8) if whole is None else whole
            buffer.data = whole[buffer.offset:buffer.offset + buffer.size]
            buffer.offset = buffer.size = 0
    return model


# The bytes `read` unpacked last, and their ModelT
_last_read = None


def read(tflite_model):
    """The model as a ModelT to read, never to change: one unpacking serves every reader of the same bytes.

    A conversion's checks and reports (its op counts, types and scales, Flex ops, the validation, the check
    job's) each read the one .tflite, seven unpackings a conversion on average, each in pure Python (0.1 s for
    a model of 1,500 tensors). The last `bytes` read is remembered (an immutable object: its identity is its
    content), with its ModelT; a mutable buffer is unpacked each time. A caller that changes the model takes
    its own, `as_object`'s.
    """
    global _last_read
    last = _last_read
    if last is not None and last[0] is tflite_model:
        return last[1]
    model = as_object(tflite_model)
    if type(tflite_model) is bytes:
        _last_read = (tflite_model, model)
    return model


def as_bytes(model, size_hint):
    """Serialize a ModelT as the stock converter would: whole where its weights fit in a flatbuffer (the form
    every runtime reads: TFLite Micro reads no buffer after the flatbuffer), else with them after it."""
    weights = sum(len(buffer.data) for buffer in model.buffers or () if buffer.data is not None)
    if weights > _INLINE_WEIGHTS_LIMIT:
        return _with_buffers_after(model)
    # A model read in the other form names it in its metadata: the name goes with the form
    model.metadata = [entry for entry in model.metadata or () if not _names_the_form(entry)] or None
    return _packed(model, size_hint)


def _names_the_form(entry):
    """Whether a metadata entry is the one that says the weights lie after the flatbuffer."""
    return (entry.name.encode() if isinstance(entry.name, str) else entry.name) == _BUFFER_LOCATION


def _with_buffers_after(model):
    """The flatbuffer without its weights, then each weight buffer on a 16-byte boundary, at the offset its
    Buffer names. A Buffer's offset is a 64-bit scalar either way, so the flatbuffer packed with placeholder
    offsets has the size it has with the real ones: packed twice, the second time with the real offsets."""
    if not any(_names_the_form(entry) for entry in model.metadata or ()):
        location = schema.BufferT()
        location.data = np.frombuffer(_BUFFER_LOCATION_VALUE, np.uint8)
        entry = schema.MetadataT()
        entry.name, entry.buffer = _BUFFER_LOCATION, len(model.buffers)
        model.buffers.append(location)
        model.metadata = [*(model.metadata or ()), entry]
    metadata_buffers = {entry.buffer for entry in model.metadata}
    outside = [(buffer, buffer.data) for index, buffer in enumerate(model.buffers)
               if index not in metadata_buffers and buffer.data is not None and len(buffer.data)]
    try:
        for buffer, data in outside:
            buffer.data, buffer.offset, buffer.size = None, 2, len(data)
        head = _packed(model)
        position = _aligned(len(head))
        for buffer, data in outside:
            buffer.offset, position = position, _aligned(position + len(data))
        head = _packed(model)
    finally:
        for buffer, data in outside:
            buffer.data, buffer.offset, buffer.size = data, 0, 0
    pieces, end = [head], len(head)
    for buffer, data in outside:
        pieces += [bytes(_aligned(end) - end), data]
        end = _aligned(end) + len(data)
    return b"".join(pieces)


def _packed(model, size_hint=0):
    """The builder sized for the model up front, its bytes copied out once."""
    builder = flatbuffers.Builder(size_hint + (1 << 20))
    builder.Finish(model.Pack(builder), file_identifier=paths.TFLITE_FILE_IDENTIFIER)
    return bytes(memoryview(builder.Bytes)[builder.Head():])


def _aligned(position):
    return -(-position // _BUFFER_ALIGNMENT) * _BUFFER_ALIGNMENT


def builtin_code(operator_code):
    """An OperatorCodeT's builtin op (the schema keeps codes below 127 in a deprecated byte too)."""
    return max(operator_code.builtinCode, operator_code.deprecatedBuiltinCode)


def custom_code(operator_code):
    """An OperatorCodeT's custom op name (a Flex op's "Flex..."), as text; None for a builtin op."""
    code = operator_code.customCode
    return code.decode() if isinstance(code, bytes) else code


def opcode_index(model, name):
    """The index of builtin op `name`'s operator code in a ModelT, any version, added (version 1) where it has
    none."""
    code = getattr(schema.BuiltinOperator, name)
    return _found_or_added(model, lambda operator_code: builtin_code(operator_code) == code, (code, min(code, 127), 1))


def code_index(model, code):
    """The index of the builtin operator code (builtin, deprecated builtin, version) in a ModelT, added where it
    has none."""
    return _found_or_added(model, lambda operator_code: not operator_code.customCode and (
        operator_code.builtinCode, operator_code.deprecatedBuiltinCode, operator_code.version) == code, code)


def _found_or_added(model, matches, code):
    for index, operator_code in enumerate(model.operatorCodes):
        if matches(operator_code):
            return index
    operator_code = schema.OperatorCodeT()
    operator_code.builtinCode, operator_code.deprecatedBuiltinCode, operator_code.version = code
    model.operatorCodes.append(operator_code)
    return len(model.operatorCodes) - 1


def per_tensor_scale(tensor):
    """A TensorT's one quantization scale, as a float; None where it has none or one per channel."""
    quantization = tensor.quantization
    scales = None if quantization is None else quantization.scale
    return float(scales[0]) if scales is not None and len(scales) == 1 else None


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


def integer_dtype(tensor_type):
    """The numpy dtype of an int8 or int16 tensor type (the integer types activations are quantized to)."""
    return np.int8 if tensor_type == schema.TensorType.INT8 else np.int16


def is_constant(model, tensor):
    """Whether a tensor holds data of its own (buffer 0 is the empty one every computed tensor points at)."""
    data = model.buffers[tensor.buffer].data if 0 < tensor.buffer < len(model.buffers) else None
    return data is not None and len(data) > 0


def constant(model, subgraph, values, tensor_type, name, quantization=None):
    """A constant tensor of `values` (a numpy array of the type's own dtype) in the subgraph: its index."""
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(values.tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.buffer = np.array(values.shape, np.int32), tensor_type, len(model.buffers) - 1
    tensor.name, tensor.quantization = name, quantization
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def tensor_like(subgraph, like, suffix, tensor_type=None, quantization=None):
    """A new computed tensor shaped as subgraph.tensors[like], of its type or `tensor_type`, named as it is with
    `suffix` added: its index."""
    original, tensor = subgraph.tensors[like], schema.TensorT()
    tensor.shape, tensor.shapeSignature = original.shape, original.shapeSignature
    tensor.type = original.type if tensor_type is None else tensor_type
    tensor.name, tensor.quantization = tensor_name(original) + suffix, quantization
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


def conversion_operator(model, kind, source, target):
    """A QUANTIZE or DEQUANTIZE operator (`kind`) from tensor `source` to tensor `target`."""
    operator = schema.OperatorT()
    operator.opcodeIndex = opcode_index(model, kind)
    options = {"QUANTIZE": (schema.BuiltinOptions.QuantizeOptions, schema.QuantizeOptionsT),
               "DEQUANTIZE": (schema.BuiltinOptions.DequantizeOptions, schema.DequantizeOptionsT)}[kind]
    operator.builtinOptionsType, operator.builtinOptions = options[0], options[1]()
    operator.inputs, operator.outputs = [source], [target]
    return operator
