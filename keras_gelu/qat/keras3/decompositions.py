"""keras.ops functions that each backend computes in one call of its own, written as the int8 ops TFLite runs
for them, each result on a range of its own.

While a composite layer's call is intercepted (`operations.py`), such a function's result is ranged, but the
arithmetic inside it is the backend's: the int8 model held it in float between a DEQUANTIZE and a QUANTIZE
(an attention's scores, mask and softmax; a GroupNormalization's moments, a MEAN whose mean the variance
then read before its range), or TFLite has no op for it at all (FFT2D, Complex). Here it is computed from
keras.ops functions TFLite has int8 kernels for, on the ranges of a `Context` wherever TFLite rounds.

Each decomposition takes (context, *the function's arguments) and computes what the function computes; the
functions are matched by name in `DECOMPOSED`.
"""

import collections
import math

from keras_gelu.flavour import keras
from keras_gelu.qat.keras3 import attention

# range(name): this call's activation range `name` (made at the first call), called as range(x, training);
# training: whether the call trains; is_zeros(tensor): whether the tensor is zeros_like's, no data at all
Context = collections.namedtuple("Context", ["range", "training", "is_zeros"])


def moments(context, x, axes, keepdims=False, synchronized=False):
    """`keras.ops.moments` as MEAN, SQUARED_DIFFERENCE and MEAN: the mean, the squared deviations and the
    variance each on a range. (`synchronized` gathers statistics across replicas in training, which a
    single-device int8 model has none of.)"""
    ops, ranges, training = keras.ops, context.range, context.training
    mean = ranges("mean")(ops.mean(x, axis=axes, keepdims=True), training)
    squared = ranges("squared_deviation")(ops.square(x - mean), training)
    variance = ranges("variance")(ops.mean(squared, axis=axes, keepdims=True), training)
    if not keepdims:
        mean, variance = ops.squeeze(mean, axis=axes), ops.squeeze(variance, axis=axes)
    return mean, variance


def _fourier_matrices(size, dtype):
    """cos, sin and -sin of 2 pi j k / size, each on the int8 grid of [-1, 1] (a weight's, symmetric): computed
    from the size alone, so constants where the converter fixes the shapes."""
    ops = keras.ops
    steps = ops.arange(size)
    turns = ops.cast(ops.mod(steps[:, None] * steps[None, :], size), dtype) * (2 * math.pi) / ops.cast(size, dtype)
    return tuple(keras.quantizers.fake_quant_with_min_max_vars(matrix, -1.0, 1.0, num_bits=8, narrow_range=True)
                 for matrix in (ops.cos(turns), ops.sin(turns), -ops.sin(turns)))


def fft2(context, x):
    """`keras.ops.fft2((real, imaginary))` over the last two axes as products with the cosine and sine matrices
    of each, on ranges (TFLite has no FFT2D, nor complex numbers: keras-hub's FNet). An imaginary part that is
    zeros_like's is left out of the products."""
    ops, ranges, training = keras.ops, context.range, context.training
    real, imaginary = x
    imaginary = None if context.is_zeros(imaginary) else imaginary
    rows, columns = ops.shape(real)[-2], ops.shape(real)[-1]
    (row_cos, row_sin, row_minus_sin), (column_cos, column_sin, column_minus_sin) = (
        _fourier_matrices(size, real.dtype) for size in (rows, columns))

    def along_rows(matrix, value, name):
        return ranges(name)(ops.einsum("ij,...jk->...ik", matrix, value), training)

    def along_columns(value, matrix, name):
        return ranges(name)(ops.matmul(value, matrix), training)

    # e^(-i t) = cos t - i sin t: (C - iS)(A + iB) = (CA + SB) + i(CB - SA), along the rows, then the columns
    row_real, row_imaginary = along_rows(row_cos, real, "rows_cos_real"), along_rows(row_minus_sin, real,
                                                                                      "rows_minus_sin_real")
    if imaginary is not None:
        row_real = ranges("rows_real")(row_real + along_rows(row_sin, imaginary, "rows_sin_imaginary"), training)
        row_imaginary = ranges("rows_imaginary")(
            row_imaginary + along_rows(row_cos, imaginary, "rows_cos_imaginary"), training)
    result_real = ranges("real")(along_columns(row_real, column_cos, "columns_real_cos")
                                 + along_columns(row_imaginary, column_sin, "columns_imaginary_sin"), training)
    result_imaginary = ranges("imaginary")(along_columns(row_imaginary, column_cos, "columns_imaginary_cos")
                                           + along_columns(row_real, column_minus_sin, "columns_real_minus_sin"),
                                           training)
    return result_real, result_imaginary


DECOMPOSED = {"dot_product_attention": attention.dot_product_attention, "moments": moments, "fft2": fft2}
