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
from .operators import op_name
from .operators import per_tensor_grid

_INTEGER = (schema.TensorType.INT8, schema.TensorType.INT16)


# How far from a whole step a constant may be, in steps, and still be that grid point written in float32
_OFF_GRID = 1e-3
_COMPARISONS = ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")


def _code(model, operator):
    return flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex])


def _minus_one(model, subgraph, integer_type, name):
    """A constant int8 (or int16) tensor holding -1 exactly: the quantized value -127 (-32767) at scale 1/127."""
    dtype = flatbuffer_model.integer_dtype(integer_type)
    largest = np.iinfo(dtype).max
    return flatbuffer_model.constant(model, subgraph, np.array([-largest], dtype), integer_type, name,
                                     _grid(1.0 / largest, 0))


def _grid(scale, zero_point):
    """Per-tensor quantization parameters."""
    quantization = schema.QuantizationParametersT()
    quantization.scale, quantization.zeroPoint = [float(scale)], [int(zero_point)]
    return quantization


def _producers_and_consumers(operators):
    """({tensor: the position of the operator writing it}, {tensor: [positions of those reading it]})."""
    producer, consumers = {}, collections.defaultdict(list)
    for position, operator in enumerate(operators):
        for index in operator.outputs:
            producer[index] = position
        for index in operator.inputs:
            if index >= 0:
                consumers[index].append(position)
    return producer, consumers


def _negations_as_integer(model):
    """Each DEQUANTIZE -> NEG -> QUANTIZE chain of `model` (a ModelT), its float tensors used by nothing else, made
    one integer MUL by -1; returns {"NEG": count} of the islands made integer."""
    dequantize, neg, quantize = schema.BuiltinOperator.DEQUANTIZE, schema.BuiltinOperator.NEG, \
        schema.BuiltinOperator.QUANTIZE
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        operators = subgraph.operators or []
        producer, consumers = _producers_and_consumers(operators)
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
            replaced[after[0]] = [product]
            made["NEG"] += 1
        _rebuild(subgraph, dropped, replaced)
    return made


def _float_constant(model, tensor):
    """The values of a float32 constant tensor, or None."""
    if tensor.type != schema.TensorType.FLOAT32 or not flatbuffer_model.is_constant(model, tensor):
        return None
    return np.frombuffer(bytes(model.buffers[tensor.buffer].data), np.float32)


def _on_grid(values, scale, zero_point, integer_type):
    """`values` as the integers they are on the grid (scale, zero point), or None where one is off it."""
    info = np.iinfo(flatbuffer_model.integer_dtype(integer_type))
    steps = values.astype(np.float64) / scale + zero_point
    # a grid point written in float32 is within float32's rounding of a whole step (1e-5 of one at 127 steps)
    if not np.all(np.isfinite(steps)) or np.max(np.abs(steps - np.round(steps)), initial=0.0) > _OFF_GRID \
            or steps.min(initial=0) < info.min or steps.max(initial=0) > info.max:
        return None
    return np.round(steps).astype(info.dtype)


def _comparisons_as_integer(model):
    """Each comparison of a DEQUANTIZE's output with a float constant on that integer's grid made a comparison
    of the integers; returns {op: count}. x op c is q op c_q exactly, where x = s (q - z) and c =
    s (c_q - z), s > 0; TFLite compares int8 and int16 (each input at its own scale). The QAT engine masks
    with a float mask != 0 (a mask a layer computed, on a range): the .tflite compared it in float after a
    DEQUANTIZE (keras-hub's XLNet)."""
    dequantize = schema.BuiltinOperator.DEQUANTIZE
    comparisons = {getattr(schema.BuiltinOperator, name): name for name in _COMPARISONS}
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        operators = subgraph.operators or []
        producer, consumers = _producers_and_consumers(operators)
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
        _rebuild(subgraph, dropped, {})
    return made


def _integer_constant(model, subgraph, values, float_tensor, integer_tensor):
    """A constant of `values` (integers) shaped as float_tensor, quantized as integer_tensor."""
    quantization = _grid(integer_tensor.quantization.scale[0], integer_tensor.quantization.zeroPoint[0])
    shaped = values if float_tensor.shape is None else np.reshape(values, float_tensor.shape)
    return flatbuffer_model.constant(model, subgraph, shaped, integer_tensor.type,
                                     flatbuffer_model.tensor_name(float_tensor) + "/keras_gelu_on_grid", quantization)


# Ops each element of whose result is computed from the same element of their operands alone (a constant of one
# value broadcast): a region of them computed from one int8 tensor computes a function of its 256 values. GATHER
# is one where it looks an element up in a constant table (a lookup made here, or by the converter).
_ELEMENTWISE = frozenset({
    "ABS", "ADD", "CAST", "CEIL", "COS", "DEQUANTIZE", "DIV", "EQUAL", "EXP", "FLOOR", "FLOOR_DIV", "FLOOR_MOD",
    "GATHER", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "LOG", "LOGICAL_AND", "LOGICAL_NOT", "LOGICAL_OR",
    "LOGISTIC", "MAXIMUM", "MINIMUM", "MUL", "NEG", "NOT_EQUAL", "POW", "QUANTIZE", "ROUND", "RSQRT", "SELECT",
    "SELECT_V2", "SIGN", "SIN", "SQRT", "SQUARE", "SUB", "TANH"})
# The types a region's result may take where it leaves as an integer or a mask (a CAST in the QUANTIZE's place)
_TABLE_TYPES = (schema.TensorType.INT8, schema.TensorType.INT32, schema.TensorType.BOOL)


def _lookups_as_integer(model, interpreter):
    """Each float island computed from one int8 tensor by elementwise ops alone (DEQUANTIZE, COS, LOG, MUL by a
    constant, a CAST to int32, a comparison with a constant, a SELECT_V2 between constants, ...), up to a
    QUANTIZE or a CAST to int32 or bool, made a lookup in a table of its 256 results: CAST to int32, ADD 128,
    GATHER; returns {op: count} of the float ops the lookups replace. The table is what the island computes
    for each of the int8 tensor's 256 values, computed by `interpreter` (a LiteRT Interpreter class) running
    the island's own ops on them: the same kernels, the same roundings. Rotary tables computed at run time from
    positions (keras-hub Gemma 4: COS and SIN of an int8 angle), an inverse sigmoid's LOG times a constant and a
    bilinear sampling's fraction y - float(clip(int(y))) (SAM 3's box refinement, its ROI align) were float
    islands. An op of an island that other ops read too stays for them, and goes where the lookups leave it
    unread."""
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        operators = subgraph.operators or []
        producer, consumers = _producers_and_consumers(operators)
        outputs = set(subgraph.outputs)
        replaced, left = {}, []  # left: the ops a lookup stopped reading
        for position, operator in enumerate(operators):
            name = op_name(model, operator)
            if name not in ("QUANTIZE", "CAST") or len(operator.inputs) != 1 or len(operator.outputs) != 1:
                continue
            (floats_out,), (result,) = operator.inputs, operator.outputs
            if subgraph.tensors[floats_out].type != schema.TensorType.FLOAT32 or floats_out in outputs \
                    or subgraph.tensors[result].type not in _TABLE_TYPES:
                continue
            region = _region(model, subgraph, producer, floats_out)
            if region is None:
                continue
            source, positions = region
            if not np.array_equal(subgraph.tensors[source].shape, subgraph.tensors[result].shape):
                continue  # (a constant of more axes broadcast the island's result)
            table = _island_table(model, subgraph, sorted(positions) + [position], source, result, interpreter)
            if table is None:
                continue
            replaced[position] = _lookup(model, subgraph, source, result, table)
            consumers[floats_out].remove(position)
            consumers[source].append(position)  # the lookup reads the int8 tensor now
            left.append(producer[floats_out])
            made.update(op_name(model, operators[at]) for at in [*positions, position]  # the float ops
                        if op_name(model, operators[at]) not in ("DEQUANTIZE", "QUANTIZE") and any(
                            subgraph.tensors[index].type == schema.TensorType.FLOAT32
                            for index in [*operators[at].inputs, *operators[at].outputs] if index >= 0))
        _rebuild(subgraph, _unread(operators, producer, consumers, outputs, left), replaced)
    return made


def _unread(operators, producer, consumers, outputs, left):
    """The positions of the operators among `left` whose every output nothing reads any longer (the float ops
    before a lookup now reading the int8 tensor), and of those they read, followed back likewise."""
    unread = set()
    pending = list(left)
    while pending:
        position = pending.pop()
        operator = operators[position]
        if position in unread or any(consumers[index] or index in outputs for index in operator.outputs):
            continue
        unread.add(position)
        for index in operator.inputs:
            if index >= 0 and position in consumers[index]:
                consumers[index].remove(position)
                if index in producer and not consumers[index]:
                    pending.append(producer[index])
    return unread


def _region(model, subgraph, producer, tensor):
    """(the int8 tensor, quantized per tensor, that `tensor` is computed from by elementwise ops alone, with
    constants of one value; the positions of those ops), or None; the region holds a DEQUANTIZE: an island.
    Its int8 tensors are where it starts, save those computed in it from the others (SAM 3's ROI align reads y,
    and SELECT(y_low >= top, y, y), y_low computed from y)."""
    positions, sources = set(), set()

    def walk(pending, expanded=None):
        """Take the ops computing `pending` into the region, back to int8 tensors (but `expanded`); False where
        one is not elementwise."""
        while pending:
            tensor = pending.pop()
            if flatbuffer_model.is_constant(model, subgraph.tensors[tensor]):
                continue
            if tensor != expanded and per_tensor_grid(subgraph.tensors[tensor]) is not None:
                sources.add(tensor)
                continue
            position = producer.get(tensor)
            if position is None:  # a model input
                return False
            if position in positions:
                continue
            operator = subgraph.operators[position]
            name = op_name(model, operator)
            if name not in _ELEMENTWISE or len(operator.outputs) != 1:
                return False
            inputs = [index for index in operator.inputs if index >= 0]
            if name == "GATHER":  # a lookup of each element in a constant table
                table = subgraph.tensors[inputs[0]]
                if not flatbuffer_model.is_constant(model, table) or len(table.shape) != 1 or \
                        getattr(operator.builtinOptions, "axis", 0) != 0:
                    return False
                inputs = inputs[1:]
            elif any(flatbuffer_model.is_constant(model, subgraph.tensors[index])
                     and _size(subgraph.tensors[index]) != 1
                     for index in inputs):
                return False
            positions.add(position)
            pending.extend(inputs)
        return True

    if not walk([tensor]):
        return None
    while len(sources) > 1:  # the one computed last may be computed from the others
        latest = max(sources, key=lambda source: producer.get(source, -1))
        sources.discard(latest)
        if not walk([latest], expanded=latest):
            return None
    if len(sources) != 1 or not any(op_name(model, subgraph.operators[position]) == "DEQUANTIZE"
                                    for position in positions):
        return None
    return next(iter(sources)), positions


def _size(tensor):
    return int(np.prod(tensor.shape)) if tensor.shape is not None else 0


def _island_table(model, subgraph, positions, source, result, interpreter):
    """What the operators at `positions` (in order, the last writing `result`) compute from each of the int8
    `source` tensor's 256 values: a model of them alone, on a vector of the 256, run by `interpreter`; None
    where it does not run."""
    island = schema.ModelT()
    island.version, island.operatorCodes = model.version, model.operatorCodes
    island.buffers, tensors, indices = [schema.BufferT()], [], {}

    def copied(index):
        if index < 0 or index in indices:
            return indices.get(index, index)
        original = subgraph.tensors[index]
        tensor = schema.TensorT()
        tensor.type, tensor.name, tensor.quantization = original.type, original.name, original.quantization
        if flatbuffer_model.is_constant(model, original):
            tensor.shape = original.shape
            island.buffers.append(model.buffers[original.buffer])
            tensor.buffer = len(island.buffers) - 1
        else:
            tensor.shape, tensor.buffer = np.array([256], np.int32), 0
        tensors.append(tensor)
        indices[index] = len(tensors) - 1
        return indices[index]

    island_subgraph = schema.SubGraphT()
    island_subgraph.inputs = [copied(source)]
    island_subgraph.operators = []
    for position in positions:
        original = subgraph.operators[position]
        operator = schema.OperatorT()
        operator.opcodeIndex = original.opcodeIndex
        operator.builtinOptionsType, operator.builtinOptions = original.builtinOptionsType, original.builtinOptions
        operator.inputs = [copied(index) for index in original.inputs]
        operator.outputs = [copied(index) for index in original.outputs]
        island_subgraph.operators.append(operator)
    island_subgraph.outputs = [copied(result)]
    island_subgraph.tensors = tensors
    island.subgraphs = [island_subgraph]
    try:
        runner = interpreter(model_content=flatbuffer_model.as_bytes(island, 0))
        runner.allocate_tensors()
        runner.set_tensor(runner.get_input_details()[0]["index"], np.arange(-128, 128).astype(np.int8))
        runner.invoke()
        return np.asarray(runner.get_tensor(runner.get_output_details()[0]["index"])).reshape(256)
    except (RuntimeError, ValueError):  # an op the runtime refuses on a vector: the island stays as it is
        return None


def _lookup(model, subgraph, integer_in, integer_out, table):
    """[CAST, ADD, GATHER]: integer_out = table[integer_in + 128] (an int8 table on integer_out's grid, or one of
    integer_out's own type)."""
    source = subgraph.tensors[integer_in]
    name = flatbuffer_model.tensor_name(subgraph.tensors[integer_out]) + "/keras_gelu_lookup"
    indices = []
    for suffix in ("raw", "index"):
        tensor = schema.TensorT()
        tensor.shape, tensor.type, tensor.name = source.shape, schema.TensorType.INT32, f"{name}/{suffix}"
        tensor.shapeSignature = source.shapeSignature
        subgraph.tensors.append(tensor)
        indices.append(len(subgraph.tensors) - 1)
    offset = flatbuffer_model.constant(model, subgraph, np.array([128], np.int32), schema.TensorType.INT32,
                                       f"{name}/offset")
    if table.dtype == np.int8:
        values = flatbuffer_model.constant(model, subgraph, table, schema.TensorType.INT8, f"{name}/table",
                                           _grid(*per_tensor_grid(subgraph.tensors[integer_out])))
    else:
        values = flatbuffer_model.constant(model, subgraph, table, subgraph.tensors[integer_out].type,
                                           f"{name}/table")
    cast = schema.OperatorT()
    cast.opcodeIndex = flatbuffer_model.opcode_index(model, "CAST")
    cast.builtinOptionsType, cast.builtinOptions = schema.BuiltinOptions.CastOptions, schema.CastOptionsT()
    cast.builtinOptions.inDataType, cast.builtinOptions.outDataType = schema.TensorType.INT8, schema.TensorType.INT32
    cast.inputs, cast.outputs = [integer_in], [indices[0]]
    add = schema.OperatorT()
    add.opcodeIndex = flatbuffer_model.opcode_index(model, "ADD")
    add.builtinOptionsType, add.builtinOptions = schema.BuiltinOptions.AddOptions, schema.AddOptionsT()
    add.inputs, add.outputs = [indices[0], offset], [indices[1]]
    gather = schema.OperatorT()
    gather.opcodeIndex = flatbuffer_model.opcode_index(model, "GATHER")
    gather.builtinOptionsType, gather.builtinOptions = schema.BuiltinOptions.GatherOptions, schema.GatherOptionsT()
    gather.inputs, gather.outputs = [values, indices[1]], [integer_out]
    return [cast, add, gather]


def _rebuild(subgraph, dropped, replaced):
    """The subgraph's operators without the positions `dropped`, those in `replaced` (position -> [operators]) by
    their replacements."""
    if dropped or replaced:
        subgraph.operators = [made for position, operator in enumerate(subgraph.operators or [])
                              if position not in dropped for made in replaced.get(position, [operator])]


def made_integer(tflite_model, interpreter):
    """(the .tflite with every float island above that has an exact integer spelling made integer,
    {op: count} of those made integer); the flatbuffer read and written once, whatever the passes make.
    `interpreter`: a LiteRT Interpreter class, which computes the lookups' tables."""
    model = flatbuffer_model.as_object(tflite_model)
    made = {}
    for made_integer_in in (_negations_as_integer, _comparisons_as_integer):
        made.update(made_integer_in(model))
    made.update(_lookups_as_integer(model, interpreter))
    if not made:
        return tflite_model, {}
    flatbuffer_model.drop_unused_codes(model)
    return flatbuffer_model.as_bytes(model, len(tflite_model)), made
