"""The zygote: a process that has imported the converter and run nothing, from which each conversion forks.

TensorFlow cannot be forked once it has run anything (its thread pools do not survive a fork), and importing
it takes seconds. So the supervisor starts this process once per caller (`python -m
keras_gelu.converters.sandbox.zygote`); it imports what a conversion needs, runs nothing, and forks one
worker per job (`worker.run`), which confines itself and converts. Until the worker ends, the zygote watches
it and kills it past its time or memory limit, or when the supervisor cancels it or goes away.

It talks to the supervisor in JSON lines: jobs and cancellations on stdin; {"ready"}, {"started"} and
{"ended"} on stdout. The end of its input ends it.
"""

import importlib
import os
import signal
import sys
import time

from . import channel

# What every worker runs: the pipeline (which imports TensorFlow, Keras and the layers), and the runtimes a
# target may run, where they are installed; then the packages its arguments name.
PRELOAD = ("keras_gelu.converters.running.pipeline",)
OPTIONAL = ("ai_edge_litert.interpreter", "tflite_micro", "ethosu.vela.vela", "h5py")
_POLL_SECONDS = 0.05
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _say(event):
    channel.send(sys.stdout.buffer, event)


def resident_bytes(pid):
    """The resident memory of a process (the pages it shares with the zygote included), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as stream:
            return int(stream.read().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def _end_of(pid):
    """A descriptor readable once the process has ended (Linux 5.3 and later), so that a short job's end is seen
    at once rather than at the next poll; None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _watched(pid, time_limit, memory_limit, requests):
    """Wait for the worker to end, killing it at a limit or on request; the {"ended"} event."""
    started = time.monotonic()
    stopped, peak = None, 0
    ending = _end_of(pid)
    try:
        while True:
            ended, status, usage = os.wait4(pid, os.WNOHANG)
            if ended:
                break
            peak = max(peak, resident_bytes(pid))
            if time.monotonic() - started > time_limit:
                stopped = "time"
            elif peak > memory_limit:
                stopped = "memory"
            elif requests.waiting(_POLL_SECONDS, also=() if ending is None else (ending,)):
                stopped = "cancelled" if requests.next() is not None else "caller gone"
            if stopped is not None:
                os.kill(pid, signal.SIGKILL)
                _, status, usage = os.wait4(pid, 0)
                break
    finally:
        if ending is not None:
            os.close(ending)
    return {"ended": pid, "status": os.waitstatus_to_exitcode(status), "stopped": stopped,
            "seconds": time.monotonic() - started, "peak_bytes": max(peak, usage.ru_maxrss * 1024)}


def main():
    # ^C in a terminal reaches the whole process group: the supervisor decides, and cancels the worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in PRELOAD:
        importlib.import_module(name)
    for name in OPTIONAL + tuple(sys.argv[1:]):  # the packages the caller's Keras has classes of (supervisor)
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a package that will not import here is one a worker imports, or not
            pass
    from . import worker

    _say({"ready": os.getpid()})
    requests = channel.Lines(0)
    while True:
        request = requests.next()
        if request is None:
            return
        job = request.get("job")
        if job is None:
            continue  # a cancellation that came after its worker ended
        pid = os.fork()
        if pid == 0:
            worker.run(job)
        _say({"started": pid})
        _say(_watched(pid, job["time_limit"], job["memory_limit"], requests))


if __name__ == "__main__":
    main()
