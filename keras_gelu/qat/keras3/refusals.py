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


def no_rule(layer, subclassed_model, why=""):
    """The NoInt8Rule for a layer without a rule, none for each of its sublayers either (`why`: which, and why,
    a sentence), named for keep_float by the model's layer holding it; `subclassed_model`: whether it is one,
    whose call() quantize_model sees into only through the sublayers."""
    holders = getattr(_state, "quantizing", None)
    kept = holders[0] if holders else layer.name
    kind = type(layer).__name__
    if subclassed_model:
        return refusal(layer, f"quantize_model quantizes Sequential and functional models, nested ones too; "
                              f"{layer.name} is a subclassed model, whose call() it cannot see into. Register a "
                              f"rule for {kind}, or keep it float with keep_float=[{kept!r}]. {why}"
                              f"Received: layer={layer.name}")
    return refusal(layer, f"quantize_model has no rule for layer {layer.name} ({kind}), nor for each of its "
                          f"sublayers: register one with keras_gelu.qat.register_rule({kind}, rule), or keep it "
                          f"float with keep_float=[{kept!r}]. {why}Received: layer={layer.name}")


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
