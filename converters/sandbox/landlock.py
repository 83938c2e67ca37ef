"""Landlock, the kernel's unprivileged access control, through ctypes: a process gives up, for good, every file
access but those it lists, and TCP bind/connect and signals outside itself, where the kernel knows them.

Three system calls (landlock_create_ruleset, landlock_add_rule, landlock_restrict_self), the same numbers on
every architecture Linux has added since 2021. What a kernel offers grows with its ABI version: file access
from 1, renames across folders from 2, truncation from 3, TCP bind/connect from 4, device ioctls from 5,
abstract unix sockets and signals from 6. `restrict` handles everything the running kernel knows, so whatever
it does not list is denied, and says what that was.
"""

import ctypes
import os
import stat

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_VERSION_QUERY = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

# File-system rights, with the ABI version that brought them.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
# Rights that apply to a file itself; the rest apply to what a folder holds.
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

READ = READ_FILE | READ_DIR
# A scratch folder: files, folders and links made, written, read, renamed and removed; no devices, sockets or
# pipes. A link grants nothing: Landlock checks the path an open resolves to (the rewritten SavedModel links to
# the model's own variables/, which the worker may read anyway).
READ_WRITE = READ | WRITE_FILE | TRUNCATE | MAKE_REG | MAKE_DIR | MAKE_SYM | REMOVE_FILE | REMOVE_DIR | REFER

_NET_TCP = 0b11  # bind, connect (ABI 4)
_SCOPES = 0b11  # abstract unix sockets, signals (ABI 6)


class Unavailable(Exception):
    """The kernel offers no Landlock (too old, built without it, or switched off at boot)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number, *arguments):
    result = _libc.syscall(number, *arguments)
    if result < 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))
    return result


def abi_version():
    """The kernel's Landlock ABI version; Unavailable where it has none."""
    try:
        return _syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION_QUERY))
    except OSError as error:
        raise Unavailable(f"Landlock: {error.strerror}") from None


def _handled(abi):
    fs = _FS_RIGHTS_BY_ABI[max(version for version in _FS_RIGHTS_BY_ABI if version <= abi)]
    return _RulesetAttr(fs, _NET_TCP if abi >= 4 else 0, _SCOPES if abi >= 6 else 0)


def describe(abi):
    """What a ruleset of this ABI confines, in words."""
    handled = _handled(abi)
    parts = ["files"] + (["TCP"] if handled.handled_access_net else []) + (["signals"] if handled.scoped else [])
    return f"Landlock ABI {abi} ({', '.join(parts)})"


def restrict(rules):
    """Confine this process (and what it starts) to `rules`, [(path, rights)], for good; returns describe(abi).

    A path that does not exist is skipped. Rights a file cannot have (a folder's) are dropped for files.
    Everything the running kernel can restrict and `rules` does not grant is denied: other files, TCP bind
    and connect, abstract unix sockets and signals to processes outside.
    """
    abi = abi_version()
    handled = _handled(abi)
    size = ctypes.sizeof(ctypes.c_uint64) * (3 if handled.scoped else 2 if handled.handled_access_net else 1)
    ruleset = _syscall(_CREATE_RULESET, ctypes.byref(handled), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for path, rights in rules:
            try:
                descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                allowed = rights & handled.handled_access_fs
                if not stat.S_ISDIR(os.fstat(descriptor).st_mode):
                    allowed &= _FILE_RIGHTS
                rule = _PathBeneathAttr(allowed, descriptor)
                _syscall(_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                         ctypes.c_uint32(0))
            finally:
                os.close(descriptor)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        _syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return describe(abi)
