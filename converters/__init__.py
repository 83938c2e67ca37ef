"""keras_gelu.converters: SavedModel/.keras/.h5 to TFLite with every GELU spelling rewritten.

    tflite_bytes, report = keras_gelu.converters.convert("saved_model_dir", mode="builtin", exact_as="erf")

The same as the `keras-gelu-convert` command; see `converters.cli`.
"""

from keras_gelu.vocabulary import EXACT_AS
from keras_gelu.vocabulary import MODE_NAMES as MODES

from . import errors
from . import patterns
from .convert import convert
from .errors import ConversionError

__all__ = ["EXACT_AS", "MODES", "ConversionError", "convert", "errors", "patterns"]
