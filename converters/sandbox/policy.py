"""What a contained conversion may do: the rules a worker confines itself to, stated once.

Files (Landlock). It may read the model and the --inputs and --calibration files; the Python installation,
the folders of the code already loaded (a module Keras imports late must still load), Keras's settings file
and the shared libraries mapped into the process; and the few system files the C library and TensorFlow read
about the machine and the process itself. It may write its scratch folder, and /dev/null. Nothing else: not the
user's home, not the working directory, not /tmp. Landlock also denies TCP bind and connect, abstract unix
sockets and signals to any process outside.

System calls (seccomp): `denied_system_calls`, each with what it would let a model do.
"""

import functools
import os
import site
import sys

from . import landlock
from . import privileges

# What the C library, Python and TensorFlow read about the machine and the process while converting (measured
# with strace over conversions in every mode and target): CPU and memory figures, time zone, the dynamic
# linker's cache, randomness, and the process's own /proc entries (its status, threads' names).
SYSTEM_READS = ("/usr", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache", "/etc/localtime", "/proc/self",
                "/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu", "/dev/urandom", "/dev/random", "/dev/zero")
# Of the cgroup file system, the limits a process reads of its own group (memory, CPU quota), files alone: its
# folders list every process and every other group's use of the machine.
_CGROUP_ROOT = "/sys/fs/cgroup"
_CGROUP_LIMITS = ("memory.max", "memory.high", "memory.limit_in_bytes", "cpu.max", "cpu.cfs_quota_us",
                  "cpu.cfs_period_us", "cpuset.cpus", "cpuset.cpus.effective")
DEVICE_WRITES = ("/dev/null",)

# The environment a conversion runs in, by name: what changes how Python, TensorFlow, Keras and their math
# libraries load and compute, and nothing else. The caller's other variables (API tokens, credentials,
# Terraform's TF_VAR_*) never reach a process that runs a model. KERAS_BACKEND is set, not passed: the converter
# computes in TensorFlow.
ENVIRONMENT = (
    "PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ", "PYTHONPATH", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "LD_LIBRARY_PATH", "KERAS_HOME", "TF_USE_LEGACY_KERAS", "TF_ENABLE_ONEDNN_OPTS",
    "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE", "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS", "TF_DETERMINISTIC_OPS", "TF_XLA_FLAGS", "XLA_FLAGS", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "HDF5_PLUGIN_PATH",
    "CUDA_VISIBLE_DEVICES")


def environment(caller):
    """The conversion's environment from the caller's (`caller`, a mapping): the ENVIRONMENT variables it sets,
    PYTHONPATH's folders made absolute (the zygote works in a folder of its own: a relative or empty entry would
    name the caller's folder, whose modules would then shadow the standard library's), and Keras on
    TensorFlow."""
    passed = {name: caller[name] for name in ENVIRONMENT if name in caller}
    if "PYTHONPATH" in passed:
        folders = [os.path.abspath(folder) for folder in passed["PYTHONPATH"].split(os.pathsep) if folder]
        passed["PYTHONPATH"] = os.pathsep.join(folders)
    return {**passed, "KERAS_BACKEND": "tensorflow", "HDF5_USE_FILE_LOCKING": "FALSE"}


def plan():
    """Which layers of confinement this machine lets a worker apply, decided once by the zygote before any job
    (each worker then applies exactly these, or dies): {"landlock": ABI or 0, "seccomp", "namespaces",
    "pid_namespace", "missing": [why a layer is absent], "root"}."""
    from . import seccomp

    result = {"landlock": 0, "seccomp": False, "namespaces": False, "pid_namespace": False, "missing": [],
              "root": os.getuid() == 0}
    try:
        result["landlock"] = landlock.abi_version()
    except landlock.Unavailable as error:
        result["missing"].append(f"Landlock: {error}")
    try:
        seccomp.available()
        result["seccomp"] = True
    except seccomp.Unavailable as error:
        result["missing"].append(f"seccomp: {error}")
    own_processes, refused = privileges.namespaces_available()
    result["namespaces"], result["pid_namespace"] = own_processes is not None, bool(own_processes)
    if refused is not None:
        result["missing"].append(f"{'PID namespace' if result['namespaces'] else 'namespaces'}: {refused}")
    return result


def job_uid(plan, reads):
    """(the uid a job's process takes, or None for its own; why not nobody, or None): under root, nobody, where
    every file every worker reads (the code loaded so far among them) and the job reads (`reads`: the model,
    --inputs, --calibration) is open to others."""
    if not plan["root"]:
        return None, None
    closed = _static_reads_closed() or privileges.closed_to_others(reads)
    if closed is not None:
        return None, f"an unprivileged uid: {closed} is closed to other users"
    return privileges.NOBODY, None


def describe(plan, sandbox=True, uid_refused=None):
    """The report's containment line for a plan: what held, and why any layer is missing; `sandbox` False: the
    test suite's switch (KERAS_GELU_SANDBOX=off) was thrown; `uid_refused`: why the job's process, under root,
    kept uid 0 (job_uid), or None where it became nobody."""
    if not sandbox:
        return "not contained: switched off (KERAS_GELU_SANDBOX=off); op checks only"
    in_force = ([landlock.describe(plan["landlock"])] if plan["landlock"] else []) + \
        (["seccomp allow-list"] if plan["seccomp"] else []) + \
        ([f"own user, {'PID, ' if plan['pid_namespace'] else ''}IPC and network namespaces"]
         if plan["namespaces"] else [])
    who = "no capabilities"
    if plan["root"]:
        who = "uid 0 without capabilities" if uid_refused else "uid 65534 (nobody), no capabilities"
    missing = plan["missing"] + ([uid_refused] if plan["root"] and uid_refused else [])
    absent = f" ({'; '.join(missing)})" if missing else ""
    if not plan["landlock"] and not plan["seccomp"]:
        return f"not contained: op checks only, {who}{absent}"
    kind = "contained" if plan["landlock"] and plan["seccomp"] else "partly contained"
    return f"{kind}: {' + '.join(in_force)}, {who}{absent}"


def _python_reads():
    """The Python installation, and the folder (or, outside any installation, the file) of every module loaded."""
    installations = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages(),
                     site.getusersitepackages()}
    reads = set(installations)
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not os.path.isabs(file):
            continue
        folder = os.path.dirname(file)
        is_package = os.path.basename(file) == "__init__.py"
        # A package's folder holds its code; a lone module's folder may hold anything (a script's, the user's)
        reads.add(folder if is_package or _beneath_any(folder, installations) else file)
    return reads


def _mapped_libraries():
    """Folders of the files mapped into this process: the shared libraries (dlopen may load their siblings)."""
    folders = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/") and not fields[5].endswith("(deleted)\n"):
                    folders.add(os.path.dirname(fields[5].strip()))
    except OSError:
        pass
    return folders


def _beneath_any(path, roots):
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots if root)


def _keras_settings():
    """Keras's settings file, which tf-keras reads again as a module imported late loads (tfmot's, for a
    quantization-aware .h5): $KERAS_HOME/keras.json, or ~/.keras/keras.json."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(home, "keras.json")


def _cgroup_limits():
    """The limit files of this process's own cgroups (v1: one hierarchy per controller; v2: one), and of the
    roots where a library reads them there."""
    groups = {(_CGROUP_ROOT, ""), (_CGROUP_ROOT, "memory"), (_CGROUP_ROOT, "cpu")}
    try:
        with open("/proc/self/cgroup") as stream:
            for line in stream:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                for controller in controllers.split(",") if controllers else [""]:
                    groups.add((_CGROUP_ROOT, os.path.join(controller, path.lstrip("/"))))
    except (OSError, ValueError):
        pass
    return {os.path.join(root, group, name) for root, group in groups for name in _CGROUP_LIMITS}


def _static_reads():
    """What every worker reads, whatever its job: the Python installation and the code loaded, the libraries, the
    system's files, Keras's settings."""
    return _python_reads() | _mapped_libraries() | set(SYSTEM_READS) | _cgroup_limits() | {_keras_settings()}


# Paths the kernel resolves for the process that opens them, and a worker in a PID namespace of its own mounts a
# /proc of its own (/proc/self is the opener's): kept as they are.
_PER_PROCESS = ("/proc",)


def _made_again_where_a_module_was_loaded(make):
    """`make` as a function that keeps what it made while the same modules are loaded (the code loaded is what it
    reads)."""
    made = {}

    @functools.wraps(make)
    def kept():
        loaded = frozenset(sys.modules)
        if loaded not in made:
            made.clear()
            made[loaded] = make()
        return made[loaded]

    return kept


@_made_again_where_a_module_was_loaded
def static_reads():
    """_static_reads() less what a folder among them covers (`_outermost`), made where the zygote forks, before it
    forks: each worker inherits them rather than walk some 3,000 modules and its mappings again (38 ms of each
    job's confinement on the Xeon, measured), and gives Landlock about a hundred rules rather than a thousand (10
    ms, 1 now). Made again where a module was loaded since (a target's runtime, imported for its first job)."""
    return tuple(sorted(_outermost(_static_reads())))


@_made_again_where_a_module_was_loaded
def _static_reads_closed():
    """The first of what every worker reads that a user other than its owner could not read, or None: made again
    where a module was loaded since, which may lie in a folder of root's own (a package imported for a job)."""
    return privileges.closed_to_others(sorted(_static_reads()))


def _outermost(paths):
    """`paths` less those another covers: a path whose real path lies beneath the real path of a folder among them
    (a Landlock rule on a folder grants what lies beneath it, where the kernel finds it: through links too), or
    is that of another. The same reads in a tenth as many rules, each opened and added in every job. What lies
    under /proc is kept as it is, neither resolved nor covering anything."""
    kept, by_real = set(), {}
    for path in sorted(paths):
        if _beneath_any(path, _PER_PROCESS):
            kept.add(path)
        else:
            by_real.setdefault(os.path.realpath(path), path)
    folders = {real for real in by_real if os.path.isdir(real)}
    return kept | {path for real, path in by_real.items() if not _within(real, folders)}


def _within(path, folders):
    """Whether a folder in `folders` (real paths) holds `path` (a real path) at any depth."""
    parent = os.path.dirname(path)
    while parent != path:
        if parent in folders:
            return True
        path, parent = parent, os.path.dirname(parent)
    return False


def file_rules(model_reads, scratch):
    """[(path, Landlock rights)]: the model's own files (the model, --inputs, --calibration) and the system's
    to read, the scratch folder to write."""
    reads = {os.path.abspath(path) for path in model_reads} | set(static_reads())
    rules = [(path, landlock.READ) for path in sorted(reads)]
    rules += [(path, landlock.READ_FILE | landlock.WRITE_FILE | landlock.TRUNCATE) for path in DEVICE_WRITES]
    rules.append((scratch, landlock.READ_WRITE))
    return rules


# System calls (seccomp), an allow-list: every call a conversion makes once confined, measured with strace over
# conversions in every mode and target (TensorFlow, the TFLite converter and calibrator, LiteRT, TFLite Micro,
# Vela, the GPU analyzer, h5py; SavedModel, .keras, .h5 and .tflite inputs, QAT models, a transformer, a
# trusted Lambda, a parity failure), both Keras flavours, oneDNN on and off: 55 calls. Beside them, their
# siblings on other architectures and C libraries (openat for open, newfstatat for stat, ...) and calls that
# act on the process alone. Every other call fails with EPERM. Calls that take another process, or act on a
# file's metadata, are kept to this process, or out.
_CLONE_THREAD = 0x00010000
_PR_OPTIONS = {
    # Thread names (TensorFlow's and OpenMP's pools: the one option measured); glibc 2.38's malloc names its
    # arenas (PR_SET_VMA).
    "PR_SET_NAME": 15, "PR_GET_NAME": 16, "PR_SET_VMA": 0x53564D41,
}
# A descriptor's own flags. Not F_SETOWN or F_SETSIG: with O_ASYNC they have the kernel signal any process the
# worker names.
# No locks either (flock, F_SETLK): a lock on a file it may only read (Keras's settings, the model) would hold
# another process's lock on it; HDF5 locks no file here (HDF5_USE_FILE_LOCKING, `environment`).
_FCNTLS = {"F_DUPFD": 0, "F_GETFD": 1, "F_SETFD": 2, "F_GETFL": 3, "F_SETFL": 4, "F_DUPFD_CLOEXEC": 1030}
# x86-64's AMX permission (asked by oneDNN and XNNPACK where the CPU has AMX), and the thread pointer read back.
_ARCH_PRCTLS = {"ARCH_GET_FS": 0x1003, "ARCH_GET_GS": 0x1004, "ARCH_GET_XCOMP_SUPP": 0x1021,
                "ARCH_GET_XCOMP_PERM": 0x1022, "ARCH_REQ_XCOMP_PERM": 0x1023}
_IOCTLS = {
    # isatty() and the terminal's size (Python's stdio and shutil; ENOTTY on the log file), and a descriptor's
    # close-on-exec and non-blocking flags.
    "TCGETS": 0x5401, "TIOCGWINSZ": 0x5413, "FIONREAD": 0x541B, "FIOCLEX": 0x5451, "FIONCLEX": 0x5450,
    "FIONBIO": 0x5421,
}
_ANY = (
    # Memory.
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "membarrier",
    # Threads and their synchronisation (signals to itself and its threads: the pid filters below), time; AMX's
    # permission (arch_prctl ARCH_REQ_XCOMP_PERM, asked by oneDNN where the CPU has it).
    "futex", "set_robust_list", "set_tid_address", "rseq", "sched_yield", "sched_getaffinity", "sched_getparam",
    "sched_getscheduler", "getcpu", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack",
    "restart_syscall", "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "exit",
    "exit_group",
    # Descriptors, and the files Landlock lets it open (reads of the model and the installation, writes in its
    # scratch folder: the rewritten SavedModel links to the model's variables): the checks on paths are
    # Landlock's. No metadata is changed (chmod, chown, utime, xattrs), no hard link made.
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "lseek", "open", "openat",
    "close", "close_range", "dup", "dup2", "dup3", "fsync", "fdatasync", "ftruncate", "stat", "fstat", "lstat",
    "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat",
    "faccessat2", "getdents64", "getcwd", "readlink", "readlinkat", "mkdir", "mkdirat", "rmdir", "unlink",
    "unlinkat", "rename", "renameat", "renameat2", "symlink", "symlinkat", "umask", "pipe2", "eventfd2", "poll",
    "ppoll", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait",
    # What the process asks about itself and the machine.
    "getpid", "gettid", "getppid", "getuid", "geteuid", "getgid", "getegid", "getrlimit", "getrusage", "times",
    "sysinfo", "uname", "getrandom",
)


def system_calls(own_pid):
    """[(system call, [conditions])] for seccomp.restrict: a call is allowed where all of one entry's
    conditions hold; a condition is (argument index, comparison, value...)."""
    self_only = [[(0, "==", 0)], [(0, "==", own_pid)]]  # a process id argument: itself (0 means the caller)
    # (Not for kill, where 0 means the caller's process group, the zygote in it.)
    allowed = [(name, []) for name in _ANY]
    # New threads only: a new process would outlive the watchdog's kill. glibc falls back from clone3, whose
    # flags a filter cannot read, to clone where clone3 is refused (seccomp.FALLBACK).
    allowed.append(("clone", [(0, "&==", _CLONE_THREAD, _CLONE_THREAD)]))
    allowed += [("prctl", [(0, "==", option)]) for option in _PR_OPTIONS.values()]
    allowed += [("ioctl", [(1, "&==", 0xFFFFFFFF, request)]) for request in _IOCTLS.values()]
    allowed += [("fcntl", [(1, "==", command)]) for command in _FCNTLS.values()]
    allowed += [("arch_prctl", [(0, "==", code)]) for code in _ARCH_PRCTLS.values()]
    # Signals to itself and its threads (abort(), Python's signal handling), to no other process.
    allowed += [(name, [(0, "==", own_pid)]) for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")]
    # Its own limits read, never set: the bounds are kept from outside (a limit set on the zygote or the command
    # would blind the watcher or kill them).
    allowed += [("prlimit64", condition + [(2, "==", 0)]) for condition in self_only]
    # Its own scheduling (TensorFlow's and OpenMP's thread pools pin and rank their threads), no one else's.
    allowed += [(name, condition) for name in ("sched_setaffinity", "sched_setscheduler", "sched_setparam")
                for condition in self_only]
    allowed += [("setpriority", [(0, "==", 0), (1, "==", who)]) for who in (0, own_pid)]  # PRIO_PROCESS, itself
    return allowed
