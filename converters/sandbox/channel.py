"""JSON lines between the supervisor and the zygote: one dict a line, read from the descriptor itself (a line
that came while the reader was busy must show to select(), not wait in a file object's buffer)."""

import json
import os
import select
import time


def send(stream, message):
    """Write `message` (a dict) to a binary stream as one line."""
    stream.write(json.dumps(message).encode() + b"\n")
    stream.flush()


class Lines:
    """The lines coming in on a descriptor."""

    def __init__(self, descriptor):
        self._descriptor = descriptor
        self._pending = b""
        self.ended = False  # the writer closed its end

    def waiting(self, timeout, also=()):
        """Whether a line (or the end) waits, after at most `timeout` seconds; `also`: descriptors that end the
        wait early."""
        ready = select.select([self._descriptor, *also], [], [], timeout)[0]
        return b"\n" in self._pending or self._descriptor in ready

    def next(self, timeout=None):
        """The next line as a dict; None at the end of input, or when none came within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._pending:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and (remaining <= 0 or not self.waiting(remaining)):
                return None
            chunk = os.read(self._descriptor, 1 << 16)
            if not chunk:
                self.ended = True
                return None
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)
