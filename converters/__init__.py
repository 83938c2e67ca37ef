"""keras_gelu.converters: SavedModel/.keras/.h5 to TFLite with every GELU spelling rewritten.

    tflite_bytes, report = keras_gelu.converters.convert("saved_model_dir", mode="builtin", exact_as="erf")

The same as the `keras-gelu-convert` command; see `converters.cli`.
"""

import sys

from keras_gelu.flavour import BACKEND
from keras_gelu.vocabulary import EXACT_AS
from keras_gelu.vocabulary import MODE_NAMES as MODES

# `python -m keras_gelu.converters` is the command (`__main__`), which converts in a process of its own on Keras's
# TensorFlow backend whatever the backend here (sandbox.supervisor), as `keras-gelu-convert` does. Python is
# locating that module while sys.argv[0] is "-m": under another backend the package is then the command's alone.
if BACKEND != "tensorflow" and sys.argv[:1] != ["-m"]:
    raise ImportError(f"keras_gelu.converters computes with TensorFlow, so it runs under Keras's TensorFlow "
                      f"backend: from {BACKEND}, save the model as .keras and run `keras-gelu-convert` on it, which "
                      f"loads it there. Received: backend={BACKEND}")

if BACKEND == "tensorflow":
    from . import errors
    from .convert import convert
    from .errors import ConversionError
    from .rewriting import patterns

__all__ = ["EXACT_AS", "MODES", "ConversionError", "convert", "errors", "patterns"]
