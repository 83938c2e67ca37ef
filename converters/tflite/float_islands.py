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
    return _constant(model, subgraph, np.array([-largest], dtype), integer_type, name, _grid(1.0 / largest, 0))


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
    return _constant(model, subgraph, shaped, integer_tensor.type,
                     flatbuffer_model.tensor_name(float_tensor) + "/keras_gelu_on_grid", quantization)


# A float CAST's result, by its type: what each of 256 int8 values becomes (bool: a mask computed as float)
_CAST_TABLES = {schema.TensorType.INT32: lambda values: np.trunc(values).astype(np.int32),
                schema.TensorType.BOOL: lambda values: values != 0}
# Elementwise functions TFLite computes in float only, as numpy computes them in float32
_ELEMENTWISE = {"COS": np.cos, "SIN": np.sin, "FLOOR": np.floor, "CEIL": np.ceil, "ROUND": np.round,
                "EXP": np.exp, "LOG": np.log, "SQRT": np.sqrt, "ABS": np.abs, "SIGN": np.sign}
# Binary ops that the stock converter leaves in float with a float constant operand (DINOv3's rotated half,
# x * -1), as functions of the tensor operand x and the constant c
_WITH_A_CONSTANT = {"MUL": lambda x, c: x * c, "ADD": lambda x, c: x + c, "MAXIMUM": np.maximum,
                    "MINIMUM": np.minimum, "SUB": (lambda x, c: x - c, lambda x, c: c - x),
                    "DIV": (lambda x, c: x / c, lambda x, c: c / x)}


def _lookups_as_integer(model):
    """Each DEQUANTIZE -> f1 -> ... -> fn -> QUANTIZE, every f one of _ELEMENTWISE of the one before (or of
    _WITH_A_CONSTANT, its other operand a float constant of one value), or with a CAST to int32 or bool in the
    QUANTIZE's place, made a lookup in a table of the chain's 256 results: CAST to int32, ADD 128, GATHER;
    returns {the first op: count}. An int8 input has 256 values, and the chain of each, rounded onto the
    output's grid, is what the float island computes; the table rounds half away from zero where TFLite's
    QUANTIZE rounds half to even, a step at an exact tie. A rotary table computed at run time from positions
    (keras-hub's Gemma 4: COS and SIN of an int8 angle) was a float island, and so was an inverse sigmoid's LOG
    and its product with a constant (SAM 3's box refinement). An op of a chain that other ops read too stays
    for them, and goes where the lookups leave it unread."""
    dequantize, quantize = schema.BuiltinOperator.DEQUANTIZE, schema.BuiltinOperator.QUANTIZE
    cast = schema.BuiltinOperator.CAST
    functions = {getattr(schema.BuiltinOperator, name): name for name in (*_ELEMENTWISE, *_WITH_A_CONSTANT)}
    made = collections.Counter()
    for subgraph in model.subgraphs or ():
        operators = subgraph.operators or []
        producer, consumers = _producers_and_consumers(operators)
        outputs = set(subgraph.outputs)
        replaced, left = {}, []  # left: the ops a lookup stopped reading

        def link(position):
            """(the float tensor the op at `position` computes from, its function), or (None, None)."""
            return _operand_and_function(model, subgraph, operators[position],
                                         functions.get(_code(model, operators[position])))

        for position, operator in enumerate(operators):
            code = _code(model, operator)
            if code not in (quantize, cast) or len(operator.inputs) != 1 or len(operator.outputs) != 1:
                continue
            (floats_out,), (result,) = operator.inputs, operator.outputs
            if subgraph.tensors[floats_out].type != schema.TensorType.FLOAT32:
                continue
            chain, chained, tensor = [], [], floats_out
            while tensor not in outputs and producer.get(tensor) is not None:
                operand, function = link(producer[tensor])
                if operand is None or len(operators[producer[tensor]].outputs) != 1:
                    break
                chain.insert(0, producer[tensor])
                chained.insert(0, function)
                tensor = operand
            before = producer.get(tensor)
            if before is None or _code(model, operators[before]) != dequantize or tensor in outputs or (
                    not chain and code == quantize):
                continue
            (integer_in,) = operators[before].inputs
            grid_in = _per_tensor_grid(subgraph.tensors[integer_in])
            if grid_in is None:
                continue
            computed = _composed(chained)
            if code == cast:  # to int32, truncated (a float-valued count back to int32), or to bool (!= 0)
                if subgraph.tensors[result].type not in _CAST_TABLES:
                    continue
                table = _table(lambda values, to=_CAST_TABLES[subgraph.tensors[result].type]: to(computed(values)),
                               grid_in, None)
            else:
                grid_out = _per_tensor_grid(subgraph.tensors[result])
                if grid_out is None:
                    continue
                table = _table(computed, grid_in, grid_out)
            replaced[position] = _lookup(model, subgraph, integer_in, result, table)
            consumers[floats_out].remove(position)
            consumers[integer_in].append(position)  # the lookup reads the int8 tensor now
            left.append(producer[floats_out])
            made[op_name(model, operators[chain[0]] if chain else operator)] += 1
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


def _composed(functions):
    """The functions applied in turn, each result in float32, as a float island computes them."""
    def computed(values):
        for function in functions:
            values = np.asarray(function(values)).astype(np.float32)
        return values
    return computed


def _operand_and_function(model, subgraph, operator, name):
    """(the float operand an op of `name` computes from, the op as a function of it: None for a CAST, whose
    table is by its type), or (None, None) for an op _lookups_as_integer does not take."""
    if name in _WITH_A_CONSTANT:
        return _of_the_tensor_operand(model, subgraph, operator, name)
    if name is None or len(operator.inputs) != 1:
        return None, None
    return operator.inputs[0], _ELEMENTWISE.get(name)


def _of_the_tensor_operand(model, subgraph, operator, name):
    """(the non-constant operand of a binary op whose other operand is a float constant of one value, the op as a
    function of it), or (None, None)."""
    if len(operator.inputs) != 2:
        return None, None
    for side in (0, 1):
        constant = _float_constant(model, subgraph.tensors[operator.inputs[1 - side]])
        if constant is not None and constant.size == 1 and _float_constant(
                model, subgraph.tensors[operator.inputs[side]]) is None:
            value = np.float32(constant[0])
            function = _WITH_A_CONSTANT[name]
            if isinstance(function, tuple):  # not symmetric: which operand the constant is
                function = function[side]
            return operator.inputs[side], lambda x, function=function: function(x, value)
    return None, None


def _per_tensor_grid(tensor):
    """(scale, zero point) of an int8 tensor quantized per tensor, or None."""
    quantization = tensor.quantization
    if (tensor.type != schema.TensorType.INT8 or quantization is None or quantization.scale is None
            or len(quantization.scale) != 1 or not float(quantization.scale[0]) > 0):
        return None
    return float(quantization.scale[0]), int(quantization.zeroPoint[0])


def _table(function, grid_in, grid_out):
    """function's result for each int8 input -128..127, as the float island computes it in float32: on the
    int8 grid `grid_out`, or as the function gives it (int32, bool) where that is None."""
    scale_in, zero_in = grid_in
    inputs = (np.float32(scale_in) * (np.arange(-128, 128) - zero_in).astype(np.float32)).astype(np.float32)
    with np.errstate(all="ignore"):
        results = function(inputs)
    if grid_out is None:  # the function's own integer or bool results
        return results
    results = results.astype(np.float32).astype(np.float64)
    scale_out, zero_out = grid_out
    steps = np.where(np.isnan(results), zero_out, results / scale_out + zero_out)
    return np.clip(np.sign(steps) * np.floor(np.abs(steps) + 0.5), -128, 127).astype(np.int8)


def _constant(model, subgraph, values, tensor_type, name, quantization=None):
    """A constant tensor of `values` (a numpy array of the type's own dtype) in the subgraph: its index."""
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(values.tobytes(), np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.buffer = np.array(values.shape, np.int32), tensor_type, len(model.buffers) - 1
    tensor.name, tensor.quantization = name, quantization
    subgraph.tensors.append(tensor)
    return len(subgraph.tensors) - 1


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
    offset = _constant(model, subgraph, np.array([128], np.int32), schema.TensorType.INT32, f"{name}/offset")
    if table.dtype == np.int8:
        values = _constant(model, subgraph, table, schema.TensorType.INT8, f"{name}/table",
                           _grid(*_per_tensor_grid(subgraph.tensors[integer_out])))
    else:
        values = _constant(model, subgraph, table, subgraph.tensors[integer_out].type, f"{name}/table")
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


def made_integer(tflite_model):
    """(the .tflite with every float island above that has an exact integer spelling made integer,
    {op: count} of those made integer); the flatbuffer read and written once, whatever the passes make."""
    model = flatbuffer_model.as_object(tflite_model)
    made = {}
    for made_integer_in in (_negations_as_integer, _comparisons_as_integer, _lookups_as_integer):
        made.update(made_integer_in(model))
    if not made:
        return tflite_model, {}
    flatbuffer_model.drop_unused_codes(model)
    return flatbuffer_model.as_bytes(model, len(tflite_model)), made
