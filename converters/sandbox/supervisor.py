"""The caller's side of a contained conversion: a zygote to fork from, one job at a time, and what its end means.

Runs in the command's process or a user's program; imports no TensorFlow and runs nothing of the model. It
keeps one zygote per environment (the variables that change what Python, TensorFlow or Keras load), hands it
a job, and reads the answer the worker left in the job's scratch folder. A worker that died, was killed at a
limit, or ended without an answer (its nonce) becomes one ConversionError naming the step it was in.
"""

import atexit
import dataclasses
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time

from .. import errors
from ..report import Report
from . import channel

# Environment variables that change what the zygote imports or how TensorFlow runs: a change starts another.
# (keras-gelu's own, KERAS_GELU_*, are read here for each job.)
_ENVIRONMENT_PREFIXES = ("TF_", "KERAS_", "PYTHON", "XLA_", "LD_", "OMP_", "MKL", "HDF5_", "CUDA")
_OUR_PREFIX = "KERAS_GELU_"
# How long a zygote may take to import TensorFlow and the converter (a cold disk: tens of seconds).
_START_SECONDS = 600
# How much longer than a job's limit the zygote may take to say it ended (it kills at the limit itself).
_GRACE_SECONDS = 60
# How often a caller that shows progress hears the step.
_PROGRESS_SECONDS = 0.5
_STARTING = "starting (TensorFlow's import)"
_ZYGOTE = "import keras_gelu_launcher; keras_gelu_launcher.zygote()"
_RESULT_BYTES = 64 << 20
_LOG_BYTES = 1 << 20


@dataclasses.dataclass
class Outcome:
    """A finished job: the worker's log lines, and its .tflite (a path in the scratch folder) and report, or the
    error that says why there is none."""

    log_lines: list
    report: Report = None
    output: str = None
    error: errors.ConversionError = None


class _Zygote:
    def __init__(self, environment, progress):
        self._log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, *_registering_packages()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, env=environment, start_new_session=True, close_fds=True)
        self._events = channel.Lines(self.process.stdout.fileno())
        event = self.next_event(_START_SECONDS, lambda: progress(_STARTING))
        if event is None or "ready" not in event:
            raise errors.ConversionCrashed(f"the conversion process could not start: {self._last_words()}")

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
            event = self._events.next(max(min(left, _PROGRESS_SECONDS), 0) if waiting else max(left, 0))
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
            self.process.kill()
        self._log.close()


_zygotes = {}
_lock = threading.Lock()


def _registering_packages():
    """The packages whose classes this process has registered with its Keras (keras-hub's, your own package's):
    a Keras file names them, and the zygote imports them once rather than each worker for its file."""
    packages = set()
    for name in ("keras", "tf_keras"):
        module = sys.modules.get(name)
        saving = getattr(module, "saving", None)
        if saving is not None and hasattr(saving, "get_custom_objects"):
            packages |= {getattr(value, "__module__", "").split(".")[0] for value in saving.get_custom_objects().values()}
    return sorted(name for name in packages if name and name != "__main__")


def _environment():
    """The zygote's environment: the caller's, with Keras on TensorFlow, which the converter computes in."""
    return {**os.environ, "KERAS_BACKEND": "tensorflow"}


def _zygote(progress):
    environment = _environment()
    key = (sys.executable, tuple(sorted((name, value) for name, value in environment.items()
                                        if name.startswith(_ENVIRONMENT_PREFIXES) and not name.startswith(_OUR_PREFIX))))
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
    """The two switches the test suite throws, read for each job: KERAS_GELU_SANDBOX=off, to show what the op
    checks stop alone (never for models you did not make), and KERAS_GELU_TEST_CRASH_AT=<stage>, a worker that
    dies of SIGSEGV as it enters that step (a runtime that crashes, made to)."""
    return {"sandbox": os.environ.get("KERAS_GELU_SANDBOX", "").lower() != "off",
            "crash_at": os.environ.get("KERAS_GELU_TEST_CRASH_AT")}


def run(job, scratch, progress=None):
    """Run `job` (worker.run's dict, without its nonce) in a worker; its Outcome. `scratch` is the job's folder,
    which the caller made and removes. `progress(step)`, if given, hears the step every half second."""
    job = {**job, **_test_switches(), "scratch": scratch, "nonce": secrets.token_hex(16)}
    progress = progress or (lambda step: None)
    with _lock:
        zygote = _zygote(progress)
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
    return _outcome(job, ended)


def _step(scratch):
    return _read(os.path.join(scratch, "stage"), 200).decode(errors="replace") or "start-up"


def _wait_for_end(zygote, job, progress):
    """The zygote's {"ended"} event for the job; a zygote that stops answering is closed, and the job said to
    have stopped answering."""
    deadline = time.monotonic() + job["time_limit"] + _GRACE_SECONDS
    while True:
        event = zygote.next_event(max(deadline - time.monotonic(), 0), lambda: progress(_step(job["scratch"])))
        if event is None:
            _close_zygotes()  # it will serve no other job
            return {"status": None, "stopped": None}
        if "ended" in event:
            return event


def _read(path, limit):
    try:
        with open(path, "rb") as stream:
            return stream.read(limit)
    except OSError:
        return b""


def _outcome(job, ended):
    scratch = job["scratch"]
    log_lines = _read(os.path.join(scratch, "log"), _LOG_BYTES).decode(errors="replace").splitlines()
    stage = _step(scratch)
    name, stopped, status = job["name"], ended["stopped"], ended["status"]
    if stopped == "time":
        return Outcome(log_lines, error=errors.TimeLimitExceeded(
            f"{name}: {stage} ran past the time limit of {job['time_limit']:g} s (--time-limit); nothing written"))
    if stopped == "memory":
        return Outcome(log_lines, error=errors.MemoryLimitExceeded(
            f"{name}: {stage} used more than {job['memory_limit'] / 2**30:.3g} GiB of memory (--memory-limit); "
            "nothing written"))
    result = _result(scratch, job["nonce"])
    if status != 0 or result is None:
        return Outcome(log_lines, error=errors.ConversionCrashed(f"{name}: {_death(status)} during {stage}, "
                                                                 "without an answer; nothing written"))
    report = Report.from_dict(result["report"]) if isinstance(result.get("report"), dict) else None
    if report is not None:
        report.peak_bytes = ended.get("peak_bytes", 0)
        report.stage_peak_bytes = ended.get("stage_peak_bytes", {})
    if result.get("status") == "converted" and report is not None:
        output = os.path.join(scratch, "output.tflite")
        if os.path.isfile(output):
            return Outcome(log_lines, report=report, output=output)
    return Outcome(log_lines, report=report, error=_error(result, report))


def _result(scratch, nonce):
    """The worker's answer, if it is one: JSON naming the job's nonce."""
    try:
        result = json.loads(_read(os.path.join(scratch, "result.json"), _RESULT_BYTES))
    except ValueError:
        return None
    return result if isinstance(result, dict) and result.get("nonce") == nonce else None


def _death(status):
    if status is None:
        return "the conversion process stopped answering"
    if status < 0:
        try:
            return f"the conversion process died of {signal.Signals(-status).name} ({signal.strsignal(-status)})"
        except ValueError:
            return f"the conversion process died of signal {-status}"
    return f"the conversion process ended (exit status {status})"


def _error(result, report):
    """The worker's error as the ConversionError it raised; anything else as an internal error."""
    message = str(result.get("message", ""))
    kind = getattr(errors, str(result.get("error")), None)
    if result.get("status") == "refused" and isinstance(kind, type) and issubclass(kind, errors.ConversionError):
        error = kind(report, message) if kind is errors.ParityFailure else kind(message)
    else:
        error = errors.InternalError(f"internal error: {result.get('error')}: {' '.join(message.split())[:300]} "
                                     "(rerun with --debug for a traceback)")
    error.traceback = result.get("traceback")
    return error
