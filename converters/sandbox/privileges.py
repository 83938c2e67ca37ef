"""What the worker gives up before it reads the model, besides Landlock and seccomp: every capability, and the
namespaces it shares with the rest of the machine. Through ctypes; Linux only.

* Namespaces (`unshare`): a user namespace of its own, and in it an IPC namespace (no SysV shared memory,
  message queue or semaphore of another process is there to attach), a network namespace (no interface but
  a loopback that is down), and where the kernel allows, a PID namespace with a /proc of its own (a mount
  namespace holds it): no other process has an id there to name, in a system call or in /proc. The kernel
  offers them to unprivileged processes where it allows user namespaces; a container or a sysctl may forbid
  them, and `plan` says so before any job.
* Capabilities: the bounding set emptied, the ambient set cleared, then effective, permitted and inheritable
  set to nothing, in the worker's own namespace and so in every other; with no_new_privs, no program or file
  capability can give one back. Root's process keeps uid 0 in name (its files and the ones it writes are
  root's), with none of root's powers: it may change no file's owner, bypass no permission, signal, trace or
  set the limits of no process of another user, load nothing into the kernel.
* An unprivileged uid: under root, where every file the worker reads is open to other users (the Python
  installation, the libraries, the model), the job's process becomes nobody (65534) before anything else, its
  scratch folder handed to it, so that root's own files are not its own. Where one is closed (here the Python
  installation lies in /root, mode 0700), it keeps uid 0, without any capability, and the report says why.

A PID namespace's first process is its init, and the kernel drops the signals an init sends itself: a
runtime's abort() would end as SIGSEGV after a detour, and its crash would be named wrongly. So the worker is
not the first: the job's process makes the namespaces, spawns an init that only waits (`sleep`, without a copy
of the converter's memory), and forks the worker (pid 2), which mounts the /proc; the job's process waits for
the worker, kills the init, whose namespace dies with it, and ends as the worker ended, by the same signal or
with the same code.
"""

import ctypes
import os
import shutil
import signal
import stat

_CLONE_NEWUSER, _CLONE_NEWIPC, _CLONE_NEWNET = 0x10000000, 0x08000000, 0x40000000
_CLONE_NEWPID, _CLONE_NEWNS = 0x20000000, 0x00020000
NAMESPACES = _CLONE_NEWUSER | _CLONE_NEWIPC | _CLONE_NEWNET
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
# The PID namespace's init: `sleep`, for as long as the job may last (its process kills it sooner; where the zygote
# is killed first, the supervisor kills its process group, the init in it).
_SLEEP = shutil.which("sleep") or "/bin/sleep"
# Exit status of a process of the job whose own code failed past catching (its answer is missing: the
# supervisor says so).
FAILED = 70
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


NOBODY = 65534


def closed_to_others(paths):
    """The first folder or file on the way to one of `paths` that a user other than its owner and group cannot
    pass or read (search permission on each folder, read on the end), or None; a path that is not there has
    nothing to read."""
    for path in paths:
        real = os.path.realpath(path)
        try:
            mode = os.stat(real).st_mode
        except OSError:
            continue
        folder = os.path.dirname(real)
        while True:
            if not os.stat(folder).st_mode & stat.S_IXOTH:
                return folder
            if folder == os.path.dirname(folder):
                break
            folder = os.path.dirname(folder)
        needed = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & needed != needed:
            return real
    return None


def become_nobody(owned):
    """This root process as nobody, for good, with the files in `owned` (its scratch folder and what it made
    there) given to it first; the parent-death signal, which a change of uid clears, set again."""
    for path in owned:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    die_with_parent()


def _checked(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def enter_namespaces(own_processes, lifetime=60):
    """This (single-threaded) process into new user, IPC and network namespaces, its own uid and gid mapped to
    themselves; with `own_processes`, a PID namespace and a /proc of its own too, and it returns in the worker
    beside the namespace's init, which lives `lifetime` seconds at most (`_below_an_init`). OSError where the
    kernel refuses."""
    uid, gid = os.getuid(), os.getgid()
    _checked(_libc.unshare(NAMESPACES | (_CLONE_NEWPID | _CLONE_NEWNS if own_processes else 0)), "unshare")
    # setgroups denied first: an unprivileged process may map its gid only so, and none may change its groups
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as stream:
            stream.write(text)
    if own_processes:
        _below_an_init(lifetime)


def _below_an_init(lifetime):
    """Returns in the worker, pid 2 of the new PID namespace, whose parent is this process; this process never
    returns: it waits for the worker, then ends the namespace's init and ends as the worker did."""
    # pid 1: a program that waits and does nothing else, spawned without copying this process (vfork); the
    # worker has no process to leave it, and any left of a job is the zygote's to kill (a child subreaper)
    init = os.posix_spawn(_SLEEP, (_SLEEP, str(int(lifetime))), {})
    worker = os.fork()
    if worker == 0:
        die_with_parent()
        _mount_own_proc()
        return
    _, status = os.waitpid(worker, 0)
    os.kill(init, signal.SIGKILL)  # an init takes SIGKILL from a process of an ancestor namespace
    os.waitpid(init, 0)
    _end_as(status)


def set_dumpable(dumpable):
    """Whether another process of this user may open what /proc shows of this one (its descriptors among it): the
    zygote is not, so that a worker the kernel confines less (no Landlock, no namespaces) cannot reach the
    zygote's channel; each worker is again (a fork inherits the flag), for the zygote's watch of it."""
    _checked(_libc.prctl(_PR_SET_DUMPABLE, int(dumpable), 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def die_with_parent():
    """SIGKILL when the parent ends: set before confinement, which then denies changing it."""
    _checked(_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")


def _mount_own_proc():
    """A /proc that shows this PID namespace's processes only, in a mount namespace whose mounts never reach
    the machine's."""
    _checked(_libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "mount(/, private)")
    _checked(_libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "mount(/proc)")


def _end_as(status):
    """End this process as the one whose wait status is `status`: a death by a signal by the same signal, so that
    its parent reads the crash it was."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:  # SIGKILL and SIGSTOP have no handler to reset, nor the C library's own 32 and 33
            signal.signal(-code, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else FAILED)


def _last_capability():
    try:
        with open("/proc/sys/kernel/cap_last_cap") as stream:
            return int(stream.read())
    except (OSError, ValueError):
        return 63  # every bit a kernel could define: dropping one it lacks fails, and is skipped


def drop_capabilities():
    """Every capability given up for good: bounding set, ambient set, then the process's own sets; with
    no_new_privs, so nothing executed or set later gives one back."""
    for capability in range(_last_capability() + 1):
        _libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the kernel's last: nothing to drop
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before Linux 4.3: none to clear
    _checked(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    header, data = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _checked(_libc.capset(ctypes.byref(header), data), "capset")


def capabilities_held():
    """The process's effective and permitted capability masks and its bounding set, as /proc/self/status says;
    what a test reads to see that nothing is left."""
    held = {}
    with open("/proc/self/status") as stream:
        for line in stream:
            name, _, value = line.partition(":")
            if name in ("CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"):
                held[name] = int(value, 16)
    return held


def namespaces_available():
    """Which namespaces this kernel lets a process like the worker make, tried in children that make them and
    end: (own_processes, why_not): (True, None) for all of them, (False, a phrase) without the PID namespace,
    (None, a phrase) for none."""
    if _tried(own_processes=True):
        return True, None
    if _tried(own_processes=False):
        return False, "the kernel or a container refuses a PID namespace with a /proc of its own"
    return None, "the kernel or a container refuses user namespaces"


def _tried(own_processes):
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            enter_namespaces(own_processes)
            status = 0 if not own_processes or os.getpid() == 2 and os.path.exists("/proc/2") else 1
        finally:
            os._exit(status)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
