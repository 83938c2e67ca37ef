"""Deprecated: QAT moved to `keras_gelu.qat`, which has every name this module had.

`keras_gelu.quantization.quantize_model` and the rest still work, each with a
DeprecationWarning naming its new place.
"""

import warnings

from keras_gelu import qat


def __getattr__(name):
    value = getattr(qat, name)  # AttributeError, with qat's explanation, for what qat has not
    warnings.warn(f"keras_gelu.quantization.{name} moved to keras_gelu.qat.{name}", DeprecationWarning, stacklevel=2)
    return value
