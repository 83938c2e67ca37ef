"""The worker: the process forked from the zygote for one conversion, confined before it reads the model.

It gives up what the policy denies (Landlock, then seccomp), with its standard streams on a log file in the
scratch folder, no core dumps and a cap on the size of any file it writes; then it converts and answers in
the scratch folder: `output.tflite`, and `result.json` (written last, with the job's nonce: a model that
ends the process early, or writes a result of its own without knowing the nonce, answers nothing).
While it works, `stage` names the step it is in, for the supervisor to name when it dies.
"""

import ctypes
import json
import os
import resource
import signal
import tempfile
import traceback

from . import landlock
from . import policy
from . import seccomp

_PR_SET_PDEATHSIG = 1
# Exit status of a worker whose own code failed past catching (its answer is missing: the supervisor says so).
_FAILED = 70


def run(job):
    """Confine this (forked) process, convert, answer; never returns."""
    status = _FAILED
    try:
        _prepare_process(job)
        containment = _confine(job)
        _answer(job, *_converted(job, containment))
        status = 0
    finally:
        os._exit(status)


def _prepare_process(job):
    scratch = job["scratch"]
    os.chdir(job["cwd"])  # the caller's: the paths it was given are relative to it
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the zygote's death is ours
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the file size cap a write fails, one clear error
    log = os.open(os.path.join(scratch, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, log), (2, log)):
        os.dup2(source, target)
    for descriptor in (null, log):
        os.close(descriptor)
    _close_channels()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (job["file_limit"], job["file_limit"]))
    temporary = os.path.join(scratch, "tmp")
    os.mkdir(temporary, 0o700)
    os.environ["TMPDIR"] = tempfile.tempdir = temporary


def _close_channels():
    """Close every pipe and socket inherited past the standard streams: the zygote's channel to its caller
    among them, which a model could otherwise write events into."""
    for name in os.listdir("/proc/self/fd"):
        descriptor = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if descriptor > 2 and target.startswith(("pipe:", "socket:")):
            os.close(descriptor)


def _confine(job):
    """Apply the policy; what is in force, as the report says it."""
    if not job["sandbox"]:
        return "not contained: switched off (KERAS_GELU_SANDBOX=off); op checks only"
    in_force, missing = [], []
    try:
        in_force.append(landlock.restrict(policy.file_rules(job["reads"], job["scratch"])))
    except landlock.Unavailable as error:
        missing.append(f"Landlock: {error}")
    try:
        seccomp.restrict(policy.denied_system_calls(os.getpid()))
        in_force.append("seccomp")
    except seccomp.Unavailable as error:
        missing.append(f"seccomp: {error}")
    absent = f" ({'; '.join(missing)})" if missing else ""
    if not in_force:
        return f"not contained: op checks only{absent}"
    return f"{'contained' if not missing else 'partly contained'}: {' + '.join(in_force)}{absent}"


def _stage_writer(scratch, crash_at):
    path = os.path.join(scratch, "stage")

    def entered(stage):
        with open(path, "w") as stream:
            stream.write(stage)
        if stage == crash_at:
            ctypes.string_at(0)  # the test suite's crash: a read of address 0, SIGSEGV

    return entered


def _converted(job, containment):
    """(result, the .tflite's bytes or None): the pipeline's answer, or its error, as data."""
    from ..options import Options
    from ..running import pipeline
    from ..running import progress

    progress.listen(_stage_writer(job["scratch"], job["crash_at"]))
    try:
        tflite_model, report = pipeline.convert(job["model"], Options(**job["options"]), kind=job["kind"],
                                                name=job["name"])
    except Exception as error:  # noqa: BLE001 - an answer, not a dead worker, for anything unforeseen
        return _failure(job, error, containment, traceback.format_exc()), None
    report.containment = containment
    return {"status": "converted", "report": report.to_dict()}, tflite_model


def _failure(job, error, containment, trace):
    """The result that says why there is no .tflite: a user error by its class, the sandbox's denial behind any
    error, or an internal error."""
    from ..errors import ConversionError

    denied = _denial(error) if job["sandbox"] else None
    if denied is not None:
        result = {"status": "refused", "error": "SandboxStopped", "message": (
            f"{job['name']}: the sandbox stopped the model: it tried to reach a file, a connection or a program "
            f"outside it ({denied}); nothing written")}
    elif isinstance(error, ConversionError):
        result = {"status": "refused", "error": type(error).__name__, "message": error.message}
    else:
        result = {"status": "internal", "error": type(error).__name__, "message": str(error)}
    report = getattr(error, "report", None)  # a parity failure's figures
    if report is not None:
        report.containment = containment
        result["report"] = report.to_dict()
    if job["debug"]:
        result["traceback"] = trace
    return result


# What a denied file or system call becomes: Python's PermissionError (EACCES from Landlock, EPERM from
# seccomp), TensorFlow's PermissionDeniedError from its own file system.
_DENIALS = ("PermissionError", "PermissionDeniedError")


def _denial(error):
    """The first line of the sandbox's denial behind `error` (it, or what caused it), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ in _DENIALS:
            return " ".join(str(error).split())[:200]
        error = error.__cause__ or error.__context__
    return None


def _answer(job, result, tflite_model):
    scratch = job["scratch"]
    if tflite_model is not None:
        with open(os.path.join(scratch, "output.tflite"), "wb") as stream:
            stream.write(tflite_model)
    result["nonce"] = job["nonce"]
    with open(os.path.join(scratch, "result.json.part"), "w") as stream:
        json.dump(result, stream)
    os.replace(os.path.join(scratch, "result.json.part"), os.path.join(scratch, "result.json"))
