"""TensorFlow's and LiteRT's native logging: what of it a user sees, and what the converter reads.

TensorFlow's C++ core, the TFLite converter and the TFLite interpreter write
straight to file descriptor 2, past Python's sys.stderr and past
TF_CPP_MIN_LOG_LEVEL for everything absl logs before it is initialised: about
six lines at each import (CUDA probing, oneDNN, CPU instruction notices), one
per interpreter ("Created TensorFlow Lite XNNPACK delegate"), and the
converter's MLIR diagnostics, whose substance reaches us in its exception.
The sandbox's worker writes all of it to its log; the command shows it before
its report or its one error line.

* `worth_showing` picks the lines of a log a user should see: not CHATTER,
  not a traceback a library logged and went on from.
* `discarded` drops fd 2 altogether (around the TFLite converter).
* `captured` keeps what is written to a descriptor, for a runtime whose only
  account of a failure or a figure is a line it prints (TFLite Micro, Vela).
"""

import contextlib
import os
import re
import sys
import tempfile
import warnings

from . import safe_text

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
    # A kernel's failure restated, and the allocator's account of an allocation that failed: the error says it.
    r"^([EW]\d{4} |" + _TF_PREFIX + "[EW] ).*(OP_REQUIRES failed|bfc_allocator|cpu_allocator|allocator\\.cc)",
)))
_TRACEBACK = ("Traceback (most recent call last):", "During handling of the above exception",
              "The above exception was the direct cause")


def worth_showing(lines):
    """The lines of a conversion process's log worth a user's eyes: not CHATTER, and not a Python traceback
    that a library logged and went on from (the error that ended the conversion, if any, is one line)."""
    shown, in_traceback = [], False
    for line in lines:
        if line.startswith(_TRACEBACK):
            in_traceback = True
        elif in_traceback:
            in_traceback = line.startswith((" ", "\t"))  # its last line, the exception, is not indented
        elif line.strip() and not CHATTER.search(line):
            shown.append(line)
    return shown


# What marks a line of the conversion process's log: whatever it says, it is not the tool speaking.
ATTRIBUTION = "model: "


def attributed(lines):
    """Lines the conversion process printed, shown as its own: each after ATTRIBUTION, with every character a
    terminal would act on escaped (safe_text.inert). The process ran the model, whose prints are among them;
    none of them can pass for the tool's own line, an error line above the real last one included."""
    return [ATTRIBUTION + safe_text.inert(line) for line in lines]


@contextlib.contextmanager
def _redirected(descriptor, target):
    """`descriptor` goes to `target` within the block."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    previous = os.dup(descriptor)
    os.dup2(target, descriptor)
    try:
        yield
    finally:
        os.dup2(previous, descriptor)
        os.close(previous)


@contextlib.contextmanager
def discarded():
    """Within this block, whatever is written to fd 2 is dropped."""
    with open(os.devnull, "wb") as devnull, _redirected(2, devnull.fileno()):
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
def captured(descriptors=(2,)):
    """Within this block, what is written to `descriptors` is held back; yields a list that afterwards holds
    its lines."""
    lines = []
    with tempfile.TemporaryFile() as held, contextlib.ExitStack() as redirections:
        try:
            for descriptor in descriptors:
                redirections.enter_context(_redirected(descriptor, held.fileno()))
            yield lines
        finally:
            redirections.close()
            held.seek(0)
            lines.extend(line for line in held.read().decode(errors="replace").splitlines() if line.strip())
