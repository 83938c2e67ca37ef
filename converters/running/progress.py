"""Which step of a conversion is running, for whoever must say so if the process dies in it (the sandbox's
worker writes it where its supervisor reads it)."""

_listeners = []


def listen(callback):
    """Call `callback(stage)` at each step from now on."""
    _listeners.append(callback)


def entered(stage):
    """A step begins: "load", "rewrite", "convert", "verify", or a runtime's run ("verify: TFLite Micro")."""
    for callback in _listeners:
        callback(stage)
