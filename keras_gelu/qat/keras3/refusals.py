"""What the Keras 3 engine refuses to quantize, and `keep_float="auto"`, which keeps exactly that float.

A refusal is about one layer of the model: the layer itself, or the model's
layer (a composite) that holds it, since keep_float keeps a model's layers
whole. Keras re-raises an exception from inside a layer's call as a new one
of its class, with a longer message and without the original, so the layer
a refusal is about is recorded as the refusal is made, by `refusal`.
"""

import contextlib
import threading

_state = threading.local()


class NoInt8Rule(ValueError):
    """quantize_model cannot quantize a layer as its int8 op computes it; keep_float=[its name] leaves it float."""


def refusal(layer, message):
    """The NoInt8Rule to raise for `layer`, recorded for keep_float="auto" as about the model's layer holding it."""
    holders = getattr(_state, "quantizing", None)
    refused = getattr(_state, "refused", None)
    if refused is not None:
        refused.append((holders[0] if holders else layer.name, message))
    return NoInt8Rule(message)


@contextlib.contextmanager
def quantizing(layer):
    """While a wrapper builds or calls `layer`: a refusal made inside is about the outermost such layer."""
    holders = _state.__dict__.setdefault("quantizing", [])
    holders.append(layer.name)
    try:
        yield
    finally:
        holders.pop()


def keeping_refused_layers_float(quantize):
    """keep_float="auto": `quantize(keep_float)`, with each layer it refuses kept float and tried again; the QAT
    model and {layer name: why it is float}, in the order they were found."""
    kept = {}
    while True:
        _state.refused = []
        try:
            return quantize(set(kept)), kept
        except ValueError:
            if not _state.refused or _state.refused[0][0] in kept:
                raise
            name, message = _state.refused[0]
            kept[name] = message
        finally:
            _state.refused = None
