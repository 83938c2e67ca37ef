"""keras_gelu.converters: SavedModel/.keras/.h5 to TFLite with every GELU spelling rewritten.

    tflite_bytes, report = keras_gelu.converters.convert("saved_model_dir", mode="builtin", exact_as="erf")

The same as the `keras-gelu-convert` command; see `converters.cli`.
"""

from keras_gelu import command_start
from keras_gelu.vocabulary import EXACT_AS
from keras_gelu.vocabulary import MODE_NAMES as MODES

# `python -m keras_gelu.converters` is the command (`__main__`), which converts in a process of its own on Keras's
# TensorFlow backend whatever the backend here (sandbox.supervisor), as `keras-gelu-convert` does: while Python
# locates it, the package is the command's alone, under any backend (see command_start).
if not command_start.the_command_is_starting():
    from keras_gelu.flavour import BACKEND

    if BACKEND != "tensorflow":
        raise ImportError(f"keras_gelu.converters computes with TensorFlow, so it runs under Keras's TensorFlow "
                          f"backend: from {BACKEND}, save the model as .keras and run `keras-gelu-convert` on it, "
                          f"which loads it there. Received: backend={BACKEND}")

    from . import errors
    from .convert import convert
    from .errors import ConversionError
    from .rewriting import patterns

__all__ = ["EXACT_AS", "MODES", "ConversionError", "convert", "errors", "patterns"]
