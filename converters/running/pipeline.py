"""The conversion pipeline: load, rewrite, convert, verify, report, write."""

import collections
import contextlib
import copy
import dataclasses
import functools
import gc
import logging
import os
import re
import shutil
import tempfile
import time
import types

import numpy as np
import tensorflow as tf

from keras_gelu import replacements
from keras_gelu import vocabulary

from .. import errors
from .. import explanation
from .. import native_logs
from .. import options as conversion_options
from .. import report as reporting
from .. import targets
from ..reading import loading
from ..reading import trust
from ..rewriting import graph
from ..rewriting import int8 as integer
from ..rewriting import integer_valued
from ..rewriting import rewrite
from ..rewriting import saved_model
from ..rewriting import stablehlo_as_tf
from ..rewriting import tf_ops_as_builtins
from ..tflite import deduplication
from ..tflite import equivalent_ops
from ..tflite import float_islands
from ..tflite import kernel_grids
from ..tflite import operators
from ..tflite import quantizer
from ..tflite import signatures
from ..tflite import validation
from . import calibration
from . import explain
from . import lifting
from . import progress
from . import rounding_envelope
from . import target_checks
from . import tflite_input
from . import verify as parity

# A full garbage collection takes about 0.2 s with TensorFlow loaded, as long as converting a small
# model; it pays off only where the weights are large.
_COLLECT_ABOVE_BYTES = 64 * 2**20
# The share of the conversion's time limit --mixed-precision's search may take from where it starts: what
# follows (verifying, checking and writing the lifted model) took no more than the conversion before it, on the
# suite's models and ViT-B/16, whose search ran past the whole limit before there was one.
LIFTING_SHARE = 0.4
# A protocol buffer's size limit, and with it a frozen GraphDef's.
_PROTOBUF_LIMIT = 2**31 - 1


class _SerializedGraph:
    """The GraphDef the converter gets: the weightless skeleton for the nodes its checks read, and the
    whole graph's bytes for what it converts, so that no Python copy of the weights is held meanwhile."""

    def __init__(self, skeleton, serialized):
        self.skeleton, self.serialized = skeleton, serialized

    def __getattr__(self, name):
        return getattr(self.skeleton, name)

    def SerializeToString(self, **kwargs):  # noqa: N802 (the protobuf method it stands in for)
        return self.serialized


def _tflite_converter(graph_def, source):
    """A TFLiteConverter over our already frozen GraphDef (a _SerializedGraph).

    The public entry points want a ConcreteFunction, which the converter then
    freezes again (and by default saves as a temporary SavedModel first):
    for a graph whose weights are inline constants that round trip tripled the
    conversion time. So we hand the converter's freeze step the graph as it
    is. `_freeze_concrete_function` has kept this contract from TF 2.7 to 2.21.
    """
    scratch = tf.Graph()
    with scratch.as_default():
        tf.compat.v1.import_graph_def(graph_def.skeleton, name="")
    inputs = [scratch.get_tensor_by_name(info.tensor) for info in source.inputs]
    outputs = [scratch.get_tensor_by_name(info.tensor) for info in source.outputs]
    # autograph=False: AutoGraph would read and rewrite this lambda's source in every fresh worker (0.13 s)
    placeholder_function = tf.function(lambda: tf.constant(0.0), autograph=False).get_concrete_function()
    absl_logger = logging.getLogger("absl")  # a deprecation notice about trackable_obj, which we do not use
    previous_level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        converter = tf.lite.TFLiteConverter.from_concrete_functions([placeholder_function])
    finally:
        absl_logger.setLevel(previous_level)
    converter.experimental_lower_to_saved_model = False
    frozen = types.SimpleNamespace(graph=scratch, inputs=inputs, outputs=outputs)
    converter._freeze_concrete_function = lambda: (graph_def, inputs, outputs, frozen)
    return converter


def _saved_model_converter(directory, signature):
    """A TFLiteConverter over a SavedModel folder whose graph we rewrote where it is (rewriting.saved_model).

    Its SavedModel importer reads the variables from disk: no frozen graph holds the weights, nor a protocol
    buffer capped at 2 GB. `from_saved_model` and its `convert()` each load the model in Python first, for
    signatures and debug information we have (each load holds every weight): so we build the converter as
    `from_saved_model` does and hand its importer the folder, as `convert()` does after its load. Both steps
    have this shape in TF 2.18 and 2.21 (the suite's two); the public route is the fallback.
    """
    from tensorflow.lite.python import lite

    try:
        converter = lite.TFLiteSavedModelConverterV2(directory, {"serve"}, [signature])
        load_graph, convert_loaded = converter._load_saved_model, converter._convert_from_saved_model
    except (AttributeError, TypeError):
        return tf.lite.TFLiteConverter.from_saved_model(directory, signature_keys=[signature])
    converter._debug_info = None
    optimize = converter._optimize_tflite_model

    def optimized(model, *args, **kwargs):
        # A float conversion's only optimization is sharing repeated weights, done here without the stock
        # step's two unpackings and its repacking of every weight (`deduplication`)
        if converter.optimizations or converter._sparsify_model() or {converter.inference_input_type,
                                                                      converter.inference_output_type} - {tf.float32}:
            return optimize(model, *args, **kwargs)
        return deduplication.deduplicated(model)

    converter._optimize_tflite_model = optimized

    def convert():
        graph_def, _, _ = load_graph(converter.saved_model_dir, converter._saved_model_tags)
        return convert_loaded(graph_def)

    converter.convert = convert
    return converter


def serialized_for_converter(graph_def):
    """graph_def as to_tflite takes it, after which the caller may let graph_def and its weights go."""
    return _SerializedGraph(graph.without_weights(graph_def), graph_def.SerializeToString())


def to_tflite(graph_def, source, mode, float16_weights, int8=None, report=None, target=None):
    """Convert with mode.op_sets; `int8`: None for float, else (calibration samples or None for QAT, int8_io,
    int16); `report`, where given, is told of calibrated ranges repaired; `target`, where given, has its
    float-only kernels' ops kept float (`float_kernels`).

    `graph_def` is a GraphDef, what serialized_for_converter made of one, or the folder of a SavedModel
    rewritten where it keeps its graph.
    """
    if int8 is not None and _calibrated_apart(int8):
        samples, int8_io, int16 = int8
        calibrated_model, repairs = calibrated(graph_def, source, mode, samples, report, int16)
        return quantized(calibrated_model, source, int8_io,
                         set(repairs.float_ops) | float_kernels(calibrated_model, target, int16), int16)
    converter = _stock_converter(graph_def, source, mode)
    if float16_weights:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    if int8 is not None:
        integer.configure(converter, *int8)
    return _run(converter, source, mode)


def _calibrated_apart(int8):
    """Whether an integer conversion calibrates and quantizes in two steps (`tflite/quantizer.py`): post-training
    int8 and 16x8; not QAT, which has no calibration."""
    samples, _, _ = int8
    return samples is not None


def calibrated(graph_def, source, mode, samples, report=None, int16=False):
    """(the float model with every tensor's calibrated range, which `quantized` makes integer, quantizer.Repairs):
    the ranges recorded with nothing computed in place (`calibration.py`) and repaired where the quantizer could
    not take them, with the ops to keep float for that; `report`, where given, says what was repaired."""
    converter = _stock_converter(graph_def, source, mode)
    integer.configure(converter, samples, int8_io=False, int16=int16)
    quantizer.calibrate_only(converter)
    calibrated_model = _run(converter, source, mode)
    # the judged batch in our recording alone: the stock calibrator prepares its model for the first sample's
    # shapes, and a batch of another size met a CONCATENATION of inputs prepared for two (2 != 16)
    recorded = calibration.recorded_ranges(calibrated_model, _with_the_judged_batch(samples, source.inputs))
    floors = quantizer.softmax_floors(calibrated_model, recorded, int16)
    calibrated_model, repairs = quantizer.repaired(calibrated_model, recorded.ranges, floors, recorded.read_alone)
    if report is not None and any(repairs):
        report.ranges_repaired = repairs._asdict()
    return calibrated_model, repairs


def _judged_batch(samples):
    """The first JUDGED_SAMPLES calibration samples as one batch: a list of one array per input, in input order."""
    judged = samples[:conversion_options.JUDGED_SAMPLES]
    return [np.concatenate([sample[position] for sample in judged]) for position in range(len(judged[0]))]


def _batch_of_one(source):
    """Whether the signature fixes the batch (the first dimension) of every input and output at 1, as a model
    exported for a phone often is: parity then takes samples (--inputs, --calibration) and runs them one by one,
    where it refused an --inputs of more than one and judged one calibration sample alone (an output of one value
    per sample, keras-hub SAM 3's presence logit, had a cosine of 1 or -1)."""
    return all(info.shape is not None and len(info.shape) and info.shape[0] == 1
               for info in (*source.inputs, *source.outputs))


def _batch_open(inputs):
    """Whether no input fixes the batch (its first dimension), so that samples may run as one batch."""
    return not any(info.shape is not None and len(info.shape) and info.shape[0] is not None for info in inputs)


def _with_the_judged_batch(samples, inputs):
    """`samples`, and the batch the parity check judges (_calibration_as_parity_inputs) where the batch is open
    and there are two samples or more: an op that computes across the batch (a contrastive model's logits,
    every image against every text) gets the range of what it computes on a batch, which samples of one never
    show. Hugging Face's CLIP, calibrated on its two samples one at a time, held its logits' cross terms on the
    range of the matched pairs alone: int8 0.9447, 16x8 0.9289; with the batch too, 0.9995 and 0.9999. What any
    other op computes on the batch are the samples' own values again."""
    if len(samples) < 2 or not _batch_open(inputs):
        return samples
    return list(samples) + [_judged_batch(samples)]


def float_kernels(calibrated_model, target, int16=False):
    """The names (`quantizer.ops`) of the calibrated model's ops whose kernels on `target` take float alone (TFLite
    Micro's SQRT, SIN, COS, LOG, SQUARE): kept float, each a float function of one integer tensor becomes a
    lookup in a table of its results (`float_islands.made_integer`), which the target runs."""
    if target is None:
        return set()
    integer = "int16" if int16 else "int8"
    return {op.name for op in quantizer.ops(calibrated_model) if op.kind in target.op_output_types
            and not target.runs(op.kind, integer) and target.runs(op.kind, "float32")}


def quantized(calibrated_model, source, int8_io, float_ops=(), int16=False):
    """`calibrated`'s model in int8, with the ops named in `float_ops` kept in float; or `int16`, in 16x8."""
    try:
        if int16:
            return quantizer.quantized_16x8(calibrated_model, int8_io, float_ops)
        return quantizer.quantized(calibrated_model, int8_io, float_ops)
    except Exception as error:  # the quantizer raises ConverterError and friends
        failure = error
    raise errors.ConverterFailed(f"{source.path}: the TFLite quantizer failed: "
                                 f"{' '.join(str(failure).split())[:400]}") from failure


def _stock_converter(graph_def, source, mode):
    if isinstance(graph_def, str):
        converter = _saved_model_converter(graph_def, source.signature)
    else:
        if not isinstance(graph_def, _SerializedGraph):
            graph_def = serialized_for_converter(graph_def)
        converter = _tflite_converter(graph_def, source)
    converter.target_spec.supported_ops = [getattr(tf.lite.OpsSet, name) for name in mode.op_sets]
    return converter


def _run(converter, source, mode):
    try:
        return native_logs.converted(converter)
    except Exception as error:  # the converter raises ConverterError and friends
        failure = error
    raise errors.ConverterFailed(f"{source.path}: {_converter_failure(failure, mode)}") from failure


# The converter's words for a TensorFlow op that the op sets allowed have no kernel for.
_NO_KERNEL = re.compile(r"'tf\.(\w+)' op is neither a custom op nor a flex op")


def _located(line):
    """An MLIR error line, `<unknown>:0: error: loc(...): message`, as `op: message`: the op its location names
    first (its name's last three parts), so that the message shows whatever the location's length. A location
    of calls within calls (`loc(fused[callsite(fused["Less:", "model/layer/Less@__inference_..."] at ...)])`)
    ran past the line's 400 characters before the message began."""
    start = line.find("error: loc(")
    if start < 0:
        return line
    depth, quoted = 0, False
    for end in range(start + len("error: "), len(line)):
        if line[end] == '"':
            quoted = not quoted
        elif not quoted and line[end] in "()":
            depth += 1 if line[end] == "(" else -1
            if depth == 0:
                break
    else:
        return line
    names = [name for name in re.findall(r'"([^"]*)"', line[start:end]) if not name.endswith(":")]
    named = next((name for name in names if "/" in name), names[0] if names else "")
    op = "/".join(named.split("@")[0].split("/")[-3:])
    message = line[end + 1:].lstrip(": ")
    return f"{op}: {message}" if op else message


def _converter_failure(failure, mode):
    """The TFLite converter's error as one line: the ops it has no builtin for, by name, or its first error."""
    text = str(failure)
    missing = sorted(set(_NO_KERNEL.findall(text)))
    if missing:
        named = ", ".join(missing)
        if "SELECT_TF_OPS" in mode.op_sets:
            hint = "; Erfc has no Flex kernel, use --mode builtin or native, which rewrite it" if "Erfc" in missing \
                else ""
            return f"TensorFlow op(s) {named} have neither a TFLite builtin nor a Flex kernel{hint}"
        return (f"TFLite has no builtin op for TensorFlow op(s) {named}; --mode select keeps them as TensorFlow "
                "ops (Flex), which the runtime must then link")
    lines = [line.strip() for line in text.splitlines()]
    summary = next((line for line in lines if line.startswith(("Custom ops:", "Flex ops:"))), None)
    summary = summary or next((line for line in lines if "error:" in line), lines[0] if lines else "")
    # the op's location by the end of its name, so that what follows (a same-scale refusal's two scales) shows
    summary = _located(summary)
    return f"the TFLite converter failed: {summary[:400]}"


def _summarise(findings):
    grouped = collections.Counter((f.pattern, f.alpha, f.became) for f in findings)
    return [{"pattern": p, "alpha": a, "became": b, "count": n} for (p, a, b), n in sorted(grouped.items())]


def convert(model, options, kind=None, name=None):
    """Convert a model to TFLite; returns (tflite bytes, Report). Runs the model: in the sandbox's worker for
    a file (`keras_gelu.converters.convert` is the entry point), in the caller's process for a live model.

    `model` is the path of a model file of `kind` (paths.model_kind's, decided outside from its name and
    content; `name` is how the report names it), or a live Keras model (Keras 3 or tf-keras; Sequential,
    functional, or subclassed once built), converted through its serving signature. `options` is an
    `Options`. Unless options.trust_model, a model that carries code or reaches outside the process is
    refused (errors.UntrustedModel) before any of it is loaded or run. Raises a
    `converters.errors.ConversionError` subclass for user errors, including a parity failure.
    """
    if kind == ".tflite":
        progress.entered("load")
        with open(model, "rb") as stream:
            return tflite_input.convert(stream.read(), name or model, options)
    started = time.perf_counter()
    stages = dict.fromkeys(("load", "rewrite", "convert", "verify"), 0.0)  # where the time goes
    target = targets.TARGETS.get(options.target)
    # The SavedModel protocol buffer whose graph is rewritten where it keeps it, or None for the frozen route
    kept_graph = _rewritable_in_place(model, kind, options, target)
    with _timed(stages, "load"):
        source = loading.load(model, options.signature, trust_model=options.trust_model, kind=kind, name=name,
                              config_limit=int(options.config_limit * 2**20),
                              member_limit=None if options.memory_limit is None else int(options.memory_limit * 2**30),
                              freeze=kept_graph is None)
        if kept_graph is not None and (source.retyped_to_float32 or integer.is_quantization_aware(source.graph_def)):
            loading.freeze_graph(source)  # retyped or quantization-aware: the frozen route's passes serve these
            kept_graph = None
        if kept_graph is None:
            _refuse_past_the_protobuf_limit(source, options, target)
            if stablehlo_as_tf.holds_modules(source.graph_def):  # JAX's exports: TensorFlow ops from here on
                with _naming_the_model(source.path):
                    source.graph_def = graph.with_passes(source.graph_def, [stablehlo_as_tf.modules_translated])
        parity_inputs, batch_fixed = source.inputs, False  # parity runs on batches of the model's own shapes
        if (target is not None and target.static_shapes) or options.input_shapes:
            source, parity_inputs, batch_fixed = target_checks.with_static_shapes(source, target,
                                                                                  options.input_shapes)
        if _batch_of_one(source):  # sample by sample, as where a target's runtime fixes the batch
            parity_inputs = [dataclasses.replace(info, shape=(None, *info.shape[1:])) for info in parity_inputs]
            batch_fixed = True
    report = reporting.Report(source.path, source.kind, source.signature, options.mode, options.exact_as,
                              float16_weights=options.float16_weights,
                              retyped_to_float32=list(source.retyped_to_float32), trusted=options.trust_model)
    int8_setup = _int8_setup(source, options, report)
    # The original graph, for the float model an int8 model is judged against, or that --explain compares with
    original_graph = _original_graph(source, options) if kept_graph is None else None
    rewritten_folder = tempfile.mkdtemp() if kept_graph is not None else None
    try:
        with _timed(stages, "rewrite"):
            if kept_graph is not None:
                result, reference = _rewritten_in_place(kept_graph, source, options, rewritten_folder)
            else:
                result, reference = _rewritten(source, options, target)
        report.gelus = _summarise(result.findings)
        report.leftover_erf = result.leftover_erf
        # The requested mode's op sets: int8 select rewrites GELUs as native does but may leave other ops to Flex.
        requested = vocabulary.MODES[options.mode]
        arrays = source_outputs = reference_outputs = None
        if options.verify:
            with _timed(stages, "verify"):
                arrays = _calibration_as_parity_inputs(options, int8_setup, parity_inputs, batch_fixed, report) or \
                    parity.make_inputs(parity_inputs, options.seed, options.dynamic_size, options.inputs)
                # The original model runs now, so that its variables can go before converting; not where the
                # .tflite may need Flex, which LiteRT cannot run: a model is not run for a check that cannot
                # happen. The rewritten SavedModel too: one model's weights at a time.
                if "SELECT_TF_OPS" not in requested.op_sets:
                    source_outputs = _source_outputs(source, arrays, batch_fixed)
                    if kept_graph is not None:
                        _let_go_of_the_source(source)
                        reference_outputs = _on_batches(parity.reference_runner(reference, source), batch_fixed)(
                            arrays)
                        _collect_if_large(source)  # the rewritten SavedModel's weights, before converting
        with _timed(stages, "convert"):
            if kept_graph is not None:
                if source_outputs is not None or not options.verify:
                    _let_go_of_the_source(source)
                tflite_model = _converted(reference, source, requested, options, int8_setup, target, report)
            else:
                keep_source = options.verify and source_outputs is None
                serialized, reference = _handed_to_converter(source, result, reference, keep_source)
                if not _lifts(options, report):
                    tflite_model = _converted(serialized, source, requested, options, int8_setup, target, report)
        explainer = _Explainer(original_graph, source, options, result.findings, batch_fixed)
        if _lifts(options, report):
            with _timed(stages, "convert"):
                if source_outputs is None:
                    source_outputs = _source_outputs(source, arrays, batch_fixed)
                tflite_model = _lifted(serialized, source, requested, options, int8_setup, target, report, arrays,
                                       source_outputs, explainer)
        if options.verify:
            with _timed(stages, "verify"):
                if kept_graph is None:
                    if reference is None:
                        reference = tf.compat.v1.GraphDef.FromString(serialized.serialized)
                    del serialized
                _verify(tflite_model, source, reference, options, report, target, arrays, source_outputs, batch_fixed,
                        reference_outputs, explainer)
        else:
            report.not_verified_reason = "verification switched off (--no-verify)"
    finally:
        if rewritten_folder is not None:
            shutil.rmtree(rewritten_folder, ignore_errors=True)
    report.seconds = time.perf_counter() - started
    report.stage_seconds = stages
    return tflite_model, report


def _original_graph(source, options):
    """The frozen original graph, kept past the rewrite (which works in place where no pass copies it) where an
    int8 model is judged against its float model, or --explain compares with it; else None."""
    if not (options.int8 and options.min_cosine) and not options.explain:
        return None
    if options.int8:
        return source.graph_def  # the int8 passes rewrite a copy (graph.with_passes)
    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(source.graph_def)
    return copy


def _calibration_as_parity_inputs(options, int8_setup, parity_inputs, batch_fixed, report):
    """The first calibration samples as one batch, for parity where no --inputs are given: an int8 model is
    judged on the values it was calibrated for (seeded random inputs may lie far outside the ranges real
    samples give, where int8 clips), and on more than one batch; None where parity takes --inputs or random
    inputs (a float or quantization-aware model)."""
    if options.inputs or not options.int8 or int8_setup is None or int8_setup[0] is None:
        return None
    samples = int8_setup[0][:conversion_options.JUDGED_SAMPLES]
    if not batch_fixed and not _batch_open(parity_inputs):
        samples = samples[:1]  # a batch the model fixes, which no parity run splits: one sample
    count = len(samples) * integer.fixed_batch(parity_inputs)  # samples in batches of the batch a model fixes
    report.inputs_used = f"the first {count} calibration samples ({options.calibration})"
    return {info.name: batch for info, batch in zip(parity_inputs, _judged_batch(samples))}


class _Explainer:
    """The float model, converted once when first asked for, and the explanation of a .tflite against it."""

    def __init__(self, original_graph, source, options, findings, batch_fixed):
        self.original_graph, self.source, self.options = original_graph, source, options
        self.findings, self.batch_fixed = findings, batch_fixed
        self._float_model = None

    @property
    def available(self):
        return self.original_graph is not None

    def float_model(self):
        """The original graph converted to float with its GELUs as written (native mode), signed."""
        if self._float_model is None:
            float_options = dataclasses.replace(self.options, mode="native", exact_as=None, int8=False,
                                                calibration=None, int8_io=False, max_steps=None,
                                                float16_weights=False, target=None, allow_cpu_fallback=False,
                                                mixed_precision=False)
            original = types.SimpleNamespace(graph_def=self.original_graph, inputs=self.source.inputs,
                                             outputs=self.source.outputs)
            result, _ = _rewritten(original, float_options, None)
            tflite_model = to_tflite(result.graph_def, self.source, vocabulary.MODES["native"], False)
            self._float_model = signatures.with_signature(tflite_model, self.source.signature,
                                                          [info.name for info in self.source.inputs],
                                                          [info.name for info in self.source.outputs])
        return self._float_model

    def explained(self, tflite_model, arrays, report):
        """The explanation on `arrays` (sample by sample where the batch is fixed), or None, with a warning in
        `report` saying why there is none."""
        progress.entered("explain")
        try:
            float_model = self.float_model()
        except errors.ConversionError as error:
            report.warnings.append(f"no tensor compared: the float model does not convert ({error.message[:200]})")
            return None
        samples = target_checks.one_by_one(arrays) if self.batch_fixed else [arrays]
        return explain.explained(tflite_model, float_model, self.source.signature, samples,
                                 "the original graph in float, its GELUs as written (native mode), on LiteRT", report,
                                 self.findings)


def _rewritable_in_place(model, kind, options, target):
    """The SavedModel's protocol buffer where its graph is rewritten where it keeps it (rewriting.saved_model),
    the weights left in its variables, else None for a frozen copy: a TensorFlow 2 SavedModel converted to
    float for the whole op set. The frozen route serves the rest (int8, float16 weights, a target's passes
    and fixed shapes, Keras files and live models, TF1 SavedModels and initializers that do more than restore)."""
    if (kind != "SavedModel" or options.int8 or options.float16_weights or target is not None
            or options.input_shapes or options.explain):
        return None
    try:
        proto = saved_model.read(model)
    except Exception:  # noqa: BLE001 - loading says what is wrong with the file, in one line
        return None
    return proto if saved_model.keeps_its_graph_in_functions(proto) else None


def _refuse_past_the_protobuf_limit(source, options, target):
    """errors.ModelTooLarge, in one line with the figure, where the frozen graph's weights pass 2 GB: the
    converter would fail after serializing most of them (measured: 47 s, "basic_string::append")."""
    weight_bytes = graph.constant_bytes(source.graph_def)
    if weight_bytes <= _PROTOBUF_LIMIT:
        return
    flags = [flag for flag, given in (("--int8", options.int8), ("--float16-weights", options.float16_weights),
                                      (f"--target {options.target}", target is not None),
                                      ("--input-shape", options.input_shapes)) if given]
    route = {"SavedModel": " and ".join(flags) or "this SavedModel (TensorFlow 1, retyped to float32, or QAT)",
             "Keras model": "a live Keras model"}.get(source.kind, f"a {source.kind} file")
    raise errors.ModelTooLarge(
        f"{source.path}: its {weight_bytes:,} bytes of weights ({weight_bytes / 2**30:.2f} GiB) pass the 2 GiB "
        "a protocol buffer holds, "
        f"and {route} converts a frozen copy of the graph; a TensorFlow 2 SavedModel (Keras: model.export) "
        "converted to float without --int8, --float16-weights, --target or --input-shape keeps its weights in "
        "its variables")


def _collect_if_large(source):
    """A full garbage collection where the weights are large: a loaded SavedModel's objects hold each other in
    cycles."""
    variables = os.path.join(source.directory, "variables")
    files = [os.path.join(variables, name) for name in os.listdir(variables)] if os.path.isdir(variables) else []
    if sum(os.path.getsize(path) for path in files) >= _COLLECT_ABOVE_BYTES:
        gc.collect()


def _let_go_of_the_source(source):
    if source.function is not None:
        source.function = source.owner = None
        _collect_if_large(source)


def _rewritten_in_place(proto, source, options, folder):
    """(rewrite.RewriteResult, the rewritten SavedModel's folder, made in `folder`): source's SavedModel (its
    protocol buffer `proto`) rewritten where it keeps its graph."""
    mode = vocabulary.conversion_mode(options.mode, options.int8)
    graph.constant_arguments_inlined(proto.meta_graphs[0].graph_def)  # the constants functions captured
    passes = (stablehlo_as_tf.modules_translated,) + (tf_ops_as_builtins.TO_BUILTINS if mode.rewrites else ())
    with _naming_the_model(source.path):
        result = rewrite.rewrite_saved_model(proto, source.signature, mode, options.exact_as, passes)
    return result, saved_model.write(proto, source.directory, os.path.join(folder, "model"))


@contextlib.contextmanager
def _naming_the_model(path):
    """A graph pass's ConverterFailed (the StableHLO translation's), its line starting with the model's path."""
    try:
        yield
    except errors.ConverterFailed as error:
        raise errors.ConverterFailed(f"{path}: {error.message}") from error


@contextlib.contextmanager
def _timed(stages, stage):
    progress.entered(stage)
    started = time.perf_counter()
    try:
        yield
    finally:
        stages[stage] += time.perf_counter() - started


def _handed_to_converter(source, result, reference, keep_source):
    """(the rewritten graph as to_tflite takes it, the fidelity reference or None to parse it back later).

    The converter gets the graph as bytes, and every other copy of its weights
    is let go (the GraphDef, and the loaded model's variables unless
    `keep_source`): the converter's own copies and the bytes are already four.
    """
    serialized = serialized_for_converter(result.graph_def)
    reference = None if reference is result.graph_def else reference
    source.graph_def = result.graph_def = None
    if not keep_source:
        source.function = source.owner = None
    if len(serialized.serialized) >= _COLLECT_ABOVE_BYTES:
        gc.collect()  # a loaded SavedModel's objects hold each other in cycles
    return serialized, reference


def _converted(serialized, source, requested, options, int8_setup, target, report):
    """The .tflite with its signature and the target's op names; fills in the report's op figures."""
    tflite_model = to_tflite(serialized, source, requested, options.float16_weights, int8_setup, report, target)
    return _finished(tflite_model, serialized, source, options, target, report)


def _finished(tflite_model, serialized, source, options, target, report):
    """What the converter made of `serialized`, signed, checked and made runnable (see _converted)."""
    if not options.trust_model:  # a select-mode .tflite carries TensorFlow ops to the device: the same rules
        trust.check_flex_ops(source.path, tflite_model)
    if not isinstance(serialized, str):  # the converter signs what it imports from a SavedModel itself
        tflite_model = signatures.with_signature(tflite_model, source.signature,
                                                 [info.name for info in source.inputs],
                                                 [info.name for info in source.outputs])
    if target is not None:
        report.target = target_checks.section(target, options)
        if target.ops is not None:
            tflite_model, report.target["renamed_ops"] = equivalent_ops.for_target(tflite_model, target.ops)
    if options.int8:
        tflite_model, report.islands_made_integer = float_islands.made_integer(
            tflite_model, parity.interpreter_class()[0])
        # before any interpreter prepares it: a grid finer than its kernel rescales to aborts the process
        tflite_model, report.kernel_grids = kernel_grids.made_acceptable(tflite_model)
    report.ops = operators.op_histogram(tflite_model)
    if "GELU" in report.ops and vocabulary.conversion_mode(options.mode, options.int8).exact_as:
        # A mode that spells exact GELU in builtins promises no GELU op: the converter fused one we did not find.
        raise errors.ConverterFailed(f"{source.path}: {report.ops['GELU']} GELU op(s) the rewrite missed would "
                                     "remain in builtin mode (a keras-gelu bug: please report the model); "
                                     "nothing written")
    if options.int8:
        report.op_types = operators.typed_op_histogram(tflite_model)
        report.float_ops = operators.float_islands(tflite_model)
        if report.float_ops and not _lifts(options, report):  # what --mixed-precision lifts, it reports itself
            open_dimensions = [info.name for info in source.inputs
                               if info.shape is None or None in tuple(info.shape)[1:]]
            hint = (f"; --input-shape for {', '.join(open_dimensions)} folds what is computed from a shape "
                    "(positions, masks, rotary tables)") if open_dimensions else ""
            report.warnings.append(f"not fully integer: {reporting.counted(report.float_ops)} compute in float"
                                   + hint)
    report.note_flex_ops()
    report.size_bytes = len(tflite_model)
    invalid = validation.problem(tflite_model)
    if invalid is not None:  # before any runtime reads it
        raise errors.ConverterFailed(f"{source.path}: the TFLite converter wrote a .tflite whose {invalid}; "
                                     "nothing written")
    if target is not None:  # before any runtime sees the model: a refusal here names what does not fit
        report.target["ops"] = target_checks.check(tflite_model, target, options.allow_cpu_fallback)
    return tflite_model


def _lifts(options, report):
    """Whether --mixed-precision searches for ops to lift: not in a quantization-aware model, whose int8 model
    computes its FakeQuant graph, which is what the budget holds it to (lifting.QUANTIZATION_AWARE)."""
    return options.mixed_precision and not report.quantization_aware


def _lifted(serialized, source, requested, options, int8_setup, target, report, arrays, source_outputs, explainer):
    """--mixed-precision: the int8 model with the ops that lose the most lifted to float, until its worst output
    keeps --min-cosine against the float model on `arrays` (running/lifting.py); report.lifted says which."""
    samples, int8_io, _ = int8_setup
    calibrated_model, repairs = calibrated(serialized, source, requested, samples, report)
    kept_float = set(repairs.float_ops) | float_kernels(calibrated_model, target)  # whatever is lifted

    def made(float_ops):
        """(the model with `float_ops` float, the report its finishing filled in: a copy of `report`)."""
        filled = copy.deepcopy(report)
        model = quantized(calibrated_model, source, int8_io, set(float_ops) | kept_float)
        return _finished(model, serialized, source, options, target, filled), filled

    def quantize(float_ops):  # a choice the quantizer, a check or the target refuses is no choice
        try:
            return made(float_ops)
        except errors.ConversionError:
            return None

    def judge(made_model):
        progress.entered("mixed precision: judge a lift")
        run = parity.signature_runner(made_model[0], source.signature)
        outputs = _on_batches(run, explainer.batch_fixed)(arrays)
        # a cosine is taken over the finite values alone: a trial giving NaN where the float model is finite
        # (Hugging Face GroupViT's search met one) looked closest, and verification refused it
        if any(parity.non_finite_where_finite(outputs[info.name], source_outputs[info.name])
               for info in source.outputs):
            return -1.0
        return min(parity.compare(info.name, outputs[info.name], source_outputs[info.name], float("inf"), 0.0).cosine
                   for info in source.outputs)

    scratch = copy.deepcopy(report)  # what explaining a trial would warn of is about the trial alone
    # the search's share of the time limit, so that the lifted model is still verified and written within it
    deadline = None if options.time_limit is None else time.monotonic() + LIFTING_SHARE * options.time_limit
    (tflite_model, filled), lifting_done = lifting.lifted(
        made(()), quantizer.ops(calibrated_model), options.min_cosine, quantize, judge,
        lambda made_model: explainer.explained(made_model[0], arrays, scratch) if explainer.available else None,
        deadline)
    vars(report).update(vars(filled))  # the chosen model's figures, not quantized and finished again for them
    report.lifted = lifting_done.as_dict()
    return tflite_model


def _on_batches(run, batch_fixed):
    """`run` over a batch, sample by sample where the model fixes its batch at one."""
    return (lambda batch: target_checks.per_sample(run, batch)) if batch_fixed else run


def _source_outputs(source, arrays, batch_fixed):
    """The original model's outputs on `arrays` (parity.run_source), sample by sample where the batch is fixed."""
    return _on_batches(functools.partial(parity.run_source, source), batch_fixed)(arrays)


def _without_clamp(build, alpha, x, nodes):
    """The `mark` where the target lacks the guards' ops: the replacement without its -inf clamp, unmarked."""
    return replacements.unmarked, ", without the -inf clamp (the target lacks the guards' ops)"


def _rewritten(source, options, target):
    """(rewrite.RewriteResult, the reference graph the .tflite must compute) for the conversion's mode."""
    passes, marker = (), None
    if options.int8:
        passes, marker = integer.GRAPH_PASSES + (integer.INT16_PASSES if options.int16 else ()), integer.marker
    elif target is not None and not target.keeps_non_finite_guards:
        passes, marker = (integer.drop_non_finite_guards,), _without_clamp
    mode = vocabulary.conversion_mode(options.mode, options.int8)
    if mode.rewrites:  # builtin op sets only: TensorFlow ops TFLite lacks are spelled in builtins first
        passes = tf_ops_as_builtins.TO_BUILTINS + passes
        if target is not None and not target.runs("CUMSUM", "int32"):  # a padding mask's running count
            passes = (tf_ops_as_builtins.int32_cumsums_as_additions,) + passes
        if target is not None:  # a device's runtime: positions in int32, which its kernels take where any take int64
            passes = (integer_valued.int64_arithmetic_in_int32,) + passes
        if target is not None and not target.has("TILE") and target.has("BROADCAST_TO"):
            passes = (tf_ops_as_builtins.tiles_as_broadcasts,) + passes
    keep = [info.tensor for info in source.inputs + source.outputs]
    graph_def = graph.with_passes(source.graph_def, passes)  # a copy where there are passes, as for int8
    if options.int8 and options.calibration:  # TFLite's calibrator would crash on a loop handing a tensor on
        graph.loop_invariants_recomputed(graph_def)
    result = rewrite.rewrite(graph_def, keep, mode, options.exact_as, int8=options.int8, marker=marker)
    if options.int8:  # after the rewrite: a GELU's spelling, read before its FakeQuant, is matched as it is
        result.graph_def = graph.with_passes(result.graph_def, integer.AFTER_REWRITE_PASSES)
    if not options.float16_weights:
        return result, result.graph_def
    return result, graph.round_float_constants_to_float16(result.graph_def, except_scope=rewrite.FUSED_SCOPE)


def _int8_setup(source, options, report):
    """Check the int8 flags against the model; (calibration samples or None, int8_io), or None for float."""
    report.quantization_aware = quantization_aware = integer.is_quantization_aware(source.graph_def)
    target = targets.TARGETS.get(options.target)
    if quantization_aware and not options.int8 and target is not None and target.takes_int8:
        # Trained for int8, converted for a runtime that runs int8: a float conversion would keep the FakeQuants
        # as QUANTIZE/DEQUANTIZE pairs of its own, which TFLite Micro, for one, refuses.
        options.int8 = True
    if not options.int8:
        if options.max_steps is not None:
            raise errors.BadInputs(f"{source.path}: --max-steps applies to int8 conversions, and this one is float "
                                   "(the model is not quantization-aware): pass --int8")
        if quantization_aware:
            report.warnings.append("the model is quantization-aware (FakeQuant ops): pass --int8 for an int8 model")
        return None
    report.int8 = True
    report.step_type = "int16" if options.int16 else "int8"
    if quantization_aware:
        if options.int16:
            raise errors.BadInputs(f"{source.path}: the model is quantization-aware, trained for int8 ranges; drop "
                                   "--int16, or convert its float model with --int16 --calibration")
        if options.calibration:
            raise errors.BadInputs(f"{source.path}: the model is quantization-aware, its int8 ranges are trained; "
                                   "drop --calibration")
        report.int8_ranges = "ranges trained by quantization-aware training (FakeQuant ops)"
        return None, options.int8_io, False
    if not options.calibration:
        target = targets.TARGETS.get(options.target)
        implied = target is not None and target.int8 and not options.int16  # a target that runs int8 models only
        flag = "--int16" if options.int16 else "--int8" + (f" (implied by --target {target.name})" if implied else "")
        raise errors.BadInputs(f"{source.path}: a float model needs --calibration file.npz or random:N for "
                               f"{flag} (or train it with keras_gelu.qat.quantize_model)")
    samples = integer.calibration_samples(options.calibration, source.inputs, options.seed, options.dynamic_size)
    batch = integer.fixed_batch(source.inputs)
    batches = f" in {len(samples)} batch{'es' * (len(samples) > 1)} of {batch}, the batch the model fixes" \
        if batch > 1 else ""
    report.int8_ranges = (f"post-training, calibrated on {len(samples) * batch} samples{batches} "
                          f"({options.calibration})")
    return samples, options.int8_io, options.int16


def _within_rounding_envelope(reference, source, arrays, graph_outputs, scales, limits, limit, report, run):
    """(limits, the limit as the report states it), each output's widened to the rewritten graph's own rounding
    envelope where that is the wider (`rounding_envelope`): an int8 model beyond the default limit in steps
    because one step of rounding anywhere moves its outputs by as much."""
    progress.entered("verify: the rounding envelope")
    moved = rounding_envelope.envelope(reference, source, arrays, graph_outputs, run=run)
    steps = {info.name: None if scale is None else round(moved[info.name] / scale, 2)
             for info, scale in zip(source.outputs, scales)}
    report.tolerance["rounding_envelope"] = {"fraction": rounding_envelope.FRACTION,
                                             "trials": rounding_envelope.TRIALS, "steps": steps}
    widened = [(max(atol, moved[info.name]), rtol) for info, (atol, rtol) in zip(source.outputs, limits)]
    envelope = max((value for value in steps.values() if value is not None), default=0.0)
    return widened, (f"{limit}, nor within the rounding envelope of {envelope:.1f} steps (one step on "
                     f"{rounding_envelope.FRACTION:.0%} of each activation's values moves the graph so far)")


def _judge_budget(tflite_model, source, options, report, arrays, explainer):
    """An int8 model's worst output cosine against the float model, on the parity inputs (--inputs, the
    calibration samples, or seeded random ones), held to --min-cosine: below it, a ParityFailure naming the
    tensor where the signal went (the explanation's worst, made here unless --explain made it), and what would
    help."""
    if not (options.int8 and options.min_cosine) or not report.drift:
        return
    worst = min(report.drift, key=lambda c: c["cosine"])
    report.budget = {"min_cosine": options.min_cosine, "cosine": worst["cosine"], "output": worst["output"],
                     "passed": bool(worst["cosine"] >= options.min_cosine)}
    if options.mixed_precision and not _lifts(options, report):  # the search would start here, and lift nothing
        report.lifted = lifting.Lifting(worst["cosine"], worst["cosine"], [], 0,
                                        "" if report.budget["passed"] else lifting.QUANTIZATION_AWARE).as_dict()
    if report.budget["passed"]:
        return
    if report.explanation is None and explainer is not None and explainer.available:
        report.explanation = explainer.explained(tflite_model, arrays, report)
    where = "" if report.explanation is None else explanation.where_lost(report.explanation)
    where = f"; {where}" if where else ""
    finer = "" if options.int16 or report.quantization_aware else "--int16 (16x8: activations on a finer grid), "
    lift = "" if options.int16 or report.quantization_aware or options.mixed_precision else \
        "--mixed-precision (the ops that lose it in float), "
    help_ = f"{finer}{lift}keras_gelu.qat (quantization-aware training), calibration on real samples"
    look = "" if options.explain else ", --explain DIR to see every tensor"
    stopped = {"trials": f"after {lifting.MAX_TRIALS} quantizations tried", "time": "at its share of --time-limit",
               lifting.QUANTIZATION_AWARE: "as it lifts none of a quantization-aware model's: keep its layers float "
                                           "in training, keras_gelu.qat.quantize_model's keep_float"}
    lifted = "" if report.lifted is None else (
        f" (--mixed-precision: {len(report.lifted['float_ops'])} op(s) in float, "
        + stopped.get(report.lifted["stopped"], "the closest of its trials, every op it can lift lifted "
                                                "among them") + ")")
    raise errors.ParityFailure(report, f"{source.path}: the {'16x8' if options.int16 else 'int8'} model's "
                               f"{worst['output']} reaches cosine {worst['cosine']:.4f}{lifted} against the "
                               f"float model, below --min-cosine "
                               f"{options.min_cosine:g}{where}; {help_}{look} may help; nothing written")


def _verify(tflite_model, source, reference, options, report, target, arrays, source_outputs, batch_fixed,
            reference_outputs=None, explainer=None):
    """Fill in the parity figures; `reference` is the rewritten graph as TFLite should compute it (a GraphDef,
    or a rewritten SavedModel's folder).

    `arrays` are the inputs, and `source_outputs` and `reference_outputs` the original model's and the
    reference's outputs for them, or None where they have yet to run; where the target fixed the batch at 1
    (`batch_fixed`), the .tflite and the reference run them sample by sample.
    """

    report.inputs_used = report.inputs_used or (
        f"inputs from {options.inputs}" if options.inputs else
        f"seeded random inputs (seed {options.seed}, dynamic dimensions = {options.dynamic_size})")
    _, report.runtime = parity.interpreter_class()
    try:
        tflite_outputs = _on_batches(parity.signature_runner(tflite_model, source.signature), batch_fixed)(arrays)
    except (RuntimeError, ValueError) as error:
        why = " ".join(str(error).split())[:300]
        if not report.flex_ops:  # Flex ops are the runtime's to link; any other op it cannot run, no device runs
            raise errors.ConverterFailed(f"{source.path}: the TFLite converter wrote a .tflite {report.runtime} "
                                         f"cannot run ({why}); nothing written") from error
        report.not_verified_reason = f"{report.runtime} cannot run this model: {why}"
        return
    graph_outputs = reference_outputs
    if graph_outputs is None:
        graph_outputs = _on_batches(parity.reference_runner(reference, source), batch_fixed)(arrays)
    if source_outputs is None:  # not run before converting (see convert)
        source_outputs = _source_outputs(source, arrays, batch_fixed)
    report.tolerance = {"atol": options.atol, "rtol": options.rtol, "max_drift": options.max_drift}
    scales = [None] * len(source.outputs)
    if options.int8:
        scales = operators.output_scales(tflite_model)
        max_steps = options.max_steps
        if max_steps is None and report.quantization_aware:
            max_steps = conversion_options.DEFAULT_QAT_STEPS
        report.tolerance = {"max_steps": max_steps, "max_drift": options.max_drift}
    limits = [(options.atol, options.rtol)] * len(scales)
    if options.int8:  # in output steps; without a limit (post-training), only reported
        limits = [(float("inf") if max_steps is None or scale is None else max_steps * scale, 0.0) for scale in scales]
    drift_limit = float("inf") if options.max_drift is None else options.max_drift
    limit = f"atol {options.atol} + rtol {options.rtol}"
    if options.int8:
        limit = f"{report.tolerance['max_steps']} int8 steps"

    def compared(limits):
        return [parity.compare(info.name, tflite_outputs[info.name], graph_outputs[info.name], atol, rtol)
                for info, (atol, rtol) in zip(source.outputs, limits)]

    fidelities = compared(limits)
    if options.int8 and options.max_steps is None and not isinstance(reference, str) and not all(
            fidelity.passed for fidelity in fidelities):  # QAT's default limit: the envelope too, when it is wider
        limits, limit = _within_rounding_envelope(reference, source, arrays, graph_outputs, scales, limits, limit,
                                                  report, lambda runner: _on_batches(runner, batch_fixed)(arrays))
        fidelities = compared(limits)
    for info, scale, fidelity in zip(source.outputs, scales, fidelities):
        drift = parity.compare(info.name, tflite_outputs[info.name], source_outputs[info.name], drift_limit, 0.0)
        report.fidelity.append(parity.with_steps(fidelity, scale))
        report.drift.append(parity.with_steps(drift, scale))
    report.verified = True
    garbage = [info.name for info in source.outputs
               if parity.non_finite_where_finite(tflite_outputs[info.name], source_outputs[info.name])]
    if garbage:
        raise errors.ParityFailure(report, f"{source.path}: the .tflite gives NaN or Inf where the original model is "
                                   f"finite, on output(s) {', '.join(garbage)}; nothing written")
    if explainer is not None and options.explain and explainer.available:  # before any refusal: wanted most then
        report.explanation = explainer.explained(tflite_model, arrays, report)
    parity.fail_unless_passed(report.fidelity, source.path, report, "the .tflite differs from the rewritten graph",
                              limit)
    _judge_budget(tflite_model, source, options, report, arrays, explainer)
    drifted = [c["output"] for c in report.drift if not c["passed"]]
    if drifted:
        worst = max(c["max_abs"] for c in report.drift)
        raise errors.ParityFailure(report, f"{source.path}: the .tflite drifts from the original model by "
                                   f"{worst:.3g} > --max-drift {options.max_drift} on output(s) "
                                   f"{', '.join(drifted)}; nothing written")
    if target is not None:
        ordered = [arrays[info.name] for info in source.inputs]
        on_target = target_checks.run_on_target(tflite_model, target, options, report, ordered, batch_fixed)
        if on_target is not None:  # against the reference and against LiteRT, both with the fidelity limits
            for info, scale, (atol, rtol), value in zip(source.outputs, scales, limits, on_target):
                fidelity = parity.compare(info.name, value, graph_outputs[info.name], atol, rtol)
                agreement = parity.compare(info.name, value, tflite_outputs[info.name], atol, rtol)
                report.target["fidelity"].append(parity.with_steps(fidelity, scale))
                report.target["agreement"].append(parity.with_steps(agreement, scale))
            parity.fail_unless_passed(report.target["fidelity"], source.path, report,
                                f"{target.runtime} differs from the rewritten graph", limit)
            parity.fail_unless_passed(report.target["agreement"], source.path, report,
                                f"{target.runtime} differs from {report.runtime} on the same .tflite", limit)
