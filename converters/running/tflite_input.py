"""A .tflite as keras-gelu-convert's input: checked, its GELU ops rewritten (`tflite_gelus`), run against
itself, fitted to --target and reported, as a TensorFlow graph is.

A .tflite is known by its content (the flatbuffer identifier "TFL3"); a
truncated or corrupt file is refused in one line (exit 5), by the object API
or LiteRT's flatbuffer verifier. The original .tflite has the GELU op and
runs in LiteRT: it is the reference. A rewrite that computes the GELU op's
own function (the erf form of an exact GELU, the tanh form of a tanh GELU)
is held to the float tolerance; an approximation (the sigmoid form) is
measured and reported, and --max-drift bounds it. An int8 GELU becomes the
int8 form where that is within a step of the op on all 256 inputs, else a
lookup of its own 256 outputs (exact); the model is held to --max-steps
(default 1). An int16 GELU is held to itself computed in float32 and rounded
once, as TFLite's own int16 kernel is further from GELU than the rewrite.

A select-mode .tflite's Flex ops are TensorFlow ops, which a runtime that
links Flex (TensorFlow 2.18's interpreter) runs when verifying: they are
checked as a graph's ops are (`trust`), unless --trust-model. Its Flex erf
ops become builtin; where no runtime here runs Flex, the rewritten .tflite
runs, but the report says that parity was not checked.
"""

import time

import tensorflow as tf
from tensorflow.lite.python import schema_py_generated as schema

from keras_gelu import replacements
from keras_gelu import vocabulary

from .. import errors
from .. import paths
from .. import report as reporting
from .. import targets
from ..reading import integer_inputs
from ..reading import loading
from ..reading import trust
from ..tflite import equivalent_ops
from ..tflite import flatbuffer_model
from ..tflite import float_islands
from ..tflite import operators
from ..tflite import tflite_gelus
from ..tflite import validation
from . import explain
from . import target_checks
from . import verify as parity

# An int8 GELU's replacement is within a step of the GELU op on all 256 inputs (tests/test_tflite_input.py).
DEFAULT_INT8_STEPS = 1.0
# An int16 GELU's is held to GELU in float32 rounded once: within 3 of its 65,536 steps where the input's range
# is no wider than the output's, 13 at [-11, 1] (tests/test_tflite_input.py); a layer after it adds its own.
DEFAULT_INT16_STEPS = 16.0
_INTEGER_TYPES = (schema.TensorType.INT8, schema.TensorType.INT16)
# The forms that compute the GELU op's own function, to float32 rounding: held to --atol/--rtol.
_SAME_FUNCTION = {("exact", replacements.ERF_FORM), ("tanh", replacements.TANH_FORM)}


def _parsed(data, path):
    """The .tflite as a ModelT, else CorruptModel (exit 5). Read before any runtime sees it, to check its Flex
    ops: the object API fails on a corrupt file in whatever way the bytes lead it to."""
    if not paths.is_tflite(data):
        raise errors.CorruptModel(f"{path}: not a .tflite (no TFL3 flatbuffer identifier)")
    try:
        model = flatbuffer_model.as_object(data)
    except Exception as error:  # noqa: BLE001 (see above)
        raise errors.CorruptModel(f"{path}: not a valid .tflite ({type(error).__name__} reading it)") from error
    invalid = validation.problem(data)
    if invalid is not None:
        raise errors.CorruptModel(f"{path}: not a valid .tflite: its {invalid}")
    return model


def _interpreter(data, path):
    """A LiteRT interpreter of the model, which its flatbuffer verifier accepted, else CorruptModel (exit 5)."""
    interpreter_type, _ = parity.interpreter_class()
    try:
        return interpreter_type(model_content=data)
    except (ValueError, RuntimeError) as error:
        raise errors.CorruptModel(f"{path}: not a valid .tflite ({loading.first_line(error)})") from error


def _refuse_graph_flags(options, path, quantized, has_flex, target):
    """Flags that only make sense for a TensorFlow graph, refused in one line each (not what --target implies:
    an Ethos-U's int8 inputs and outputs are the .tflite's business). --trust-model applies to Flex ops only."""
    for given, flag, why in (
            (options.trust_model and not has_flex, "--trust-model", "with no Flex op it runs no code of its own"),
            (options.calibration, "--calibration", "its int8 ranges are in the file; requantizing is not in scope"),
            (options.mixed_precision, "--mixed-precision", "its ops' types are in the file; requantizing is not "
                                                           "in scope"),
            (options.float16_weights, "--float16-weights", "its weights are kept as they are"),
            (options.int8_io and not (target and target.int8_io), "--int8-io",
             "its inputs and outputs are kept as they are"),
            (options.mode == "select", "--mode select", "GELU ops become builtin (--mode builtin) or stay "
                                                        "(--mode native)")):
        if given:
            raise errors.BadInputs(f"{path}: {flag} does not apply to a .tflite: {why}")
    if options.int8 and not quantized:
        who = f"--target {target.name} runs int8 models only, and" if target and target.int8 else "--int8 on"
        raise errors.BadInputs(f"{path}: {who} a float .tflite: requantizing a .tflite is not in scope; convert "
                               "the model it came from with --int8")


def _signature(interpreter, path, requested):
    """The signature the report names (the stock converter's from_concrete_functions writes none: None)."""
    available = list(interpreter.get_signature_list())
    if not available and requested is None:
        return None
    return loading.choose_signature(path, available, requested)


def _names(interpreter, signature, details, key):
    """Each tensor of `details` by its signature name, else by its tensor name."""
    by_index = {}
    if signature is not None:
        runner = interpreter.get_signature_runner(signature)
        runner_details = runner.get_input_details() if key == "inputs" else runner.get_output_details()
        by_index = {detail["index"]: name for name, detail in runner_details.items()}
    return [by_index.get(detail["index"], detail["name"]) for detail in details]


def _input_infos(model, details, names):
    """TensorInfos of the model's inputs: quantized ones as floats (the parity inputs are then quantized with
    their own scales), integer ones with the values a GATHER reading them allows."""
    subgraph = model.subgraphs[0]
    bounds = {}
    for operator in subgraph.operators or ():
        code = flatbuffer_model.builtin_code(model.operatorCodes[operator.opcodeIndex])
        if code == schema.BuiltinOperator.GATHER and len(operator.inputs) > 1:
            rows = int(subgraph.tensors[operator.inputs[0]].shape[0])
            bounds[operator.inputs[1]] = min(rows, bounds.get(operator.inputs[1], rows))
    infos = []
    for name, detail in zip(names, details):
        dtype = tf.as_dtype(detail["dtype"])
        quantized = bool(detail["quantization"][0])
        shape = tuple(None if size < 0 else int(size) for size in detail["shape_signature"])
        values = None
        if dtype.is_integer and not quantized and detail["index"] in bounds:
            values = integer_inputs.IntegerValues(bounds[detail["index"]], mask=False)
        infos.append(loading.TensorInfo(name, name, tf.float32 if quantized else dtype, shape, values))
    return infos


def _dynamic_shape_cause(model, target):
    """Why ops a static-shape runtime lacks may be there: a dynamic input dimension (exporters then compute
    shapes at run time, with SHAPE, REDUCE_PROD, TILE...), which a fixed input shape at export folds away."""
    subgraph = model.subgraphs[0]
    signatures = [subgraph.tensors[index].shapeSignature for index in subgraph.inputs]
    if not target.static_shapes or not any(shape is not None and -1 in list(shape) for shape in signatures):
        return ""
    return (" (the .tflite's inputs have dynamic dimensions, and it computes shapes at run time: export it with "
            "fixed input shapes, e.g. Keras's export(..., format=\"litert\", input_signature=[keras.InputSpec("
            "shape=(1, ...))]))")


def _limits(options, rewritten, scales):
    """(atol, rtol) per output, and the tolerance for the report."""
    same_function = rewritten.replaced <= _SAME_FUNCTION
    # an int8 GELU's every form is within a step or two; at 16 bits the sigmoid form's own error (0.0203) shows
    if rewritten.int8 or (rewritten.int16 and same_function):
        default = DEFAULT_INT8_STEPS if rewritten.int8 else DEFAULT_INT16_STEPS
        steps = default if options.max_steps is None else options.max_steps
        # a step's worth of float32 rounding in the dequantized difference: 1 step is (1 + 1e-7) steps
        tolerance = {"max_steps": steps}
        if rewritten.int16:
            tolerance["reference"] = "the original with its int16 GELUs in float32, rounded once"
        return [((steps + 1e-3) * scale if scale else options.atol, 0.0) for scale in scales], tolerance
    if same_function:
        return [(options.atol, options.rtol)] * len(scales), {"atol": options.atol, "rtol": options.rtol}
    return [(float("inf"), 0.0)] * len(scales), {"approximation": "measured, bounded by --max-drift only"}


def convert(data, path, options):
    """(the rewritten .tflite, Report) for a .tflite's bytes; `options` as for any input."""
    started = time.perf_counter()
    model = _parsed(data, path)
    # Flex ops are TensorFlow ops, which a runtime linking Flex runs (TF 2.18's applies them as it loads)
    if not options.trust_model:
        trust.check_flex_ops(path, data)
    interpreter = _interpreter(data, path)
    quantized = any(tensor.type in _INTEGER_TYPES and tensor.quantization is not None
                    and tensor.quantization.scale is not None for subgraph in model.subgraphs
                    for tensor in subgraph.tensors or ())
    target = targets.TARGETS.get(options.target)
    original_flex_ops = [op for op in operators.op_histogram(data) if op.startswith("Flex")]
    _refuse_graph_flags(options, path, quantized, bool(original_flex_ops), target)
    _, runtime = parity.interpreter_class()
    signature = _signature(interpreter, path, options.signature)
    report = reporting.Report(path, ".tflite", signature or "(none)", options.mode,
                              vocabulary.resolve_exact_as(options.mode, options.exact_as), trusted=options.trust_model)
    # The int8 GELU's own table where the runtime has its three ops (not Ethos-U's NPU: LOGISTIC/MUL/ADD there)
    table = target is None or all(target.has(op) for op in tflite_gelus.TABLE_OPS)
    # An int8 GELU's faster form where it is within a step of the op on all its inputs, else its table; a
    # --max-steps above 1 is for the model (and the target's kernels), not a looser GELU; 0 asks for the table
    form_steps = min(DEFAULT_INT8_STEPS, DEFAULT_INT8_STEPS if options.max_steps is None else options.max_steps)
    rewritten = tflite_gelus.rewrite(data, options.mode, report.exact_as, table, form_steps)
    tflite_model = rewritten.tflite_model
    if quantized:  # the stock converter's float NEG (Keras 3's LayerNormalization), which no integer target runs
        tflite_model, report.islands_made_integer = float_islands.made_integer(
            tflite_model, parity.interpreter_class()[0])
    report.gelus = rewritten.gelus
    report.leftover_erf = rewritten.flex_erf
    if not rewritten.gelus and not rewritten.flex_erf:
        report.warnings.append("no GELU found: the .tflite is written as it was")
    report.int8 = quantized
    report.int8_ranges = "the .tflite's own"
    if rewritten.int16:
        report.step_type = "int16"
    if target is not None:
        report.target = target_checks.section(target, options)
        if target.ops is not None:
            tflite_model, report.target["renamed_ops"] = equivalent_ops.for_target(tflite_model, target.ops)
    report.ops = operators.op_histogram(tflite_model)
    report.note_flex_ops()
    if quantized:
        report.op_types = operators.typed_op_histogram(tflite_model)
        report.float_ops = operators.float_islands(tflite_model)
    report.size_bytes = len(tflite_model)
    invalid = validation.problem(tflite_model)
    if invalid is not None:  # before any runtime reads it
        raise errors.ConverterFailed(f"{path}: the rewritten .tflite's {invalid} (a keras-gelu bug: please report "
                                     "the model); nothing written")
    if target is not None:
        report.target["ops"] = target_checks.check(tflite_model, target, options.allow_cpu_fallback,
                                                   _dynamic_shape_cause(model, target))
    if options.verify:
        _verify(data, interpreter, tflite_model, model, signature, options, report, rewritten, target, runtime,
                original_flex_ops)
    else:
        report.not_verified_reason = "verification switched off (--no-verify)"
    report.seconds = time.perf_counter() - started
    return tflite_model, report


def _verify(original, interpreter, tflite_model, model, signature, options, report, rewritten, target, runtime,
            original_flex_ops):
    """Run the original and the rewritten .tflite on the same inputs (and the rewritten one on the target's
    runtime): fidelity at the mode's tolerance. Where the original cannot run here (Flex), the target's
    outputs are held to the rewritten .tflite's in LiteRT instead, and the report says parity was not checked."""
    input_details, output_details = interpreter.get_input_details(), interpreter.get_output_details()
    names = _names(interpreter, signature, input_details, "inputs")
    output_names = _names(interpreter, signature, output_details, "outputs")
    arrays = parity.make_inputs(_input_infos(model, input_details, names), options.seed, options.dynamic_size,
                                options.inputs)
    ordered = [arrays[name] for name in names]
    report.runtime = runtime
    report.inputs_used = (f"inputs from {options.inputs}" if options.inputs
                          else f"seeded random inputs (seed {options.seed})")
    try:
        actual = dict(zip(output_names, parity.invoke(tflite_model, ordered)))
    except (RuntimeError, ValueError) as error:  # Flex ops left: no runtime of TensorFlow >= 2.19 links them
        report.not_verified_reason = f"{runtime} cannot run the rewritten .tflite: {loading.first_line(error)}"
        return
    scale_of = dict(zip(model.subgraphs[0].outputs, operators.output_scales(original)))
    scales = [scale_of.get(detail["index"]) for detail in output_details]
    limits, report.tolerance = _limits(options, rewritten, scales)
    limit = (f"{report.tolerance['max_steps']} {report.step_type} steps" if "max_steps" in report.tolerance
             else f"atol {options.atol} + rtol {options.rtol}")
    try:
        original_outputs = dict(zip(output_names, parity.invoke(original, ordered)))
    except (RuntimeError, ValueError) as error:
        report.not_verified_reason = (
            f"the rewritten .tflite runs, but {runtime} cannot run the original, which needs Flex ("
            + ", ".join(original_flex_ops) + "): TensorFlow 2.18's tf.lite.Interpreter can" if original_flex_ops
            else f"{runtime} cannot run the original .tflite: {loading.first_line(error)}")
        _run_on_target(tflite_model, target, options, report, ordered, actual, None, scales, limits, limit)
        return
    if options.explain:  # the model as given is the one to compare with: the rewrite's own error, tensor by tensor
        report.explanation = explain.explained(tflite_model, original, signature, [arrays],
                                               "the original .tflite, as given, on LiteRT", report)
    # TFLite's int16 GELU op is itself far from GELU where its input's range is wide: the rewrite is held to
    # GELU rounded once, and its drift from the op reported
    expected = (dict(zip(output_names, parity.invoke(tflite_gelus.with_float_gelus(original), ordered)))
                if rewritten.int16 else original_outputs)
    drift_limit = float("inf") if options.max_drift is None else options.max_drift
    for (name, value), scale, (atol, rtol) in zip(expected.items(), scales, limits):
        report.fidelity.append(parity.with_steps(parity.compare(name, actual[name], value, atol, rtol), scale))
        report.drift.append(parity.with_steps(parity.compare(name, actual[name], original_outputs[name], drift_limit,
                                                             0.0), scale))
    report.verified = True
    parity.fail_unless_passed(report.fidelity, report.input, report, "the rewritten .tflite differs from the "
                              "original", limit)
    parity.fail_unless_passed(report.drift, report.input, report, "the rewritten .tflite drifts from the original",
                              f"--max-drift {options.max_drift}")
    _run_on_target(tflite_model, target, options, report, ordered, actual, expected, scales, limits, limit)


def _run_on_target(tflite_model, target, options, report, ordered, rewritten_outputs, reference, scales, limits,
                   limit):
    """The target's runtime on the parity inputs, held to the rewritten .tflite's outputs in LiteRT
    ("agreement": the runtimes' kernels, which round int8 differently) and, where the original ran, to the
    reference ("fidelity"); both {output name: value}, `reference` None where there is none."""
    if target is None:
        return
    # a static-shape runtime (TFLite Micro) runs each sample on its own, at the shapes the file holds
    on_target = target_checks.run_on_target(tflite_model, target, options, report, ordered,
                                            batch_fixed=target.static_shapes)
    if on_target is None:
        return
    for kind, against in (("agreement", rewritten_outputs), ("fidelity", reference)):
        if against is None:
            continue
        for (name, value), scale, (atol, rtol), result in zip(against.items(), scales, limits, on_target):
            report.target[kind].append(parity.with_steps(parity.compare(name, result, value, atol, rtol), scale))
    parity.fail_unless_passed(report.target["agreement"], report.input, report,
                              f"{target.runtime} differs from {report.runtime} on the same rewritten .tflite", limit)
    parity.fail_unless_passed(report.target["fidelity"], report.input, report,
                              f"{target.runtime} differs from the original .tflite", limit)
