"""seccomp through libseccomp (ctypes): system calls a conversion never makes, made to fail.

libseccomp turns rules into the kernel's BPF filter for the running architecture and knows each system call's
number there. A filter applies to the process and everything it starts, for good.
"""

import ctypes
import ctypes.util

_ALLOW = 0x7FFF0000  # SCMP_ACT_ALLOW
_COMPARISONS = {"!=": 1, "&==": 7}  # SCMP_CMP_NE, SCMP_CMP_MASKED_EQ


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


def _test(argument, comparison, *values):
    """A rule's condition on a system call's argument: (index, "!=", value) or (index, "&==", mask, value)."""
    if comparison == "&==":
        mask, value = values
        return _ArgumentTest(argument, _COMPARISONS[comparison], mask, value)
    (value,) = values
    return _ArgumentTest(argument, _COMPARISONS[comparison], value, 0)


def restrict(rules):
    """Make system calls fail, for good. `rules`: [(name, errno, condition or None)], a condition being
    (argument index, "!=", value) or (argument index, "&==", mask, value). A call this architecture lacks is
    skipped."""
    library = _library()
    context = library.seccomp_init(_ALLOW)
    if not context:
        raise Unavailable("seccomp_init failed")
    try:
        for name, error, condition in rules:
            number = library.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue
            tests = (_ArgumentTest * 1)(_test(*condition)) if condition else None
            action = 0x00050000 | (error & 0xFFFF)  # SCMP_ACT_ERRNO(error)
            result = library.seccomp_rule_add_array(context, action, number, 1 if condition else 0, tests)
            if result < 0:
                raise Unavailable(f"cannot add the rule for {name} (error {-result})")
        result = library.seccomp_load(context)
        if result < 0:
            raise Unavailable(f"the kernel refused the filter (error {-result})")
    finally:
        library.seccomp_release(context)
