"""The zygote: a process that has imported the converter and run nothing, from which each conversion forks.

TensorFlow cannot be forked once it has run anything (its thread pools do not survive a fork), and importing
it takes seconds. So the supervisor starts this process once per caller (through `keras_gelu_launcher.zygote`,
which holds keras_gelu's own import back until `main` runs it); it imports what a conversion needs, runs
nothing, and forks one worker per job (`worker.run`), which confines itself and converts. Until the worker
ends, the zygote watches it and kills it past its time or memory limit, or when the supervisor cancels it or
goes away.

It forks only while it has no thread but its own: a forked child has the calling thread alone, and a lock
another thread held stays held in it (TensorFlow's thread pools start with the first op run). A package whose
import starts a thread (one that runs a TensorFlow op as it is imported) ends the zygote with {"unforkable":
[its name]}, and a thread found before a fork that no import is known to have started, with the names of
every package it imported by name: the supervisor starts another that leaves them to each worker.

It talks to the supervisor in JSON lines: jobs and cancellations on stdin; {"ready"}, {"started"},
{"ended"} and {"unforkable"} on the descriptor its first argument names. Its standard output is its log,
from its start: nothing a package or a library prints reaches the channel. The end of its input ends it.
It is not dumpable: a process of the same user cannot open its descriptors through /proc (a worker, where
the kernel gives it neither Landlock nor namespaces).
"""

import ctypes
import gc
import importlib
import importlib.util
import os
import resource
import signal
import stat
import sys
import time

from . import channel
from . import policy
from . import privileges
from . import scratch

# What every worker runs: the pipeline (which imports TensorFlow, Keras and the layers); then what its arguments
# name, where it is installed (LiteRT, h5py, the packages the caller has registered Keras classes of:
# supervisor._preloaded). What a job names besides (a target's runtime: TFLite Micro, Vela, a second's import
# between them; a package the caller registered since) is imported when the first job that names it comes, and
# kept for the next.
PRELOAD = ("keras_gelu.converters.running.pipeline",)
# Keras imports scikit-learn and matplotlib at its own import where they are installed, for its scikit-learn
# wrappers and image-gallery plots, and TensorFlow's TFLite module imports JAX, for converting JAX functions;
# no conversion here uses them (a JAX export's module is read by jaxlib, imported when one comes): 10 s of the
# 26 s `import keras_gelu` took on a busy 2-core AMD EPYC (python -X importtime). Kept out while the converter
# imports (Keras and TensorFlow take their ImportError as "not installed"); importable again afterwards, as a
# trusted model's code may.
_NOT_PRELOADED = ("sklearn", "matplotlib", "jax")
_POLL_SECONDS = 0.05
_PR_SET_CHILD_SUBREAPER = 36
# A job's processes: its child, the PID namespace's init, the worker (and room for what a kernel adds).
_JOB_PROCESSES = 8
# The steps whose peak memory is kept: a conversion names about ten; the worker, any.
_STAGES_KEPT = 32
# The scratch folder is counted every this many polls (a walk of its entries; a worker writes at most its file
# size cap, RLIMIT_FSIZE, into each file between two counts).
_SCRATCH_POLLS = 10
# The limits the zygote starts with, which every job starts from: a worker could not change them (the seccomp
# allow-list keeps prlimit64 to itself), and if anything did, the zygote puts them back or ends.
_LIMITS = [getattr(resource, name) for name in dir(resource) if name.startswith("RLIMIT_")]


# The channel to the supervisor: the pipe its first argument names (standard output is its log).
_events = None


def _say(event):
    channel.send(_events, event)


# What the kernel spends on each thread beyond its pages: its kernel stack.
_KERNEL_STACK_BYTES = 16 << 10


def _live_view(pid):
    """The /proc folder that shows a process's memory and descriptors: its own, or, where its main thread has
    ended while others run on (a zombie leader, whose status holds no memory figures and whose fd folder is
    empty), one of its live threads'; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as stream:
            zombie = any(line.startswith("State:") and "Z" in line.split()[1] for line in stream)
        if not zombie:
            return f"/proc/{pid}"
        for thread in os.listdir(f"/proc/{pid}/task"):
            view = f"/proc/{pid}/task/{thread}"
            with open(f"{view}/status") as stream:
                if not any(line.startswith("State:") and "Z" in line.split()[1] for line in stream):
                    return view
    except (OSError, IndexError):
        pass
    return None


def _footprint(pid):
    """(memory, threads) of a process, from its status (a live thread's, _live_view): its resident pages (those
    it shares with the zygote included), its page tables (a sparse mapping read once every 2 MiB holds no
    resident page but a page table each, which resident memory never shows) and its threads' kernel stacks;
    (0, 0) if it is gone."""
    view = _live_view(pid)
    try:
        with open(f"{view}/status") as stream:
            fields = dict(line.split(":", 1) for line in stream if ":" in line)
        kib = sum(int(fields.get(name, "0 kB").split()[0]) for name in ("VmRSS", "VmPTE"))
        threads = int(fields.get("Threads", "0"))
    except (OSError, ValueError, IndexError, TypeError):
        return 0, 0
    return kib * 1024 + threads * _KERNEL_STACK_BYTES, threads


def _hidden_bytes(pid):
    """The disk a process holds in files no folder names: open, and unlinked (or made with O_TMPFILE), which a
    walk of its scratch folder cannot see."""
    held, view = 0, _live_view(pid)
    try:
        descriptors = os.listdir(f"{view}/fd")
    except (OSError, TypeError):
        return 0
    for descriptor in descriptors:
        try:
            status = os.stat(f"{view}/fd/{descriptor}")
        except OSError:
            continue
        if stat.S_ISREG(status.st_mode) and status.st_nlink == 0:
            held += status.st_blocks * 512
    return held


def _job_processes(pid):
    """The job's processes as the zygote sees them: its child, and below it, where the worker runs in a PID
    namespace of its own (privileges._below_an_init), the namespace's init and the worker."""
    found, pending = [], [pid]
    while pending and len(found) < _JOB_PROCESSES:
        current = pending.pop(0)
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as stream:
                pending.extend(int(child) for child in stream.read().split())
        except (OSError, ValueError):
            pass
    return found


def _killed(processes):
    """SIGKILL to each of the job's processes, then all waited for: the child, and those left to the zygote (a
    child subreaper) when their parent died first."""
    for pid in processes:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status, usage = os.wait4(processes[0], 0)
    _reap_orphans()
    return status, usage


def _reap_orphans():
    """Every other child of the zygote is what a job left (its init, or a worker whose parent died): killed, and
    waited for."""
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as stream:
            left = [int(child) for child in stream.read().split()]
    except (OSError, ValueError):
        left = []
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _end_of(pid):
    """A descriptor readable once the process has ended (Linux 5.3 and later), so that a short job's end is seen
    at once rather than at the next poll; None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _stage(folder, before):
    """The step the worker says it is in (worker._stage_writer), or `before` while it has said none or is
    rewriting the file; read as scratch.read reads (no link, FIFO or device)."""
    return scratch.read(folder, "stage", 200).decode(errors="replace") or before


def _watched(pid, job, requests):
    """Wait for the worker to end, killing it at a limit or on request; the {"ended"} event, with the peak
    resident memory seen in each step (sampled: a spike shorter than a poll shows only in the whole's peak)."""
    started = time.monotonic()
    time_limit, memory_limit, folder = job["time_limit"], job["memory_limit"], job["scratch"]
    stopped, peak, stage, stage_peaks, polls = None, 0, "start-up", {}, 0
    ending = _end_of(pid)
    try:
        while True:
            ended, status, usage = os.wait4(pid, os.WNOHANG)
            if ended:
                _reap_orphans()
                break
            processes = _job_processes(pid)
            footprints = [_footprint(process) for process in processes]
            # the largest (each counts the pages it shares with the zygote), and every thread of them
            resident, threads = max(memory for memory, _ in footprints), sum(count for _, count in footprints)
            stage = _stage(folder, stage)
            if resident:  # 0: it has just ended
                peak = max(peak, resident)
                if stage in stage_peaks or len(stage_peaks) < _STAGES_KEPT:  # the worker names them
                    stage_peaks[stage] = max(stage_peaks.get(stage, 0), resident)
            polls += 1
            if time.monotonic() - started > time_limit:
                stopped = "time"
            elif peak > memory_limit:
                stopped = "memory"
            elif threads > job["thread_limit"]:
                stopped = "threads"  # each a process id: past this, a worker could leave the machine none
            elif polls % _SCRATCH_POLLS == 0 and _past_scratch_limits(processes, folder, job["scratch_limits"]):
                stopped = "scratch"
            elif requests.waiting(_POLL_SECONDS, also=() if ending is None else (ending,)):
                stopped = "cancelled" if requests.next() is not None else "caller gone"
            if stopped is not None:
                status, usage = _killed(processes)
                break
    finally:
        if ending is not None:
            os.close(ending)
    return {"ended": pid, "status": os.waitstatus_to_exitcode(status), "stopped": stopped,
            "seconds": time.monotonic() - started, "peak_bytes": max(peak, usage.ru_maxrss * 1024),
            "stage_peak_bytes": stage_peaks}


def _past_scratch_limits(processes, folder, limits):
    used, entries = scratch.usage(folder, limits)
    return used + sum(_hidden_bytes(pid) for pid in processes) > limits["bytes"] or entries > limits["entries"]


def _own_limits():
    return {limit: resource.getrlimit(limit) for limit in _LIMITS}


def _limits_restored(expected):
    """Put back any limit of this process that changed since it started; False where that cannot be done."""
    for limit, value in expected.items():
        if resource.getrlimit(limit) != value:
            try:
                resource.setrlimit(limit, value)
            except (OSError, ValueError):
                return False
    return True


# The names an import was tried for: each once. A name that would not import is not tried again before each
# later job, when a module of that name planted since in a folder on the zygote's path would run here, unconfined.
_TRIED = set()
# The packages imported here by name (its arguments, the jobs' preloads), in order.
_IMPORTED = []


def _lasting_threads():
    """The threads of this process besides its own that a fork would leave behind: those still there after a
    child that exits at once was forked (numpy's OpenBLAS stops its pool in its handler before a fork, and starts
    it again when next used)."""
    own = {str(os.getpid())}
    if set(os.listdir("/proc/self/task")) == own:
        return set()
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    return set(os.listdir("/proc/self/task")) - own


def _import_where_installed(names):
    """Import each of `names` not tried before; the first whose import left a lasting thread, or None."""
    for name in names:
        if name in _TRIED:
            continue
        _TRIED.add(name)
        try:
            importlib.import_module(name)
            _IMPORTED.append(name)
        except Exception:  # noqa: BLE001 - a package that will not import here is one a worker imports, or not
            pass
        if _lasting_threads():  # a failed import may have started one too
            return name
    return None


def _package_files(names):
    """The folders (or files) of the top-level packages `names`, found as an import finds them, without running
    them: what a worker that imports them confined must read."""
    files = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name) if "." not in name else None
        except (ImportError, ValueError):
            continue
        if spec is not None:
            files += [*(spec.submodule_search_locations or ()), *([spec.origin] if spec.has_location else [])]
    return [path for path in files if isinstance(path, str) and os.path.isabs(path)]


def main(import_keras_gelu):
    """Serve jobs until the input ends; `import_keras_gelu()` imports the package this module is in (and with it
    TensorFlow and Keras), which its launcher held back until what they import is chosen here."""
    global _events
    _events = os.fdopen(int(sys.argv[1]), "wb")
    os.set_inheritable(_events.fileno(), False)  # no program it runs (a namespace's init) holds the channel open
    privileges.set_dumpable(False)
    # ^C in a terminal reaches the whole process group: the supervisor decides, and cancels the worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Orphans of a job's processes become the zygote's, which waits for them: no process of a job outlives it.
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # The collector is off through the start-up's imports: it walked the heap they make (TensorFlow's and Keras's)
    # again and again as it grew, to free next to nothing. With one collection at the end instead, the command's
    # conversion of a small .keras file, this start included, takes 3.68 s of CPU where it took 3.86 s.
    gc.disable()
    kept_out = [name for name in _NOT_PRELOADED if name not in sys.modules]
    sys.modules.update(dict.fromkeys(kept_out))  # None: `import sklearn` raises ImportError, which Keras expects
    try:
        import_keras_gelu()
        for name in PRELOAD:
            importlib.import_module(name)
    finally:
        for name in kept_out:
            del sys.modules[name]
    if _lasting_threads():
        raise SystemExit("the converter's own imports left a thread running: no worker can be forked")
    unforkable = _import_where_installed(sys.argv[2:])
    if unforkable is not None:
        _say({"unforkable": [unforkable]})
        return
    from keras_gelu import xla_kernels

    xla_kernels.compile_with_xla(False)  # a worker runs its model once: XLA's compiles would not pay for themselves
    from ..reading import loading

    loading.autograph_ahead()
    from . import worker

    gc.enable()
    gc.collect()
    limits = _own_limits()
    sandbox_plan = policy.plan()
    _say({"ready": os.getpid(), "plan": sandbox_plan})
    requests = channel.Lines(0)
    while True:
        request = requests.next()
        if request is None:
            return
        job = request.get("job")
        if job is None:
            continue  # a cancellation that came after its worker ended
        if not _limits_restored(limits):
            return  # a changed zygote serves no job: the supervisor starts another
        unforkable = _import_where_installed(job.get("preload", ()))
        if unforkable is not None:
            _say({"unforkable": [unforkable]})
            return
        policy.static_reads()  # here, for every worker to inherit: made again only where a module was loaded since
        job["reads"] = [*job["reads"], *_package_files(job.get("worker_imports", ()))]
        # here, where what every worker reads is known: a package imported for this job may lie in a folder
        # closed to other users
        job["uid"], uid_refused = policy.job_uid(sandbox_plan, job["reads"])
        job["plan"] = sandbox_plan
        # Every object here so far kept out of the worker's garbage collections: a full one would walk the
        # whole of TensorFlow's and Keras's Python objects (0.2 s), writing to each and so copying its page
        # from the zygote's, and loading a SavedModel makes enough objects to set one off. Frozen, a Keras 3
        # SavedModel's conversion took 0.61 s where it took 0.74-0.81 s (tests/test_sandbox.py).
        gc.freeze()
        if _lasting_threads():  # started since its import by what a package left behind (a lazy import, a hook)
            _say({"unforkable": _IMPORTED})
            return
        pid = os.fork()
        if pid == 0:
            worker.run(job)
        _say({"started": pid})
        _say({**_watched(pid, job, requests), "uid_refused": uid_refused})
