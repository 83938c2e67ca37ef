"""What the worker gives up before it reads the model, besides Landlock and seccomp: every capability, and the
namespaces it shares with the rest of the machine. Through ctypes; Linux only.

* Namespaces (`unshare`): a user namespace of its own, and in it an IPC namespace (no SysV shared memory,
  message queue or semaphore of another process is there to attach) and a network namespace (no interface but
  a loopback that is down). The kernel offers them to unprivileged processes where it allows user namespaces;
  a container or a sysctl may forbid them, and `plan` says so before any job.
* Capabilities: the bounding set emptied, the ambient set cleared, then effective, permitted and inheritable
  set to nothing, in the worker's own namespace and so in every other; with no_new_privs, no program or file
  capability can give one back. Root's process keeps uid 0 in name (its files and the ones it writes are
  root's), with none of root's powers: it may change no file's owner, bypass no permission, signal, trace or
  set the limits of no process of another user, load nothing into the kernel.

The PID namespace is left out: its first process is its init, and the kernel drops the signals an init sends
itself, so a runtime's abort() would end as SIGSEGV after a detour, and a crash would be named wrongly; the
seccomp allow-list keeps the worker to its own process id instead (`policy.system_calls`).
"""

import ctypes
import os

_CLONE_NEWUSER, _CLONE_NEWIPC, _CLONE_NEWNET = 0x10000000, 0x08000000, 0x40000000
NAMESPACES = _CLONE_NEWUSER | _CLONE_NEWIPC | _CLONE_NEWNET
_PR_CAPBSET_DROP, _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _checked(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def enter_namespaces():
    """This (single-threaded) process into new user, IPC and network namespaces, its own uid and gid mapped to
    themselves; OSError where the kernel refuses."""
    uid, gid = os.getuid(), os.getgid()
    _checked(_libc.unshare(NAMESPACES), "unshare")
    # setgroups denied first: an unprivileged process may map its gid only so, and none may change its groups
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as stream:
            stream.write(text)


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
    """Whether this kernel lets a process like the worker make its namespaces, tried in a child that makes
    them and ends; a phrase saying why not, or None."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            enter_namespaces()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    return None if os.waitstatus_to_exitcode(status) == 0 else "the kernel or a container refuses user namespaces"
