"""keras.ops functions that each backend computes in one call of its own, written as the int8 ops TFLite runs
for them, each result on a range of its own.

While a composite layer's call is intercepted (`operations.py`), such a function's result is ranged, but the
arithmetic inside it is the backend's: the int8 model held it in float between a DEQUANTIZE and a QUANTIZE
(an attention's scores, mask and softmax; a GroupNormalization's moments, a MEAN whose mean the variance
then read before its range). Here it is computed from keras.ops functions TFLite has int8 kernels for, with
`ranges(name)` (this call's activation range `name`) wherever TFLite rounds.

Each decomposition takes (ranges, training, *the function's arguments) and computes what the function
computes; the functions are matched by name in `DECOMPOSED`.
"""

from keras_gelu.flavour import keras
from keras_gelu.qat.keras3 import attention


def moments(ranges, training, x, axes, keepdims=False, synchronized=False):
    """`keras.ops.moments` as MEAN, SQUARED_DIFFERENCE and MEAN: the mean, the squared deviations and the
    variance each on a range. (`synchronized` gathers statistics across replicas in training, which a
    single-device int8 model has none of.)"""
    ops = keras.ops
    mean = ranges("mean")(ops.mean(x, axis=axes, keepdims=True), training)
    squared = ranges("squared_deviation")(ops.square(x - mean), training)
    variance = ranges("variance")(ops.mean(squared, axis=axes, keepdims=True), training)
    if not keepdims:
        mean, variance = ops.squeeze(mean, axis=axes), ops.squeeze(variance, axis=axes)
    return mean, variance


DECOMPOSED = {"dot_product_attention": attention.dot_product_attention, "moments": moments}
