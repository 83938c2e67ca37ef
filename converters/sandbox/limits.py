"""The bounds a contained conversion runs within: time, memory, and the size of any file it writes.

The defaults serve a real model (keras-hub's GPT-2 at GPT-2 small's width, 124 M parameters, converts in
about a minute at 8.4 GB here) and stop a hostile one in minutes rather than hours: the time limit grows with
the model's size on disk, the memory limit is three quarters of the machine's (or its container's) memory,
no file the conversion writes (its .tflite, TensorFlow's own temporary files) may pass twice the model's
size plus 1 GiB, and its whole scratch folder may hold three such files and 10,000 entries. `--time-limit`
and `--memory-limit` change the first two.
"""

import os

TIME_BASE_SECONDS = 300
TIME_PER_GIB_SECONDS = 300
MEMORY_SHARE = 0.75
# What the whole scratch folder may hold: the .tflite and TensorFlow's temporary files, each within the file
# size cap, and the rewritten SavedModel (its weights linked, not copied); a conversion writes tens of files.
SCRATCH_FILE_CAPS = 3
SCRATCH_ENTRIES = 10_000
# Threads: each takes a process id, of which a machine has tens of thousands (pid_max); TensorFlow, oneDNN and
# LiteRT start a few pools of about one thread per core.
THREADS_PER_CPU = 32
THREADS_AT_LEAST = 1024
# How much longer than a job's time limit its zygote may take to say it ended (it kills at the limit itself),
# and a PID namespace's init may live.
GRACE_SECONDS = 60
# A .tflite's check (validation.py in a fresh worker) reads it once: seconds per GiB, past a start-up's.
CHECK_BASE_SECONDS = 60
CHECK_PER_GIB_SECONDS = 60
_GIB = 1 << 30


def model_bytes(path):
    """The bytes of a model file, or of every file in a SavedModel folder."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(path) for name in names
               if os.path.isfile(os.path.join(folder, name)))


def machine_memory_bytes():
    """The memory this process may use: the machine's, or its cgroup's limit where that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as stream:
                total = min(total, int(stream.read().strip()))
        except (OSError, ValueError):  # absent, or "max"
            continue
    return total


def resolve(time_limit, memory_limit_gib, size):
    """(time limit in seconds, memory limit in bytes, file size cap in bytes, the scratch folder's limits
    {"bytes", "entries"}) for a model of `size` bytes."""
    if time_limit is None:
        time_limit = TIME_BASE_SECONDS + TIME_PER_GIB_SECONDS * size / _GIB
    memory = MEMORY_SHARE * machine_memory_bytes() if memory_limit_gib is None else memory_limit_gib * _GIB
    file_cap = int(2 * size + _GIB)
    return float(time_limit), int(memory), file_cap, {"bytes": SCRATCH_FILE_CAPS * file_cap,
                                                      "entries": SCRATCH_ENTRIES}


def thread_limit():
    """How many threads a worker may run at once."""
    return max(THREADS_AT_LEAST, THREADS_PER_CPU * (os.cpu_count() or 1))


def check_seconds(size):
    """The time a .tflite of `size` bytes may take to be checked."""
    return CHECK_BASE_SECONDS + CHECK_PER_GIB_SECONDS * size / _GIB
