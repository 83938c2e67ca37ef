"""keras_gelu.converters: SavedModel/.keras/.h5 to TFLite with every GELU spelling rewritten.

    tflite_bytes, report = keras_gelu.converters.convert("saved_model_dir", mode="builtin", form="erf")

The same as the `keras-gelu-convert` command; see `converters.cli`.
"""

from . import errors
from . import patterns
from .convert import convert
from .errors import ConversionError
from .options import FORMS
from .options import MODES

__all__ = ["FORMS", "MODES", "ConversionError", "convert", "errors", "patterns"]
