"""Keep TensorFlow's and LiteRT's native logging off the command line's stderr.

TensorFlow's C++ core, the TFLite converter and the TFLite interpreter write
straight to file descriptor 2, past Python's sys.stderr and past
TF_CPP_MIN_LOG_LEVEL for everything absl logs before it is initialised: about
six lines at each import (CUDA probing, oneDNN, CPU instruction notices), one
per interpreter ("Created TensorFlow Lite XNNPACK delegate"), and the
converter's MLIR diagnostics, whose substance reaches us in its exception.

* `filtered` sends fd 2 to a temporary file while it runs, keeps Python's own
  stderr on the terminal, and afterwards passes on every native line that is
  not start-up chatter, so a real native warning or error still shows.
* `discarded` drops fd 2 altogether (around the TFLite converter).
* `captured` keeps what is written to fd 2, for a runtime whose only account
  of a failure or a figure is a line it prints there (TFLite Micro).
"""

import contextlib
import io
import os
import re
import sys
import tempfile
import warnings

# Start-up and delegate notices that say nothing about the user's model, in
# absl's format (TF >= 2.19: "I0000 00:00:...") and TF's own (TF 2.18:
# "2026-11-30 14:02:54.457403: I tensorflow/...").
_TF_PREFIX = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: "
CHATTER = re.compile("|".join((
    r"^I\d{4} ",  # absl INFO lines
    _TF_PREFIX + "I ",  # TF INFO lines
    r"^WARNING: All log messages before absl::InitializeLog\(\) (is|are) called are written to STDERR$",
    r"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.$",
    r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
    # No GPU here, which is fine.
    r"^([EW]\d{4} |" + _TF_PREFIX + "[EW] ).*\\b(cuda|cuInit|cuDNN|cuFFT|cuBLAS|computation_placer)",
    # oneDNN's kernels for a dtype it leaves to Eigen (int32 shape arithmetic, as in Swin's window masks).
    r"^([EW]\d{4} |" + _TF_PREFIX + "[EW] ).*oneDNN supports \\w+ only on platforms with",
)))


@contextlib.contextmanager
def _fd2_redirected_to(target_fd):
    """fd 2 goes to `target_fd` within the block; yields a duplicate of the fd 2 it had before."""
    sys.stderr.flush()
    previous = os.dup(2)
    os.dup2(target_fd, 2)
    try:
        yield previous
    finally:
        os.dup2(previous, 2)
        os.close(previous)


def _python_stderr_is_fd2():
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # pytest's capture, a StringIO
        return False


@contextlib.contextmanager
def discarded():
    """Within this block, whatever is written to fd 2 is dropped."""
    with open(os.devnull, "wb") as devnull, _fd2_redirected_to(devnull.fileno()):
        yield


def converted(converter):
    """`converter.convert()` (the stock TFLite converter's), without its own chatter.

    Its native diagnostics are dropped: their substance is in the exception it raises (and it prints "Ignored
    output_format" and the like on every run). So is its warning about input statistics whenever an int8 model
    keeps float inputs or carries FakeQuant ranges of its own: our interface, not a user concern.
    """
    with discarded(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Statistics for quantized inputs were expected")
        return converter.convert()


@contextlib.contextmanager
def captured():
    """Within this block, fd 2 is held back; yields a list that afterwards holds its lines."""
    lines = []
    with tempfile.TemporaryFile() as held:
        try:
            with _fd2_redirected_to(held.fileno()):
                yield lines
        finally:
            held.seek(0)
            lines.extend(line for line in held.read().decode(errors="replace").splitlines() if line.strip())


@contextlib.contextmanager
def filtered(show_all=False):
    """Within this block, native lines on fd 2 are held back; afterwards all but CHATTER are printed."""
    if show_all:
        yield
        return
    python_stderr = sys.stderr
    with tempfile.TemporaryFile() as held:
        with _fd2_redirected_to(held.fileno()) as terminal:
            if _python_stderr_is_fd2():
                sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(terminal), "wb"), line_buffering=True,
                                              encoding=python_stderr.encoding, errors="backslashreplace")
            try:
                yield
            finally:
                if sys.stderr is not python_stderr:
                    sys.stderr.close()
                    sys.stderr = python_stderr
        held.seek(0)
        for line in held.read().decode(errors="replace").splitlines():
            if line.strip() and not CHATTER.search(line):
                print(line, file=sys.stderr)
