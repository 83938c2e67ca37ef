"""The conversion pipeline: load, rewrite, convert, verify, report, write."""

import collections
import contextlib
import dataclasses
import os
import sys
import tempfile
import time
import types

import tensorflow as tf

from . import errors
from . import graph
from . import loading
from . import report as reporting
from . import rewrite
from . import verify as parity

MODES = ("builtin", "native", "select")
FORMS = ("sigmoid", "tanh", "erf")


def _tflite_converter(graph_def, source):
    """A TFLiteConverter over our already frozen GraphDef.

    The public entry points want a ConcreteFunction, which the converter then
    freezes again (and by default saves as a temporary SavedModel first):
    for a graph whose weights are inline constants that round trip tripled the
    conversion time. So we hand the converter's freeze step the graph as it
    is. `_freeze_concrete_function` has kept this contract from TF 2.7 to 2.21.
    """
    scratch = tf.Graph()
    with scratch.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    inputs = [scratch.get_tensor_by_name(info.tensor) for info in source.inputs]
    outputs = [scratch.get_tensor_by_name(info.tensor) for info in source.outputs]
    placeholder_function = tf.function(lambda: tf.constant(0.0)).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([placeholder_function])
    converter.experimental_lower_to_saved_model = False
    frozen = types.SimpleNamespace(graph=scratch, inputs=inputs, outputs=outputs)
    converter._freeze_concrete_function = lambda: (graph_def, inputs, outputs, frozen)
    return converter


def to_tflite(graph_def, source, mode, float16_weights):
    converter = _tflite_converter(graph_def, source)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if mode == "select":
        converter.target_spec.supported_ops.append(tf.lite.OpsSet.SELECT_TF_OPS)
    if float16_weights:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    with _native_stderr_silenced():
        try:
            return converter.convert()
        except Exception as error:  # the converter raises ConverterError and friends
            failure = error
    lines = [line.strip() for line in str(failure).splitlines()]
    summary = next((line for line in lines if line.startswith(("Custom ops:", "Flex ops:"))), None)
    summary = summary or next((line for line in lines if "error:" in line), lines[0] if lines else "")
    hint = ""
    if mode == "select" and "Erfc" in str(failure):
        hint = "; Erfc has no Flex kernel, use --mode builtin or native, which rewrite it"
    raise errors.ConverterFailed(f"{source.path}: the TFLite converter failed: {summary[:300]}{hint}") from failure


@contextlib.contextmanager
def _native_stderr_silenced():
    """The converter's C++ core prints MLIR diagnostics straight to fd 2; keep them off the user's terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _summarise(findings):
    grouped = collections.Counter((f.spelling, f.alpha, f.became) for f in findings)
    return [{"spelling": s, "alpha": a, "became": b, "count": n} for (s, a, b), n in sorted(grouped.items())]


def check_output_path(output, force):
    """Fail early, before any work, on an output we may not write."""
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise errors.OutputNotWritable(f"{output}: the folder {directory} does not exist")
    if os.path.exists(output) and not force:
        raise errors.OutputExists(f"{output}: exists; pass --force to overwrite it")
    try:  # os.access says yes to root even where a write fails, so try one
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise errors.OutputNotWritable(f"{output}: cannot write in {directory} ({error.strerror})") from None


def write_atomically(data, output, force):
    """Write via a temporary file and rename: readers never see half a file."""
    check_output_path(output, force)
    directory = os.path.dirname(os.path.abspath(output))
    try:
        handle, temporary = tempfile.mkstemp(prefix=".keras_gelu_", suffix=".tmp", dir=directory)
    except OSError as error:
        raise errors.OutputNotWritable(f"{output}: cannot write in {directory} ({error.strerror})") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        if force:
            os.replace(temporary, output)
        else:
            try:
                os.link(temporary, output)  # fails, atomically, if the output appeared meanwhile
            except FileExistsError:
                raise errors.OutputExists(f"{output}: exists; pass --force to overwrite it") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


@dataclasses.dataclass
class Options:
    mode: str = "builtin"
    form: str = "sigmoid"
    signature: str = None
    float16_weights: bool = False
    verify: bool = True
    inputs: str = None  # .npz path
    seed: int = 0
    dynamic_size: int = parity.DEFAULT_DYNAMIC_SIZE
    atol: float = parity.DEFAULT_ATOL
    rtol: float = parity.DEFAULT_RTOL
    max_drift: float = None


def convert(model_path, **options):
    """Convert a SavedModel/.keras/.h5 to TFLite; returns (tflite bytes, Report).

    Options are those of `Options` (mode, form, signature, float16_weights,
    verify, inputs, seed, dynamic_size, atol, rtol, max_drift). Raises a
    `converters.errors.ConversionError` subclass for user errors, including
    a parity failure, in which case nothing is returned.
    """
    options = Options(**options)
    if options.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}. Received: mode={options.mode!r}")
    if options.form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}. Received: form={options.form!r}")
    started = time.perf_counter()
    source = loading.load(model_path, options.signature)
    report = reporting.Report(model_path, source.kind, source.signature, options.mode, options.form,
                              float16_weights=options.float16_weights,
                              promoted_to_float32=source.promoted_to_float32)
    keep = [info.tensor for info in source.inputs + source.outputs]
    result = rewrite.rewrite(source.graph_def, keep, options.mode, options.form)
    reference = result.graph_def
    if options.float16_weights:
        fused_scope = rewrite.REWRITE_SCOPE if options.mode == "native" else None
        reference = graph.round_float_constants_to_float16(result.graph_def, except_scope=fused_scope)
    report.gelus = _summarise(result.findings)
    report.leftover_erf = result.leftover_erf
    tflite_model = to_tflite(result.graph_def, source, options.mode, options.float16_weights)
    report.ops = reporting.op_histogram(tflite_model)
    report.flex_ops = sorted(op for op in report.ops if op.startswith("Flex"))
    if report.flex_ops:
        report.warnings.append("the model uses Flex ops (" + ", ".join(report.flex_ops) + "): the runtime must "
                               "link the Flex delegate (select TF ops), which most mobile and MCU runtimes do not")
    report.size_bytes = len(tflite_model)
    if options.verify:
        _verify(tflite_model, source, reference, options, report)
    else:
        report.not_verified_reason = "verification switched off (--no-verify)"
    report.seconds = time.perf_counter() - started
    return tflite_model, report


def _verify(tflite_model, source, reference, options, report):
    """Fill in the parity figures; `reference` is the rewritten graph as TFLite should compute it."""
    arrays = parity.make_inputs(source.inputs, options.seed, options.dynamic_size, options.inputs)
    report.inputs_used = (f"inputs from {options.inputs}" if options.inputs else
                          f"seeded random inputs (seed {options.seed}, dynamic dimensions = {options.dynamic_size})")
    _, report.runtime = parity.interpreter_class()
    try:
        tflite_outputs = parity.run_tflite(tflite_model, source, arrays)
    except (RuntimeError, ValueError) as error:
        report.not_verified_reason = f"{report.runtime} cannot run this model: " + " ".join(str(error).split())[:300]
        return
    graph_outputs = parity.run_graph(reference, source, arrays)
    source_outputs = parity.run_source(source, arrays)
    report.tolerance = {"atol": options.atol, "rtol": options.rtol, "max_drift": options.max_drift}
    for info in source.outputs:
        fidelity = parity.compare(info.name, tflite_outputs[info.name], graph_outputs[info.name],
                                  options.atol, options.rtol)
        drift_limit = float("inf") if options.max_drift is None else options.max_drift
        drift = parity.compare(info.name, tflite_outputs[info.name], source_outputs[info.name], drift_limit, 0.0)
        report.fidelity.append(dataclasses.asdict(fidelity))
        report.drift.append(dataclasses.asdict(drift))
    report.verified = True
    failures = [c["output"] for c in report.fidelity if not c["passed"]]
    drifted = [c["output"] for c in report.drift if not c["passed"]]
    if failures:
        worst = max(c["max_abs"] for c in report.fidelity)
        raise errors.ParityFailure(report, f"{source.path}: the .tflite differs from the rewritten graph on output(s) "
                                   f"{', '.join(failures)} (max abs {worst:.3g} > atol {options.atol} + rtol "
                                   f"{options.rtol}); nothing written")
    if drifted:
        worst = max(c["max_abs"] for c in report.drift)
        raise errors.ParityFailure(report, f"{source.path}: the .tflite drifts from the original model by {worst:.3g} > "
                                   f"--max-drift {options.max_drift} on output(s) {', '.join(drifted)}; "
                                   "nothing written")
