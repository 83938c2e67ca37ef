"""`convert`: the converter's entry point, outside the sandbox.

A model in a file, or a .tflite's bytes, is converted in a process of its own that confines itself before it
reads a byte of the model (`sandbox`), within time and memory limits: here, nothing of it is parsed or run,
and a crash there is an error here. A live Keras model, your own object, already runs in your process: it is
converted here, with the op checks.
"""

import dataclasses
import os
import sys
import tempfile

from . import explanation
from . import native_logs
from . import paths
from . import errors
from . import targets
from .options import Options
from .sandbox import limits
from .sandbox import scratch
from .sandbox import supervisor


def convert(model, **options):
    """Convert a model to TFLite; returns (tflite bytes, Report).

    `model` is a SavedModel directory, a .keras, .h5 or .tflite file, a .tflite's bytes, or a live Keras
    model (Keras 3 or tf-keras; Sequential, functional, or subclassed once built), which is converted through
    its serving signature.

    Options are those of `Options` (mode, exact_as, signature, float16_weights, verify, inputs, seed,
    dynamic_size, atol, rtol, max_drift, int8, calibration, int8_io, max_steps, trust_model, target,
    allow_cpu_fallback, input_shapes, time_limit, memory_limit, config_limit, min_cosine, explain). `explain`: a
    folder for --explain's three files (explanation.FILES), which must not be there yet. Unless trust_model, a model
    that carries code or reaches outside the process is refused (errors.UntrustedModel) before any of it is
    loaded or run. Raises a `converters.errors.ConversionError` subclass for user errors, a parity failure
    included, in which case nothing is returned. What the conversion process printed (TensorFlow's notices, a
    model's own prints), its start-up chatter left out, goes to sys.stderr, each line marked as the model's
    and with its control characters escaped.
    """
    options = Options(**options)
    if options.explain:
        explanation.check_folder(options.explain, force=False)
    if _is_live_model(model):
        return _converted_here(model, options)
    with tempfile.NamedTemporaryFile(prefix=".keras_gelu_", suffix=".tflite") as destination:
        report = _contained(model, options, _printed, False, destination)
        destination.seek(0)
        return destination.read(), report


def convert_to_file(model, output, force=False, log=None, debug=False, progress=None, **options):
    """Convert a model file (not a live model) and write the .tflite to `output` atomically, never over a
    file unless `force`; returns the Report. `log(lines)` gets what the conversion process printed, each line
    marked as the model's and made inert (default: sys.stderr); with `debug`, an error carries the conversion
    process's traceback; `progress(step)`, if given, hears the step the conversion is in every half second."""
    options = Options(**options)
    paths.check_output_path(output, force)
    if options.explain:
        explanation.check_folder(options.explain, force)
    folder = os.path.dirname(os.path.abspath(output))
    # The .tflite is copied out of the scratch folder into a file of ours beside the output, then moved into place
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".keras_gelu_", suffix=".tflite", delete=False) as copy:
        try:
            report = _contained(model, options, log or _printed, debug, copy, folder, progress, force)
            copy.close()
            paths.move_atomically(copy.name, output, force)
        finally:
            if os.path.exists(copy.name):
                os.unlink(copy.name)
    report.output = output
    return report


def _is_live_model(model):
    return not isinstance(model, (str, os.PathLike, bytes, bytearray, memoryview))


def _converted_here(model, options):
    from .running import pipeline

    try:
        tflite_model, report = pipeline.convert(model, options)
    except errors.ConversionError as error:
        _explained(options, getattr(error, "report", None), False)
        raise
    report.containment = "not contained: a live model object runs in your own process; op checks only"
    _explained(options, report, False)
    return tflite_model, report


def _explained(options, report, force):
    """--explain: the explanation's files written, where the conversion made one (passed, or refused for its
    budget or parity, when they are wanted most)."""
    if options.explain and report is not None and report.explanation:
        explanation.write(options.explain, report, force)


def _printed(lines):
    for line in lines:
        print(line, file=sys.stderr)


def _contained(model, options, log, debug, destination, scratch_parent=None, progress=None, force=False):
    """The Report of converting `model` in the sandbox, its .tflite copied into `destination` (a binary file
    open for writing), after `log` has had what the conversion process printed, attributed; raises the job's
    ConversionError after it has. The job's scratch folder is made in `scratch_parent` or the system's
    temporary folder, and removed for certain (errors.ScratchNotRemoved where it cannot be)."""
    folder = tempfile.mkdtemp(prefix=".keras_gelu_", dir=scratch_parent)
    try:
        job = {**_job(model, options, folder), "debug": debug}
        outcome = supervisor.run(job, folder, destination, progress)
    finally:
        scratch.remove(folder)
    log(native_logs.attributed(native_logs.worth_showing(outcome.log_lines)))
    _explained(options, outcome.report if outcome.error is None else getattr(outcome.error, "report", None), force)
    if outcome.error is not None:
        raise outcome.error
    return outcome.report


def _job(model, options, folder):
    """worker.run's job: where the model is and what it is, what the worker may read, its options and limits.
    Every path is absolute: the worker works in its scratch folder."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        name, path, kind = "<.tflite bytes>", os.path.join(folder, "input.tflite"), ".tflite"
        with open(path, "wb") as stream:
            stream.write(model)
    else:
        name = path = os.fspath(model)
        kind = paths.model_kind(path)
        path = os.path.abspath(path)
    given = {name: getattr(options, name) for name in ("inputs", "calibration")}
    files = {name: os.path.abspath(file) for name, file in given.items()
             if file is not None and not file.startswith("random:")}
    time_limit, memory_limit, file_limit, scratch_limits = limits.resolve(options.time_limit, options.memory_limit,
                                                                          limits.model_bytes(path))
    options = dataclasses.replace(options, time_limit=time_limit, memory_limit=memory_limit / 2**30, **files)
    target = targets.TARGETS.get(options.target)
    return {"model": path, "kind": kind, "name": name, "options": dataclasses.asdict(options),
            "reads": [path, *files.values()], "time_limit": time_limit, "memory_limit": memory_limit,
            "file_limit": file_limit, "scratch_limits": scratch_limits, "thread_limit": limits.thread_limit(),
            "preload": list(target.verifier_modules) if target is not None and options.verify else []}
