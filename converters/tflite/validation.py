"""A .tflite checked before any runtime reads it: the structure a runtime trusts, and numbers it cannot use.

LiteRT's own verifier checks the flatbuffer's layout; what it leaves to the kernels (a NaN quantization scale,
a zero point off its type's range, a buffer past the file's end, an index past a list) a kernel may meet as
garbage output or a crash. `problem` finds the first such thing, for the converter's own output (its
errors.ConverterFailed) and for a .tflite given as input (errors.CorruptModel).
"""

import math

from tensorflow.lite.python import schema_py_generated as schema

from . import flatbuffer_model

# The zero points each integer type can hold; int16 activations are symmetric (TFLite's 16x8 scheme).
_ZERO_POINT_RANGES = {getattr(schema.TensorType, name): limits for name, limits in (
    ("INT8", (-128, 127)), ("UINT8", (0, 255)), ("INT16", (0, 0)), ("INT4", (-8, 7)))
    if hasattr(schema.TensorType, name)}


def problem(tflite_model):
    """The first thing in the .tflite a runtime must not meet, as a phrase, or None."""
    try:
        root = schema.Model.GetRootAsModel(tflite_model, 0)
        # A model past 2 GB keeps its buffers after the flatbuffer, at offsets the object API follows unchecked
        for index in range(root.BuffersLength()):
            buffer = root.Buffers(index)
            if buffer.Offset() and buffer.Offset() + buffer.Size() > len(tflite_model):
                return f"buffer {index} lies outside the file (offset {buffer.Offset()}, size {buffer.Size()})"
        model = flatbuffer_model.read(tflite_model)
    except Exception as error:  # noqa: BLE001 - the flatbuffer readers fail in whatever way the bytes lead them to
        return f"its flatbuffer cannot be read ({type(error).__name__})"
    not_text = next((where for where, name in _names(model) if not _is_text(name)), None)
    if not_text is not None:
        return f"{not_text} is not UTF-8 text"
    buffers = model.buffers or []
    codes = len(model.operatorCodes or [])
    for number, subgraph in enumerate(model.subgraphs or []):
        tensors = subgraph.tensors or []
        for tensor in tensors:
            found = _tensor_problem(tensor, len(buffers))
            if found is not None:
                return f"tensor {flatbuffer_model.tensor_name(tensor)!r} of subgraph {number} {found}"
        for index in [*(subgraph.inputs if subgraph.inputs is not None else []),
                      *(subgraph.outputs if subgraph.outputs is not None else [])]:
            if not 0 <= index < len(tensors):
                return f"subgraph {number} names tensor {index}, of {len(tensors)}"
        for position, operator in enumerate(subgraph.operators or []):
            if not 0 <= operator.opcodeIndex < codes:
                return f"operator {position} of subgraph {number} has op code {operator.opcodeIndex}, of {codes}"
            for index in [*(operator.inputs if operator.inputs is not None else []),
                          *(operator.outputs if operator.outputs is not None else [])]:
                if not -1 <= index < len(tensors):
                    return f"operator {position} of subgraph {number} names tensor {index}, of {len(tensors)}"
    subgraphs = model.subgraphs or []
    for number, signature in enumerate(model.signatureDefs or []):
        if not 0 <= signature.subgraphIndex < len(subgraphs):
            return f"signature {number} names subgraph {signature.subgraphIndex}, of {len(subgraphs)}"
        tensors = len(subgraphs[signature.subgraphIndex].tensors or [])
        for entry in [*(signature.inputs or []), *(signature.outputs or [])]:
            if not 0 <= entry.tensorIndex < tensors:
                return f"signature {number} names tensor {entry.tensorIndex}, of {tensors}"
    return None


def _names(model):
    """(where, name) of every name in a ModelT that runtimes and this package read as text."""
    yield "the model's description", model.description
    for number, code in enumerate(model.operatorCodes or []):
        yield f"custom op code {number}", code.customCode
    for number, subgraph in enumerate(model.subgraphs or []):
        yield f"the name of subgraph {number}", subgraph.name
        for index, tensor in enumerate(subgraph.tensors or []):
            yield f"the name of tensor {index} of subgraph {number}", tensor.name
    for number, signature in enumerate(model.signatureDefs or []):
        yield f"the key of signature {number}", signature.signatureKey
        for entry in [*(signature.inputs or []), *(signature.outputs or [])]:
            yield f"a tensor name of signature {number}", entry.name
    for number, metadata in enumerate(model.metadata or []):
        yield f"the name of metadata {number}", metadata.name


def _is_text(name):
    if isinstance(name, bytes):
        try:
            name.decode()
        except UnicodeDecodeError:
            return False
    return True


def _tensor_problem(tensor, buffer_count):
    if not 0 <= tensor.buffer < max(buffer_count, 1):
        return f"names buffer {tensor.buffer}, of {buffer_count}"
    if tensor.shape is not None and any(size < 0 for size in tensor.shape):
        return f"has shape {list(tensor.shape)}"
    quantization = tensor.quantization
    scales = [] if quantization is None or quantization.scale is None else list(quantization.scale)
    zero_points = [] if quantization is None or quantization.zeroPoint is None else list(quantization.zeroPoint)
    bad = next((scale for scale in scales if not (math.isfinite(scale) and scale > 0)), None)
    if bad is not None:
        return f"has quantization scale {bad} (a scale must be finite and positive)"
    if scales and len(zero_points) not in (len(scales), 1):
        return f"has {len(scales)} quantization scales but {len(zero_points)} zero points"
    low, high = _ZERO_POINT_RANGES.get(tensor.type, (-math.inf, math.inf))
    bad = next((point for point in zero_points if not low <= point <= high), None)
    if bad is not None and scales:
        return f"has zero point {bad}, outside [{low}, {high}] for its type"
    return None
