"""The worker: a process forked from the zygote for one job, confined before it reads a byte of the model.

It works in its scratch folder (its working folder too, so no relative path leads anywhere else), with its
standard streams on a log file there, no core dumps and a cap on the size of any file it writes. Then it gives
up, in this order and for good, what the zygote's plan (`policy.plan`) says this machine lets it: its
namespaces and every capability (`privileges`), every file but its own (Landlock), every system call but those
a conversion makes (the seccomp allow-list). A layer the plan names that fails to apply ends the process
without an answer: the containment the report states is the plan's, which the supervisor states, not
anything the worker says. Then it converts and answers in the scratch folder: `output.tflite`, and
`result.json` (written last, with the job's nonce: a model that ends the process early, or writes a result of
its own without knowing the nonce, answers nothing). While it works, `stage` names the step it is in.

Everything it leaves is hostile input to the side that reads it (`scratch`): from here on the model may run,
and with `--trust-model`, or a hole in the op checks, the model's code is this process.

A check job (`check`) is a worker too: a fresh one that never ran a model, confined the same way, reading only
a copy of a .tflite the supervisor made, and answering whether a runtime may read it.
"""

import ctypes
import importlib
import json
import os
import resource
import signal
import tempfile
import traceback

from . import landlock
from . import limits
from . import policy
from . import privileges
from . import seccomp


def run(job):
    """Confine this (forked) process, do the job, answer; never returns."""
    status = privileges.FAILED
    try:
        _prepare_process(job)
        entered = _stage_writer(job["scratch"], job.get("crash_at"))
        entered("confinement")
        _confine(job)
        _import_what_the_zygote_could_not(job.get("worker_imports", ()))
        if "check" in job:
            _answer(job, _checked(job["check"]), None)
        else:
            _run_test_payload(job)
            _answer(job, *_converted(job, entered))
        status = 0
    except BaseException:  # noqa: BLE001 - said in the log, which the command shows; the missing answer says the rest
        traceback.print_exc()
    finally:
        os._exit(status)


def _import_what_the_zygote_could_not(names):
    """Import the packages the zygote could not import and still fork (supervisor._unforkable), which a Keras file
    may name (tf-keras imports no module a file names)."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a package that will not import is one the file's loading names, or not
            pass


def _prepare_process(job):
    scratch = job["scratch"]
    os.chdir(scratch)  # paths the job names are absolute: nothing relative reaches the caller's folder
    privileges.die_with_parent()  # the zygote's
    privileges.set_dumpable(True)  # the zygote reads this process's descriptors through /proc, for its watch
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the file size cap a write fails, one clear error
    log = os.open(os.path.join(scratch, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
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
    """Close every pipe, socket and pidfd inherited past the standard streams: the zygote's channel to its
    caller among them, which a model could otherwise write events into."""
    for name in os.listdir("/proc/self/fd"):
        descriptor = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if descriptor > 2 and target.startswith(("pipe:", "socket:", "anon_inode:[pidfd]")):
            os.close(descriptor)


def _confine(job):
    """Apply the zygote's plan, every layer it names, or fail (no answer: the report never claims a layer that
    is not there)."""
    plan = job["plan"]
    if not job["sandbox"]:
        return
    if job.get("uid") is not None:
        scratch = job["scratch"]
        privileges.become_nobody([scratch] + [os.path.join(scratch, name) for name in os.listdir(scratch)])
    if plan["namespaces"]:
        # the init outlives no job: its time limit, and the supervisor's grace past it
        privileges.enter_namespaces(plan["pid_namespace"], lifetime=job["time_limit"] + limits.GRACE_SECONDS)
    privileges.drop_capabilities()
    if plan["landlock"]:
        landlock.restrict(policy.file_rules(job["reads"], job["scratch"]))
    if plan["seccomp"]:
        seccomp.restrict(policy.system_calls(os.getpid()))


def _stage_writer(scratch, crash_at):
    path = os.path.join(scratch, "stage")

    def entered(stage):
        with open(path, "w") as stream:
            stream.write(stage)
        if stage == crash_at:
            ctypes.string_at(0)  # the test suite's crash: a read of address 0, SIGSEGV

    return entered


def _run_test_payload(job):
    """The test suite's attacker (KERAS_GELU_TEST_PAYLOAD): Python run here, confined, before the conversion,
    as a model's code would run, to show what the sandbox and the supervisor hold against it."""
    payload = job.get("payload")
    if payload is not None:
        exec(compile(payload, "<test payload>", "exec"), {"__name__": "__payload__", "job": dict(job)})  # noqa: S102


def _converted(job, entered):
    """(result, the .tflite's bytes or None): the pipeline's answer, or its error, as data."""
    from ..options import Options
    from ..running import pipeline
    from ..running import progress

    progress.listen(entered)
    try:
        tflite_model, report = pipeline.convert(job["model"], Options(**job["options"]), kind=job["kind"],
                                                name=job["name"])
    except Exception as error:  # noqa: BLE001 - an answer, not a dead worker, for anything unforeseen
        return _failure(job, error, traceback.format_exc()), None
    return {"status": "converted", "report": report.to_dict()}, tflite_model


def _failure(job, error, trace):
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
        result["report"] = report.to_dict()
    if job["debug"]:
        result["traceback"] = trace
    return result


# What a denied file or system call becomes: Python's PermissionError (EACCES from Landlock, EPERM from
# seccomp), TensorFlow's PermissionDeniedError from its own file system.
_DENIALS = ("PermissionError", "PermissionDeniedError")


def _denial(error):
    """What the sandbox denied behind `error` (it, or what caused it), or None: the line of its message that
    says so (a library wraps it in lines of its own, Keras in the call's arguments after it)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if type(error).__name__ in _DENIALS:
            return essence(str(error))
        error = error.__cause__ or error.__context__
    return None


# How a denial reads: the C library's text for EACCES (Landlock) and EPERM (seccomp), TensorFlow's own.
_DENIED = ("Permission denied", "Operation not permitted", "permission denied")


def essence(message, limit=300):
    """The part of a library's long message that matters: its line naming the denial (the path, the call), else
    its first line; cut to `limit` characters from the end where the path is."""
    lines = [" ".join(line.split()) for line in message.splitlines() if line.strip()] or [""]
    line = next((line for line in lines if any(phrase in line for phrase in _DENIED)), lines[0])
    return line if len(line) <= limit else "..." + line[-(limit - 3):]


def _checked(check):
    """A check job's answer: whether the .tflite at check["path"] is one this conversion may write, and the ops
    it really holds. A TFLite flatbuffer (its identifier) with a subgraph; nothing in it a runtime must not meet
    (tflite/validation.py); no custom op but Flex ones, and those only where the op checks pass them (unless
    trusted: trust/flex_ops.py), so the worker cannot swap in a file of its own that ships a file-writing op;
    and one LiteRT's verifier and op resolver accept (where it holds Flex ops, which this interpreter may lack,
    the rest)."""
    from .. import paths
    from ..errors import UntrustedModel
    from ..reading import trust
    from ..running import verify
    from ..tflite import operators
    from ..tflite import validation

    with open(check["path"], "rb") as stream:
        data = stream.read()
    problem = None if paths.is_tflite(data) else "TFLite identifier is missing"
    problem = problem or validation.problem(data)
    ops = {}
    if problem is None:
        try:
            ops = operators.op_histogram(data)
        except Exception as error:  # noqa: BLE001 - the flatbuffer readers fail in whatever way the bytes lead them to
            problem = f"operators cannot be read ({type(error).__name__})"
    flex = [name for name in ops if name.startswith("Flex")]
    if problem is None and not ops:
        problem = "model has no operator"
    custom = [name for name in ops if name not in operators.BUILTIN_OP_NAMES and name not in flex]
    if problem is None and custom:
        problem = f"custom ops {', '.join(sorted(custom))[:200]} are none the converter writes"
    if problem is None and flex and not check["trust_model"]:
        try:
            trust.check_flex_ops(check["name"], data)
        except UntrustedModel as error:
            problem = f"Flex ops are refused: {error.message[:300]}"
    if problem is None:
        try:
            verify.interpreter_class()[0](model_content=data)
        except (ValueError, RuntimeError) as error:
            if not flex:
                problem = f"flatbuffer is refused by LiteRT ({' '.join(str(error).split())[:200]})"
    if problem is not None:
        return {"status": "invalid", "message": problem}
    return {"status": "valid", "ops": ops, "size_bytes": len(data)}


def _answer(job, result, tflite_model):
    scratch = job["scratch"]
    if tflite_model is not None:
        with open(os.path.join(scratch, "output.tflite"), "wb") as stream:
            stream.write(tflite_model)
    result["nonce"] = job["nonce"]
    with open(os.path.join(scratch, "result.json.part"), "w") as stream:
        json.dump(result, stream)
    os.replace(os.path.join(scratch, "result.json.part"), os.path.join(scratch, "result.json"))
