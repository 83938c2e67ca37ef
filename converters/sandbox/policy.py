"""What a contained conversion may do: the rules a worker confines itself to, stated once.

Files (Landlock). It may read the model and the --inputs and --calibration files; the Python installation,
the folders of the code already loaded (a module Keras imports late must still load), Keras's settings file
and the shared libraries mapped into the process; and the few system files the C library and TensorFlow read
about the machine and the process itself. It may write its scratch folder, and /dev/null. Nothing else: not the
user's home, not the working directory, not /tmp. Landlock also denies TCP bind and connect, abstract unix
sockets and signals to any process outside.

System calls (seccomp): `denied_system_calls`, each with what it would let a model do.
"""

import errno
import os
import site
import sys

from . import landlock

# What the C library, Python and TensorFlow read about the machine and the process while converting (measured
# with strace over conversions in every mode and target): CPU and memory figures, time zone, the dynamic
# linker's cache, randomness, and the process's own /proc entries (its status, threads' names).
SYSTEM_READS = ("/usr", "/lib", "/lib64", "/lib32", "/etc/ld.so.cache", "/etc/localtime", "/proc/self",
                "/proc/cpuinfo", "/proc/meminfo", "/sys/devices/system/cpu", "/sys/fs/cgroup", "/dev/urandom",
                "/dev/random", "/dev/zero")
DEVICE_WRITES = ("/dev/null",)

_CLONE_THREAD = 0x00010000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C


def denied_system_calls(own_pid):
    """[(system call, errno, condition or None)] for seccomp.restrict."""
    return [
        # Starting another program: whatever a model holds, it runs nothing but this process.
        ("execve", errno.EPERM, None), ("execveat", errno.EPERM, None),
        # New processes (a child would outlive the watchdog's kill). Threads are clones with CLONE_THREAD; glibc
        # falls back from clone3, whose flags a filter cannot read, to clone where clone3 answers ENOSYS.
        ("fork", errno.EPERM, None), ("vfork", errno.EPERM, None),
        ("clone", errno.EPERM, (0, "&==", _CLONE_THREAD, 0)), ("clone3", errno.ENOSYS, None),
        # Sockets of every family: no conversion step opens one (measured, every mode and target). io_uring
        # could open and use them without these calls.
        ("socket", errno.EPERM, None), ("socketpair", errno.EPERM, None),
        ("io_uring_setup", errno.EPERM, None), ("io_uring_enter", errno.EPERM, None),
        ("io_uring_register", errno.EPERM, None),
        # Other processes: their memory, and signals (Landlock scopes signals too, from its ABI 6).
        ("ptrace", errno.EPERM, None), ("process_vm_readv", errno.EPERM, None),
        ("process_vm_writev", errno.EPERM, None), ("pidfd_open", errno.EPERM, None),
        ("pidfd_getfd", errno.EPERM, None), ("pidfd_send_signal", errno.EPERM, None), ("tkill", errno.EPERM, None),
        ("kill", errno.EPERM, (0, "!=", own_pid)), ("tgkill", errno.EPERM, (0, "!=", own_pid)),
        ("rt_sigqueueinfo", errno.EPERM, (0, "!=", own_pid)), ("rt_tgsigqueueinfo", errno.EPERM, (0, "!=", own_pid)),
        # Typing into the terminal the command runs in.
        ("ioctl", errno.EPERM, (1, "&==", 0xFFFFFFFF, _TIOCSTI)), ("ioctl", errno.EPERM, (1, "&==", 0xFFFFFFFF, _TIOCLINUX)),
        # The kernel's own state, which a conversion run as root could otherwise change.
        *((name, errno.EPERM, None) for name in (
            "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "bpf", "perf_event_open", "userfaultfd",
            "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "open_by_handle_at",
            "name_to_handle_at", "keyctl", "add_key", "request_key", "reboot", "swapon", "swapoff", "acct",
            "settimeofday", "clock_settime", "adjtimex", "sethostname", "setdomainname")),
    ]


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


def file_rules(model_reads, scratch):
    """[(path, Landlock rights)]: the model's own files (the model, --inputs, --calibration) and the system's
    to read, the scratch folder to write."""
    reads = {os.path.abspath(path) for path in model_reads}
    reads |= _python_reads() | _mapped_libraries() | set(SYSTEM_READS) | {_keras_settings()}
    rules = [(path, landlock.READ) for path in sorted(reads)]
    rules += [(path, landlock.READ_FILE | landlock.WRITE_FILE | landlock.TRUNCATE) for path in DEVICE_WRITES]
    rules.append((scratch, landlock.READ_WRITE))
    return rules
