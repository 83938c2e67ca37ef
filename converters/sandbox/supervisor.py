"""The caller's side of a contained conversion: a zygote to fork from, one job at a time, and what its end means.

Runs in the command's process or a user's program; imports no TensorFlow and runs nothing of the model. It
keeps one zygote per environment (the variables that change what Python, TensorFlow or Keras load), hands it
a job, and reads the answer the worker left in the job's scratch folder. A worker that died, was killed at a
limit, or ended without an answer (its nonce) becomes one ConversionError naming the step it was in.
"""

import atexit
import dataclasses
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time

from .. import errors
from .. import safe_text
from ..report import Report
from . import channel
from . import limits
from . import policy
from . import scratch

# The zygote's working folder: one of ours, holding nothing to import.
_WORKING_FOLDER = "/"
# How long a zygote may take to import TensorFlow and the converter (a cold disk: tens of seconds).
_START_SECONDS = 600
# How often a caller that shows progress hears the step.
_PROGRESS_SECONDS = 0.5
_STARTING = "starting (TensorFlow's import)"
_ZYGOTE = "import keras_gelu_launcher; keras_gelu_launcher.zygote()"
_LOG_BYTES = 1 << 20


@dataclasses.dataclass
class Outcome:
    """A finished job: the worker's log lines, and its report (its .tflite copied where the caller said), or
    the error that says why there is none."""

    log_lines: list
    report: Report = None
    error: errors.ConversionError = None


class _Zygote:
    def __init__(self, environment, progress):
        self._log = tempfile.TemporaryFile()
        # The events come on a pipe of their own, standard output going to the log from the start: nothing Python
        # or a library prints as the zygote starts (a sitecustomize, a .pth file) reaches the channel.
        reading, writing = os.pipe()
        # -P and a working folder of our own: nothing is imported from the caller's folder or the model's (a
        # json.py planted beside saved_model.pb would otherwise shadow the standard library's, unconfined).
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-c", _ZYGOTE, str(writing),
                 *_preloaded([*_PRELOAD_WHERE_INSTALLED, *_registering_packages()])], cwd=_WORKING_FOLDER,
                stdin=subprocess.PIPE, stdout=self._log, stderr=self._log, env=environment, start_new_session=True,
                close_fds=True, pass_fds=(writing,))
        finally:
            os.close(writing)
        self._reading = reading
        self._events = channel.Lines(reading)
        event = self.next_event(_START_SECONDS, lambda: progress(_STARTING))
        if event is None or "ready" not in event:
            last_words = self._last_words()
            self.close()
            _raise_if_unforkable(event)
            raise errors.ConversionCrashed(f"the conversion process could not start: {last_words}")
        self.plan = event["plan"]

    def _last_words(self):
        self._log.seek(0)
        lines = [line for line in self._log.read().decode(errors="replace").splitlines() if line.strip()]
        status = self.process.poll()
        return (lines[-1].strip()[:300] if lines else "no message") + (f" (exit {status})" if status else "")

    def send(self, request):
        channel.send(self.process.stdin, request)

    def next_event(self, timeout, waiting=None):
        """The zygote's next event, or None if it ended or said nothing within `timeout` seconds; `waiting()` is
        called every _PROGRESS_SECONDS meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                event = self._events.next(max(min(left, _PROGRESS_SECONDS), 0) if waiting else max(left, 0))
            except ValueError:  # a line that is no JSON: a zygote that says that is not one to trust
                return None
            if event is not None and not isinstance(event, dict):
                return None
            if event is not None or left <= 0 or self._events.ended:
                return event
            waiting()

    def alive(self):
        return self.process.poll() is None

    def close(self):
        try:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            # its session's whole process group: the zygote, and any process of a job left (a PID namespace's
            # init has no parent-death signal; a worker may change neither its group nor its session)
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                self.process.kill()
            self.process.wait()
        self._log.close()
        os.close(self._reading)


_zygotes = {}
_lock = threading.Lock()
# What a zygote imports as it starts, where it is installed, besides the converter: what most conversions load.
_PRELOAD_WHERE_INSTALLED = ("ai_edge_litert.interpreter", "h5py")
# The packages whose import left a zygote a thread (a package that runs a TensorFlow op as it is imported): a
# zygote imports none of them, and each worker that needs one imports it itself, confined.
_unforkable = set()


class _Unforkable(Exception):
    """A zygote ended, unable to fork, after importing the packages `args[0]` (its {"unforkable"} event)."""


def _raise_if_unforkable(event):
    if event is not None and "unforkable" in event:
        names = event["unforkable"]
        raise _Unforkable([str(name) for name in names] if isinstance(names, list) else [])


def _preloaded(packages):
    """`packages` less those a zygote cannot fork after importing: what it imports before it forks."""
    return [name for name in packages if name not in _unforkable]


def _left_to_the_worker(packages):
    return [name for name in packages if name in _unforkable]


def _registering_packages():
    """The packages whose classes this process has registered with its Keras (keras-hub's, your own package's):
    a Keras file names them, and the zygote imports them once rather than each worker for its file."""
    packages = set()
    for name in ("keras", "tf_keras"):
        module = sys.modules.get(name)
        saving = getattr(module, "saving", None)
        if saving is not None and hasattr(saving, "get_custom_objects"):
            packages |= {str(getattr(value, "__module__", None) or "").split(".")[0]
                         for value in saving.get_custom_objects().values()}
    # a name an import could take: nothing else reaches the zygote's arguments (a NUL, a path)
    return sorted(name for name in packages if name.isidentifier() and name != "__main__")


def _zygote(progress):
    environment = policy.environment(os.environ)
    key = (sys.executable, tuple(sorted(environment.items())))
    zygote = _zygotes.get(key)
    if zygote is None or not zygote.alive():
        _close_zygotes()  # one at a time: each holds TensorFlow's memory
        zygote = _zygotes[key] = _Zygote(environment, progress)
    return zygote


@atexit.register
def _close_zygotes():
    for zygote in _zygotes.values():
        zygote.close()
    _zygotes.clear()


def _test_switches():
    """The switches the test suite throws, read for each job: KERAS_GELU_SANDBOX=off, to show what the op checks
    stop alone (never for models you did not make); KERAS_GELU_TEST_CRASH_AT=<stage>, a worker that dies of
    SIGSEGV as it enters that step (a runtime that crashes, made to); KERAS_GELU_TEST_PAYLOAD=<file.py>, Python
    the worker runs once confined, before converting (the attacker already inside, whom the sandbox must hold:
    it grants nothing a model's own code does not have)."""
    payload = os.environ.get("KERAS_GELU_TEST_PAYLOAD")
    if payload:
        with open(payload) as stream:
            payload = stream.read()
    return {"sandbox": os.environ.get("KERAS_GELU_SANDBOX", "").lower() != "off",
            "crash_at": os.environ.get("KERAS_GELU_TEST_CRASH_AT"), "payload": payload or None}


def run(job, scratch_folder, destination, progress=None):
    """Run `job` (worker.run's dict, without its nonce) in a worker; its Outcome. `scratch_folder` is the job's
    folder, which the caller made and removes (scratch.remove); the .tflite, checked in a fresh confined
    process, is copied into `destination` (a binary file open for writing, a path of its own: the caller's).
    `progress(step)`, if given, hears the step every half second."""
    # the packages registered since the zygote started too: it imports them once, for every later worker
    job = {**job, **_test_switches(), "scratch": scratch_folder,
           "preload": [*job.get("preload", ()), *_registering_packages()]}
    progress = progress or (lambda step: None)
    with _lock:
        zygote, ended = _ran(job, progress)
        outcome = _outcome(job, ended, zygote.plan)
        if outcome.error is None:
            try:
                size = scratch.copy_out(scratch_folder, "output.tflite", destination, job["file_limit"])
            except (OSError, scratch.Hostile) as error:
                outcome.error = _hostile(job["name"], error)
            else:
                outcome.error = _checked(job, destination.name, size, progress, outcome.report)
    return outcome


def _ran(job, progress):
    """(the zygote, its {"ended"} event) for `job`, given a nonce of its own; the event says why its process is
    not nobody, where it is not (policy.job_uid, which the zygote decides). A zygote that a package to preload
    left unable to fork is followed by one that leaves that package to the worker."""
    while True:
        try:
            return _ran_in_a_zygote(job, progress)
        except _Unforkable as error:
            blamed = set(error.args[0]) - _unforkable
            _close_zygotes()
            if not blamed:  # a thread no package it was given started
                raise errors.ConversionCrashed("the conversion process could not start: it holds a thread none of "
                                               "your packages started, and a process with threads cannot fork") \
                    from None
            _unforkable.update(blamed)


def _ran_in_a_zygote(job, progress):
    zygote = _zygote(progress)
    packages = job.get("preload", ())
    job = {**job, "nonce": secrets.token_hex(16), "preload": _preloaded(packages),
           "worker_imports": _left_to_the_worker(packages)}
    try:
        zygote.send({"job": job})
    except OSError:  # it died since: once more, with a new one
        _close_zygotes()
        zygote = _zygote(progress)
        zygote.send({"job": job})
    try:
        ended = _wait_for_end(zygote, job, progress)
    except KeyboardInterrupt:
        zygote.send({"cancel": True})
        _wait_for_end(zygote, job, progress)
        raise
    return zygote, {**ended, "nonce": job["nonce"]}


def _checked(job, path, size, progress, report):
    """None if the .tflite at `path` (the supervisor's copy) is one this conversion may write, as a fresh worker
    that never ran the model finds it (worker._checked), the report's ops and size then the file's own; else
    the error that says why nothing is written."""
    folder = tempfile.mkdtemp(prefix=".keras_gelu_check_", dir=os.path.dirname(job["scratch"]))
    trusted = bool(job["options"]["trust_model"])
    try:
        check = {"check": {"path": path, "name": job["name"], "trust_model": trusted}, "reads": [path],
                 "name": job["name"], "debug": False, "sandbox": job["sandbox"],
                 "scratch": folder, "file_limit": scratch.ANSWER_BYTES,
                 "scratch_limits": {"bytes": 4 * scratch.ANSWER_BYTES, "entries": 16},
                 "time_limit": limits.check_seconds(size), "memory_limit": job["memory_limit"],
                 "thread_limit": job["thread_limit"]}
        _, ended = _ran(check, lambda step: progress("checking the .tflite"))
        try:
            result = scratch.answer(folder, ended["nonce"])
        except scratch.Hostile as error:
            return _hostile(job["name"], error)
    finally:
        scratch.remove(folder)
    if ended["status"] != 0 or result is None:
        return errors.ConversionCrashed(f"{job['name']}: the check of the .tflite failed "
                                        f"({_death(ended['status'])}); nothing written")
    if result.get("status") != "valid":
        return errors.ConverterFailed(f"{job['name']}: the conversion process wrote a .tflite a runtime must not "
                                      f"read: its {safe_text.inert(result.get('message'))[:500]}; nothing written")
    ops, measured = result.get("ops"), result.get("size_bytes")
    if report is not None and isinstance(ops, dict) and all(isinstance(count, int) for count in ops.values()):
        report.ops, report.size_bytes = safe_text.inert_data(ops), measured if isinstance(measured, int) else size
        report.flex_ops = sorted(name for name in report.ops if name.startswith("Flex"))
    return None


def _hostile(name, error):
    return errors.ConversionCrashed(f"{name}: the conversion process left what no conversion leaves: "
                                    f"{safe_text.inert(error)}; nothing written")


def _step(folder):
    return scratch.read(folder, "stage", 200).decode(errors="replace") or "start-up"


def _wait_for_end(zygote, job, progress):
    """The zygote's {"ended"} event for the job; a zygote that stops answering is closed, its worker killed and
    seen dead (nothing may write in the scratch folder once it is read), and the job said to have stopped
    answering."""
    deadline = time.monotonic() + job["time_limit"] + limits.GRACE_SECONDS
    worker = None
    try:
        while True:
            event = zygote.next_event(max(deadline - time.monotonic(), 0), lambda: progress(_step(job["scratch"])))
            if event is None:
                _close_zygotes()  # it will serve no other job
                _killed(worker)
                return {"status": None, "stopped": None}
            _raise_if_unforkable(event)
            if "started" in event and worker is None:
                worker = _pidfd(event["started"])
            if "ended" in event:
                return event
    finally:
        if worker is not None:
            os.close(worker)


def _pidfd(pid):
    """A descriptor of the process `pid` (the worker, while the zygote has not reaped it), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError, TypeError):  # TypeError: no process id
        return None


def _killed(worker, timeout=30):
    """Kill the process a pidfd names and wait until it has ended (its pidfd turns readable)."""
    if worker is None:
        return
    try:
        signal.pidfd_send_signal(worker, signal.SIGKILL)
    except (AttributeError, OSError):
        pass
    select.select([worker], [], [], timeout)


def _outcome(job, ended, plan):
    """What the worker's end means: its answer as a Report and an error, every field of it made inert, and the
    lines about trust and containment the supervisor's own."""
    folder = job["scratch"]
    log_lines = scratch.read(folder, "log", _LOG_BYTES).decode(errors="replace").splitlines()
    stage = safe_text.inert(_step(folder))
    name, stopped, status = job["name"], ended["stopped"], ended["status"]
    if stopped == "time":
        return Outcome(log_lines, error=errors.TimeLimitExceeded(
            f"{name}: {stage} ran past the time limit of {job['time_limit']:g} s (--time-limit); nothing written"))
    if stopped == "memory":
        return Outcome(log_lines, error=errors.MemoryLimitExceeded(
            f"{name}: {stage} used more than {job['memory_limit'] / 2**30:.3g} GiB of memory (--memory-limit); "
            "nothing written"))
    if stopped == "threads":
        return Outcome(log_lines, error=errors.ScratchLimitExceeded(
            f"{name}: {stage} ran more than {job['thread_limit']:,} threads at once; nothing written"))
    if stopped == "scratch":
        limit = job["scratch_limits"]
        return Outcome(log_lines, error=errors.ScratchLimitExceeded(
            f"{name}: {stage} wrote more than {limit['bytes'] / 2**30:.3g} GiB or {limit['entries']:,} files in its "
            "scratch folder; nothing written"))
    try:
        result = scratch.answer(folder, ended["nonce"])
        report = _report(result, job, plan, ended)
    except (scratch.Hostile, ValueError) as error:
        return Outcome(log_lines, error=_hostile(name, error))
    if status != 0 or result is None:
        return Outcome(log_lines, error=errors.ConversionCrashed(f"{name}: {_death(status)} during {stage}, "
                                                                 "without an answer; nothing written"))
    if result.get("status") == "converted" and report is not None:
        return Outcome(log_lines, report=report)
    return Outcome(log_lines, report=report, error=_error(result, report, name))


def _report(result, job, plan, ended):
    """The Report in the worker's answer (None where it gave none), checked against its schema and made inert;
    ValueError where it is not one. Trust, containment and memory are stated here, from the job, the plan and
    the zygote's watch."""
    if result is None or result.get("report") is None:
        return None
    report = Report.from_untrusted(result["report"])
    report.input, report.kind = job["name"], job["kind"]
    report.trusted = bool(job["options"]["trust_model"])
    report.containment = policy.describe(plan, job["sandbox"], ended.get("uid_refused"))
    # the steps' names are the worker's (its stage file): inert, as every string it gives
    report.peak_bytes = ended.get("peak_bytes", 0)
    report.stage_peak_bytes = safe_text.inert_data(ended.get("stage_peak_bytes", {}), collapse_spaces=True)
    return report


def _death(status):
    if status is None:
        return "the conversion process stopped answering"
    if status < 0:
        try:
            return f"the conversion process died of {signal.Signals(-status).name} ({signal.strsignal(-status)})"
        except ValueError:
            return f"the conversion process died of signal {-status}"
    return f"the conversion process ended (exit status {status})"


# The errors only the supervisor and the zygote find (a bound, a crash, the scratch folder, the output path):
# a worker that names one names what it cannot know.
_NOT_THE_WORKERS = (errors.TimeLimitExceeded, errors.MemoryLimitExceeded, errors.ScratchLimitExceeded,
                    errors.ScratchNotRemoved, errors.ConversionCrashed, errors.OutputExists, errors.OutputNotWritable,
                    errors.InternalError)
_MESSAGE_CHARACTERS = 2000


def _error(result, report, name):
    """The worker's error as the ConversionError it raised (one a worker can raise: a parity failure with its
    figures); anything else as an internal error."""
    message = safe_text.inert(result.get("message", ""))[:_MESSAGE_CHARACTERS]
    kind = getattr(errors, str(result.get("error")), None)
    is_ours = isinstance(kind, type) and issubclass(kind, errors.ConversionError)
    if is_ours and (issubclass(kind, _NOT_THE_WORKERS) or (kind is errors.ParityFailure and report is None)):
        error = errors.ConversionCrashed(f"{name}: the conversion process answered an error no conversion gives "
                                         f"({kind.__name__}); nothing written")
    elif result.get("status") == "refused" and is_ours:
        error = kind(report, message) if kind is errors.ParityFailure else kind(message)
    else:
        error = errors.InternalError(f"internal error: {safe_text.inert(result.get('error'))}: {message[:300]} "
                                     "(rerun with --debug for a traceback)")
    trace = result.get("traceback")
    error.traceback = None if trace is None else "\n".join(safe_text.inert(line) for line in str(trace).splitlines())
    return error
