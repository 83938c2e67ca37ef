"""Keep TensorFlow's and LiteRT's native start-up chatter off the command line's stderr.

TensorFlow's C++ core and the TFLite interpreter write straight to file
descriptor 2, past Python's sys.stderr and past TF_CPP_MIN_LOG_LEVEL for
everything absl logs before it is initialised: about six lines at each
import (CUDA probing, oneDNN, CPU instruction notices) and one per
interpreter ("Created TensorFlow Lite XNNPACK delegate"). `filtered` sends
fd 2 to a temporary file while it runs, keeps Python's own stderr on the
terminal, and afterwards passes on every native line that is not such
chatter, so a real native warning or error still reaches the user.
"""

import contextlib
import io
import os
import re
import sys
import tempfile

# Start-up and delegate notices that say nothing about the user's model.
CHATTER = re.compile("|".join((
    r"^I\d{4} ",  # absl INFO lines
    r"^WARNING: All log messages before absl::InitializeLog\(\) (is|are) called are written to STDERR$",
    r"^INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.$",
    r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
    r"^[EW]\d{4} .*\b(cuda|cuInit|cuDNN|cuFFT|cuBLAS|computation_placer)",  # no GPU here, which is fine
)))


def _python_stderr_is_fd2():
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # pytest's capture, a StringIO
        return False


@contextlib.contextmanager
def filtered(show_all=False):
    """Within this block, native lines on fd 2 are held back; afterwards all but CHATTER are printed."""
    if show_all:
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    python_stderr = sys.stderr
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        if _python_stderr_is_fd2():
            sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(terminal), "wb"), line_buffering=True,
                                          encoding=python_stderr.encoding, errors="backslashreplace")
        try:
            yield
        finally:
            if sys.stderr is not python_stderr:
                sys.stderr.close()
                sys.stderr = python_stderr
            os.dup2(terminal, 2)
            os.close(terminal)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines():
                if line.strip() and not CHATTER.search(line):
                    print(line, file=sys.stderr)
