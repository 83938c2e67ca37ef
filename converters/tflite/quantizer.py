"""The stock post-training quantizer in its two steps: calibrate, then quantize from the calibrated ranges.

`TFLiteConverter.convert()` calibrates a float model on the representative samples and quantizes it in one
call (TensorFlow's lite.py, `_quantize`). Taken apart, the calibrated model (float, with every tensor's
smallest and largest value recorded) is read before it is quantized, and quantized as often as wanted
without running the samples again: with chosen ops kept in float (`mlir_quantize`'s `denylisted_nodes`),
which is what --mixed-precision lifts, one quantization of the same calibrated model per choice.

16x8 is quantized from the calibrated model too, by the older quantizer, which lite.py hands int16 activations
to (the MLIR one makes int8 only): it reads the ranges the calibrated model holds. It keeps no op float on
request: ops on integers alone, which it would ask ranges of, and the ops a repair keeps float, it is shown as
ops it leaves alone, and each of the latter is then put between a DEQUANTIZE and a QUANTIZE.
"""

import collections
import math

import numpy as np
import tensorflow as tf
from tensorflow.lite.python import convert as stock_convert
from tensorflow.lite.python import lite as stock_lite
from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.python.optimize import calibrator as stock_calibrator

from .. import native_logs
from . import deduplication
from . import flatbuffer_model
from .operators import op_name
from .operators import per_tensor_grid


def calibrate_only(converter):
    """Set up a converter configured for post-training int8 to stop at the calibrated float model."""
    converter._experimental_calibrate_only = True  # noqa: SLF001 (TensorFlow's switch for this split)


def quantized(calibrated_model, int8_io, float_ops=()):
    """The int8 model from a calibrated one, as `TFLiteConverter.convert()` makes it in one call; `float_ops`:
    the ops kept in float, by name (`ops`), each between a DEQUANTIZE and a QUANTIZE."""
    io_type = tf.int8 if int8_io else tf.float32
    with native_logs.discarded():  # it prints its settings on every call
        quantized_model = stock_convert.mlir_quantize(calibrated_model, input_data_type=io_type,
                                                      output_data_type=io_type,
                                                      denylisted_nodes=sorted(float_ops) or None)
    return deduplication.deduplicated(quantized_model)  # as convert() shares repeated weights last


def recorded_tensors(calibrated_model):
    """The indices of the main subgraph's tensors the calibrator recorded one range for (activations: weights
    have none until they are quantized, per channel)."""
    subgraph = flatbuffer_model.read(calibrated_model).subgraphs[0]
    return [index for index, tensor in enumerate(subgraph.tensors) if _one_range(tensor.quantization)]


def _one_range(quantization):
    return quantization is not None and quantization.min is not None and len(quantization.min) == 1


def quantized_16x8(calibrated_model, int16_io, float_ops=()):
    """The 16x8 model (int16 activations, int8 weights) from a calibrated one, as `TFLiteConverter.convert()`
    makes it in one call (lite.py's `_quantize` and `_optimize_tflite_model`), from the ranges the model holds:
    a calibrator fed no samples quantizes with them. Ops without a 16x8 kernel stay float (allow_float: our op
    sets follow the 16x8 one with the mode's); ops on integers alone, and those `float_ops` names, are shown to it
    as an op it leaves alone (`_ops_hidden`), and have them back after (`_as_written`), the latter in float."""
    io_type = tf.int16 if int16_io else tf.float32
    hidden_model, hidden = _ops_hidden(calibrated_model, set(float_ops) | _running_untaken_branches(calibrated_model))
    with native_logs.discarded():
        quantized_model = stock_calibrator.Calibrator(hidden_model).calibrate_and_quantize(
            lambda: iter(()), io_type, io_type, allow_float=True, activations_type=tf.int16, bias_type=tf.int64)
    quantized_model = _as_written(quantized_model, hidden)
    if int16_io:  # as lite.py does for an I/O type the quantizer leaves
        quantized_model = stock_lite._modify_model_io_type(quantized_model, tf.int16, tf.int16)  # noqa: SLF001
    return deduplication.deduplicated(quantized_model)


# The older quantizer asks a range of every input of an op it has a rule for, an integer one too: a language
# model's NOT_EQUAL on its token ids failed it ("Max and min for dynamic tensors should be recorded during
# calibration: Failed for tensor input_ids"), and the stock converter's 16x8 the same way. An op that reads and
# writes no float tensor has nothing to quantize: the quantizer is shown it as an op it has no rule for, and it
# gets its own op back after.
_LEFT_ALONE = schema.BuiltinOperator.HASHTABLE_LOOKUP
_FLOAT_TYPES = (schema.TensorType.FLOAT32, schema.TensorType.FLOAT16)
_INTEGER_ACTIVATIONS = (schema.TensorType.INT8, schema.TensorType.INT16)
_DEQUANTIZE = schema.BuiltinOperator.DEQUANTIZE


# What _ops_hidden hid: {(subgraph, the op's first output's name): its operator code's (builtin, deprecated
# builtin, version)}, and which of them compute in float (kept so, with the ops around them quantized)
Hidden = collections.namedtuple("Hidden", "codes kept_float")


def _one_buffer_per_constant(model):
    """Copy each buffer that several constants of `model` (a ModelT) share for each after the first (the converter
    keeps one buffer for equal bytes: an int32 0 and a float32 0.0, a branch's ones and another's); whether any
    was. The older quantizer writes a constant's quantized values into its buffer, whoever else reads it:
    ViT-MAE's int32 0, the begin and the axis of its shapes' slices and products, was left two bytes long, and
    so were the ones of LED's untaken branches, kept float; LiteRT refused both models ("Tensor 40 is invalidly
    specified in schema"). The quantized model's equal buffers are shared again after (`deduplication`)."""
    taken, copied = set(), False
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            if not flatbuffer_model.is_constant(model, tensor):
                continue
            if tensor.buffer in taken:
                copy = schema.BufferT()
                copy.data = np.array(model.buffers[tensor.buffer].data, np.uint8)
                model.buffers.append(copy)
                tensor.buffer, copied = len(model.buffers) - 1, True
            taken.add(tensor.buffer)
    return copied


def _running_untaken_branches(calibrated_model):
    """The names (`ops`) of the main graph's ops that run a subgraph holding a float activation with no recorded
    range: a branch no calibration sample took (LED's global attention, where no sample had a global position).
    The older quantizer refuses it ("Max and min for dynamic tensors should be recorded during calibration"); the
    int8 quantizer keeps such an op float with what it runs, and so does 16x8."""
    model = flatbuffer_model.read(calibrated_model)
    unranged = {index for index, subgraph in enumerate(model.subgraphs) if index and any(
        tensor.type in _FLOAT_TYPES and not flatbuffer_model.is_constant(model, tensor)
        and not _one_range(tensor.quantization) for tensor in subgraph.tensors)}
    main = model.subgraphs[0]
    return {flatbuffer_model.tensor_name(main.tensors[operator.outputs[0]]) for operator in main.operators or ()
            if len(operator.outputs) and _subgraphs_reached(model, operator) & unranged}


def _subgraphs_reached(model, operator):
    """The indices of the subgraphs `operator` runs, through any depth of calls."""
    reached, pending = set(), [operator]
    while pending:
        for index in _subgraphs_called(pending.pop()) - reached:
            if 0 < index < len(model.subgraphs):
                reached.add(index)
                pending.extend(model.subgraphs[index].operators or ())
    return reached


def _ops_hidden(tflite_model, float_ops=frozenset()):
    """(the model as the older quantizer is shown it, a `Hidden`): each constant with a buffer of its own
    (`_one_buffer_per_constant`), and each op on integers alone, and each op of the main graph named in
    `float_ops` with every op of the subgraphs it runs, made a _LEFT_ALONE op; or the model as it is and an empty
    `Hidden` where none of that changes it."""
    model = flatbuffer_model.as_object(tflite_model)
    copied = _one_buffer_per_constant(model)
    hidden, kept_float = {}, set()
    left_alone = None
    main = model.subgraphs[0]
    floated_subgraphs = {index for operator in main.operators or () if len(operator.outputs) and
                         _key(0, main, operator)[1] in float_ops for index in _subgraphs_reached(model, operator)}
    for subgraph_index, subgraph in enumerate(model.subgraphs):
        for operator in subgraph.operators or ():
            if operator.outputs is None or len(operator.outputs) == 0:
                continue
            tensors = [subgraph.tensors[index] for index in [*operator.inputs, *operator.outputs] if index >= 0]
            key = _key(subgraph_index, subgraph, operator)
            floated = (subgraph_index == 0 and key[1] in float_ops) or subgraph_index in floated_subgraphs
            if any(tensor.type in _FLOAT_TYPES for tensor in tensors) and not floated:
                continue
            code = model.operatorCodes[operator.opcodeIndex]
            hidden[key] = (code.builtinCode, code.deprecatedBuiltinCode, code.version)
            if floated:
                kept_float.add(key)
            if left_alone is None:
                left_alone = flatbuffer_model.code_index(model, (_LEFT_ALONE, _LEFT_ALONE, 1))
            operator.opcodeIndex = left_alone
    if not hidden and not copied:
        return tflite_model, Hidden(hidden, kept_float)
    # the calibrator resolves every operator code, and an op nothing uses any more it has no kernel for
    flatbuffer_model.drop_unused_codes(model)
    return flatbuffer_model.as_bytes(model, len(tflite_model)), Hidden(hidden, kept_float)


def _as_written(tflite_model, hidden):
    """The older quantizer's model with each op `_ops_hidden` hid its own again (in float where it was one of
    `quantized`'s float_ops; and each op writing float on float inputs: `_float_where_written`), and each
    constant of zeros on a grid: the quantizer gives it scale 0 from its values (a random model's zero biases
    and LayerNorm offsets; no runtime takes it). Its values are 0 on any grid; it takes the finest of its
    readers' other operands, since an int16 ADD or SUB rescales both operands by the coarser scale, which must
    not be its own."""
    model = flatbuffer_model.as_object(tflite_model)
    for subgraph_index, subgraph in enumerate(model.subgraphs):
        for operator in subgraph.operators or ():
            if flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex]) != _LEFT_ALONE:
                continue
            key = _key(subgraph_index, subgraph, operator)
            if key in hidden.codes:  # not a lookup the model had itself
                operator.opcodeIndex = flatbuffer_model.code_index(model, hidden.codes[key])
        # the constants' grids first: an op left float takes a float copy of a constant on its grid (a constant
        # of zeros on scale 0 had none, and LED's 16x8 SELECT_V2 read an int16 0 beside a float 1)
        for index, tensor in enumerate(subgraph.tensors):
            scale = flatbuffer_model.per_tensor_scale(tensor)
            if scale is None or model.buffers[tensor.buffer].data is None:
                continue
            if scale == 0:
                tensor.quantization.scale = np.array([_finest_beside(subgraph, index)], np.float32)
            elif np.isnan(scale) and (value := _one_value(tensor)):  # another NaN stays, for the validation
                _on_its_own_grid(model, tensor, value)
        for operator in subgraph.operators or ():
            _zero_channels_on_a_grid(model, subgraph, operator)
        subgraph.operators = [made for operator in subgraph.operators or ()
                              for made in _float_where_written(model, subgraph, operator,
                                                               _key(subgraph_index, subgraph, operator)
                                                               in hidden.kept_float)]
        _zeros_moved_on_their_grid(subgraph)
    flatbuffer_model.drop_unused_codes(model)
    return flatbuffer_model.as_bytes(model, len(tflite_model))


# The ops that read weights quantized per channel, and where they read them and their bias
_WEIGHED = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D")
_WEIGHTS, _BIAS = 1, 2


def _zero_channels_on_a_grid(model, subgraph, operator):
    """Each channel of zeros in an op's weights, which the older quantizer puts on scale 0 (FNet's matrix of the
    Fourier transform's sines is 0 at frequency 0; Gemma 3n's per-layer input gate is zeros before training), on
    the largest scale of the other channels (1 where every channel is zeros), and that channel of its bias, zero
    too, on the input's scale times that one: zeros on any grid. No runtime takes a scale of 0. A bias channel
    that is not zero keeps its scale of 0, which the .tflite's validation refuses: its value is lost."""
    if op_name(model, operator) not in _WEIGHED or len(operator.inputs) <= _WEIGHTS:
        return
    weights = subgraph.tensors[operator.inputs[_WEIGHTS]]
    scales = _per_channel_scales(weights)
    if scales is None or np.all(scales > 0) or not flatbuffer_model.is_constant(model, weights):
        return
    scales = scales.copy()
    scales[scales == 0] = np.max(scales) if np.any(scales > 0) else 1.0
    weights.quantization.scale = scales
    input_scale = flatbuffer_model.per_tensor_scale(subgraph.tensors[operator.inputs[0]])
    bias = subgraph.tensors[operator.inputs[_BIAS]] if len(operator.inputs) > _BIAS and operator.inputs[_BIAS] >= 0 \
        else None
    bias_scales = None if bias is None else _per_channel_scales(bias)
    if input_scale is None or bias_scales is None or len(bias_scales) != len(scales) \
            or not flatbuffer_model.is_constant(model, bias):
        return
    values = np.frombuffer(model.buffers[bias.buffer].data.tobytes(), _BIAS_DTYPES[bias.type])
    zero = (bias_scales == 0) & (values == 0)
    bias.quantization.scale = np.where(zero, np.float32(input_scale) * scales, bias_scales).astype(np.float32)


_BIAS_DTYPES = {schema.TensorType.INT32: np.int32, schema.TensorType.INT64: np.int64}


def _per_channel_scales(tensor):
    """The scales of a tensor quantized per channel, as a float32 array, or None."""
    quantization = tensor.quantization
    if quantization is None or quantization.scale is None or len(quantization.scale) < 2:
        return None
    return np.asarray(quantization.scale, np.float32)


def _zeros_moved_on_their_grid(subgraph):
    """Each activation the quantizer put on scale 0, its op's input's scale: what an op that moves values (a TILE,
    a RESHAPE) writes of a constant of zeros, whose scale it copied before `_as_written` gave the constant one
    (GroupViT's group tokens, zeros before training, tiled over the batch). It holds zeros, on any grid; on its
    input's, the op moves them as they are."""
    for operator in subgraph.operators or ():
        scales = [flatbuffer_model.per_tensor_scale(subgraph.tensors[index]) for index in operator.inputs if index >= 0]
        given = next((scale for scale in scales if scale is not None and scale > 0), None)
        for index in operator.outputs:
            if given is not None and index >= 0 and flatbuffer_model.per_tensor_scale(subgraph.tensors[index]) == 0:
                subgraph.tensors[index].quantization.scale = np.array([given], np.float32)


def _key(subgraph_index, subgraph, operator):
    return subgraph_index, (flatbuffer_model.tensor_name(subgraph.tensors[operator.outputs[0]])
                            if operator.outputs is not None and len(operator.outputs) else None)


def _float_where_written(model, subgraph, operator, hidden_float):
    """[`operator`] on float inputs where it computes in float, and what makes them so: hidden as one of
    `quantized`'s float_ops (`hidden_float`), a DEQUANTIZE of each input the quantizer made integer and a QUANTIZE
    into each output it did, as the MLIR quantizer keeps an op float; and for any op writing float alone (as one
    the quantizer left float), a float copy of each constant it quantized, shared with an op it quantized (a
    one-hot's 1 and 0, which the int8 passes write as a SELECT_V2)."""
    outputs = [subgraph.tensors[index] for index in operator.outputs if index >= 0]
    dequantizes = flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex]) == _DEQUANTIZE
    writes_float = bool(outputs) and all(tensor.type in _FLOAT_TYPES for tensor in outputs)
    if not hidden_float and (dequantizes or not writes_float):
        return [operator]
    before, after = [], []
    operator.inputs, operator.outputs = list(operator.inputs), list(operator.outputs)  # read as views of bytes
    for slot, index in enumerate(operator.inputs):
        grid = per_tensor_grid(subgraph.tensors[index], _INTEGER_ACTIVATIONS) if index >= 0 else None
        if grid is not None and flatbuffer_model.is_constant(model, subgraph.tensors[index]):
            operator.inputs[slot] = _float_constant(model, subgraph, index, grid)
        elif grid is not None and hidden_float:
            dequantized = flatbuffer_model.tensor_like(subgraph, index, "/dequantized", schema.TensorType.FLOAT32)
            before.append(flatbuffer_model.conversion_operator(model, "DEQUANTIZE", index, dequantized))
            operator.inputs[slot] = dequantized
    for slot, index in enumerate(operator.outputs if hidden_float else ()):
        if subgraph.tensors[index].type in _INTEGER_ACTIVATIONS:
            computed = flatbuffer_model.tensor_like(subgraph, index, "/float", schema.TensorType.FLOAT32)
            after.append(flatbuffer_model.conversion_operator(model, "QUANTIZE", computed, index))
            operator.outputs[slot] = computed
    return [*before, operator, *after]


def _float_constant(model, subgraph, index, grid):
    """A float32 constant of tensor `index`'s values on its grid: its index."""
    tensor, (scale, zero_point) = subgraph.tensors[index], grid
    dtype = flatbuffer_model.integer_dtype(tensor.type)
    values = np.frombuffer(model.buffers[tensor.buffer].data.tobytes(), dtype).astype(np.float64) - zero_point
    return flatbuffer_model.constant(model, subgraph, (values * scale).astype(np.float32).reshape(tensor.shape),
                                     schema.TensorType.FLOAT32, f"{flatbuffer_model.tensor_name(tensor)}/float")


def _one_value(tensor):
    """The one value a constant holds, as the quantizer recorded its range (its smallest and largest alike), or
    None."""
    low, high = tensor.quantization.min, tensor.quantization.max
    if low is None or high is None or len(low) != 1 or len(high) != 1 or low[0] != high[0]:
        return None
    return float(low[0])


def _on_its_own_grid(model, tensor, value):
    """A constant of one value other than 0 put on the grid whose largest step is that value: the quantizer gave
    it a scale of NaN (its range's span, 0, divided by 0: a LayerNormalization's gamma of ones, before training,
    as ConvNeXt's head keeps it), and its integers are what NaN rounded to."""
    dtype = flatbuffer_model.integer_dtype(tensor.type)
    largest = np.iinfo(dtype).max
    count = int(np.prod(tensor.shape)) if tensor.shape is not None else 1
    data = np.full(count, np.sign(value) * largest, dtype)
    model.buffers[tensor.buffer].data = np.frombuffer(data.tobytes(), np.uint8)
    tensor.quantization.scale = np.array([abs(value) / largest], np.float32)
    tensor.quantization.zeroPoint = np.zeros(1, np.int64)


def _finest_beside(subgraph, index):
    """The finest scale of the other tensors the ops reading tensor `index` read or write (1 where none has one)."""
    scales = [flatbuffer_model.per_tensor_scale(subgraph.tensors[other])
              for operator in subgraph.operators or () if index in operator.inputs
              for other in [*operator.inputs, *operator.outputs] if other >= 0 and other != index]
    return min((scale for scale in scales if scale is not None and scale > 0), default=1.0)


# A calibrated range narrower than this, with zero in it as every int8 range has, holds nothing an int8 grid
# could resolve beside its neighbours' (TensorFlow's calibrator records a tensor that was 0 throughout as
# [0, FLT_MIN], whose scale, FLT_MIN / 255, is denormal: the quantizer aborts the process, "scale out of
# expressed type range", LayoutLMv3's attention mask when nothing is masked). Widened to WIDENED_RANGE, on which
# its values round to 0 as they are, and its consumers' rescales stay within what the kernels take.
DEGENERATE_SPAN = 2.0 ** -32
WIDENED_RANGE = (-1.0, 1.0)
# A range reaching past this is held by a sentinel, not by data: an infinity (a logarithm of 0 that a later
# select discards, as relative position buckets compute it), or what the calibrator saturates one to, float32's
# largest value. No int8 grid spans it and resolves the rest (the quantizer aborts on an infinite one; on
# -3.4e38 its step is 1e36, and every real value rounds to 0).
UNBOUNDED = 2.0 ** 64

# What the quantizer could not take, repaired before it sees it: the tensors whose ranges were widened, the ops
# kept float because a range they write or read is unbounded, the softmax inputs whose ranges were narrowed
# to what their softmax can tell apart (`softmax_floors`), and the tensors whose ranges hold only the values an
# output reads, where others were only ever multiplied by zero (`running/multiplied_by_zero.py`).
Repairs = collections.namedtuple("Repairs", "widened float_ops narrowed multiplied_by_zero", defaults=((), ()))


def repaired(calibrated_model, ranges, floors=None, read_alone=()):
    """(the calibrated model with `ranges` ({tensor index: (smallest, largest)} of `recorded_tensors`) as its
    tensors' recorded ranges, each one the quantizer can take, `Repairs`); `read_alone`: the indices of the tensors
    whose `ranges` hold only the values an output reads, which `Repairs` names.

    A degenerate range (narrower than DEGENERATE_SPAN) is widened. An unbounded one is taken away, and the op
    writing it and those reading it stay float (`quantized`'s float_ops), computing what the float model does.
    `floors` ({tensor index: value}, `softmax_floors`) raise the smallest value of the ranges they name.
    """
    model = flatbuffer_model.as_object(calibrated_model)
    subgraph = model.subgraphs[0]
    names = [flatbuffer_model.tensor_name(tensor) for tensor in subgraph.tensors]
    ranges, narrowed = _raised_to_floors(ranges, floors or {}, names)
    widened, unbounded = [], set()
    for index, tensor in enumerate(subgraph.tensors):
        quantization = tensor.quantization
        if index in ranges and _one_range(quantization):
            quantization.min, quantization.max = [ranges[index][0]], [ranges[index][1]]
        if quantization is None or quantization.min is None or not len(quantization.min):
            continue
        low, high = np.asarray(quantization.min, np.float64), np.asarray(quantization.max, np.float64)
        if not np.all(np.abs(np.concatenate([low, high])) < UNBOUNDED):  # NaN and infinities too
            tensor.quantization = None
            unbounded.add(index)
            continue
        resolvable = np.maximum(high, 0.0) - np.minimum(low, 0.0) >= DEGENERATE_SPAN
        if not np.all(resolvable):
            quantization.min = np.where(resolvable, low, WIDENED_RANGE[0]).astype(np.float32).tolist()
            quantization.max = np.where(resolvable, high, WIDENED_RANGE[1]).astype(np.float32).tolist()
            widened.append(names[index])
    float_ops = {names[operator.outputs[0]] for operator in subgraph.operators
                 if len(operator.outputs) and unbounded & (set(operator.inputs) | set(operator.outputs))}
    return flatbuffer_model.as_bytes(model, len(calibrated_model)), Repairs(
        widened, sorted(float_ops), narrowed, sorted(names[index] for index in read_alone))


def _raised_to_floors(ranges, floors, names):
    """(`ranges` with each smallest value below its tensor's floor raised to it, the names of those raised)."""
    raised, narrowed = dict(ranges), []
    for index, floor in floors.items():
        if index in raised and raised[index][0] < floor <= raised[index][1]:
            raised[index] = (floor, raised[index][1])
            narrowed.append(names[index])
    return raised, sorted(narrowed)


Op = collections.namedtuple("Op", "name kind inputs outputs called", defaults=((),))


def ops(calibrated_model):
    """The calibrated model's ops, in the order they run: (the name `quantized` keeps one float by (its first
    output's), its kind, the names of the tensors it reads that an op computes, and of those it writes, and the
    names of the ops it runs in subgraphs of their own: an IF's branches, a WHILE's condition and body, and what
    those call in turn)."""
    model = flatbuffer_model.read(calibrated_model)
    subgraph = model.subgraphs[0]
    names = [flatbuffer_model.tensor_name(tensor) for tensor in subgraph.tensors]
    computed = {index for operator in subgraph.operators for index in operator.outputs}
    return [Op(names[operator.outputs[0]], op_name(model, operator),
               tuple(names[index] for index in operator.inputs if index >= 0 and index in computed),
               tuple(names[index] for index in operator.outputs), tuple(sorted(_called_ops(model, operator))))
            for operator in subgraph.operators if len(operator.outputs)]


def _called_ops(model, operator, seen=frozenset({0})):
    """The names (as `ops` gives them) of the ops in every subgraph `operator` calls, through any depth of calls."""
    called = _subgraphs_called(operator)
    found = set()
    for index in called - seen:
        if not 0 <= index < len(model.subgraphs):
            continue
        inner = model.subgraphs[index]
        for inner_operator in inner.operators or ():
            if len(inner_operator.outputs):
                found.add(flatbuffer_model.tensor_name(inner.tensors[inner_operator.outputs[0]]))
                found |= _called_ops(model, inner_operator, seen | called)
    return found


def _subgraphs_called(operator):
    """The subgraphs an operator runs, by whichever of its options' fields name one or several, on any op that
    has them: an IF's branches, a WHILE's condition and body, CALL_ONCE's, CALL's, StableHLO's regions and
    cases (schema_py_generated's fields: thenSubgraphIndex, bodySubgraphIndex, subgraph, branchSubgraphIndices)."""
    options, called = operator.builtinOptions, set()
    for field, value in (vars(options).items() if options is not None else ()):
        if "subgraph" in field.lower() and value is not None:
            called.update(int(index) for index in np.atleast_1d(value))
    return called


# A SOFTMAX rounds each exp(beta (x - the largest x of its row)) under half its output's step to 0 (int8: a step
# of 1/256; int16: 1/32768, and LiteRT's int16 kernel reads exp from a table that ends at exp(-10)): an input
# further than SOFTMAX_REACH / beta below its row's largest computes the same there as a value that far below.
# A masked score is such a value, and it set the range: Keras 3's Softmax selects -1e9 where its mask is 0 (every
# keras-hub decoder's causal mask), MultiHeadAttention's float32's lowest. On that range's grid every score
# rounded to 0 (int8 steps of 4e6: each attention uniform, in the stock converter's models too), and LiteRT's
# int16 SOFTMAX overflowed its rescale of the differences (masked scores weighed as much as the rest).
SOFTMAX_REACH = {False: math.log(2 * 256), True: math.log(2 * 32768)}
# Ops that move values, which the quantizers hold on their input's scale: a floor of their output is one of their
# input's (a mask selected, then reshaped for the softmax).
_MOVING_VALUES = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE")
_SELECTIONS = ("SELECT", "SELECT_V2")


def softmax_inputs(calibrated_model):
    """{tensor index: beta} of each tensor a SOFTMAX of the main graph reads, with a beta above 0 (at 0 every
    output is the same, whatever the input)."""
    model = flatbuffer_model.read(calibrated_model)
    return {operator.inputs[0]: float(operator.builtinOptions.beta)
            for operator in model.subgraphs[0].operators or ()
            if op_name(model, operator) == "SOFTMAX" and operator.builtinOptions is not None
            and operator.builtinOptions.beta > 0}


def softmax_floors(calibrated_model, recorded, int16):
    """{tensor index: the smallest value its range needs} for each softmax input of `recorded`
    (`calibration.Recorded`) that a selection of a constant (a mask's fill) computes, directly, through ops that
    move values or through concatenations (_floored_way), and for each tensor on that way, where the softmax and
    those ops alone read them: what lies below computes the softmax's output as the floor does (SOFTMAX_REACH).
    The selection writes on the floor's grid, and its constant saturates there. An added mask is not floored:
    LiteRT's optimized int8 ADD carried an operand on a scale hundreds of times its output's wrongly, a masked
    -1e4 to +7.4, and an int16 model of an added mask so narrowed aborted the process as LiteRT prepared it.
    `int8.added_masks_as_selections` writes the masks it finds as selections; a selection whose computed operand
    still reaches _MASK_DEPTH floored spans below the floor (a mask it did not find, added to the scores) keeps
    its range.

    The floor is the smallest largest value of a row over the samples, less as much again as those largest values
    spread apart (a row below any seen), less the softmax's reach."""
    model = flatbuffer_model.read(calibrated_model)
    subgraph = model.subgraphs[0]
    readers = collections.Counter(index for operator in subgraph.operators or () for index in operator.inputs)
    readers.update(subgraph.outputs)
    producers = {index: operator for operator in subgraph.operators or () for index in operator.outputs}
    floors = {}
    for index, (smallest, largest) in recorded.row_maxima.items():
        floor = smallest - (largest - smallest) - SOFTMAX_REACH[int16] / recorded.softmax_betas[index]
        way = _floored_way(model, readers, producers, recorded.ranges, index, floor)
        floors.update(dict.fromkeys(way or (), floor))
    return floors


def _floored_way(model, readers, producers, ranges, index, floor):
    """The tensors from `index`, read by one op alone, up to a selection of a constant whose other operand does
    not reach far below `floor` (_below_the_floor), through ops that move values, each read by the next alone;
    or up to a concatenation, with every way from its operands where at least one has one, and every other
    operand a constant or not far below the floor (GPT-OSS concatenates its masked scores with its attention
    sinks' column). None where there is no such way."""
    subgraph = model.subgraphs[0]
    way = [index]
    while readers[way[-1]] == 1 and way[-1] in producers and \
            op_name(model, producers[way[-1]]) in _MOVING_VALUES:
        way.append(producers[way[-1]].inputs[0])
    producer = producers.get(way[-1])
    if readers[way[-1]] != 1 or producer is None:
        return None
    kind = op_name(model, producer)
    if kind in _SELECTIONS:
        operands = {operand: None for operand in producer.inputs[1:]}
    elif kind == "CONCATENATION":
        operands = {operand: _floored_way(model, readers, producers, ranges, operand, floor)
                    for operand in producer.inputs}
    else:
        return None
    constant = {operand for operand in operands if flatbuffer_model.is_constant(model, subgraph.tensors[operand])}
    if not (constant if kind in _SELECTIONS else any(operands.values())):
        return None
    if any(_below_the_floor(ranges.get(operand), floor) for operand, found in operands.items()
           if found is None and operand not in constant):
        return None
    return way + [tensor for found in operands.values() for tensor in found or ()]


# How many spans of a floored range a selection's computed operand may reach below the floor: a score a floor
# clips lies a few spans down at most; a mask's fill (1e4 or more, against scores of tens) hundreds.
_MASK_DEPTH = 64


def _below_the_floor(recorded_range, floor):
    """Whether a range reaches more than _MASK_DEPTH spans of [floor, its largest value] below the floor."""
    if recorded_range is None:
        return False
    low, high = recorded_range
    return floor - low > _MASK_DEPTH * max(high - floor, np.finfo(np.float32).tiny)
