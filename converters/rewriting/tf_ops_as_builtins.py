"""TensorFlow ops that TFLite has no builtin op for, spelled in builtin ops before converting.

A model that uses one cannot convert in builtin or native mode (the converter
stops at it), while --mode select would carry it as a Flex op, which the
runtimes this package targets do not link. Each spelling computes the same
values from the same inputs, so parity and int8 ranges are unaffected:

* Roll (`tf.roll`, e.g. the shifted windows of Swin Transformers), with a
  constant shift and axis on an axis of known size: along each axis, the last
  `shift` entries and the rest, swapped (two STRIDED_SLICEs and a
  CONCATENATION, which every runtime and target profile has).
* StridedSlice with new axes (`mask[None, None, :, :]`, how keras-hub's
  Gemma, CLIP text, PaliGemma and GPT-OSS widen an attention mask) on a
  tensor of dynamic shape, with constant begin, end and strides:
  TFLite's STRIDED_SLICE takes new axes on static shapes only, and the stock
  converter stops there too. The same slice without the new axes, then
  EXPAND_DIMS at each new axis's place in the output. An ellipsis
  (`mask[..., None]`, Gemma 3's and SAM's) is first spelled out as the full
  slices it stands for, where the input's rank is known.
* Einsum that sums no index (`ab,c->abc`, an outer product: Gemma 4's
  rotary embedding) on operands of dynamic shape: the stock converter makes
  every einsum a BATCH_MATMUL of reshaped operands, and stops where the
  reshape would merge two dynamic dimensions. Each operand transposed into
  the output's order and widened with EXPAND_DIMS, then MUL, which
  broadcasts.
* Einsum on an operand of no rank to the converter (Longformer's and LED's
  sliding-window attention, in a conditional branch, slicing its chunks
  from an argument that a conditional of branches of differing rank made):
  the operand reshaped to its own shape read as the rank its equation's
  subscripts say, which the converter's BATCH_MATMUL lowering needs.
* Less, Greater and their like of 8- and 16-bit integers (LED's int8 mask
  compared with 0), which TFLite compares only as quantized values: the
  same comparison of their int32 casts, exactly.
* Abs and Sign of int64 (DeBERTa's relative-position buckets), which TFLite's
  ABS and SIGN do not take: max(x, -x), and x clipped to [-1, 1], in the
  int64 NEG, MAXIMUM and MINIMUM TFLite has.
* MaxPool of int32 or int64 (Funnel Transformer's attention mask and token
  types, pooled with tf.nn.max_pool1d as its sequence halves), which TFLite's
  MAX_POOL_2D does not take (float32, 8- and 16-bit integers): along height,
  then width, the input padded by its dtype's lowest value where SAME pads,
  and the MAXIMUM of the window's strided slices, one a position in it:
  exact for every integer, where a float pooling would round past 2**24.
* Transpose of more than four axes (Swin's window partition: six), where the
  axes it keeps next to each other and in order make fewer: each such run one
  axis (a RESHAPE), the runs permuted, the result reshaped to the output's
  shape (sizes the converter folds where shapes are static). TFLite Micro
  transposes five axes at most, and refused Swin's six.
* The Fourier transform of a real tensor, FFT, FFT2D or FFT3D of which only
  the real or imaginary part or the magnitude is read (FNet's token mixing):
  products with cosine and sine matrices (`fourier_as_matmuls.py`).

Two passes run for the targets whose runtime lacks what TFLite has:

* Cumsum of int32 (RoBERTa's and XLM-RoBERTa's positions, a running count
  along the padding mask), which TFLite Micro's CUMSUM does not take (float32
  and int8 only): Hillis and Steele's scan, log2(n) PADs and ADDs in int32.
* Tile, which TFLite Micro lacks, where every axis it repeats has size 1 and
  constants compute how often (Funnel's attention and its decoder's
  tf.repeat): the broadcast it is, BROADCAST_TO the tiled shape.

One pass changes what a graph computes, for values a model is never given:

* Keras 3's `keras.ops.take` (every Embedding's lookup) wraps negative ids
  before its gather, `where(ids < 0, ids + rows, ids)`: LESS, ADD and an
  int32 SELECT_V2, which TFLite Micro does not run. Where the ids are a
  model input (through casts), the gather reads them directly: ids index a
  table's rows, and a negative id from a tokenizer is a bug, which TFLite's
  GATHER reports as out of range where the wrap would have read another row.
  Computed indices keep their wrap.

`TO_BUILTINS` lists the graph passes; each rewrites a graph in place and
returns how many ops it rewrote.
"""

import operator

import tensorflow as tf

from . import fourier_as_matmuls
from . import graph

_SCOPE = "/keras_gelu_builtins/"


def _rolled(x, rolls):
    """x rolled by each (shift, axis) in turn; 0 <= shift < the axis's size, axis >= 0."""
    for shift, axis, size in rolls:
        if shift:
            leading = (slice(None),) * axis
            x = tf.concat([x[leading + (slice(size - shift, size),)], x[leading + (slice(0, size - shift),)]],
                          axis=axis)
    return x


def _spelled_in_builtins(graph_def, found, spelling):
    """Splice `spelling(node, nodes, shape of its first input)` (a function of that input, or None to leave the
    node) in for each node of `found`; how many were rewritten."""
    if not found:
        return 0
    nodes = graph.nodes_by_name(graph_def)
    # each node's input as found: one of `found` may read another (XLNet's mask[:, :, None][..., None]), whose
    # rewrite hands it the spliced value, of the same shape, under a name no shape was computed for
    first_inputs = {node.name: graph.data_inputs(node)[0] for node in found}
    shapes = graph.static_shapes(graph_def, list(first_inputs.values()))
    rewritten = 0
    for node in found:
        x = graph.data_inputs(node)[0]
        replacement = spelling(node, nodes, shapes[first_inputs[node.name]])
        if replacement is not None:
            dtype = tf.as_dtype(node.attr["T"].type)
            graph.redirect(graph_def, node.name, graph.splice(graph_def, replacement, x, dtype, node.name + _SCOPE,
                                                              nodes))
            rewritten += 1
    return rewritten


def _roll_spelling(node, nodes, shape):
    _, shift, axis = graph.data_inputs(node)
    shifts, axes = graph.constant_value(shift, nodes), graph.constant_value(axis, nodes)
    if shifts is None or axes is None or shape.rank is None:
        return None
    rolls = []
    for one_shift, one_axis in zip(shifts.reshape(-1).tolist(), axes.reshape(-1).tolist()):
        one_axis %= shape.rank
        size = shape[one_axis]
        if size is None:
            return None
        rolls.append((one_shift % size, one_axis, size))
    return lambda value: _rolled(value, rolls)


def rolls_as_slices(graph_def):
    """Rewrite Roll(x, shift, axis) with constant shift and axis, on axes of known size, as slices and a concat."""
    return _spelled_in_builtins(graph_def, [node for node in graph_def.node if node.op == "Roll"], _roll_spelling)


def _transpose_spelling(node, nodes, shape):
    permutation = graph.constant_value(graph.data_inputs(node)[1], nodes)
    if permutation is None or shape.rank is None or shape.rank <= 4:
        return None
    runs = []  # the output's axes in runs of input axes that stay next to each other, in order
    for axis in (int(axis) % shape.rank for axis in permutation.reshape(-1)):
        if runs and axis == runs[-1][-1] + 1:
            runs[-1].append(axis)
        else:
            runs.append([axis])
    if len(runs) == shape.rank:
        return None
    in_input_order = sorted(runs)
    order = [in_input_order.index(run) for run in runs]

    def spelled(x):  # sizes read at run time: the converter folds them where the shapes are static
        sizes = tf.shape(x)
        merged = tf.stack([tf.reduce_prod(tf.gather(sizes, run)) for run in in_input_order])
        output = tf.gather(sizes, [axis for run in runs for axis in run])
        return tf.reshape(tf.transpose(tf.reshape(x, merged), order), output)

    return spelled


def transposes_of_fewer_axes(graph_def):
    """Rewrite Transpose of more than four axes, where some stay next to each other and in order, as one of fewer
    axes between two reshapes."""
    return _spelled_in_builtins(graph_def, [node for node in graph_def.node if node.op == "Transpose"],
                                _transpose_spelling)


def _cumsum_spelling(node, nodes, shape):
    axis = graph.constant_value(graph.data_inputs(node)[1], nodes)
    if axis is None or shape.rank is None or node.attr["exclusive"].b or node.attr["reverse"].b:
        return None
    axis = int(axis) % shape.rank
    size = shape[axis]
    if size is None:
        return None

    def spelled(x):  # Hillis and Steele's scan: each sum adds the one `step` before it, the step doubling
        step = 1
        while step < size:
            earlier = x[(slice(None),) * axis + (slice(0, size - step),)]
            x += tf.pad(earlier, [[step, 0] if dimension == axis else [0, 0] for dimension in range(shape.rank)])
            step *= 2
        return x

    return spelled


def int32_cumsums_as_additions(graph_def):
    """Rewrite Cumsum of int32 along an axis of known size (not exclusive, not reversed) as PADs and ADDs, for the
    targets whose CUMSUM takes no int32 (TFLite Micro's: float32 and int8): RoBERTa's positions, counted along
    the padding mask."""
    int32 = tf.int32.as_datatype_enum
    found = [node for node in graph_def.node if node.op == "Cumsum" and node.attr["T"].type == int32]
    return _spelled_in_builtins(graph_def, found, _cumsum_spelling)


def _tile_spelling(node, nodes, shape, graph_def):
    times = graph.constant_subgraph_value(graph.data_inputs(node)[1], graph_def, nodes, graph.STATELESS_OPS)
    if times is None or shape.rank is None:
        return None
    times = [int(count) for count in times.reshape(-1)]
    if any(count != 1 and size != 1 for size, count in zip(shape.as_list(), times)):
        return None
    return lambda x: tf.broadcast_to(x, tf.shape(x) * times)


def tiles_as_broadcasts(graph_def):
    """Rewrite Tile that repeats only axes of size 1, by multiples constants compute, as BROADCAST_TO the tiled
    shape: for the targets without TILE."""
    return _spelled_in_builtins(graph_def, [node for node in graph_def.node if node.op == "Tile"],
                                lambda node, nodes, shape: _tile_spelling(node, nodes, shape, graph_def))


def _bits(mask, count):
    return [bool(mask >> index & 1) for index in range(count)]


def _without_new_axes(x, begin, end, strides, begin_mask, end_mask, shrink_mask, new_axis):
    """x[spec] as a slice without new axes, then each new axis expanded at its place in the output."""
    kept = [index for index, new in enumerate(new_axis) if not new]

    def mask(bits):
        return sum(1 << position for position, index in enumerate(kept) if bits[index])

    def operand(values):
        return tf.constant([values[index] for index in kept], tf.int32, shape=[len(kept)])

    value = tf.strided_slice(x, operand(begin), operand(end), operand(strides), begin_mask=mask(begin_mask),
                             end_mask=mask(end_mask), shrink_axis_mask=mask(shrink_mask))
    position = 0
    for index, new in enumerate(new_axis):
        if new:
            value = tf.expand_dims(value, position)
        if not shrink_mask[index]:
            position += 1
    return value


def _ellipsis_spelled_out(rank, begin, end, strides, masks, ellipsis):
    """The slice's operands and masks with its ellipsis replaced by the full slices it stands for on a tensor
    of `rank` dimensions: what TensorFlow's own slice does, written per axis."""
    at = ellipsis.index(True)
    consumed = sum(1 for index, new in enumerate(masks[3]) if not new and index != at)  # axes the others index
    count = rank - consumed
    if count < 0:
        return None

    def spread(values, filler):
        return values[:at] + [filler] * count + values[at + 1:]

    begin_mask, end_mask, shrink_mask, new_axis = masks
    return (spread(begin, 0), spread(end, 0), spread(strides, 1),
            [spread(begin_mask, True), spread(end_mask, True), spread(shrink_mask, False), spread(new_axis, False)])


# The most axes of a STRIDED_SLICE that TensorFlow's own TFLite interpreter (the stock converter's calibrator)
# and TFLite Micro take; LiteRT's takes more.
_LARGEST_SLICED_RANK = 5


def _new_axes_spelling(node, nodes, shape):
    values = [graph.constant_value(operand, nodes) for operand in graph.data_inputs(node)[1:]]
    if any(value is None for value in values):
        return None
    begin, end, strides = (value.reshape(-1).tolist() for value in values)
    masks = [_bits(node.attr[name].i, len(begin)) for name in ("begin_mask", "end_mask", "shrink_axis_mask",
                                                                "new_axis_mask")]
    ellipsis = _bits(graph.attribute(node, "ellipsis_mask", 0), len(begin))
    if any(ellipsis):  # x[..., None], as keras-hub widens a mask or a point's coordinates: rank known suffices
        if shape.rank is None:
            return None
        spelled = _ellipsis_spelled_out(shape.rank, begin, end, strides, masks, ellipsis)
        if spelled is None:
            return None
        begin, end, strides, masks = spelled
    # on a static shape the converter takes new axes itself, into a slice of the rank they make: keras-hub's SAM 3
    # widens a label to six axes, x[:, None, None, None, None, None], which the stock calibrator could not run
    if shape.is_fully_defined() and shape.rank + sum(masks[3]) - sum(masks[2]) <= _LARGEST_SLICED_RANK:
        return None
    return lambda value: _without_new_axes(value, begin, end, strides, *masks)


def new_axes_as_expand_dims(graph_def):
    """Rewrite StridedSlice with new axes and constant operands (an ellipsis too, where the input's rank is
    known) on a tensor of dynamic shape, or making more axes than _LARGEST_SLICED_RANK, as the slice without
    them and EXPAND_DIMS."""
    found = [node for node in graph_def.node if node.op == "StridedSlice" and graph.attribute(node, "new_axis_mask", 0)]
    return _spelled_in_builtins(graph_def, found, _new_axes_spelling)


def _product_subscripts(equation):
    """(the operands' subscripts, the output's) of an einsum equation that sums no index: each operand's
    indices distinct and all in the output, no ellipsis; else None."""
    operands, arrow, output = equation.replace(" ", "").partition("->")
    operands = operands.split(",")
    if not arrow or "." in equation or len(set(output)) != len(output) or set("".join(operands)) != set(output):
        return None
    return None if any(len(set(operand)) != len(operand) for operand in operands) else (operands, output)


def _broadcast_product(operands, subscripts, output):
    """The product of `operands` (tensors with those subscripts), each transposed into the output's order and
    given a size-1 axis for every output index it lacks, then multiplied with broadcasting."""
    product = None
    for value, indices in zip(operands, subscripts):
        order = sorted(range(len(indices)), key=lambda axis: output.index(indices[axis]))
        if order != list(range(len(indices))):
            value = tf.transpose(value, order)
        for position, index in enumerate(output):
            if index not in indices:
                value = tf.expand_dims(value, position)
        product = value if product is None else product * value
    return product


def products_as_mul(graph_def):
    """Rewrite Einsum that sums no index (`ab,c->abc`, an outer product, as Gemma 4's rotary embedding takes
    positions times frequencies; `abc,ac->abc`) on operands of dynamic shape as TRANSPOSE, EXPAND_DIMS and MUL.

    The stock converter lowers every einsum to a BATCH_MATMUL between reshaped operands: without a summed
    index it reshapes with a size-1 contraction, and where two or more of the dimensions it merges are dynamic
    that reshape has no shape it can write, so it stops ("'tf.Einsum' op is neither a custom op nor a flex
    op"). A product that sums nothing is an elementwise product with broadcasting, exactly.
    """
    found = [node for node in graph_def.node if node.op == "Einsum" and len(graph.data_inputs(node)) == 2
             and _product_subscripts(graph.attribute(node, "equation", b"").decode()) is not None]
    if not found:
        return 0
    nodes = graph.nodes_by_name(graph_def)
    shapes = graph.static_shapes(graph_def, [operand for node in found for operand in graph.data_inputs(node)])
    rewritten = 0
    for node in found:
        operands = graph.data_inputs(node)
        if all(shapes[operand].is_fully_defined() for operand in operands):
            continue  # on static shapes the converter's own lowering serves
        subscripts, output = _product_subscripts(node.attr["equation"].s.decode())
        dtype = tf.as_dtype(node.attr["T"].type)
        (product,) = graph.splice_many(
            graph_def, lambda *values: [_broadcast_product(values, subscripts, output)],
            [(operand, dtype, None) for operand in operands], node.name + _SCOPE, nodes)
        graph.redirect(graph_def, node.name, product)
        rewritten += 1
    return rewritten


_INPUT_OPS = ("Placeholder", "_Arg")


def _of_rank(x, rank):
    """x reshaped to its own shape, read as `rank` sizes: the same values, on a tensor whose rank is known."""
    shape = tf.shape(x)
    return tf.reshape(x, tf.stack([shape[axis] for axis in range(rank)]))


def _loses_rank(node):
    """Whether the converter may read what `node` writes as of no rank, though TensorFlow's shape inference knows
    one: a function body's argument (a conditional branch's takes the rank of its caller's tensor) and a
    conditional's output (none where its branches' differ)."""
    return node is not None and (node.op in _INPUT_OPS or bool(graph.branches(node)))


def _rank_may_be_lost(operand, nodes):
    """Whether tensor `operand` is such a tensor, or is made from one by one op."""
    producer = graph.producer(operand, nodes)
    if producer is not None and not _loses_rank(producer) and graph.data_inputs(producer):
        producer = graph.producer(graph.data_inputs(producer)[0], nodes)
    return _loses_rank(producer)


def einsum_operands_given_their_rank(graph_def):
    """Give each Einsum operand that is a function's argument or a conditional's output, or made from one by one
    op, the rank its equation's subscripts say (no ellipsis), as a RESHAPE to its own shape read as that many sizes.

    The stock converter lowers an einsum to BATCH_MATMUL only on operands of known rank: a conditional's output
    whose branches differ in rank has none, and a conditional branch's argument has the rank of its caller's
    tensor, none where that is such an output, even where TensorFlow's own shape inference gives a slice of it
    one (Longformer's sliding-window attention slices its chunks' probabilities so). It stopped there
    ("'tf.Einsum' op is neither a custom op nor a flex op")."""
    nodes = graph.nodes_by_name(graph_def)
    rewritten = 0
    for node in [node for node in graph_def.node if node.op == "Einsum"]:
        equation, arrow, _ = graph.attribute(node, "equation", b"").decode().replace(" ", "").partition("->")
        if not arrow or "." in equation:
            continue
        dtype = tf.as_dtype(node.attr["T"].type)
        for slot, (operand, subscripts) in enumerate(zip(graph.data_inputs(node), equation.split(","))):
            if not _rank_may_be_lost(operand, nodes):
                continue
            node.input[slot] = graph.splice(graph_def, lambda x, rank=len(subscripts): _of_rank(x, rank), operand,
                                            dtype, f"{node.name}{_SCOPE}operand_{slot}/", nodes)
            rewritten += 1
    return rewritten


_ORDERINGS = {"Less": tf.math.less, "LessEqual": tf.math.less_equal, "Greater": tf.math.greater,
              "GreaterEqual": tf.math.greater_equal}
_ORDERED = {"Less": operator.lt, "LessEqual": operator.le, "Greater": operator.gt, "GreaterEqual": operator.ge}
# The narrow integers TFLite's LESS, GREATER and their like take only as quantized values, and the stock converter
# refuses as plain integers.
_NARROW_INTEGERS = frozenset(dtype.as_datatype_enum for dtype in (tf.int8, tf.uint8, tf.int16, tf.uint16))


def narrow_integer_orderings_in_int32(graph_def):
    """Rewrite Less, Greater and their like of 8- and 16-bit integers (LED's attention mask, cast to int8 and
    compared with 0 for its masked and global positions) as the same comparison of their int32 casts: exact."""
    found = [node for node in graph_def.node if node.op in _ORDERINGS
             and graph.attribute(node, "T", None) in _NARROW_INTEGERS]
    nodes = graph.nodes_by_name(graph_def)
    for node in found:
        dtype = tf.as_dtype(node.attr["T"].type)
        (compared,) = graph.splice_many(
            graph_def, lambda x, y, order=_ORDERINGS[node.op]: [order(tf.cast(x, tf.int32), tf.cast(y, tf.int32))],
            [(operand, dtype, None) for operand in graph.data_inputs(node)], node.name + _SCOPE, nodes)
        graph.redirect(graph_def, node.name, compared)
    return len(found)


def _cast_boolean(name, nodes):
    """The boolean tensor that tensor `name` is a Cast of, or None."""
    node = graph.producer(name, nodes)
    if node is None or node.op != "Cast" or graph.attribute(node, "SrcT", None) != tf.bool.as_datatype_enum:
        return None
    return graph.data_inputs(node)[0]


def _boolean_ordering(condition, *, at_false, at_true):
    """What an ordering of a boolean's cast with a constant gives, `at_false` and `at_true` for each value."""
    if at_false == at_true:
        return tf.fill(tf.shape(condition), at_false)
    return condition if at_true else tf.logical_not(condition)


def orderings_of_booleans_as_booleans(graph_def):
    """Rewrite Less, Greater and their like of a boolean's cast (to a number) and a constant scalar as the
    boolean, its negation or a constant of its shape, by what the ordering gives for 0 and for 1: exact.

    The stock converter folds `cast(b) < 0` and `cast(b) >= 0` (either operand first) into ZEROS_LIKE of the
    boolean, which TFLite has no bool kernel for, and refuses the model: keras-hub's SAM 3 casts its box labels
    to bool and back for its Embedding, whose lookup (`keras.ops.take`) compares the ids with 0."""
    nodes = graph.nodes_by_name(graph_def)
    rewritten = 0
    for node in [node for node in graph_def.node if node.op in _ORDERINGS]:
        for position, (operand, other) in enumerate(zip(graph.data_inputs(node), graph.data_inputs(node)[::-1])):
            condition, value = _cast_boolean(operand, nodes), graph.constant_value(other, nodes)
            if condition is None or value is None or value.shape != ():
                continue
            ordered = [_ORDERED[node.op](*((bit, value.item()) if position == 0 else (value.item(), bit)))
                       for bit in (0, 1)]
            (replaced,) = graph.splice_many(
                graph_def, lambda b, outcomes=ordered: [_boolean_ordering(b, at_false=bool(outcomes[0]),
                                                                          at_true=bool(outcomes[1]))],
                [(condition, tf.bool, None)], node.name + _SCOPE, nodes)
            graph.redirect(graph_def, node.name, replaced)
            rewritten += 1
            break
    return rewritten


_INT64_SPELLINGS = {
    # |x| = max(x, -x): NEG and MAXIMUM, both int64 in TFLite; at -2**63 both wrap to -2**63, as TensorFlow's Abs
    "Abs": lambda x: tf.maximum(x, -x),
    # the sign of an integer is the integer clipped to [-1, 1]
    "Sign": lambda x: tf.minimum(tf.maximum(x, tf.constant(-1, x.dtype)), tf.constant(1, x.dtype)),
}


def int64_abs_and_sign_as_min_max(graph_def):
    """Rewrite int64 Abs and Sign (DeBERTa's relative-position buckets: the distances between int64 positions)
    as NEG, MAXIMUM and MINIMUM, which TFLite has in int64; its ABS and SIGN take float32 and int32 (ABS
    int16 too) only."""
    found = [node for node in graph_def.node if node.op in _INT64_SPELLINGS
             and graph.attribute(node, "T", None) == tf.int64.as_datatype_enum]
    return _spelled_in_builtins(graph_def, found, lambda node, nodes, shape: _INT64_SPELLINGS[node.op])


# The dtypes TFLite's MAX_POOL_2D takes.
_POOLED_DTYPES = frozenset(dtype.as_datatype_enum for dtype in (tf.float32, tf.int8, tf.uint8, tf.int16))


def _window_maxima(x, size, stride, padding, axis):
    """The maxima of x's windows of `size` every `stride` along `axis`, as TensorFlow's pooling places them
    (SAME: the input padded by the lowest value, the odd element after), where the input's size along it is
    known only when it runs: the maximum of `size` strided slices, one a position in the window."""
    length = tf.shape(x)[axis]

    def along_the_axis(value, elsewhere):  # a vector of 4 (a matrix of 4 rows), `value` at the axis
        return tf.stack([value if each == axis else elsewhere for each in range(4)])

    if padding == b"SAME":
        count = (length + stride - 1) // stride
        total = tf.maximum((count - 1) * stride + size - length, 0)
        x = tf.pad(x, along_the_axis(tf.stack([total // 2, total - total // 2]), tf.zeros([2], tf.int32)),
                   constant_values=x.dtype.min)
    else:
        count = (length - size) // stride + 1
    every_other_axis = 0b1111 & ~(1 << axis)
    windows = [tf.strided_slice(x, along_the_axis(tf.constant(offset), 0),
                                along_the_axis(offset + (count - 1) * stride + 1, 0),
                                [stride if each == axis else 1 for each in range(4)],
                                begin_mask=every_other_axis, end_mask=every_other_axis) for offset in range(size)]
    pooled = windows[0]
    for window in windows[1:]:
        pooled = tf.maximum(pooled, window)
    return pooled


def _max_pool_spelling(node, nodes, shape):
    sizes, strides = list(node.attr["ksize"].list.i), list(node.attr["strides"].list.i)
    padding = node.attr["padding"].s
    if len(sizes) != 4 or len(strides) != 4 or sizes[0] != 1 or sizes[3] != 1 or strides[0] != 1 or \
            strides[3] != 1 or padding not in (b"SAME", b"VALID"):
        return None

    def pooled(x):
        for axis in (1, 2):  # a maximum over a window's rows of the maxima over its columns
            if sizes[axis] != 1 or strides[axis] != 1:
                x = _window_maxima(x, sizes[axis], strides[axis], padding, axis)
        return x

    return pooled


def integer_max_pools_as_maxima(graph_def):
    """Rewrite MaxPool of a dtype TFLite's MAX_POOL_2D does not take (int32, int64: Funnel Transformer pools its
    attention mask and token types with tf.nn.max_pool1d), in NHWC and over height and width, as MAXIMUMs of
    strided slices: exact for any value, where a float pooling would round int32's beyond 2**24."""
    found = [node for node in graph_def.node if node.op == "MaxPool"
             and graph.attribute(node, "T", tf.float32.as_datatype_enum) not in _POOLED_DTYPES
             and graph.attribute(node, "data_format", b"NHWC") == b"NHWC"]
    return _spelled_in_builtins(graph_def, found, _max_pool_spelling)


def _input_ids(name, nodes):
    """Whether tensor `name` is a model input, through Identity-like nodes and casts."""
    node = graph.producer(name, nodes)
    while node is not None and node.op == "Cast":
        node = graph.producer(graph.data_inputs(node)[0], nodes)
    return node is not None and node.op in _INPUT_OPS


def _wrapped_ids(node, nodes):
    """The ids tensor of `where(ids < 0, ids + rows, ids)` (SelectV2 `node`, as keras.ops.take spells it), or
    None for any other select."""
    condition, wrapped, ids = graph.data_inputs(node)
    less, add = graph.producer(condition, nodes), graph.producer(wrapped, nodes)
    if less is None or add is None or less.op != "Less" or add.op not in ("Add", "AddV2"):
        return None
    ids = graph.resolve(ids, nodes)
    zero = graph.constant_value(graph.data_inputs(less)[1], nodes)
    if graph.resolve(graph.data_inputs(less)[0], nodes) != ids or zero is None or zero.size != 1 or zero.item():
        return None
    return ids if ids in (graph.resolve(operand, nodes) for operand in graph.data_inputs(add)) else None


def input_ids_gathered_directly(graph_def):
    """Point each gather that reads keras.ops.take's wrap of ids a model input gives at the ids themselves."""
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    rewritten = 0
    for node in [node for node in graph_def.node if node.op == "SelectV2"]:
        ids = _wrapped_ids(node, nodes)
        reading = readers.get(graph.canonical(node.name), [])
        if ids is None or not _input_ids(ids, nodes) or not reading or \
                any(reader.op not in ("GatherV2", "ResourceGather") or position != 1 for reader, position in reading):
            continue
        for reader, position in reading:
            reader.input[position] = ids
        rewritten += 1
    return rewritten


TO_BUILTINS = (rolls_as_slices, new_axes_as_expand_dims, products_as_mul, einsum_operands_given_their_rank,
               int64_abs_and_sign_as_min_max, narrow_integer_orderings_in_int32, integer_max_pools_as_maxima,
               transposes_of_fewer_axes, fourier_as_matmuls.real_transforms_as_matmuls, input_ids_gathered_directly,
               orderings_of_booleans_as_booleans)  # after the ids' gather: it reads the ids, dropping their wrap
