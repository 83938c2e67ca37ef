"""keras_gelu.converters: SavedModel/.keras/.h5 to TFLite with every GELU spelling rewritten.

    tflite_bytes, report = keras_gelu.converters.convert("saved_model_dir", mode="builtin", exact_as="erf")

The same as the `keras-gelu-convert` command; see `converters.cli`.
"""

from keras_gelu.flavour import BACKEND
from keras_gelu.vocabulary import EXACT_AS
from keras_gelu.vocabulary import MODE_NAMES as MODES

if BACKEND != "tensorflow":
    raise ImportError(f"keras_gelu.converters computes with TensorFlow, so it runs under Keras's TensorFlow "
                      f"backend: from {BACKEND}, save the model as .keras and run `keras-gelu-convert` on it, which "
                      f"loads it there. Received: backend={BACKEND}")

from . import errors  # noqa: E402
from .convert import convert  # noqa: E402
from .errors import ConversionError  # noqa: E402
from .rewriting import patterns  # noqa: E402

__all__ = ["EXACT_AS", "MODES", "ConversionError", "convert", "errors", "patterns"]
