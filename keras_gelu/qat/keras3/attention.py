"""Attention as TFLite's int8 ops compute it: the scores and the attended values as BATCH_MATMULs on ranges,
masked-off scores set below the scores' range, SOFTMAX on its fixed k/256 grid.

`MultiHeadAttentionRule` computes Keras's MultiHeadAttention so, and `dot_product_attention` computes
`keras.ops.dot_product_attention` so where a composite layer calls it (`decompositions`: keras-hub's ESM, and
every MultiHeadAttention subclass with a `call` of its own, reach it through Keras's `_compute_attention`). The
backends compute that function in one call of their own (TensorFlow's einsums, a `where` with -1e9, a softmax),
which no interception sees: its scores, mask and softmax were float ops between a DEQUANTIZE and a QUANTIZE in
the int8 model.
"""

import math

from keras_gelu import replacements
from keras_gelu.flavour import keras

# A masked-off score is set this far below the scores' range, so that its softmax weight, e^-16 of the row's
# largest at most, is 0 on SOFTMAX's k/256 grid and next to nothing in its sum. Keras sets it to -1e9, which no
# int8 range holds: on the scores' own grid (TFLite's SELECT_V2 keeps its input's scale) it would land at the
# range's low end, a few hundredths below the kept scores of an untrained model, and weigh as much as they do.
# (A row masked off entirely then averages its values evenly, as the backends' -1e9 does.)
MASKED_MARGIN = 16.0


def masked_scores(scores_range, masked_range, scores, keep, training):
    """SELECT_V2 setting the scores `keep` leaves out MASKED_MARGIN below `scores_range`, onto `masked_range`,
    wide enough for them."""
    masked_off = scores_range.low - MASKED_MARGIN
    return masked_range(keras.ops.where(keep, scores, masked_off), training)


def kept(mask):
    """A mask as the booleans it means: True, or nonzero (compared in the mask's own type: an integer mask
    compared with 0.5 was a CAST to float, a float island in the int8 model)."""
    return mask if keras.backend.standardize_dtype(mask.dtype) == "bool" else keras.ops.not_equal(mask, 0)


def dot_product_attention(context, query, key, value, bias=None, mask=None, scale=None, is_causal=False,
                          flash_attention=None, attn_logits_soft_cap=None):
    """`keras.ops.dot_product_attention` (same arguments; query (B, T, N, H), key and value (B, S, K, H)) as int8
    ops, on the ranges of `context` (a `decompositions.Context`). Flash attention is a kernel, not a
    different result, and the logits' soft cap is applied by JAX's TPU kernel alone: on a CPU, each backend
    computes without them, and so does this."""
    ops, ranges, training = keras.ops, context.range, context.training
    heads, key_heads = query.shape[2], key.shape[2]
    if heads is not None and key_heads is not None and heads > key_heads:  # grouped queries: K heads, N // K each
        key = ops.repeat(key, heads // key_heads, axis=2)
        value = ops.repeat(value, heads // key_heads, axis=2)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    scores = ranges("products")(ops.einsum("btnh,bsnh->bnts", query, key), training)
    scores_range = ranges("scaled")
    scores = scores_range(ops.multiply(scores, scale), training)
    if bias is not None:
        scores_range = ranges("biased")
        scores = scores_range(scores + ops.cast(bias, scores.dtype), training)
    keep = None if mask is None else kept(mask)
    if is_causal:
        steps = ops.shape(scores)[-2:]
        causal = ops.tril(ops.ones(steps, "bool"))
        keep = causal if keep is None else ops.logical_and(keep, causal)
    if keep is not None:
        scores = masked_scores(scores_range, ranges("masked_scores"), scores, keep, training)
    probabilities = replacements.on_logistic_int8_grid(ops.softmax(scores, axis=-1))
    return ranges("attended")(ops.einsum("bnts,bsnh->btnh", probabilities, ops.cast(value, scores.dtype)),
                              training)
