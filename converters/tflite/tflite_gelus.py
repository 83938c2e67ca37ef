"""A .tflite's GELU ops, in every subgraph, replaced with the builtin ops of `replacements.RULES`.

The route: each replacement is built in TensorFlow by the very function the
graph path splices (`replacements.replacement_for`), converted by the stock
TFLite converter into a one-GELU "snippet" model, and its operators, tensors
and buffers are spliced into the .tflite in the GELU op's place (the schema's
object API). So every op is the one the converter makes for that spelling,
with the quantization its kernels want (LOGISTIC's fixed k/256 output grid),
and no op semantics are written twice.

An int8 GELU's snippet is quantized from the GELU op's own tensors: its input
takes 256 values, on which the replacement's intermediates are evaluated for
their ranges (as `int8.marker` does for a QAT graph); its output is the GELU
op's output, scale and zero point. No calibration data is needed.

A select-mode .tflite (the stock converter with SELECT_TF_OPS on a GELU
spelled with inexact constants) computes its erf with a Flex op, FlexErf,
around builtin arithmetic. Each Flex erf becomes `replacements.BARE_ERF`,
the graph path's builtin erf for a bare Erf op (within 1.5e-7): the GELU
around it keeps its own arithmetic, and the model needs no Flex delegate.
"""

import collections
import dataclasses
import math

import numpy as np
import tensorflow as tf
from tensorflow.lite.python import schema_py_generated as schema

from keras_gelu import replacements
from keras_gelu import vocabulary

from .. import native_logs
from ..rewriting import int8 as integer
from ..running import verify
from . import flatbuffer_model

_GELU = schema.BuiltinOperator.GELU
_CUSTOM = schema.BuiltinOperator.CUSTOM
# The integer GELU ops there are: int8, and int16 activations with int8 weights (the stock converter's 16x8)
_INTEGER_BITS = {schema.TensorType.INT8: 8, schema.TensorType.INT16: 16}
# A 16x8 snippet is calibrated on at most this many batches of the GELU's input values (see _snippet_16x8)
_CALIBRATION_BATCHES = 16
# The Flex ops of TensorFlow's Erf and Erfc (TF has no Flex kernel for Erfc, but a runtime might).
FLEX_ERF = {"FlexErf": "Erf", "FlexErfc": "Erfc"}


@dataclasses.dataclass(frozen=True)
class SplicedOp:
    """An op to replace: where it is, and its one input and one output (tensor indices)."""
    subgraph: int
    position: int  # in the subgraph's operators
    input: int
    output: int


@dataclasses.dataclass(frozen=True)
class GeluOp(SplicedOp):
    approximate: bool

    @property
    def function(self):
        return "tanh" if self.approximate else "exact"


@dataclasses.dataclass(frozen=True)
class FlexErfOp(SplicedOp):
    op: str  # "Erf" or "Erfc", a key of replacements.BARE_ERF


def gelu_ops(model):
    """Every GELU op of a ModelT, subgraph by subgraph."""
    found = []
    for subgraph_index, subgraph in enumerate(model.subgraphs or ()):
        for position, operator in enumerate(subgraph.operators or ()):
            if flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex]) == _GELU:
                options = operator.builtinOptions
                found.append(GeluOp(subgraph_index, position, operator.inputs[0], operator.outputs[0],
                                    bool(options is not None and options.approximate)))
    return found


def flex_erf_ops(model):
    """Every float32 Flex erf op of a ModelT (one input, one output), subgraph by subgraph."""
    found = []
    for subgraph_index, subgraph in enumerate(model.subgraphs or ()):
        for position, operator in enumerate(subgraph.operators or ()):
            operator_code = model.operatorCodes[operator.opcodeIndex]
            op = (FLEX_ERF.get(flatbuffer_model.custom_code(operator_code))
                  if flatbuffer_model.builtin_code(operator_code) == _CUSTOM else None)
            if (op is not None and len(operator.inputs) == 1 and len(operator.outputs) == 1
                    and subgraph.tensors[operator.inputs[0]].type == schema.TensorType.FLOAT32):
                found.append(FlexErfOp(subgraph_index, position, operator.inputs[0], operator.outputs[0], op))
    return found


def _quantization(tensor):
    """(scale, zero point) of a per-tensor quantized tensor, else None."""
    parameters = tensor.quantization
    if parameters is None or parameters.scale is None or len(parameters.scale) != 1:
        return None
    return float(parameters.scale[0]), int(parameters.zeroPoint[0])


def _range(scale, zero_point):
    """The float range an int8 tensor covers, as a FakeQuant's min and max."""
    return (-128 - zero_point) * scale, (127 - zero_point) * scale


def _converter(function, spec):
    module = tf.Module()
    # autograph=False: the replacements are graph code already (as the rewrite runs them), and AutoGraph would
    # read and rewrite their source in every fresh worker
    module.function = tf.function(function, input_signature=[spec], autograph=False)
    return tf.lite.TFLiteConverter.from_concrete_functions([module.function.get_concrete_function()], module)


def _spec(shape, dtype):
    return tf.TensorSpec([None if size < 0 else size for size in shape], dtype)


def _snippet(replacement, shape, quantized_input, quantized_output):
    """A one-GELU .tflite computing `replacement` on a float32 (or, quantized, int8) tensor of `shape`."""
    spec = _spec(shape, tf.float32)
    if quantized_input is None:
        return native_logs.converted(_converter(lambda x: replacement.build(x, 1.0), spec))
    low, high = _range(*quantized_input)
    grid = ((np.arange(-128, 128) - quantized_input[1]) * quantized_input[0]).astype(np.float32)
    mark = integer.fake_quantizer(replacements.intermediate_ranges(replacement.build, 1.0, tf.constant(grid)))
    out_low, out_high = _range(*quantized_output)

    def quantized(x):
        x = tf.quantization.fake_quant_with_min_max_args(x, min=low, max=high, num_bits=8)
        y = replacement.build(x, 1.0, mark=mark)
        return tf.quantization.fake_quant_with_min_max_args(y, min=out_low, max=out_high, num_bits=8)

    converter = _converter(quantized, spec)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    return native_logs.converted(converter)


def _snippet_16x8(replacement, shape, input_quantization):
    """A one-GELU .tflite computing `replacement` on an int16 tensor of `shape`, quantized 16x8 by the stock
    converter (which takes no FakeQuant at 16 bits) with every intermediate range calibrated on the input's
    own values: all 65,536 where a few batches of `shape` hold them, else an even subsample with both ends
    (the intermediates are smooth: their extremes move by less than a step between neighbouring inputs)."""
    scale, zero_point = input_quantization
    concrete = [1 if size < 0 else size for size in shape]
    per_batch = int(np.prod(concrete))
    count = min(65536, per_batch * _CALIBRATION_BATCHES)
    values = ((np.round(np.linspace(-32768, 32767, count)) - zero_point) * scale).astype(np.float32)
    batches = [np.resize(values[start:start + per_batch], concrete) for start in range(0, count, per_batch)]
    converter = _converter(lambda x: replacement.build(x, 1.0), _spec(shape, tf.float32))
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([batch] for batch in batches)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int16
    return native_logs.converted(converter)


def gelu_table(approximate, input_quantization, output_quantization):
    """The int8 GELU op's own lookup table, as TFLite's kernel fills it (LUTPopulate, in float32): the output
    for each of the 256 inputs, indexed by input + 128."""
    (input_scale, input_zero), (output_scale, output_zero) = input_quantization, output_quantization
    x = np.float32(input_scale) * (np.arange(-128, 128, dtype=np.float32) - np.float32(input_zero))
    if approximate:
        gate = np.tanh(np.float32(math.sqrt(2 / math.pi)) * (x + np.float32(0.044715) * x * x * x))
    else:
        gate = np.array([math.erf(value) for value in (x * np.float32(math.sqrt(0.5))).astype(np.float64)])
    scaled = np.float32(0.5) * x * (np.float32(1.0) + gate.astype(np.float32)) * (np.float32(1.0) /
                                                                                 np.float32(output_scale))
    whole = np.trunc(scaled)
    rounded = whole + np.where(np.abs(scaled - whole) >= 0.5, np.sign(scaled), 0.0)  # std::round: half away
    return np.clip(rounded + output_zero, -128, 127).astype(np.int8)


def _table_snippet(table, shape):
    """A .tflite looking an int8 tensor of `shape` up in `table` (256 int8 values, indexed by value + 128):
    CAST, ADD, GATHER, exactly the GELU op's outputs."""
    constant = tf.constant(table, tf.int8)
    return native_logs.converted(_converter(lambda x: tf.gather(constant, tf.cast(x, tf.int32) + 128),
                                            _spec(shape, tf.int8)))


def _same_code(a, b):
    return ((flatbuffer_model.builtin_code(a), a.customCode, a.version)
            == (flatbuffer_model.builtin_code(b), b.customCode, b.version))


def _splice(model, site, snippet):
    """Replace the op at `site` (a SplicedOp) of `model` by the operators of `snippet` (a ModelT of one
    subgraph)."""
    subgraph, piece = model.subgraphs[site.subgraph], snippet.subgraphs[0]
    (snippet_input,), (snippet_output,) = piece.inputs, piece.outputs
    tensor_map = {snippet_input: site.input, snippet_output: site.output}
    for index, tensor in enumerate(piece.tensors):
        if index in tensor_map:
            continue
        if tensor.buffer:  # 0 is the schema's empty buffer
            model.buffers.append(snippet.buffers[tensor.buffer])
            tensor.buffer = len(model.buffers) - 1
        tensor.name = flatbuffer_model.tensor_name(subgraph.tensors[site.output]) + f"/keras_gelu_replacement/{index}"
        subgraph.tensors.append(tensor)
        tensor_map[index] = len(subgraph.tensors) - 1
    code_map = {}
    for index, code in enumerate(snippet.operatorCodes):
        existing = [position for position, known in enumerate(model.operatorCodes) if _same_code(known, code)]
        if not existing:
            model.operatorCodes.append(code)
            existing = [len(model.operatorCodes) - 1]
        code_map[index] = existing[0]
    operators = []
    for operator in piece.operators:
        operator.opcodeIndex = code_map[operator.opcodeIndex]
        operator.inputs = [tensor_map[index] if index >= 0 else index for index in operator.inputs]
        operator.outputs = [tensor_map[index] for index in operator.outputs]
        operators.append(operator)
    subgraph.operators[site.position:site.position + 1] = operators


def with_float_gelus(tflite_model):
    """The .tflite with each int16 GELU op computed in float32 and rounded once (DEQUANTIZE, the GELU op on
    float32, QUANTIZE into the op's own output): the int16 GELU as it should be, against which a rewrite is
    held. TFLite's int16 GELU kernel interpolates a table over the input's range, so it is up to 356 output
    steps from GELU where that range is much wider than the output's (measured at [-11, 1])."""
    model = flatbuffer_model.as_object(tflite_model)
    for site in sorted(gelu_ops(model), key=lambda op: (op.subgraph, -op.position)):
        subgraph = model.subgraphs[site.subgraph]
        if subgraph.tensors[site.input].type != schema.TensorType.INT16:
            continue
        gelu = subgraph.operators[site.position]
        floats = []
        source = subgraph.tensors[site.input]
        for role in ("input", "output"):  # GELU is elementwise: both have the input's shape
            tensor = schema.TensorT()
            tensor.shape, tensor.shapeSignature = source.shape, source.shapeSignature
            tensor.type = schema.TensorType.FLOAT32
            tensor.name = f"{flatbuffer_model.tensor_name(source)}/keras_gelu_float_reference/{role}"
            subgraph.tensors.append(tensor)
            floats.append(len(subgraph.tensors) - 1)
        dequantize, quantize = schema.OperatorT(), schema.OperatorT()
        dequantize.opcodeIndex = flatbuffer_model.opcode_index(model, "DEQUANTIZE")
        dequantize.inputs, dequantize.outputs = [site.input], [floats[0]]
        quantize.opcodeIndex = flatbuffer_model.opcode_index(model, "QUANTIZE")
        quantize.inputs, quantize.outputs = [floats[1]], [site.output]
        gelu.inputs, gelu.outputs = [floats[0]], [floats[1]]
        subgraph.operators[site.position:site.position + 1] = [dequantize, gelu, quantize]
    return flatbuffer_model.as_bytes(model, len(tflite_model))


def _shape(tensor):
    return tuple(int(size) for size in (tensor.shapeSignature if tensor.shapeSignature is not None
                                        else tensor.shape))


@dataclasses.dataclass
class Rewritten:
    tflite_model: bytes
    gelus: list  # [{"pattern", "alpha", "became", "count"}], as the graph path reports
    int8: bool  # an int8 GELU was among them
    int16: bool  # an int16 (16x8) GELU was among them
    replaced: set  # {(function, Replacement)} of the GELUs replaced
    flex_erf: dict  # {Flex op: count} of the Flex erf ops made builtin


TABLE_OPS = frozenset({"CAST", "ADD", "GATHER"})
TABLE_DESCRIPTION = "int8 table lookup (CAST/ADD/GATHER): the GELU op's own 256 outputs"


def _int8_steps_from(snippet, table, shape):
    """The most int8 steps by which `snippet` (int8 in, int8 out) differs from `table` on all 256 inputs."""
    interpreter_type, _ = verify.interpreter_class()
    interpreter = interpreter_type(model_content=snippet)
    (input_detail,), (output_detail,) = interpreter.get_input_details(), interpreter.get_output_details()
    concrete = [1 if size < 0 else size for size in shape]
    interpreter.resize_tensor_input(input_detail["index"], concrete)
    interpreter.allocate_tensors()
    size = int(np.prod(concrete))
    worst = 0
    for start in range(0, 256, size):
        values = np.resize(np.arange(-128, 128)[start:start + size], size).astype(np.int8)
        interpreter.set_tensor(input_detail["index"], values.reshape(concrete))
        interpreter.invoke()
        output = interpreter.get_tensor(output_detail["index"]).reshape(-1).astype(np.int64)
        worst = max(worst, int(np.abs(output - table[values.astype(np.int64) + 128]).max()))
    return worst


def _int8_snippet(replacement, approximate, shape, quantizations, table, form_steps):
    """(snippet, description) for an int8 GELU op: the RULES form in int8 where it is within `form_steps` of
    the op on all 256 inputs (checked here, input by input), or where `table` is False (a runtime without
    GATHER); else the op's own table, exact. The form is the faster: measured in an FFN block, 0.93x the int8
    GELU op where the table costs 1.49x (benchmarks/bench_tflite_input.py)."""
    arithmetic = _snippet(replacement, shape, *quantizations)
    if not table:
        return arithmetic, replacement.description
    own_table = gelu_table(approximate, *quantizations)
    steps = _int8_steps_from(arithmetic, own_table, shape)
    if steps <= form_steps:
        return arithmetic, (f"{replacement.description}, within {steps} step{'s' if steps != 1 else ''} of the op "
                            "on all 256 inputs")
    return (_table_snippet(own_table, shape),
            f"{TABLE_DESCRIPTION} (the {replacement.description} form is {steps} steps from it)")


def rewrite(tflite_model, mode, exact_as, table=True, form_steps=1):
    """(bytes of the .tflite with every GELU op replaced as `mode` and `exact_as` call for, the report's GELUs).

    An int8 GELU op becomes the int8 form of the RULES replacement where
    that is within `form_steps` of the op on all 256 inputs, else (with `table`,
    where the runtime has GATHER) a lookup of its own 256 outputs, exact.
    The form's LOGISTIC rounds onto TFLite's fixed k/256 grid: within a step
    where the input's range is no wider than the output's, a few more where it
    is (measured: 2 at [-3, 1], 8 at [-11, 1]). An int16 GELU op becomes the
    float form, quantized 16x8. Every float32 Flex erf op becomes the builtin
    erf (in either mode: native mode has no erf op to keep).
    `tflite_model` must parse (a corrupt file raises from the object API)."""
    model = flatbuffer_model.as_object(tflite_model)
    became = collections.Counter()
    flex_erf = collections.Counter()
    replaced = set()
    snippets = {}
    integer_bits = set()
    # From the last op of each subgraph back: splicing one keeps the positions of those before it
    for site in sorted(gelu_ops(model) + flex_erf_ops(model), key=lambda op: (op.subgraph, -op.position)):
        tensors = model.subgraphs[site.subgraph].tensors
        source, destination = tensors[site.input], tensors[site.output]
        if isinstance(site, FlexErfOp):
            key = (site.op, _shape(source))
            if key not in snippets:
                snippets[key] = native_logs.converted(
                    _converter(replacements.BARE_ERF[site.op], _spec(_shape(source), tf.float32)))
            _splice(model, site, flatbuffer_model.as_object(snippets[key]))
            flex_erf["Flex" + site.op] += 1
            continue
        bits = _INTEGER_BITS.get(source.type)
        integer_bits |= {bits} - {None}
        conversion_mode = vocabulary.conversion_mode(mode, int8=bits is not None)
        # int16 takes the float forms: at 16 bits they are closer to GELU than the int8 ones (tests)
        replacement = replacements.replacement_for(site.function, conversion_mode, exact_as, bits == 8)
        pattern = (f"GELU op ({'approximate' if site.approximate else 'exact'}, "
                   f"{'float32' if bits is None else f'int{bits}'})")
        if replacement.fused:  # native mode: the GELU op is what it would become
            became[(pattern, "kept: GELU op")] += 1
            continue
        quantizations = (_quantization(source), _quantization(destination)) if bits else (None, None)
        key = (site.function, bits, _shape(source), quantizations, replacement, table, form_steps)
        if key not in snippets:
            if bits == 16:
                snippets[key] = (_snippet_16x8(replacement, _shape(source), quantizations[0]),
                                 replacement.description + ", int16x8")
            elif bits == 8:
                snippets[key] = _int8_snippet(replacement, site.approximate, _shape(source), quantizations, table,
                                              form_steps)
            else:
                snippets[key] = _snippet(replacement, _shape(source), None, None), replacement.description
        snippet, description = snippets[key]
        _splice(model, site, flatbuffer_model.as_object(snippet))
        became[(pattern, description)] += 1
        replaced.add((site.function, replacement))
    gelus = [{"pattern": pattern, "alpha": 1.0, "became": description, "count": count}
             for (pattern, description), count in sorted(became.items())]
    if became or flex_erf:
        flatbuffer_model.drop_unused_codes(model)
    return Rewritten(flatbuffer_model.as_bytes(model, len(tflite_model)), gelus, 8 in integer_bits,
                     16 in integer_bits, replaced, dict(flex_erf))
