"""A job's scratch folder, seen from outside the worker: hostile input, every byte of it.

The worker writes its answer, its log and its .tflite in the scratch folder, and the process that wrote them
ran the model: it may have put a link, a FIFO, a device, a sparse file of a terabyte or a hard link to a
file of yours where a file was expected, or changed a file after it checked it. So the unconfined side (the
supervisor, the zygote) never follows a link there, never opens anything but a regular file with one name,
reads within a bound, copies bytes from the descriptor it opened (never renames, links or chmods a path the
worker controls), parses within a depth, and removes the folder for certain.
"""

import errno
import json
import os
import shutil
import stat

from .. import errors

# The answer's size and nesting: a report is a few kB, with lists of lists at most four deep.
ANSWER_BYTES = 16 << 20
ANSWER_DEPTH = 16
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class Hostile(Exception):
    """What the worker left is not what an honest worker leaves: the phrase says what."""


def open_regular(folder, name, limit):
    """A descriptor of `folder`/`name`, a regular file of at most `limit` bytes with no other name; Hostile
    otherwise (FileNotFoundError where there is none). Never follows a link, never waits on a FIFO."""
    try:
        descriptor = os.open(os.path.join(folder, name), _OPEN_FLAGS)
    except OSError as error:
        if error.errno == errno.ENOENT:
            raise
        raise Hostile(f"its {name} is not a file ({os.strerror(error.errno)})") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise Hostile(f"its {name} is not a regular file")
        if status.st_nlink != 1:  # a hard link to a file outside, which the worker could not write but could name
            raise Hostile(f"its {name} has {status.st_nlink} names")
        if status.st_size > limit:
            raise Hostile(f"its {name} holds {status.st_size:,} bytes, past {limit:,}")
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def read(folder, name, limit):
    """The bytes of `folder`/`name` (open_regular's rules), at most `limit` of them; b"" where there is none or it
    is not a plain file."""
    try:
        descriptor = open_regular(folder, name, 1 << 62)
    except (OSError, Hostile):
        return b""
    with os.fdopen(descriptor, "rb") as stream:
        return stream.read(limit)


def copy_out(folder, name, destination, limit):
    """Copy `folder`/`name` (open_regular's rules, at most `limit` bytes) into the open binary file
    `destination`, from the descriptor: what is written is what was checked, whatever the name points to
    now. Returns the number of bytes."""
    descriptor = open_regular(folder, name, limit)
    try:
        with os.fdopen(descriptor, "rb", closefd=False) as source:
            shutil.copyfileobj(source, destination, 1 << 20)
        destination.flush()
        copied = destination.tell()
    finally:
        os.close(descriptor)
    if copied > limit:  # it grew since fstat: only possible while something still writes it
        raise Hostile(f"its {name} grew while it was copied")
    return copied


def _depth(value):
    """The deepest nesting of lists and dicts in a parsed JSON value, walked without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def answer(folder, nonce):
    """The worker's answer: result.json as a dict naming the job's `nonce`, within ANSWER_BYTES and ANSWER_DEPTH;
    None where there is none; Hostile where it is not one an honest worker writes."""
    try:
        descriptor = open_regular(folder, "result.json", ANSWER_BYTES)
    except FileNotFoundError:
        return None
    with os.fdopen(descriptor, "rb") as stream:
        data = stream.read(ANSWER_BYTES + 1)
    if len(data) > ANSWER_BYTES:
        raise Hostile("its result.json grew while it was read")
    try:  # linear in the bytes; a nest past Python's recursion limit is refused by the parser itself, at once
        result = json.loads(data)
    except ValueError:
        raise Hostile("its result.json is not JSON") from None
    except RecursionError:
        raise Hostile(f"its result.json nests deeper than {ANSWER_DEPTH}") from None
    if _depth(result) > ANSWER_DEPTH:
        raise Hostile(f"its result.json nests deeper than {ANSWER_DEPTH}")
    if not isinstance(result, dict) or result.get("nonce") != nonce:
        return None  # not the answer to this job: a model's own file, or the answer of none
    return result


def usage(folder, limits=None):
    """(bytes on disk, entries) under `folder`, links not followed, each folder opened by its descriptor (a nest
    deeper than a path can name is counted too); the count stops once past `limits` ({"bytes", "entries"}), so
    a flood of files costs the watcher no more than the limit's worth."""
    used = entries = 0
    pending = []
    try:
        pending.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
    except OSError:
        return used, entries
    try:
        while pending:
            descriptor = pending.pop()
            try:
                with os.scandir(descriptor) as listing:
                    for entry in listing:
                        entries += 1
                        try:
                            status = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        used += status.st_blocks * 512  # what the disk holds: a sparse file its written pages
                        if limits is not None and (used > limits["bytes"] or entries > limits["entries"]):
                            return used, entries
                        if stat.S_ISDIR(status.st_mode):
                            try:
                                pending.append(os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                                       | os.O_CLOEXEC, dir_fd=descriptor))
                            except OSError:
                                continue
            except OSError:
                pass
            finally:
                os.close(descriptor)
    finally:
        for descriptor in pending:
            os.close(descriptor)
    return used, entries


def remove(folder, attempts=64):
    """Remove `folder` and all in it, links not followed, folders the worker locked (mode 000, or no write)
    opened again; ScratchNotRemoved, one line, where anything is left."""
    for _ in range(attempts):
        failed = []
        shutil.rmtree(folder, onerror=lambda function, path, info: failed.append((path, info[1])))
        if not os.path.lexists(folder):
            return
        # Only once the worker has ended: nothing can swap a path between the check and the chmod.
        unlocked = [_unlocked(path) | _unlocked(os.path.dirname(path)) for path, _ in failed]
        if not any(unlocked):
            break
    reason = f" ({failed[0][1].strerror}: {failed[0][0]})" if failed and isinstance(failed[0][1], OSError) else ""
    raise errors.ScratchNotRemoved(f"the conversion's scratch folder {folder} could not be removed{reason}; "
                                   "remove it by hand")


def _unlocked(path):
    """Whether `path`, a folder and not a link, was made readable, searchable and writable by us: changed
    through a descriptor opened without following a link, so the mode lands on that folder and nothing else."""
    try:
        descriptor = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if stat.S_IMODE(os.fstat(descriptor).st_mode) & 0o700 == 0o700:
            return False
        os.chmod(f"/proc/self/fd/{descriptor}", 0o700)  # an O_PATH descriptor's own inode
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)
