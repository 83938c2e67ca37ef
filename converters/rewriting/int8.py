"""Integer (int8) conversion: the int8 graph passes, QAT ranges, calibration data and exact GELU ranges.

Two sources of int8 ranges:

* Quantization-aware models (tfmot) carry FakeQuant ops with trained ranges.
  Their GELUs are quantized at input and output only, so the ops a GELU is
  rewritten into need ranges for their intermediate tensors. Each is a
  function of one int8 input, which takes only 256 values: we evaluate the
  replacement on exactly those values and fake-quantize every intermediate to
  its true min/max. Nothing is clipped and the int8 model stays integer.
* Float models are calibrated by the TFLite converter (post-training
  quantization) on --calibration data: an .npz of samples or random:N.
"""

import functools
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from keras_gelu import formulas
from keras_gelu import replacements

from .. import errors
from . import graph
from . import integer_valued

FAKE_QUANT_OPS = ("FakeQuantWithMinMaxVars", "FakeQuantWithMinMaxArgs")
# Below this, a Maximum(x, c) is keras_gelu's -inf clamp.
_LOWEST_FLOAT32 = float(np.finfo(np.float32).min)

_RANDOM_CALIBRATION = re.compile(r"^random:(\d+)$")


def is_quantization_aware(graph_def):
    return any(node.op in FAKE_QUANT_OPS for node in graph_def.node)


def _scalar(name, nodes):
    value = graph.constant_value(name, nodes)
    return None if value is None or value.size != 1 else float(value.reshape(()))


def _is_lowest_float(name, nodes):
    value = _scalar(name, nodes)
    return value is not None and value <= _LOWEST_FLOAT32


def _is_zero(name, nodes):
    return _scalar(name, nodes) == 0.0


def _innermost_else(name, nodes):
    """The value a chain of SelectV2(cond, c, SelectV2(...)) ends in: the x of LearnableGELU's two bounds."""
    node = graph.producer(name, nodes)
    while node is not None and node.op in ("Select", "SelectV2"):
        name = graph.data_inputs(node)[2]
        node = graph.producer(name, nodes)
    return name


def _guarded_value(node, nodes):
    """The tensor a keras_gelu inf/NaN guard passes through for finite inputs, or None.

    * Maximum(x, lowest float32): the -inf clamp of the fixed forms.
    * SelectV2(x > 1e20, 1e20, x) and SelectV2(x < -1e20, -1e20, x): LearnableGELU's bounds on the x
      its sigmoid takes.
    * SelectV2(IsInf(x), ..., x): LearnableGELU's clamp of +-inf.
    * SelectV2(Equal(g, 0), ZerosLike(..), x * g): its 0 * inf guard; x * g is 0 there anyway.
    """
    operands = graph.data_inputs(node)
    if node.op == "Maximum":
        for kept, bound in ((operands[0], operands[1]), (operands[1], operands[0])):
            if _is_lowest_float(bound, nodes):
                return kept
        return None
    if node.op not in ("Select", "SelectV2"):
        return None
    condition = graph.producer(operands[0], nodes)
    if condition is None:
        return None
    otherwise = graph.resolve(operands[2], nodes)
    if condition.op == "IsInf" and graph.resolve(condition.input[0], nodes) == otherwise:
        return operands[2]
    if condition.op in ("Greater", "Less"):
        compared, bound_name = graph.data_inputs(condition)
        value = _scalar(bound_name, nodes)
        bound = formulas.LEARNABLE_GATE_X_BOUND
        if (value is not None and abs(abs(value) - bound) <= 1e-6 * bound and _scalar(operands[1], nodes) == value
                and graph.resolve(compared, nodes) == graph.resolve(_innermost_else(otherwise, nodes), nodes)):
            return operands[2]
    if condition.op == "Equal":
        compared = [graph.resolve(name, nodes) for name in graph.data_inputs(condition) if not _is_zero(name, nodes)]
        when_zero = graph.producer(operands[1], nodes)
        product = graph.producer(otherwise, nodes)
        if (len(compared) == 1 and when_zero is not None and when_zero.op == "ZerosLike" and product is not None
                and product.op == "Mul"
                and compared[0] in {graph.resolve(name, nodes) for name in graph.data_inputs(product)}):
            return operands[2]
    return None


def drop_non_finite_guards(graph_def):
    """Bypass keras_gelu's inf/NaN guards: int8 tensors are finite, so they are the identity there.

    Returns how many were bypassed (their ops are pruned later as dead).
    """
    nodes = graph.nodes_by_name(graph_def)
    dropped = 0
    for node in list(graph_def.node):
        kept = _guarded_value(node, nodes)
        if kept is not None:
            graph.redirect(graph_def, node.name, kept)
            dropped += 1
    return dropped


def negations_as_multiplications(graph_def):
    """Rewrite Neg(x) as Mul(x, -1): TFLite's quantizer leaves NEG in float, an int8 MUL it quantizes.

    Keras's LayerNormalization negates its mean, so without this every
    LayerNormalization would be a float island. Returns how many were rewritten.
    """
    rewritten = 0
    for node in list(graph_def.node):
        if node.op != "Neg":
            continue
        dtype = tf.as_dtype(node.attr["T"].type)
        minus_one = graph_def.node.add()
        minus_one.name = node.name + "/minus_one"
        minus_one.op = "Const"
        minus_one.attr["dtype"].type = dtype.as_datatype_enum
        minus_one.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(-1, dtype=dtype, shape=[]))
        node.op = "Mul"
        controls = [name for name in node.input if name.startswith("^")]
        operands = graph.data_inputs(node)
        del node.input[:]
        node.input.extend(operands + [minus_one.name] + controls)
        rewritten += 1
    return rewritten


def squares_as_multiplications(graph_def):
    """Rewrite Square(x) and Pow(x, 2) as Mul(x, x): TFLite's SQUARE and POW have float kernels only, and its
    int8 model computed an RMS normalization's square in float between a DEQUANTIZE and a QUANTIZE (keras-hub's
    MobileNetV5, Gemma; MiT's x ** 2). The square of a difference stays: TFLite fuses Square(Sub(x, y)) into an
    int8 SQUARED_DIFFERENCE (a LayerNormalization's variance). Returns how many were rewritten."""
    nodes = graph.nodes_by_name(graph_def)
    rewritten = 0
    for node in graph_def.node:
        operands = graph.data_inputs(node)
        if node.op == "Pow":
            exponent = graph.constant_value(operands[1], nodes)
            if exponent is None or exponent.size != 1 or float(exponent.reshape(())) != 2.0:
                continue
            _square_as_product(node, operands[0])
            rewritten += 1
            continue
        if node.op != "Square" or getattr(graph.producer(operands[0], nodes), "op", None) == "Sub":
            continue
        _square_as_product(node, operands[0])
        rewritten += 1
    return rewritten


def _square_as_product(node, operand):
    """Make `node` Mul(operand, operand), its control inputs kept."""
    controls = [name for name in node.input if name.startswith("^")]
    del node.input[:]
    node.input.extend([operand, operand] + controls)
    node.op = "Mul"


def squared_differences_as_products(graph_def):
    """Rewrite SquaredDifference(x, y) and Square(Sub(x, y)) as Mul(d, d) of d = Sub(x, y), for 16x8: LiteRT's
    SQUARED_DIFFERENCE has no int16 kernel ("only supports FLOAT32 and INT32"), which every LayerNormalization's
    variance met; SUB and MUL have. Returns how many were rewritten."""
    nodes = graph.nodes_by_name(graph_def)
    rewritten = 0
    for node in list(graph_def.node):
        operands = graph.data_inputs(node)
        if node.op == "SquaredDifference":
            difference = graph_def.node.add(name=f"{node.name}/difference", op="Sub")
            difference.input.extend(operands[:2])
            difference.attr["T"].CopyFrom(node.attr["T"])
            if node.device:
                difference.device = node.device
            operands = [difference.name]
        elif node.op != "Square" or getattr(graph.producer(operands[0], nodes), "op", None) != "Sub":
            continue
        _square_as_product(node, operands[0])
        rewritten += 1
    return rewritten


_BATCH_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
# data format -> (the axes a batch's statistics are taken over, the shape a scale or offset of channels takes)
_BATCH_AXES = {b"NHWC": ([0, 1, 2], [-1]), b"NCHW": ([0, 2, 3], [1, -1, 1, 1])}


def _fill_of(name, nodes, value):
    """Whether tensor `name` is a Fill of the constant `value`, of whatever shape (a shape computed at run time,
    as tf-keras's LayerNormalization makes its scale of ones and offset of zeros)."""
    node = graph.producer(name, nodes)
    if node is None or node.op != "Fill":
        return False
    filled = graph.constant_value(graph.data_inputs(node)[1], nodes)
    return filled is not None and filled.size == 1 and float(filled.reshape(())) == value


def _moments(x, *affine, axes, by_channel, epsilon, scaled, shifted):
    """[x normalized by its mean and biased variance over `axes`, times the scale and plus the offset (reshaped to
    `by_channel`) where `scaled` and `shifted` (`affine`'s tensors, in that order)], as FusedBatchNorm computes in
    training."""
    centred = x - tf.reduce_mean(x, axes, keepdims=True)
    normalized = centred * tf.math.rsqrt(tf.reduce_mean(centred * centred, axes, keepdims=True) + epsilon)
    affine = list(affine)
    if scaled:
        normalized = normalized * tf.reshape(affine.pop(0), by_channel)
    if shifted:
        normalized = normalized + tf.reshape(affine.pop(0), by_channel)
    return [normalized]


def batch_statistics_as_moments(graph_def):
    """Rewrite a FusedBatchNorm that normalizes by its own batch's statistics (is_training), which is what
    tf-keras's LayerNormalization runs on its rows, reshaped to four axes, as the mean, the centred values, their
    mean square and its Rsqrt, for 16x8: the stock converter lowers the op itself, into a SQUARED_DIFFERENCE
    LiteRT has no int16 kernel for and a FILL of zeros its quantizer puts on scale 0, where these ops have int16
    kernels. Its scale of ones and offset of zeros are left out; another scale and offset are applied by channel.
    Only where nothing reads the statistics it also returns. Returns how many were rewritten."""
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    rewritten = 0
    for node in list(graph_def.node):
        if node.op not in _BATCH_NORMS:
            continue
        layout = _BATCH_AXES.get(graph.attribute(node, "data_format", b"NHWC"))
        if (layout is None or not graph.attribute(node, "is_training", True)
                or any(readers.get(f"{node.name}:{index}") for index in range(1, 6))):
            continue
        axes, by_channel = layout
        x, scale, offset = graph.data_inputs(node)[:3]
        dtype = tf.dtypes.as_dtype(node.attr["T"].type)
        scaled, shifted = not _fill_of(scale, nodes, 1.0), not _fill_of(offset, nodes, 0.0)
        operands = [(name, dtype, None) for name, kept in ((x, True), (scale, scaled), (offset, shifted)) if kept]
        build = functools.partial(_moments, axes=axes, by_channel=by_channel,
                                  epsilon=graph.attribute(node, "epsilon", 1e-4), scaled=scaled, shifted=shifted)
        (normalized,) = graph.splice_many(graph_def, build, operands, f"{node.name}/moments", nodes)
        graph.redirect(graph_def, node.name, normalized)
        rewritten += 1
    return rewritten


def sums_as_means(graph_def):
    """Rewrite a float Sum over constant axes as the Mean over them times the count of the values it sums, for
    16x8: the older quantizer gives an int16 SUM its input's grid (LiteRT's kernel rescales 8-bit sums only), on
    which a sum past its input's range saturates. Hugging Face's Wav2Vec2 sums its attention mask of ones to each
    sample's length, which at 1 made every frame count after it wrong and the output zeros (cosine 0.0 to the
    float model, where int8 keeps 0.998). A MEAN stays within its input's range, and the MUL rescales. The count
    is a constant where the summed axes' sizes are known, else computed from the shape (integers, which 16x8
    leaves alone). Returns how many were rewritten."""
    nodes = graph.nodes_by_name(graph_def)
    found = []
    for node in graph_def.node:
        if node.op == "Sum" and node.attr["T"].type == tf.float32.as_datatype_enum:
            axes = graph.constant_value(graph.data_inputs(node)[1], nodes)
            if axes is not None:
                found.append((node, [int(axis) for axis in np.ravel(axes)]))
    shapes = graph.static_shapes(graph_def, [graph.data_inputs(node)[0] for node, _ in found]) if found else {}
    for node, axes in found:
        operand = graph.data_inputs(node)[0]
        shape, keep_dims = shapes[operand], bool(graph.attribute(node, "keep_dims", False))
        sizes = [None if shape.rank is None else shape[axis] for axis in axes]
        count = None if None in sizes else float(np.prod(sizes))

        def as_mean(x, axes=axes, keep_dims=keep_dims, count=count):
            counted = count if count is not None else tf.cast(
                tf.reduce_prod(tf.gather(tf.shape(x), tf.math.floormod(axes, tf.rank(x)))), tf.float32)
            return [tf.reduce_mean(x, axes, keepdims=keep_dims) * counted]

        (result,) = graph.splice_many(graph_def, as_mean, [(operand, tf.float32, None)], f"{node.name}/as_mean",
                                      nodes)
        graph.redirect(graph_def, node.name, result)
    return len(found)


# What a 16x8 conversion runs after GRAPH_PASSES: the spellings LiteRT has no int16 kernel for, or none that
# computes them.
INT16_PASSES = (batch_statistics_as_moments, squared_differences_as_products, sums_as_means)


def _in_four_axes(first, second):
    """The two shapes with adjacent axes merged where each operand is whole or broadcast alike, of at most four
    axes; None where more remain."""
    rank = max(len(first), len(second))
    first, second = [1] * (rank - len(first)) + list(first), [1] * (rank - len(second)) + list(second)
    merged = []  # [kind, first's size, second's size]; an axis of size 1 in both merges with any
    for a, b in zip(first, second):
        kind = None if a == b == 1 else (a == max(a, b), b == max(a, b))
        if merged and (kind is None or merged[-1][0] in (None, kind)):
            merged[-1] = [merged[-1][0] if kind is None else kind, merged[-1][1] * a, merged[-1][2] * b]
        else:
            merged.append([kind, a, b])
    if len(merged) > 4:
        return None
    return [a for _, a, _ in merged], [b for _, _, b in merged]


def squared_differences_in_four_axes(graph_def):
    """Rewrite a float SquaredDifference(x, y), or Square(Sub(x, y)), of five or more axes as the
    SquaredDifference of x and y reshaped to four, where merging axes that broadcast alike leaves four; returns
    how many were.

    TFLite's SQUARED_DIFFERENCE broadcasts four axes at most: past them, the
    converter computes a SUB and a SQUARE, in float (a GroupNormalization of
    images reshapes them to five, (batch, height, width, groups, channels per
    group): keras-hub SAM 3's pixel decoder). Merged axes hold the same values
    in the same order: the same differences.
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    found = []
    for node in graph_def.node:
        operands = graph.data_inputs(node)
        if node.op == "Square":
            difference = graph.producer(operands[0], nodes)
            if difference is None or difference.op != "Sub" or len(readers.get(graph.canonical(operands[0]),
                                                                                 ())) != 1:
                continue
            operands = graph.data_inputs(difference)
        elif node.op != "SquaredDifference":
            continue
        if tf.as_dtype(node.attr["T"].type).is_floating:
            found.append((node, operands))
    if not found:
        return 0
    shapes = graph.static_shapes(graph_def, [operand for _, operands in found for operand in operands])
    rewritten = 0
    for node, (x, y) in found:
        x_shape, y_shape = shapes[x], shapes[y]
        if not (x_shape.is_fully_defined() and y_shape.is_fully_defined()) or max(x_shape.rank, y_shape.rank) <= 4:
            continue
        folded = _in_four_axes(x_shape.as_list(), y_shape.as_list())
        if folded is None:
            continue
        x_folded, y_folded = folded
        output_shape = tf.broadcast_static_shape(x_shape, y_shape).as_list()

        def in_four_axes(first, second):
            return [tf.reshape(tf.math.squared_difference(tf.reshape(first, x_folded), tf.reshape(second, y_folded)),
                               output_shape)]

        dtype = tf.as_dtype(node.attr["T"].type)
        (squared,) = graph.splice_many(graph_def, in_four_axes, [(x, dtype, x_shape), (y, dtype, y_shape)],
                                       node.name + "/in_four_axes/", nodes)
        graph.redirect(graph_def, node.name, squared)
        rewritten += 1
    return rewritten


def zeros_like_as_multiplications(graph_def):
    """Rewrite a float ZerosLike(x) as Mul(x, 0): TFLite's ZEROS_LIKE has no int8 kernel, and Gemma's attention
    selected between its output and zeros_like of it in float. x is finite in an int8 model, so the product is
    exactly 0. Returns how many were rewritten."""
    rewritten = 0
    for node in list(graph_def.node):
        if node.op != "ZerosLike" or not tf.as_dtype(node.attr["T"].type).is_floating:
            continue
        dtype = tf.as_dtype(node.attr["T"].type)
        zero = graph_def.node.add(name=node.name + "/zero", op="Const")
        zero.attr["dtype"].type = dtype.as_datatype_enum
        zero.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0, dtype=dtype, shape=[]))
        node.op = "Mul"
        node.input.insert(1, zero.name)
        rewritten += 1
    return rewritten


def one_hots_as_selections(graph_def):
    """Rewrite a float OneHot(ids, depth, on, off) along the last axis as SelectV2(Equal(ids[..., None],
    Range(depth)), on, off): TFLite's ONE_HOT takes no quantized values, and refused the QAT model of GPT-OSS's
    router, whose one-hot rows are rounded; an int32 comparison and an int8 SELECT_V2 compute the same rows.
    Returns how many were rewritten."""
    rewritten = 0
    for node in list(graph_def.node):
        if node.op != "OneHot" or graph.attribute(node, "axis", -1) != -1 \
                or not tf.as_dtype(node.attr["T"].type).is_floating:
            continue
        ids, depth, on_value, off_value = graph.data_inputs(node)
        if tf.as_dtype(node.attr["TI"].type) != tf.int32:
            cast = graph_def.node.add(name=node.name + "/ids", op="Cast")
            cast.attr["SrcT"].type = node.attr["TI"].type
            cast.attr["DstT"].type = tf.int32.as_datatype_enum
            cast.input.append(ids)
            ids = cast.name
        constants = {}
        for name, value in (("zero", 0), ("one", 1), ("last_axis", -1)):
            constant = graph_def.node.add(name=f"{node.name}/{name}", op="Const")
            constant.attr["dtype"].type = tf.int32.as_datatype_enum
            constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=tf.int32, shape=[]))
            constants[name] = constant.name
        positions = graph_def.node.add(name=node.name + "/positions", op="Range")
        positions.attr["Tidx"].type = tf.int32.as_datatype_enum
        positions.input.extend([constants["zero"], depth, constants["one"]])
        column = graph_def.node.add(name=node.name + "/column", op="ExpandDims")
        column.attr["T"].type = tf.int32.as_datatype_enum
        column.attr["Tdim"].type = tf.int32.as_datatype_enum
        column.input.extend([ids, constants["last_axis"]])
        equal = graph_def.node.add(name=node.name + "/equal", op="Equal")
        equal.attr["T"].type = tf.int32.as_datatype_enum
        equal.input.extend([column.name, positions.name])
        controls = [name for name in node.input if name.startswith("^")]
        node.op = "SelectV2"
        dtype = node.attr["T"].type
        for attribute in list(node.attr):
            del node.attr[attribute]
        node.attr["T"].type = dtype
        del node.input[:]
        node.input.extend([equal.name, on_value, off_value] + controls)
        rewritten += 1
    return rewritten


def _scattered_by_selection(tensor, indices, updates):
    """tf.tensor_scatter_nd_update(tensor, indices, updates) as a SELECT_V2 of the updates gathered where an index
    lands, the update's position among them scattered in int32 (a tensor's leading axes hold how many of
    `indices`' last axis says)."""
    indices = tf.cast(indices, tf.int32)
    depth = tf.shape(indices)[-1]
    flat_indices = tf.reshape(indices, tf.stack([-1, depth]))
    count = tf.shape(flat_indices)[0]
    leading = tf.shape(tensor)[:depth]
    # duplicate indices, whose update TensorFlow leaves undefined, add up here: kept within the updates
    positions = tf.minimum(tf.scatter_nd(flat_indices, tf.range(1, count + 1), leading), count)
    rows = tf.reshape(updates, tf.concat([[count], tf.shape(tensor)[depth:]], 0))
    # and a row of zeros after them, which no position selects: where no update comes (Longformer's scatter of its
    # local positions when every one is global), the gather still has a row 0 to read
    rows = tf.pad(rows, tf.concat([[[0, 1]], tf.zeros(tf.stack([tf.rank(rows) - 1, 2]), tf.int32)], 0))
    gathered = tf.gather(rows, tf.maximum(positions - 1, 0))
    landed = tf.reshape(positions > 0, tf.concat([leading, tf.ones([tf.rank(tensor) - depth], tf.int32)], 0))
    return [tf.where(landed, gathered, tensor)]


def scatter_updates_as_selections(graph_def):
    """Rewrite a float TensorScatterUpdate (`keras.ops.scatter_update`) as a SELECT_V2 of the updates, gathered by
    their positions scattered in int32; returns how many were.

    TFLite's SCATTER_ND, which the converter lowers it to, takes no
    quantized values: the QAT model of SAM 3's geometry encoder, which writes
    its box embeddings after each prompt's text tokens, was refused. An int32
    SCATTER_ND, an int8 GATHER (the updates' grid) and a SELECT_V2 compute the
    same tensor.
    """
    rewritten = 0
    for node in list(graph_def.node):
        if node.op != "TensorScatterUpdate" or not tf.as_dtype(node.attr["T"].type).is_floating:
            continue
        tensor, indices, updates = graph.data_inputs(node)
        dtype = tf.as_dtype(node.attr["T"].type)
        (selected,) = graph.splice_many(graph_def, _scattered_by_selection, [
            (tensor, dtype, None), (indices, tf.as_dtype(node.attr["Tindices"].type), None), (updates, dtype, None)],
            node.name + "/as_selection/")
        graph.redirect(graph_def, node.name, selected)
        rewritten += 1
    return rewritten


# An attention mask's fill: the magnitude of what it adds to a score it masks, at least this (BERT's -1e4, BART's
# -1e8, tf-keras's Softmax -1e9, float32's lowest; GPT-2 and Funnel subtract theirs). Half of it below its row's
# largest score, exp is 0 in float32.
_MASK_FILL = 1e4
# The ops an attention mask is made by from its inputs and constants, each with its operands that carry values
# (those not listed are shapes, axes, multiples, or a selection's condition).
_MASK_MAKING = {"Identity": (0,), "StopGradient": (0,), "Neg": (0,), "Reshape": (0,), "ExpandDims": (0,),
                "Squeeze": (0,), "Transpose": (0,), "Tile": (0,), "BroadcastTo": (0,), "StridedSlice": (0,),
                "Slice": (0,), "MatrixBandPart": (0,), "MatrixSetDiag": (0, 1), "MatrixSetDiagV2": (0, 1),
                "MatrixSetDiagV3": (0, 1), "Fill": (1,), "OnesLike": (), "ZerosLike": (),
                "Select": (1, 2), "SelectV2": (1, 2),
                "Add": (0, 1), "AddV2": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Minimum": (0, 1), "Maximum": (0, 1),
                "Pack": slice(None), "ConcatV2": slice(0, -1)}
# What may lie between a masked sum and its softmax: ops that move values (and additions of a constant).
_SOFTMAX_WAY = ("Identity", "Reshape", "ExpandDims", "Squeeze", "Transpose")
_SUMS = ("Add", "AddV2", "Sub")


def _mask_fill(name, nodes, library):
    """The largest magnitude of a float constant tensor `name` is made from, at most float32's largest, where it
    is made from inputs and constants by _MASK_MAKING ops alone, conditionals' branches too (an attention mask: a
    padding mask's (1 - mask) * -1e4, a causal mask's band, Whisper's chosen by a tf.cond on the length) and that
    magnitude is at least _MASK_FILL; else None. `library`: {name: FunctionDef}."""
    largest = _largest_constant(name, nodes, library, {})
    return None if largest is None or largest < _MASK_FILL else min(largest, -_LOWEST_FLOAT32)


def _largest_constant(name, nodes, library, arguments):
    """_mask_fill's largest magnitude, of any size, or None; `arguments`: {a function body's argument: the walk
    of the tensor its caller passes}."""
    pending, seen, largest = [name], set(), 0.0
    while pending:
        tensor = pending.pop()
        node = nodes.get(graph.split_tensor_name(tensor)[0])
        if node is None:
            return None
        if node.name in seen:
            continue
        seen.add(node.name)
        if node.op == "Const":
            value = tf.make_ndarray(node.attr["value"].tensor)
            if value.dtype.kind == "f" and value.size:
                largest = max(largest, float(np.max(np.abs(value))))
        elif node.op == "Placeholder":  # an input, or an argument of the branch being walked
            caller = arguments.get(node.name)
            found = 0.0 if caller is None else caller()
            if found is None:
                return None
            largest = max(largest, found)
        elif node.op == "Cast":  # from an integer or boolean: a mask's condition, its values none of them a fill
            if tf.as_dtype(node.attr["SrcT"].type).is_floating:
                pending.append(node.input[0])
        elif graph.branches(node):  # an If or a Case
            operands = graph.data_inputs(node)[1:]
            for branch in graph.branches(node):
                if branch not in library:
                    return None
                body, outputs, _ = graph.function_as_graph(library[branch], library)
                passed = {argument.name: functools.partial(_largest_constant, operand, nodes, library, arguments)
                          for argument, operand in zip(library[branch].signature.input_arg, operands)}
                found = _largest_constant(outputs[graph.split_tensor_name(tensor)[1]], graph.nodes_by_name(body),
                                          library, passed)
                if found is None:
                    return None
                largest = max(largest, found)
        elif node.op in _MASK_MAKING:
            positions = _MASK_MAKING[node.op]
            operands = graph.data_inputs(node)
            pending.extend(operands[positions] if isinstance(positions, slice)
                           else [operands[position] for position in positions])
        else:
            return None
    return largest


def _scalar_operand(node, nodes):
    """The operand of `node` that is a constant of one value, or None."""
    for operand in graph.data_inputs(node):
        value = graph.constant_value(operand, nodes)
        if value is not None and value.size == 1:
            return operand
    return None


def _softmax_sum(softmax, readers, nodes):
    """(the sum `softmax` alone reads, through _SOFTMAX_WAY ops and additions of a constant, and those additions
    each with the operand it adds the constant to: Hugging Face's stable_softmax adds 1e-9), or None where it
    reads no such sum."""
    tensor, shifts = graph.data_inputs(softmax)[0], []
    while len(readers.get(graph.canonical(tensor), ())) == 1:
        node = nodes.get(graph.split_tensor_name(tensor)[0])
        if node is None:
            return None
        if node.op in _SOFTMAX_WAY:
            tensor = graph.data_inputs(node)[0]
        elif node.op in _SUMS:
            shift = _scalar_operand(node, nodes)
            if shift is None:
                return node, shifts
            if node.op == "Sub" and shift != graph.data_inputs(node)[1]:
                return None  # a constant less the rest: the softmax of the rest negated
            tensor = next(operand for operand in graph.data_inputs(node) if operand != shift)
            shifts.append((node, tensor))
        else:
            return None
    return None


def _selected_fill(name, nodes):
    """(the SelectV2 computing tensor `name`, the position, 1 or 2, of its branch that is a mask's fill: a float
    constant whose every value is of magnitude _MASK_FILL or more), or None."""
    node = nodes.get(graph.split_tensor_name(name)[0])
    if node is None or node.op != "SelectV2":
        return None
    for position in (1, 2):
        value = graph.constant_value(graph.data_inputs(node)[position], nodes)
        if value is not None and value.size and value.dtype.kind == "f" and np.all(np.abs(value) >= _MASK_FILL):
            return node, position
    return None


# The ops a product or quotient by a constant is spelled with: {op: whether the constant may be either operand}
_SCALINGS = {"Mul": True, "RealDiv": False, "Div": False}


def _selected(condition, fill, other, position):
    """The selection by `condition` of `fill` at `position` (1: where it holds, 2: where it does not) and of
    `other` at the other."""
    return tf.where(condition, fill, other) if position == 1 else tf.where(condition, other, fill)


def _scaled(condition, scores, factor, fill, position, scaling):
    """The selection by `condition` of `scores` scaled by `factor` as `scaling` (an op of _SCALINGS) scales, and of
    `fill` (already scaled, a constant: what _selected_fill finds) at `position`."""
    scaled = tf.multiply(scores, factor) if scaling == "Mul" else tf.divide(scores, factor)
    return [_selected(condition, tf.constant(fill, scores.dtype), scaled, position)]


def scalings_into_selections(graph_def):
    """Rewrite a product or quotient by a constant of one value of a selection of a mask's fill (_selected_fill)
    as the selection of the product or quotient of each branch, the fill's a constant again; returns how many
    were.

    Hugging Face's GPT-J selects -1e9 where its causal mask masks, then
    divides by the square root of its head size, and the quotient's range,
    the fill's, held its scores on steps of 7,630 at 16x8 (a million at
    int8): every score one value, and LiteRT's int16 SOFTMAX on that grid
    weighed masked positions too (cosine 0.986 to the float model). Selected
    last, the fill is a constant that quantizer.softmax_floors floors, or a
    term that added_masks_as_selections splits off."""
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    rewritten = 0
    for node in list(graph_def.node):
        if node.op not in _SCALINGS or node.attr["T"].type != tf.float32.as_datatype_enum:
            continue
        operands = graph.data_inputs(node)[:2]
        for selection, factor in (operands, operands[::-1]) if _SCALINGS[node.op] else (operands,):
            value = graph.constant_value(factor, nodes)
            found = _selected_fill(selection, nodes)
            if value is None or value.size != 1 or found is None \
                    or len(readers.get(graph.canonical(selection), ())) != 1:
                continue
            select, position = found
            condition, *branches = graph.data_inputs(select)
            fill = graph.constant_value(branches[position - 1], nodes).astype(np.float32)
            fill = fill * value.reshape(()) if node.op == "Mul" else fill / value.reshape(())
            (scaled,) = graph.splice_many(
                graph_def, functools.partial(_scaled, fill=fill, position=position, scaling=node.op),
                [(condition, tf.bool, None), (branches[2 - position], tf.float32, None), (factor, tf.float32, None)],
                node.name + "/into_selection/", nodes)
            graph.redirect(graph_def, node.name, scaled)
            rewritten += 1
            break
    return rewritten


def _split_selection(condition, first, second, position):
    """(the scores a selection of a fill chooses, 0 where it chooses the fill; the fill where it chooses it, 0
    elsewhere): two terms whose sum it is."""
    zero = tf.constant(0, first.dtype)
    fill, scores = (first, second) if position == 1 else (second, first)
    return [_selected(condition, zero, scores, position), _selected(condition, fill, zero, position)]


def _terms(total, readers, nodes, library):
    """[(tensor, 1 or -1, its _mask_fill)]: the tensors the sum `total` adds or subtracts, through the sums among
    them that it alone reads and that are not a mask (CLIP adds its causal mask, then its padding mask)."""
    terms, pending = [], [(total, 1)]
    while pending:
        tensor, sign = pending.pop()
        node = nodes.get(graph.split_tensor_name(tensor)[0])
        is_sum = node is not None and node.op in _SUMS
        fill = None if tensor == total else _mask_fill(tensor, nodes, library)
        if is_sum and (tensor == total or (len(readers.get(graph.canonical(tensor), ())) == 1 and fill is None)):
            first, second = graph.data_inputs(node)
            pending += [(first, sign), (second, -sign if node.op == "Sub" else sign)]
        else:
            terms.append((tensor, sign, fill))
    return terms


# The smallest constant a product by one is written with (_over): TensorFlow's quantizer gives a constant a range
# at least 1e-6 wide, on whose grid a factor of 1e-9 (a fill of -1e9: T5Gemma's) was 0.
_SMALLEST_FACTOR = 1e-4


def _over(tensor, divisor):
    """tensor / divisor as products by constants of _SMALLEST_FACTOR or more, as many as that takes."""
    while divisor > 1 / _SMALLEST_FACTOR:
        tensor, divisor = tensor * tf.constant(_SMALLEST_FACTOR, tensor.dtype), divisor * _SMALLEST_FACTOR
    return tensor * tf.constant(1 / divisor, tensor.dtype)


def _masked_by_selection(*terms, signs, fills):
    """The sum of `terms`, each times its sign, with the largest fill's negative selected where a term whose fill
    is given (a mask) is at most minus half its fill.

    Each mask is divided by its fill, then compared to -0.5: LiteRT's int8
    comparison of the mask, on steps of 4e5 for a fill of 1e8, with the
    constant on a grid of its own, found no masked position. A mask's other
    values are added multiplied by 1: selected, the quantizer's grids of a
    selection would put the mask on its other values' grid (a range of
    [0, 0]), and added as they are, the sum's range would reach the fill."""
    dtype = terms[0].dtype
    signed = [term if sign > 0 else term * tf.constant(-1, dtype) for term, sign in zip(terms, signs)]
    masks = [(term, fill) for term, fill in zip(signed, fills) if fill is not None]
    masked = functools.reduce(tf.logical_or, [_over(mask, fill) <= tf.constant(-0.5, dtype) for mask, fill in masks])
    unmasked = tf.where(masked, tf.constant(0, dtype), tf.constant(1, dtype))
    kept = functools.reduce(tf.add, [term for term, fill in zip(signed, fills) if fill is None] + [
        mask * unmasked for mask, _ in masks])  # not AddN: the terms broadcast
    return [tf.where(masked, tf.constant(-max(fills, key=lambda fill: fill or 0), dtype), kept)]


def added_masks_as_selections(graph_def):
    """Rewrite a sum a Softmax alone reads where some of its terms are attention masks (_mask_fill: made of a
    constant of magnitude 1e4 or more) and some are not (the scores): minus the largest fill selected where a
    mask is at most minus half its fill, the sum elsewhere; additions of a constant on the way to the softmax are
    dropped (it computes the same of every row shifted alike). Returns how many sums were rewritten.

    The sum's range reached down to the fill, and on its grid every score
    rounded to one value: a tf-keras MultiHeadAttention with a causal mask
    kept cosine 0.90 at int8 and 0.49 at 16x8, a BERT-style padding mask
    calibrated on padded samples 0.37, Hugging Face's BART 0.94 and Whisper
    0.96 (the suite's models, and the sweep's). Selected, the fill is a constant
    that quantizer.softmax_floors floors, and the scores keep their own
    range. In float the softmax computes the same where masks only lower the
    scores (as every mask here does): a masked score, half a fill or further
    below its row's largest, gave 0, and gives 0; a mask that is not so low
    anywhere is added as it was. (A row masked throughout, which no causal or
    padding mask makes, computes equal weights where it computed the softmax
    of its scores shifted by the fill.)
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    library = {function.signature.name: function for function in graph_def.library.function}
    rewritten = 0
    for softmax in [node for node in graph_def.node if node.op == "Softmax"]:
        found = _softmax_sum(softmax, readers, nodes)
        if found is None:
            continue
        total, shifts = found
        dtype = tf.as_dtype(total.attr["T"].type)
        terms = []
        for term, sign, fill in _terms(total.name, readers, nodes, library):
            selected = None if fill is not None or len(readers.get(graph.canonical(term), ())) != 1 \
                else _selected_fill(term, nodes)
            if selected is None:
                terms.append((term, sign, fill))
                continue
            select, position = selected  # scores with a fill selected: the scores' term and the fill's, a mask
            halves = graph.splice_many(graph_def, functools.partial(_split_selection, position=position),
                                       list(zip(graph.data_inputs(select), (tf.bool, dtype, dtype),
                                                (None,) * 3)), select.name + "/split/", nodes)
            terms += [(halves[0], sign, None), (halves[1], sign, _mask_fill(halves[1], nodes, library))]
        terms, signs, fills = zip(*terms)
        if all(fill is None for fill in fills) or all(fill is not None for fill in fills):
            continue
        (selected,) = graph.splice_many(graph_def, functools.partial(_masked_by_selection, signs=signs, fills=fills),
                                        [(term, dtype, None) for term in terms], total.name + "/as_selection/",
                                        nodes)
        for shift, shifted in shifts:  # before the sum's readers move: a shift may read the sum itself
            graph.redirect(graph_def, shift.name, shifted)
        graph.redirect(graph_def, total.name, selected)
        rewritten += 1
    return rewritten


def biases_before_reshapes(graph_def):
    """Rewrite BiasAdd(Reshape(MatMul(x, w)), b) as Reshape(BiasAdd(MatMul(x, w), b)).

    That is how tf-keras's Dense runs on inputs of rank 3 or more (through
    tf.tensordot). With the Reshape in between, TFLite cannot fuse the bias
    into its FULLY_CONNECTED, which then has no int8 range and stays float.
    Adding the bias before the Reshape computes the same values (the bias
    runs along the last axis, which the Reshape keeps). Returns how many were
    moved.
    """
    nodes = graph.nodes_by_name(graph_def)
    moved = 0
    for node in list(graph_def.node):
        if node.op not in ("BiasAdd", "Add", "AddV2"):
            continue
        operands = graph.data_inputs(node)
        reshape = nodes.get(graph.split_tensor_name(operands[0])[0])
        bias = graph.constant_value(operands[1], nodes)
        if reshape is None or reshape.op != "Reshape" or bias is None or bias.ndim != 1:
            continue
        matmul = nodes.get(graph.split_tensor_name(graph.data_inputs(reshape)[0])[0])
        if matmul is None or matmul.op != "MatMul" or graph.attribute(matmul, "transpose_b", False):
            continue
        weights = graph.constant_value(graph.data_inputs(matmul)[1], nodes)
        if weights is not None and weights.shape[-1] != bias.shape[0]:
            continue
        early_bias = graph_def.node.add()
        early_bias.CopyFrom(node)
        early_bias.name = node.name + "/before_reshape"
        del early_bias.input[:]
        early_bias.input.extend([matmul.name, operands[1]])
        late_reshape = graph_def.node.add()
        late_reshape.CopyFrom(reshape)
        late_reshape.name = node.name + "/reshaped"
        late_reshape.input[0] = early_bias.name
        graph.redirect(graph_def, node.name, late_reshape.name, keep={late_reshape.name})
        moved += 1
    return moved


# The ops whose outputs fake_quants_read_by_every_reader moves readers off: arithmetic, which computes new
# values. An op that moves values (a Reshape, a ConcatV2) keeps its input's int8 scale in TFLite, and a
# FakeQuant as its one reader would ask for another.
_ARITHMETIC = ("Add", "AddV2", "BiasAdd", "Sub", "Mul")


def fake_quants_read_by_every_reader(graph_def):
    """Where a computed float tensor is read by one FakeQuant and by other ops, point the others at the
    FakeQuant's output. Returns how many readers moved.

    A composite layer's own arithmetic (keras-hub's `x + residual`) is
    fake-quantized where a sublayer reads it, and its Python code hands the
    unrounded tensor to its next operation as well. TFLite gives an op's
    output the FakeQuant's range only where nothing else reads it; otherwise
    the op stays float, between a DEQUANTIZE and a QUANTIZE. The int8 model
    holds the tensor rounded for every reader, and so does the graph from
    here on: the QAT model's other reader saw it unrounded, half a step of
    that tensor's range at most.
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    moved = 0
    for tensor, tensor_readers in readers.items():
        fake_quants = [node for node, position in tensor_readers if node.op in FAKE_QUANT_OPS and position == 0]
        producer = nodes.get(graph.split_tensor_name(tensor)[0])
        if len(fake_quants) != 1 or len(fake_quants) == len(tensor_readers) or producer is None \
                or producer.op not in _ARITHMETIC:
            continue
        for node, position in tensor_readers:
            if node is not fake_quants[0]:
                node.input[position] = fake_quants[0].name
                moved += 1
    return moved


def _repeated(graph_def, nodes, chosen):
    """The nodes `chosen(node)` selects that repeat another (the same op, the same tensors or equal constants
    read, the same attributes), as lists, the first node of each the one repeated."""

    def operand(name):
        value = graph.constant_value(name, nodes)
        return graph.resolve(name, nodes) if value is None else (value.dtype.str, value.shape)

    groups = {}
    for node in graph_def.node:
        if chosen(node):
            signature = (node.op, tuple(operand(name) for name in graph.data_inputs(node)),
                         tuple(sorted((name, value.SerializeToString()) for name, value in node.attr.items()
                                      if name != "_class")))
            groups.setdefault(signature, []).append(node)
    repeats = []
    for group in groups.values():
        kept = []
        for node in group:  # constants of one shape compared by value only here
            values = [graph.constant_value(name, nodes) for name in graph.data_inputs(node)]
            same = next((first for first in kept if all(
                (a is None) == (b is None) and (a is None or np.array_equal(a, b))
                for a, b in zip(values, first[1]))), None)
            if same is None:
                kept.append((node, values, []))
            else:
                same[2].append(node)
        repeats.extend([first, *others] for first, _, others in kept if others)
    return repeats


def repeated_fake_quants_merged(graph_def):
    """Point the readers of a FakeQuant that repeats another (the same tensor or an equal constant, the same
    range, the same attributes) at the first; returns how many moved.

    A layer called twice rounds its weights at each call, each from its own read of them: a shared Embedding
    (Bart's encoder and decoder tokens) gave two FakeQuants of two equal tables, and TFLite gathered both
    lookups from a float table, between a DEQUANTIZE and a QUANTIZE.
    """
    moved = 0
    for first, *others in _repeated(graph_def, graph.nodes_by_name(graph_def),
                                    lambda node: node.op in FAKE_QUANT_OPS):
        for node in others:
            graph.redirect(graph_def, node.name, first.name)
            moved += 1
    return moved


def _range(fake_quant, nodes):
    """A FakeQuant's (min, max, num_bits, narrow_range), or None where its min or max is not constant."""
    if fake_quant.op == "FakeQuantWithMinMaxArgs":
        low, high = graph.attribute(fake_quant, "min", -6.0), graph.attribute(fake_quant, "max", 6.0)
    else:
        low, high = (graph.constant_value(name, nodes) for name in graph.data_inputs(fake_quant)[1:3])
        if low is None or high is None or low.size != 1 or high.size != 1:
            return None
        low, high = float(low.reshape(())), float(high.reshape(()))
    return low, high, graph.attribute(fake_quant, "num_bits", 8), graph.attribute(fake_quant, "narrow_range", False)


def _float_constant(graph_def, name, value):
    """Add a float32 scalar Const named `name`; returns its name."""
    constant = graph_def.node.add(name=name, op="Const")
    constant.attr["dtype"].type = tf.float32.as_datatype_enum
    constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value, dtype=tf.float32, shape=[]))
    return name


def _fake_quant_node(graph_def, name, tensor, fake_quant_range):
    """Add a FakeQuantWithMinMaxVars of `tensor` on (min, max, num_bits, narrow_range); returns its name."""
    low, high, num_bits, narrow_range = fake_quant_range
    node = graph_def.node.add(name=name, op="FakeQuantWithMinMaxVars")
    node.input.extend([tensor, _float_constant(graph_def, f"{name}/min", low),
                       _float_constant(graph_def, f"{name}/max", high)])
    node.attr["num_bits"].i, node.attr["narrow_range"].b = num_bits, narrow_range
    return name


def _clipped(graph_def, name, tensor, own_range, wider_range):
    """`tensor` clipped to `own_range`'s (min, max) where it is narrower than `wider_range`'s: an int8 MAXIMUM or
    MINIMUM on the wider range's scale. TFLite folds a FakeQuant of a FakeQuant's output into the inner one, and
    with it the outer range's clipping, which this keeps. Returns the clipped tensor's name."""
    for op, bound, narrower in (("Maximum", own_range[0], own_range[0] > wider_range[0]),
                                ("Minimum", own_range[1], own_range[1] < wider_range[1])):
        if narrower:
            clip = graph_def.node.add(name=f"{name}/{op.lower()}", op=op)
            clip.attr["T"].type = tf.float32.as_datatype_enum
            clip.input.extend([tensor, _float_constant(graph_def, f"{clip.name}/bound", bound)])
            tensor = clip.name
    return tensor


def repeated_computations_on_one_range(graph_def):
    """Compute once what the graph computes more than once from the same operands where only FakeQuants read
    each copy, onto a FakeQuant of the union of their ranges, which each of theirs reads; returns how many copies
    went.

    TFLite's converter computes such copies once, and an op whose result
    FakeQuants on two ranges read it leaves float, between a DEQUANTIZE and a
    QUANTIZE per range: the MEAN of two LayerNormalizations reading one
    residual tensor (keras-hub Depth Anything's next block and its norm of an
    intermediate output). Computed once onto the union of the ranges, the op
    is int8, and each range's reader requantizes from it: where one range
    holds the others (most often), its readers see what they saw, and the
    others' half a step of the union's grid more at most.
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)

    def read_by_fake_quants_alone(node):
        definition = op_def_registry.get(node.op)
        if definition is None or definition.is_stateful or node.op in FAKE_QUANT_OPS or len(
                definition.output_arg) != 1 or definition.output_arg[0].number_attr or not definition.input_arg:
            return False
        node_readers = readers.get(graph.canonical(node.name), ())
        return bool(node_readers) and all(reader.op in FAKE_QUANT_OPS and position == 0
                                          for reader, position in node_readers)

    merged = 0
    for group in _repeated(graph_def, nodes, read_by_fake_quants_alone):
        fake_quants = [reader for node in group for reader, _ in readers[graph.canonical(node.name)]]
        ranges = [_range(fake_quant, nodes) for fake_quant in fake_quants]
        if None in ranges or len({bits_and_narrow[2:] for bits_and_narrow in ranges}) != 1:
            continue
        computed = group[0].name
        low, high = min(low for low, *_ in ranges), max(high for _, high, *_ in ranges)
        if len(set(ranges)) > 1:
            computed = _fake_quant_node(graph_def, f"{computed}/on_every_range", computed, (low, high, *ranges[0][2:]))
        for fake_quant, own_range in zip(fake_quants, ranges):
            fake_quant.input[0] = computed if computed == group[0].name else _clipped(
                graph_def, f"{fake_quant.name}/of_its_range", computed, own_range, (low, high))
        merged += len(group) - 1
    return merged


def one_table_per_lookup(graph_def):
    """Give each GATHER of a fake-quantized constant table after the first a FakeQuant of its own, its top an
    ulp of float32 higher per reader; returns how many were given one.

    TFLite computes every GATHER of one quantized constant in float, from a DEQUANTIZEd table (a shared
    Embedding: Bart's encoder and decoder tokens, T5's), while two tables on two grids each stay int8. An ulp
    of 3.0 is 2.4e-7: the grids differ by a step's 1e-7, the int8 rows are the same ones.
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    given = 0
    for fake_quant in list(graph_def.node):
        if fake_quant.op != "FakeQuantWithMinMaxVars" or graph.constant_value(
                graph.data_inputs(fake_quant)[0], nodes) is None:
            continue
        high = graph.constant_value(graph.data_inputs(fake_quant)[2], nodes)
        lookups = [node for node, position in readers.get(graph.canonical(fake_quant.name), ())
                   if node.op == "GatherV2" and position == 0]
        if high is None or high.size != 1 or len(lookups) < 2:
            continue
        top = np.float32(high.reshape(()))
        for lookup in lookups[1:]:
            top = np.nextafter(top, np.float32(np.inf))
            raised = graph_def.node.add(name=f"{lookup.name}/table_max", op="Const")
            raised.attr["dtype"].type = tf.float32.as_datatype_enum
            raised.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(top, dtype=tf.float32, shape=high.shape))
            own = graph_def.node.add()
            own.CopyFrom(fake_quant)
            own.name = f"{lookup.name}/table"
            own.input[2] = raised.name
            lookup.input[0] = own.name
            given += 1
    return given


def fake_quants_of_constants_folded(graph_def):
    """Where a FakeQuant reads another's output computed from constants alone (a rotary table, where the
    input's shape is fixed), hand it that output as a constant; returns how many were.

    TFLite folds what constants compute, the FakeQuants among it: of three in
    a row (DINOv3's rotary table, on ranges of the embedding layer, of the
    encoder and of the block that reads it), it refused the EXPAND_DIMS after
    the last, whose input it left on the middle one's scale. The constant holds
    the values the inner ones give; the outer one rounds them on its grid, as
    the QAT model does, and TFLite stores them on it.
    """
    nodes = graph.nodes_by_name(graph_def)
    stateless = graph.STATELESS_OPS
    folded = 0
    for node in list(graph_def.node):
        if node.op not in FAKE_QUANT_OPS:
            continue
        inner = graph.producer(graph.data_inputs(node)[0], nodes)
        if inner is None or inner.op not in FAKE_QUANT_OPS or graph.constant_value(
                graph.data_inputs(inner)[0], nodes) is not None:
            continue  # (a FakeQuant of a Const is TFLite's quantized constant already)
        value = graph.constant_subgraph_value(graph.data_inputs(node)[0], graph_def, nodes, stateless)
        if value is None:
            continue
        constant = graph_def.node.add(name=f"{node.name}/folded_input", op="Const")
        constant.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
        constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        node.input[0] = constant.name
        folded += 1
    return folded


def additions_of_zeros_dropped(graph_def):
    """Point the readers of x + z (or x - z) at x where z is computed from constants alone and is all zeros
    along x's last axis at most (a bias, rounded to zeros on a range of [0, 0]); returns how many moved.

    TFLite folds such an addition away, and with it the requantization
    between the range before it and the one after: where the two nudge to
    grids a fraction of a step apart (keras-hub Depth Anything's last
    LayerNormalization, whose beta's range after one step of training is
    [0, 0]), it refused the STRIDED_SLICE reading the second, on the first's
    scale. Here the two ranges are in a row, and merged where they are one
    grid (fake_quants_on_one_grid_merged).
    """
    nodes = graph.nodes_by_name(graph_def)
    stateless = graph.STATELESS_OPS
    additions = []  # (the addition, the operand it adds zeros to)
    for node in list(graph_def.node):
        if node.op not in ("Add", "AddV2", "BiasAdd", "Sub"):
            continue
        operands = graph.data_inputs(node)
        for kept, added in ((0, 1), (1, 0)) if node.op in ("Add", "AddV2") else ((0, 1),):
            if graph.constant_value(operands[kept], nodes) is not None:
                continue
            value = graph.constant_subgraph_value(operands[added], graph_def, nodes, stateless)
            if value is None or np.any(value) or any(size != 1 for size in value.shape[:-1]):
                continue
            additions.append((node, operands[kept]))
            break
    # zeros wider than the operand's last axis broadcast it (TAPAS adds its [1] segment ids to zeros of [16]): the
    # sum's shape is not the operand's, and the addition stays
    shapes = graph.static_shapes(graph_def, [name for node, kept in additions for name in (node.name, kept)]) \
        if additions else {}
    dropped = 0
    for node, kept in additions:
        if shapes[node.name].rank is not None and shapes[node.name].as_list() == shapes[kept].as_list():
            graph.redirect(graph_def, node.name, kept)
            dropped += 1
    return dropped


def _on_one_grid(first, second, nodes, steps=1e-3):
    """Whether FakeQuant tensors first and second round to one grid, up to `steps` of a step of it."""
    return _within_steps(input_grid(first, nodes), input_grid(second, nodes), steps)


def _within_steps(first_grid, second_grid, steps):
    """Whether two grids (or None) are `steps` of a step of the second apart at most, value for value."""
    return first_grid is not None and second_grid is not None and np.max(
        np.abs(first_grid - second_grid)) <= steps * float(second_grid[1] - second_grid[0])


# How far apart, in steps, two grids in a row may be for the second to be dropped: the values it gave move by
# that much at most (Depth Anything's last LayerNormalization calibrated: 0.012 of a step)
_MERGED_WITHIN_STEPS = 0.05


def fake_quants_on_one_grid_merged(graph_def):
    """Point the readers of FakeQuant(FakeQuant(x)) at the inner one where both nudge to one grid; returns how
    many moved.

    Two ranges learned apart can land on one grid (a LayerNormalization
    without beta: its normalized values' range, and its output's, set from
    the values on the first): the same scale up to float32 rounding and the
    same zero point. TFLite takes them for two scales, and refuses the RESHAPE
    that reads the second (keras-hub Moonshine). Or on grids a twentieth of a
    step apart at most (Depth Anything's last LayerNormalization, before and
    after an addition of zeros: scales 1.4e-6 apart after a training step,
    0.012 of a step apart at the far end where quantize_model calibrated its
    ranges), which TFLite folded into one op's input and output. The values
    move by that much at most.
    """
    nodes = graph.nodes_by_name(graph_def)
    merged = 0
    for node in graph_def.node:
        if node.op not in FAKE_QUANT_OPS:
            continue
        inner = graph.data_inputs(node)[0]
        producer = nodes.get(graph.split_tensor_name(inner)[0])
        if producer is None or producer.op not in FAKE_QUANT_OPS:
            continue
        if not _on_one_grid(node.name, inner, nodes, _MERGED_WITHIN_STEPS):
            continue
        graph.redirect(graph_def, node.name, inner)
        merged += 1
    return merged


# Ops that move their first input's values and compute none: TFLite holds their int8 output on their input's
# scale (the same-scale constraint of RESHAPE, TRANSPOSE, STRIDED_SLICE, GATHER, ...).
_VALUE_MOVING = ("Identity", "StopGradient", "Reshape", "Transpose", "StridedSlice", "Slice", "ExpandDims",
                 "Squeeze", "GatherV2", "Tile", "BroadcastTo")


def fake_quants_after_value_moving_ops(graph_def):
    """Where a FakeQuant reads what ops that only move values made of a tensor, keep one grid along them; returns
    how many FakeQuants changed.

    A composite layer's Python code slices a tensor with the backend's own
    `x[..., :n]` (keras-hub GPT-NeoX's fused query-key-value), which no
    interception of keras.ops sees: the slice is put on a range of its own
    where an operation reads it, and TFLite refuses a STRIDED_SLICE whose
    output's scale is not its input's (nor does it take a FakeQuant of a
    FakeQuant's output into such an op). Two cases:

    * the values come from a FakeQuant: they are on its grid already, and the
      later FakeQuant is dropped; its readers see them on that grid, which
      differs from the dropped one's rounding by half a step of it at most;
    * they come from a float op: the FakeQuant moves before the ops that move
      them, where it gives the same values (it rounds each value on its own),
      and TFLite quantizes that op's output on it.
    """
    changed = 0
    nodes = graph.nodes_by_name(graph_def)
    for fake_quant in list(graph_def.node):
        if fake_quant.op not in FAKE_QUANT_OPS:
            continue
        chain, tensor = [], graph.data_inputs(fake_quant)[0]
        while True:
            name, index = graph.split_tensor_name(tensor)
            producer = nodes.get(name)
            if producer is None or producer.op not in _VALUE_MOVING or index != 0:
                break
            chain.append(producer)
            tensor = graph.data_inputs(producer)[0]
        if all(mover.op == "Identity" for mover in chain) or producer is None or producer.op == "Const":
            continue  # (an Identity has no scale of its own in TFLite: a FakeQuant of one is a requantization)
        if producer.op in FAKE_QUANT_OPS:
            graph.redirect(graph_def, fake_quant.name, graph.data_inputs(fake_quant)[0])
        else:  # the FakeQuant first, then a copy of each op, the last under the FakeQuant's name
            early = graph_def.node.add()
            early.CopyFrom(fake_quant)
            early.name = f"{fake_quant.name}/before_{chain[-1].op.lower()}"
            early.input[0] = tensor
            previous = early.name
            for depth, mover in enumerate(reversed(chain)):
                copy = graph_def.node.add() if depth < len(chain) - 1 else fake_quant
                name = f"{fake_quant.name}/moved_{depth}" if depth < len(chain) - 1 else fake_quant.name
                controls = [control for control in copy.input if control.startswith("^")]
                copy.CopyFrom(mover)
                copy.name = name
                copy.input[0] = previous
                copy.input.extend(control for control in controls if control not in copy.input)
                previous = name
        changed += 1
    return changed


def stacks_as_concatenations(graph_def):
    """Rewrite a float Pack(x1, ..., xn, axis) as ConcatV2(ExpandDims(x1, axis), ..., ExpandDims(xn, axis), axis);
    returns how many were.

    TFLite's int8 PACK takes its operands on its result's scale and
    requantizes none: stacked values on ranges of their own (SAM 3's sines
    and cosines of box positions) were refused, or, computed by int8 ops,
    copied onto the result's scale unconverted (wrong values). Its
    CONCATENATION requantizes each operand, and an EXPAND_DIMS keeps its
    operand's scale: the same values, each operand on its own grid.
    """
    rewritten = 0
    for node in list(graph_def.node):
        if node.op != "Pack" or not tf.as_dtype(node.attr["T"].type).is_floating:
            continue
        axis = graph.attribute(node, "axis", 0)
        axis_constant = graph_def.node.add(name=node.name + "/axis", op="Const")
        axis_constant.attr["dtype"].type = tf.int32.as_datatype_enum
        axis_constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(axis, dtype=tf.int32, shape=[]))
        controls = [name for name in node.input if name.startswith("^")]
        operands = graph.data_inputs(node)
        if len(operands) == 1:  # (ConcatV2 takes two or more)
            dtype = node.attr["T"].type
            for attribute in list(node.attr):
                del node.attr[attribute]
            node.op = "ExpandDims"
            node.attr["T"].type = dtype
            node.attr["Tdim"].type = tf.int32.as_datatype_enum
            del node.input[:]
            node.input.extend(operands + [axis_constant.name] + controls)
            rewritten += 1
            continue
        expanded = []
        for position, operand in enumerate(operands):
            expand = graph_def.node.add(name=f"{node.name}/expanded_{position}", op="ExpandDims")
            expand.attr["T"].type = node.attr["T"].type
            expand.attr["Tdim"].type = tf.int32.as_datatype_enum
            expand.input.extend([operand, axis_constant.name])
            expanded.append(expand.name)
        dtype = node.attr["T"].type
        for attribute in list(node.attr):
            del node.attr[attribute]
        node.op = "ConcatV2"
        node.attr["T"].type = dtype
        node.attr["N"].i = len(expanded)
        node.attr["Tidx"].type = tf.int32.as_datatype_enum
        del node.input[:]
        node.input.extend(expanded + [axis_constant.name] + controls)
        rewritten += 1
    return rewritten


# Ops whose int8 operands TFLite holds on their result's scale (CONCATENATION, SELECT_V2, MAXIMUM, MINIMUM; a PACK
# is a CONCATENATION by then): an operand on a scale of its own is requantized, one on none takes the result's.
_ONE_GRID = ("ConcatV2", "Pack", "Select", "SelectV2", "Maximum", "Minimum")
# Ops that move values into several outputs, each on their input's scale in TFLite (SPLIT, SPLIT_V, UNPACK), and
# the position of the values they move among their operands.
_VALUE_SPLITTING = {"Split": 1, "SplitV": 0, "Unpack": 0}


def _value_readers(readers, tensor):
    """The ops that read `tensor`'s values (its shape's readers aside), from graph.consumers' `readers`."""
    return [reader for reader, _ in readers.get(graph.canonical(tensor), ()) if reader.op not in graph.SHAPE_READERS]


def one_grid_operands_on_their_grid(graph_def):
    """Where an op that requantizes its operands reads one that ops moving values made of a FakeQuant's output,
    through a tensor that other ops read too, fake-quantize that operand again on the FakeQuant's range; returns
    how many were.

    TFLite gives such an operand, on no scale of its own in the graph, the one
    the op's operands and result share, and passes it up the ops that moved
    it. Where it meets the FakeQuant, it requantizes; where it meets a tensor
    that another op reads on another scale, it refuses: the STRIDED_SLICE of
    GPT-NeoX's query, sliced from the fused query-key-value and read by the
    slice of its rotary part (split and stacked) and of the rest (concatenated
    with the rotated part), each on a range of its own. Stated again, the
    FakeQuant's range holds along the ops, and the requantization is the
    op's. The values are on that grid already: the FakeQuant changes none.
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    added = 0
    for node in list(graph_def.node):
        if node.op not in _ONE_GRID:
            continue
        for position, operand in enumerate(node.input):
            if operand.startswith("^"):
                continue
            tensor, shared = operand, False
            while True:
                name, index = graph.split_tensor_name(tensor)
                producer = nodes.get(name)
                if producer is None or producer.op not in _VALUE_SPLITTING and (
                        producer.op not in _VALUE_MOVING or index != 0):
                    break
                shared = shared or len(_value_readers(readers, tensor)) > 1
                tensor = graph.data_inputs(producer)[_VALUE_SPLITTING.get(producer.op, 0)]
            if not shared or producer is None or producer.op not in FAKE_QUANT_OPS:
                continue
            again = graph_def.node.add()
            again.CopyFrom(producer)
            again.name = f"{node.name}/operand_{position}_on_its_grid"
            del again.input[:]
            again.input.extend([operand] + graph.data_inputs(producer)[1:])
            node.input[position] = again.name
            added += 1
    return added


# The moved operands of each _ONE_GRID op by position among its data inputs (a condition is not moved).
_MOVED_OPERANDS = {"ConcatV2": slice(0, -1), "Pack": slice(None), "Select": slice(1, 3), "SelectV2": slice(1, 3),
                   "Maximum": slice(None), "Minimum": slice(None)}
# Ops whose int8 result's scale TFLite does not choose from the FakeQuant that reads it: float kernels (the
# FakeQuant is a QUANTIZE of their float result), fixed output scales (LOGISTIC's 1/256, TANH's 1/128,
# SOFTMAX's), and a Cast to float (a QUANTIZE of it).
_PINNING = ("Sin", "Cos", "Floor", "Ceil", "Round", "Erf", "Log", "Sqrt", "Cast", "Sigmoid", "Tanh", "Softmax",
            "LogSoftmax")


def _one_scale_ops(graph_def, nodes, readers):
    """(op, its result's FakeQuant) for each op that TFLite holds on one scale with its operands (a
    concatenation, a selection, a maximum or minimum) whose result one FakeQuant of a constant range reads."""
    for node in list(graph_def.node):
        if node.op not in _MOVED_OPERANDS:
            continue
        reading = _value_readers(readers, node.name)
        if len(reading) == 1 and reading[0].op in FAKE_QUANT_OPS and _range(reading[0], nodes) is not None:
            yield node, reading[0]


def _pinned(tensor, graph_def, nodes, stateless):
    """Whether TFLite holds the int8 FakeQuant of `tensor` on that FakeQuant's own scale, whatever reads it."""
    producer = graph.producer(tensor, nodes)
    if producer is None or producer.op in FAKE_QUANT_OPS + _PINNING:
        return True  # (a FakeQuant of a FakeQuant's output is folded into a requantization TFLite keeps)
    return graph.constant_subgraph_value(tensor, graph_def, nodes, stateless) is not None


def one_grid_operands_on_the_results_range(graph_def):
    """Where an op that TFLite holds on one scale with its operands (a concatenation, a selection, a maximum or
    minimum) is read by one FakeQuant, and an operand is a FakeQuant's output on a range of its own that TFLite
    cannot change, read by nothing else, fake-quantize that operand's input on the result's range instead;
    returns how many operands were.

    TFLite gives such an op one scale, taken from the FakeQuants around it,
    and drops the range of an operand an int8 op computes (its MUL or ADD
    computes onto the result's scale). It refuses ("quantization parameters
    violate the same scale constraint") an operand whose range it cannot
    drop: a QUANTIZE of a float op's result (keras-hub SAM's sines and
    cosines of its prompts' points), a requantization of LOGISTIC's fixed
    scale, a constant it folds from constants (SAM's sines and cosines of
    its image grid), a FakeQuant of a FakeQuant's output. Onto the result's
    range, each is what TFLite makes of an int8 op's operand: the result's
    rounding of the operand's input, which differs from its rounding of the
    operand's rounding by a step of the coarser grid at most, clipped to the
    operand's range where that is narrower (an int8 MAXIMUM or MINIMUM).
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    stateless = graph.STATELESS_OPS
    moved = 0
    for node, result in _one_scale_ops(graph_def, nodes, readers):
        data = [position for position, name in enumerate(node.input) if not name.startswith("^")]
        for position in data[_MOVED_OPERANDS[node.op]]:
            reader, reader_position, tensor, alone = node, position, node.input[position], True
            while True:  # down the ops that move values, to the FakeQuant they move
                producer = graph.producer(tensor, nodes)
                alone = alone and len(_value_readers(readers, tensor)) == 1
                if producer is None or producer.op not in _VALUE_MOVING or graph.split_tensor_name(tensor)[1]:
                    break
                reader, reader_position, tensor = producer, 0, producer.input[0]
            if not alone or producer is None or producer.op not in FAKE_QUANT_OPS or _range(producer, nodes) is None \
                    or _on_one_grid(producer.name, result.name, nodes):
                continue
            if not _pinned(graph.data_inputs(producer)[0], graph_def, nodes, stateless):
                continue
            ranges, inner = [_range(producer, nodes)], graph.data_inputs(producer)[0]
            while True:  # down FakeQuants of FakeQuants read by nothing else: TFLite folds them into one
                inner_fake_quant = graph.producer(inner, nodes)
                if inner_fake_quant is None or inner_fake_quant.op not in FAKE_QUANT_OPS or len(
                        _value_readers(readers, inner)) != 1 or _range(inner_fake_quant, nodes) is None:
                    break
                ranges.append(_range(inner_fake_quant, nodes))
                inner = graph.data_inputs(inner_fake_quant)[0]
            result_range = _range(result, nodes)
            name = f"{node.name}/operand_{position}_on_the_results_range"
            operand = _fake_quant_node(graph_def, name, inner, result_range)
            # the operand's ranges clip where the result's would not (a cosine's range of [0, 1] as the QAT model
            # learned it): an int8 MAXIMUM or MINIMUM on the result's scale keeps their clipping
            own_range = (max(low for low, *_ in ranges), min(high for _, high, *_ in ranges))
            reader.input[reader_position] = _clipped(graph_def, name, operand, own_range, result_range)
            moved += 1
    return moved


def _moved_onto(graph_def, nodes, fake_quant, to_range):
    """Give `fake_quant` `to_range` where its own range is another whose grid is within _MERGED_WITHIN_STEPS of a
    step of that one's (its new constants join `nodes`); whether it was moved."""
    if fake_quant.op != "FakeQuantWithMinMaxVars":
        return False
    own = _range(fake_quant, nodes)
    if own is None or own == to_range or own[2:] != to_range[2:] or not _within_steps(
            _grid(*own), _grid(*to_range), _MERGED_WITHIN_STEPS):
        return False
    for position, bound, value in ((1, "min", to_range[0]), (2, "max", to_range[1])):
        fake_quant.input[position] = _float_constant(graph_def, f"{fake_quant.name}/{bound}_on_one_grid", value)
        nodes[fake_quant.input[position]] = graph_def.node[-1]
    return True


def _moved_down_onto(holder, graph_def, nodes, tensor, to_range):
    """Give the FakeQuants that `tensor` of graph_def comes from, through ops that move values, FakeQuants on
    `to_range` and the branches of conditionals (functions of `holder`'s library), `to_range` where _moved_onto
    does; returns how many were."""
    moved = 0
    while True:
        name, index = graph.split_tensor_name(graph.resolve(tensor, nodes))
        producer = nodes.get(name)
        if producer is None:
            return moved
        if graph.branches(producer):
            return moved + _branch_results_moved_onto(holder, producer, index, to_range)
        if producer.op in FAKE_QUANT_OPS:
            if _moved_onto(graph_def, nodes, producer, to_range):
                moved += 1
            elif _range(producer, nodes) != to_range:
                return moved
        elif producer.op not in _VALUE_MOVING or index:
            return moved
        tensor = graph.data_inputs(producer)[0]


def _branch_results_moved_onto(holder, conditional, index, to_range):
    """_moved_down_onto from each of `conditional`'s functions' result `index`, each function rebuilt in
    `holder`'s library where it moved any; returns how many FakeQuants moved."""
    library = {function.signature.name: function for function in holder.library.function}
    moved = 0
    with graph.functions_known(holder.library):
        for name in dict.fromkeys(graph.branches(conditional)):
            if name not in library:
                continue  # (inside a function body, whose library holds the functions it calls, not its branches)
            body, outputs, control_outputs = graph.function_as_graph(library[name], library)
            moved_here = _moved_down_onto(holder, body, graph.nodes_by_name(body), outputs[index], to_range)
            if moved_here:
                library[name].CopyFrom(graph.graph_as_function(body, library[name], outputs, control_outputs))
                moved += moved_here
    return moved


def near_grids_onto_the_results_range(graph_def):
    """Where an op that TFLite holds on one scale with its operands (a concatenation, a selection, a maximum or
    minimum) is read by one FakeQuant, give the FakeQuants its operands come from (through ops that move
    values, FakeQuants on the result's range and the branches of conditionals) the result's range where their
    grids are within _MERGED_WITHIN_STEPS of a step of its grid; returns how many FakeQuants were moved.

    TFLite compares scales exactly, and refuses ("quantization parameters
    violate the same scale constraint") an operand on a scale it cannot drop
    a millionth apart from the result's: with calibration data, D-FINE stacks
    a sigmoid's FakeQuant, 2e-6 apart; SAM 3 concatenates a `cond`'s result,
    whose scale TFLite takes from the last FakeQuant of the branch computing
    it, 1e-5 apart. The values move by a twentieth of a step at most, as
    where fake_quants_on_one_grid_merged merges. The walk enters conditionals
    from the graph, nested ones too; from a function body's own one-scale
    ops, it stops at a conditional (the body's library holds copies).
    """
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    moved = 0
    for node, result in _one_scale_ops(graph_def, nodes, readers):
        result_range = _range(result, nodes)
        for tensor in graph.data_inputs(node)[_MOVED_OPERANDS[node.op]]:
            moved += _moved_down_onto(graph_def, graph_def, nodes, tensor, result_range)
    return moved


# Ops whose value a constant lookup's indices may be computed with (keras.ops.take's arange and its wrap).
_CONSTANT_INDEX_OPS = ("Const", "Identity", "Range", "Cast", "Reshape", "ExpandDims", "Less", "AddV2", "Add",
                       "SelectV2", "Shape", "StridedSlice", "Pack", "Fill", "Sub", "Mul")


def constant_lookups_folded(graph_def):
    """Rewrite GatherV2(FakeQuant(table), ids) with a constant table and ids computed from constants (a
    position embedding's lookup of its positions) as FakeQuant(the rows gathered): the same values, as a
    constant the converter stores int8 on the table's grid. Returns how many were folded.

    The TFLite converter keeps a GATHER of a quantized table even where both operands are constant, and the
    Ethos-U55 runs no GATHER: a ViT's position embedding stayed on the CPU beside the NPU.
    """
    nodes = graph.nodes_by_name(graph_def)
    folded = 0
    for node in list(graph_def.node):
        if node.op != "GatherV2" or graph.attribute(node, "batch_dims", 0):
            continue
        params, indices, axis = graph.data_inputs(node)
        fake_quant = graph.producer(params, nodes)
        if fake_quant is None or fake_quant.op != "FakeQuantWithMinMaxVars":
            continue
        table = graph.constant_value(graph.data_inputs(fake_quant)[0], nodes)
        axis = graph.constant_value(axis, nodes)
        if table is None or axis is None:
            continue
        ids = graph.constant_subgraph_value(indices, graph_def, nodes, _CONSTANT_INDEX_OPS)
        if ids is None or np.any(ids < 0) or np.any(ids >= table.shape[int(axis)]):
            continue
        rows = graph_def.node.add(name=node.name + "/folded_rows", op="Const")
        rows.attr["dtype"].type = tf.float32.as_datatype_enum
        rows.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.take(table, ids, axis=int(axis)).astype(
            np.float32)))
        on_grid = graph_def.node.add()
        on_grid.CopyFrom(fake_quant)
        on_grid.name = node.name + "/folded"
        on_grid.input[0] = rows.name
        graph.redirect(graph_def, node.name, on_grid.name)
        folded += 1
    return folded


# Run, in this order, on the main graph and every control-flow function before
# GELUs are rewritten (the GELU op's fusion needs the Neg that the rewrite adds
# itself, so negations are turned into multiplications first; integer values
# move to int32 after the lookups are folded, whose ids may be computed in float).
GRAPH_PASSES = (drop_non_finite_guards, negations_as_multiplications, squares_as_multiplications,
                squared_differences_in_four_axes,
                zeros_like_as_multiplications, one_hots_as_selections, scatter_updates_as_selections,
                scalings_into_selections, added_masks_as_selections, biases_before_reshapes,
                constant_lookups_folded, integer_valued.integer_arithmetic_in_int32,
                integer_valued.quantized_integers_as_lookups)
# And these after: they change which tensor an op reads, which the GELU patterns must see as the model spells it.
AFTER_REWRITE_PASSES = (additions_of_zeros_dropped, repeated_computations_on_one_range,
                        repeated_fake_quants_merged, one_table_per_lookup,
                        fake_quants_read_by_every_reader, fake_quants_of_constants_folded,
                        fake_quants_on_one_grid_merged, fake_quants_after_value_moving_ops,
                        stacks_as_concatenations, one_grid_operands_on_their_grid,
                        one_grid_operands_on_the_results_range, near_grids_onto_the_results_range)


def input_grid(x_name, nodes):
    """The 256 values an int8 tensor x can take, if x comes from a FakeQuant, directly or through ops that only
    move values (an EinsumDense's reshape back: Gemma's and Bloom's GELUs); else None.

    The FakeQuant's range is nudged as TensorFlow does (zero exactly
    representable), so these are the values the int8 model sees.
    """
    node = graph.producer(x_name, nodes)
    while node is not None and node.op in _VALUE_MOVING:
        node = graph.producer(graph.data_inputs(node)[0], nodes)
    if node is None or node.op not in FAKE_QUANT_OPS:
        return None
    fake_quant_range = _range(node, nodes)  # (None for per-channel ranges: not a GELU's input)
    return None if fake_quant_range is None else _grid(*fake_quant_range)


def _grid(low, high, bits, narrow):
    """The values a FakeQuant of range (low, high), `bits` wide, rounds to, nudged as TensorFlow does (zero
    exactly representable); None for an empty range."""
    quant_min, quant_max = (1 if narrow else 0), 2 ** bits - 1
    scale = np.float32((high - low) / (quant_max - quant_min))
    if scale <= 0:
        return None
    zero_point = np.clip(np.round(quant_min - low / scale), quant_min, quant_max)
    nudged_low = np.float32((quant_min - zero_point) * scale)
    return (nudged_low + scale * np.arange(quant_max - quant_min + 1, dtype=np.float32)).astype(np.float32)


def fake_quantizer(ranges):
    """A `mark` for a replacement that fake-quantizes the i-th intermediate to ranges[i] (8 bits).

    Sigmoid outputs go on TFLite's fixed LOGISTIC grid, so the rewritten graph
    computes what the int8 model computes.
    """
    return replacements.marking([
        functools.partial(tf.quantization.fake_quant_with_min_max_args, min=low, max=high, num_bits=8,
                          narrow_range=False)
        for low, high in ranges])


def marker(build, alpha, x, nodes):
    """(`mark`, note for the report) for the int8 replacement `build` of a GELU of tensor x.

    Exact fake-quant ranges when x is a QAT tensor; otherwise none, and
    calibration gives the ranges.
    """
    grid = input_grid(x, nodes)
    if grid is None:
        return replacements.unmarked, ""
    ranges = replacements.intermediate_ranges(build, alpha, tf.constant(grid))
    return fake_quantizer(ranges), ", intermediate int8 ranges exact from its input's 256 values"


def calibration_samples(spec, inputs, seed, dynamic_size):
    """A list of samples (one array per input, in input order) from --calibration.

    spec: "random:N" (N seeded random batches, as the parity check makes them: `dynamic_size` along every open
    dimension)
    or an .npz path holding one array per input, samples along the first axis
    (each becomes a batch of one; of the batch the model fixes, where its every input fixes one alike: a
    model exported with a batch of 4 took batches of one, and the conversion ended in an internal error).
    """
    from ..running import verify

    matched = _RANDOM_CALIBRATION.match(spec)
    if matched:
        count = int(matched.group(1))
        if count < 1:
            raise errors.BadInputs(f"--calibration {spec}: needs at least one sample")
        rng_inputs = [verify.make_inputs(inputs, seed + index, dynamic_size, option="--calibration")
                      for index in range(count)]
        return [[sample[info.name] for info in inputs] for sample in rng_inputs]
    arrays = verify.load_npz(spec, inputs, option="--calibration", batched=True)
    counts = {len(arrays[info.name]) for info in inputs}
    if len(counts) != 1 or 0 in counts:
        raise errors.BadInputs(f"{spec}: every input needs the same, non-zero number of samples along the first "
                               f"axis; found {sorted(counts)}")
    (count,) = counts
    batch = fixed_batch(inputs)
    if count < batch:
        raise errors.BadInputs(f"{spec}: {count} samples, fewer than the batch of {batch} the model fixes")
    return [[arrays[info.name][index:index + batch] for info in inputs]
            for index in range(0, count - batch + 1, batch)]


def fixed_batch(inputs):
    """The batch (the first dimension) every input of the signature fixes alike, else 1: calibration samples
    go in batches of it."""
    sizes = {info.shape[0] if info.shape else None for info in inputs}
    return sizes.pop() if len(sizes) == 1 and None not in sizes else 1


def configure(converter, samples, int8_io, int16=False):
    """Set a TFLiteConverter up for integer quantization (QAT ranges, or calibration on `samples`); `int16`: 16x8,
    int16 activations and int8 weights, in the op set whose kernels LiteRT and TFLite Micro have for it."""
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    if samples is not None:
        converter.representative_dataset = lambda: iter(samples)
    if int16:  # with the mode's op sets after it: an op without a 16x8 kernel (a mask's CAST) stays float, as in int8
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
            *converter.target_spec.supported_ops]
    if int8_io:
        converter.inference_input_type = converter.inference_output_type = tf.int16 if int16 else tf.int8
