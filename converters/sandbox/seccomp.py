"""seccomp through libseccomp (ctypes): an allow-list of system calls, every other one made to fail.

libseccomp turns rules into the kernel's BPF filter for the running architecture and knows each system call's
number there. A filter applies to the process and everything it starts, for good.
"""

import ctypes
import ctypes.util
import errno
import os

_ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW


def _errno(number):
    return 0x00050000 | (number & 0xFFFF)  # SCMP_ACT_ERRNO(number)


# What a call off the list gets: EPERM, which every library takes as "not allowed here".
DENIED = _errno(errno.EPERM)
# Calls refused as a kernel without them would refuse them, so that the C library falls back to the call the
# list allows: clone3, whose flags sit in memory a filter cannot read, to clone.
# Calls refused with an errno that has the C library take another way: clone3's flags no filter can read (glibc
# then clones), and fallocate, which reserves disk without writing it (1 GiB in 0.6 ms, faster than any watch
# counts; with FALLOC_FL_KEEP_SIZE past the file size cap): "not supported", and posix_fallocate writes instead.
FALLBACK = {"clone3": errno.ENOSYS, "fallocate": errno.EOPNOTSUPP}
_COMPARISONS = {"!=": 1, "==": 4, "&==": 7}  # SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ
_SECCOMP_ACTIONS = "/proc/sys/kernel/seccomp/actions_avail"


class Unavailable(Exception):
    """No libseccomp on this machine, or a kernel that takes no seccomp filter."""


class _ArgumentTest(ctypes.Structure):  # struct scmp_arg_cmp
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _library():
    """libseccomp, loaded once (find_library runs ldconfig: before any confinement, so at import)."""
    if isinstance(_LIBRARY, Unavailable):
        raise _LIBRARY
    return _LIBRARY


def _loaded():
    try:
        library = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    except OSError:
        return Unavailable("libseccomp is not installed")
    library.seccomp_init.restype = ctypes.c_void_p
    library.seccomp_init.argtypes = [ctypes.c_uint32]
    library.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                               ctypes.POINTER(_ArgumentTest)]
    library.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    library.seccomp_load.argtypes = [ctypes.c_void_p]
    library.seccomp_release.argtypes = [ctypes.c_void_p]
    return library


_LIBRARY = _loaded()


def available():
    """Raise Unavailable unless libseccomp loads and the kernel takes filters that fail calls with an errno."""
    _library()
    try:
        with open(_SECCOMP_ACTIONS) as stream:
            actions = stream.read().split()
    except OSError:
        raise Unavailable("the kernel takes no seccomp filter") from None
    if "errno" not in actions or "allow" not in actions:
        raise Unavailable(f"the kernel's seccomp lacks the errno action ({' '.join(actions)})")


def _test(argument, comparison, *values):
    """A condition on a system call's argument: (index, "==" or "!=", value) or (index, "&==", mask, value)."""
    if comparison == "&==":
        mask, value = values
        return _ArgumentTest(argument, _COMPARISONS[comparison], mask, value)
    (value,) = values
    return _ArgumentTest(argument, _COMPARISONS[comparison], value & 0xFFFFFFFFFFFFFFFF, 0)


def restrict(allowed):
    """Allow only the system calls in `allowed`, [(name, [condition, ...])], for good: a call is allowed where
    every condition of one of its entries holds; every other call fails with EPERM (FALLBACK's with theirs).
    A call this architecture lacks is skipped."""
    library = _library()
    context = library.seccomp_init(DENIED)
    if not context:
        raise Unavailable("seccomp_init failed")
    try:
        rules = [(name, _ALLOW, conditions) for name, conditions in allowed]
        rules += [(name, _errno(number), []) for name, number in FALLBACK.items()]
        for name, action, conditions in rules:
            number = library.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue
            tests = (_ArgumentTest * max(len(conditions), 1))(*(_test(*condition) for condition in conditions))
            result = library.seccomp_rule_add_array(context, action, number, len(conditions), tests)
            if result < 0:
                raise Unavailable(f"cannot add the rule for {name} ({os.strerror(-result)})")
        result = library.seccomp_load(context)
        if result < 0:
            raise Unavailable(f"the kernel refused the filter ({os.strerror(-result)})")
    finally:
        library.seccomp_release(context)
