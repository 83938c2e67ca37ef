"""XlaCallModule ops (StableHLO, from JAX) translated into the TensorFlow ops they compute.

Why translate rather than hand the module to the stock converter: the stock converter lowers StableHLO
straight to TFLite, so JAX's erf approximation arrives as two dozen ops (ABS, EXP, DIV, SELECT), a
polymorphic batch as shape machinery (BROADCAST_TO, UNSORTED_SEGMENT_PROD, GATHER) that TFLite Micro lacks,
and nothing of it reaches the passes that make GELUs what a runtime has. Translated, the module is a
TensorFlow graph like any other: every GELU region (`stablehlo_gelus`, by what it computes) becomes the
canonical TensorFlow GELU, which the rewrite then makes a GELU op, builtins or int8 as the mode says; shape
computations read `tf.shape`, which folds away once `--input-shape` or a static-shape target fixes the
shapes; and parity still runs the original module in TensorFlow, an independent check of this translation.

An operation without a translation here stops the conversion in one line naming it (errors.ConverterFailed, exit 11).
"""

import math
import string

import numpy as np
import tensorflow as tf

from keras_gelu import formulas

from .. import errors
from ..reading import stablehlo
from . import graph
from . import stablehlo_gelus


def _dtype(tensor_type):
    return tf.bfloat16 if tensor_type.dtype == "bfloat16" else tf.as_dtype(tensor_type.dtype)


def _shape(tensor):
    """The tensor's shape as a list: ints where static, scalar int32 tensors where dynamic."""
    static = tensor.shape.as_list()
    if all(size is not None for size in static):
        return static
    dynamic = tf.shape(tensor, out_type=tf.int32)
    return [size if size is not None else dynamic[index] for index, size in enumerate(static)]


def _shape_argument(sizes):
    """A shape for reshape or broadcast_to: the list itself where every size is static, else the sizes stacked."""
    return tf.stack(sizes) if any(isinstance(size, tf.Tensor) for size in sizes) else list(sizes)


def _canonical_gelu(x, function, alpha):
    """The GELU in the spelling rewriting.patterns reads (tf.nn.gelu's, the tanh form's, x sigmoid(1.702 x))."""
    dtype = x.dtype
    scaled = x if alpha == 1.0 else x * tf.constant(alpha, dtype)
    if function == "exact":
        return 0.5 * x * (1.0 + tf.math.erf(scaled * tf.constant(formulas.SQRT_HALF, dtype)))
    if function == "tanh":
        inner = scaled + tf.constant(formulas.TANH_CUBIC, dtype) * scaled * scaled * scaled
        return 0.5 * x * (1.0 + tf.math.tanh(tf.constant(formulas.TANH_SCALE, dtype) * inner))
    return x * tf.math.sigmoid(tf.constant(formulas.SIGMOID_SLOPE, dtype) * x)


def _is_bool(tensor):
    return tensor.dtype == tf.bool


def _integer_divide(x, y):
    return tf.truncatediv(x, y) if x.dtype.is_integer else tf.math.divide(x, y)


def _logical_or_bitwise(logical, bitwise):
    return lambda x, y: logical(x, y) if _is_bool(x) else bitwise(x, y)


_ELEMENTWISE = {
    "stablehlo.add": tf.math.add, "stablehlo.subtract": tf.math.subtract, "stablehlo.multiply": tf.math.multiply,
    "stablehlo.divide": _integer_divide, "stablehlo.maximum": tf.math.maximum, "stablehlo.minimum": tf.math.minimum,
    "stablehlo.power": tf.math.pow, "stablehlo.remainder": tf.truncatemod, "stablehlo.atan2": tf.math.atan2,
    "stablehlo.and": _logical_or_bitwise(tf.math.logical_and, tf.bitwise.bitwise_and),
    "stablehlo.or": _logical_or_bitwise(tf.math.logical_or, tf.bitwise.bitwise_or),
    "stablehlo.xor": _logical_or_bitwise(tf.math.logical_xor, tf.bitwise.bitwise_xor),
    "stablehlo.negate": tf.math.negative, "stablehlo.abs": tf.math.abs, "stablehlo.exponential": tf.math.exp,
    "stablehlo.exponential_minus_one": tf.math.expm1, "stablehlo.log": tf.math.log,
    "stablehlo.log_plus_one": tf.math.log1p, "stablehlo.tanh": tf.math.tanh, "stablehlo.logistic": tf.math.sigmoid,
    "stablehlo.sqrt": tf.math.sqrt, "stablehlo.rsqrt": tf.math.rsqrt, "stablehlo.sine": tf.math.sin,
    "stablehlo.cosine": tf.math.cos, "stablehlo.tan": tf.math.tan, "stablehlo.floor": tf.math.floor,
    "stablehlo.ceil": tf.math.ceil, "stablehlo.sign": tf.math.sign, "stablehlo.round_nearest_even": tf.math.round,
    "stablehlo.is_finite": tf.math.is_finite, "chlo.erf": tf.math.erf, "chlo.erfc": tf.math.erfc,
    "stablehlo.not": lambda x: tf.math.logical_not(x) if _is_bool(x) else tf.bitwise.invert(x),
    "stablehlo.cbrt": lambda x: tf.math.sign(x) * tf.math.pow(tf.math.abs(x), 1.0 / 3.0),
    "stablehlo.round_nearest_afz": lambda x: tf.math.sign(x) * tf.math.floor(tf.math.abs(x) + 0.5),
}
_COMPARE = {"EQ": tf.math.equal, "NE": tf.math.not_equal, "LT": tf.math.less, "LE": tf.math.less_equal,
            "GT": tf.math.greater, "GE": tf.math.greater_equal}
# A reduction body of one binary operation, and the identity an init value may be skipped at.
_REDUCTIONS = {"stablehlo.add": (tf.math.reduce_sum, 0.0), "stablehlo.multiply": (tf.math.reduce_prod, 1.0),
               "stablehlo.maximum": (tf.math.reduce_max, -math.inf),
               "stablehlo.minimum": (tf.math.reduce_min, math.inf),
               "stablehlo.and": (tf.math.reduce_all, True), "stablehlo.or": (tf.math.reduce_any, False)}


_RETURNS = ("func.return", "stablehlo.return")


class _Translation:
    """One module's translation into the default TensorFlow graph."""

    def __init__(self, module, where):
        self.module, self.where = module, where
        # A broadcast's operand with its axes aligned, by the broadcast's result (tensor.ref()): where an
        # elementwise op reads it beside an operand of the full shape, TensorFlow's implicit broadcasting does
        # the broadcast, which a dynamic batch would otherwise keep as SHAPE and BROADCAST_TO ops.
        self.aligned = {}

    def refuse(self, operation, what="has no TensorFlow translation here"):
        raise errors.ConverterFailed(f"{self.where}: StableHLO operation {operation.name} {what}")

    def call(self, function_name, arguments):
        function = self.module.functions.get(function_name)
        if function is None:
            raise errors.ConverterFailed(f"{self.where}: the StableHLO module calls {function_name}, which it does "
                                         "not hold")
        return self.block(function.body, arguments)

    def block(self, block, arguments):
        """The values `block` returns, its arguments bound to the TensorFlow tensors `arguments`."""
        values = dict(zip(block.arguments, arguments))
        gelus = stablehlo_gelus.find(block, self.module.value_types)
        needed = self._needed(block, gelus)
        for operation in block.operations:
            if operation.name in _RETURNS:
                return [values[operand] for operand in operation.operands]
            if not any(result in needed for result in operation.results):
                if operation.name == "stablehlo.custom_call":  # a call for its effect: a check, or refused
                    self._custom_call(operation, None, operation.attributes, None)
                continue
            if len(operation.results) == 1 and operation.results[0] in gelus:
                gelu = gelus[operation.results[0]]
                values[operation.results[0]] = _canonical_gelu(values[gelu.x], gelu.function, gelu.alpha)
                continue
            results = self.operation(operation, [values[operand] for operand in operation.operands])
            values.update(zip(operation.results, results))
        raise errors.ConverterFailed(f"{self.where}: a StableHLO block without a return")

    @staticmethod
    def _needed(block, gelus):
        """The values the block's return depends on, a GELU region's inner values only where something else
        reads them."""
        producer = {result: op for op in block.operations for result in op.results}
        needed, pending = set(), [v for op in block.operations if op.name in _RETURNS for v in op.operands]
        while pending:
            value = pending.pop()
            if value in needed:
                continue
            needed.add(value)
            operation = producer.get(value)
            if operation is None:
                continue
            pending.extend([gelus[value].x] if value in gelus else operation.operands)
        return needed

    def operation(self, operation, operands):
        name, attributes = operation.name, operation.attributes
        result_types = operation.result_types
        if name in _ELEMENTWISE or name in ("stablehlo.select", "stablehlo.clamp"):
            operands = self._implicitly_broadcast(operands)
        if name in _ELEMENTWISE:
            return [_ELEMENTWISE[name](*operands)]
        method = getattr(self, "_" + name.split(".", 1)[1], None) if name.startswith(("stablehlo.", "func.")) \
            else None
        if method is None:
            self.refuse(operation)
        result = method(operation, operands, attributes, result_types)
        return result if isinstance(result, list) else [result]

    def _implicitly_broadcast(self, operands):
        """The operands, each broadcast one as its aligned operand, where another operand has the full shape."""
        if len(operands) < 2 or all(operand.ref() in self.aligned for operand in operands):
            return operands
        return [self.aligned.get(operand.ref(), operand) for operand in operands]

    # One method per operation, named after it; each returns the result tensor or a list of them.

    def _constant(self, operation, operands, attributes, result_types):
        return tf.constant(attributes["value"], dtype=_dtype(result_types[0]))

    def _call(self, operation, operands, attributes, result_types):
        return self.call(attributes["callee"], operands)

    def _custom_call(self, operation, operands, attributes, result_types):
        if attributes.get("call_target_name") in stablehlo.CHECKS_ONLY:
            return []
        self.refuse(operation, f"(custom call {attributes.get('call_target_name')!r}) has no TensorFlow translation")

    def _optimization_barrier(self, operation, operands, attributes, result_types):
        return list(operands)

    def _compare(self, operation, operands, attributes, result_types):
        return _COMPARE[attributes["comparison_direction"]](*operands)

    def _select(self, operation, operands, attributes, result_types):
        return tf.where(*operands)

    def _clamp(self, operation, operands, attributes, result_types):
        low, x, high = operands
        return tf.math.minimum(tf.math.maximum(x, low), high)

    def _convert(self, operation, operands, attributes, result_types):
        dtype = _dtype(result_types[0])
        if dtype == tf.bool:
            return tf.math.not_equal(operands[0], tf.zeros((), operands[0].dtype))
        return tf.cast(operands[0], dtype)

    def _bitcast_convert(self, operation, operands, attributes, result_types):
        return tf.bitcast(operands[0], _dtype(result_types[0]))

    def _iota(self, operation, operands, attributes, result_types):
        shape = result_types[0].shape
        if None in shape:
            self.refuse(operation, "of a dynamic shape has no TensorFlow translation here")
        return self._iota_of(shape, attributes["iota_dimension"], _dtype(result_types[0]))

    def _dynamic_iota(self, operation, operands, attributes, result_types):
        return self._iota_of(tf.unstack(tf.cast(operands[0], tf.int32), num=len(result_types[0].shape)),
                             attributes["iota_dimension"], _dtype(result_types[0]))

    @staticmethod
    def _iota_of(shape, dimension, dtype):
        line = tf.range(tf.cast(shape[dimension], tf.int32), dtype=tf.int32)
        line = tf.reshape(line, [-1 if index == dimension else 1 for index in range(len(shape))])
        return tf.broadcast_to(tf.cast(line, dtype), _shape_argument(shape))

    def _get_dimension_size(self, operation, operands, attributes, result_types):
        return tf.shape(operands[0], out_type=tf.int32)[attributes["dimension"]]

    def _broadcast_in_dim(self, operation, operands, attributes, result_types):
        shape = result_types[0].shape
        if None in shape:
            self.refuse(operation, "to a dynamic shape has no TensorFlow translation here")
        return self._broadcast(operands[0], attributes["broadcast_dimensions"], shape)

    def _dynamic_broadcast_in_dim(self, operation, operands, attributes, result_types):
        return self._broadcast(operands[0], attributes["broadcast_dimensions"], tf.cast(operands[1], tf.int32),
                               rank=len(result_types[0].shape))

    def _broadcast(self, x, dimensions, shape, rank=None):
        rank = len(shape) if rank is None else rank
        sizes = _shape(x)
        aligned = [1] * rank
        for operand_dimension, result_dimension in enumerate(dimensions):
            aligned[result_dimension] = sizes[operand_dimension]
        if aligned != sizes:
            x = tf.reshape(x, _shape_argument(aligned))
        broadcast = tf.broadcast_to(x, shape)
        self.aligned[broadcast.ref()] = self.aligned.get(x.ref(), x)
        return broadcast

    def _reshape(self, operation, operands, attributes, result_types):
        shape = result_types[0].shape
        if None in shape:
            self.refuse(operation, "to a dynamic shape has no TensorFlow translation here")
        return tf.reshape(operands[0], shape)

    def _dynamic_reshape(self, operation, operands, attributes, result_types):
        return tf.reshape(operands[0], tf.cast(operands[1], tf.int32))

    def _transpose(self, operation, operands, attributes, result_types):
        return tf.transpose(operands[0], attributes["permutation"])

    def _concatenate(self, operation, operands, attributes, result_types):
        return tf.concat(operands, axis=attributes["dimension"])

    def _slice(self, operation, operands, attributes, result_types):
        return tf.strided_slice(operands[0], attributes["start_indices"], attributes["limit_indices"],
                                attributes["strides"])

    def _clamped_starts(self, x, starts, sizes):
        """StableHLO clamps a dynamic slice's starts so that the slice fits; tf.slice would fail instead."""
        dimensions = _shape(x)
        return tf.stack([tf.clip_by_value(tf.cast(tf.reshape(start, []), tf.int32), 0, dimension - size)
                         for start, dimension, size in zip(starts, dimensions, sizes)])

    def _dynamic_slice(self, operation, operands, attributes, result_types):
        sizes = attributes["slice_sizes"]
        return tf.slice(operands[0], self._clamped_starts(operands[0], operands[1:], sizes), sizes)

    def _dynamic_update_slice(self, operation, operands, attributes, result_types):
        x, update, starts = operands[0], operands[1], operands[2:]
        return tf.raw_ops.XlaDynamicUpdateSlice(input=x, update=update,
                                                indices=self._clamped_starts(x, starts, _shape(update)))

    def _pad(self, operation, operands, attributes, result_types):
        x, value = operands
        low, high = attributes["edge_padding_low"], attributes["edge_padding_high"]
        if any(attributes["interior_padding"]):
            self.refuse(operation, "with interior padding has no TensorFlow translation here")
        padded = tf.pad(x, [[max(a, 0), max(b, 0)] for a, b in zip(low, high)], constant_values=value)
        if min(low + high) >= 0:
            return padded
        sizes = _shape(padded)
        return tf.strided_slice(padded, [max(-a, 0) for a in low],
                                tf.stack([size - max(-b, 0) for size, b in zip(sizes, high)]))

    def _dot_general(self, operation, operands, attributes, result_types):
        numbers = attributes["dot_dimension_numbers"]
        lhs_batch, rhs_batch = numbers["lhs_batching_dimensions"], numbers["rhs_batching_dimensions"]
        lhs_contract, rhs_contract = numbers["lhs_contracting_dimensions"], numbers["rhs_contracting_dimensions"]
        lhs, rhs = (tf.cast(x, _dtype(result_types[0])) for x in operands)
        letters = iter(string.ascii_letters)
        lhs_letters, rhs_letters = [None] * lhs.shape.rank, [None] * rhs.shape.rank
        for left, right in list(zip(lhs_batch, rhs_batch)) + list(zip(lhs_contract, rhs_contract)):
            lhs_letters[left] = rhs_letters[right] = next(letters)
        lhs_free = [i for i in range(len(lhs_letters)) if lhs_letters[i] is None]
        rhs_free = [i for i in range(len(rhs_letters)) if rhs_letters[i] is None]
        for i in lhs_free:
            lhs_letters[i] = next(letters)
        for i in rhs_free:
            rhs_letters[i] = next(letters)
        output = [lhs_letters[i] for i in lhs_batch] + [lhs_letters[i] for i in lhs_free] + \
                 [rhs_letters[i] for i in rhs_free]
        equation = f"{''.join(lhs_letters)},{''.join(rhs_letters)}->{''.join(output)}"
        return tf.einsum(equation, lhs, rhs)

    def _reduce(self, operation, operands, attributes, result_types):
        body = operation.regions[0][0]
        count = len(operands) // 2
        if count != 1 or len(body.operations) != 2 or body.operations[0].name not in _REDUCTIONS:
            self.refuse(operation, "with a body other than one add, multiply, maximum, minimum, and or or has no "
                        "TensorFlow translation here")
        reduce, identity = _REDUCTIONS[body.operations[0].name]
        x, init = operands
        result = reduce(x, axis=attributes["dimensions"])
        if tf.get_static_value(init) is not None and np.all(tf.get_static_value(init) == identity):
            return result
        return _ELEMENTWISE[body.operations[0].name](result, init)

    def _reduce_window(self, operation, operands, attributes, result_types):
        body = operation.regions[0][0]
        x, init = operands
        rank = x.shape.rank
        window = attributes["window_dimensions"]
        strides = attributes.get("window_strides", [1] * rank)
        padding = np.asarray(attributes.get("padding", np.zeros((rank, 2), np.int64))).reshape(rank, 2)
        dilated = any(d != 1 for d in attributes.get("base_dilations", [1] * rank) +
                      attributes.get("window_dilations", [1] * rank))
        kind = body.operations[0].name if len(body.operations) == 2 else None
        pooled = [i for i in range(rank) if window[i] != 1 or strides[i] != 1]
        if dilated or kind not in ("stablehlo.add", "stablehlo.maximum") or not pooled or \
                pooled != list(range(pooled[0], pooled[-1] + 1)) or pooled[0] == 0 or pooled[-1] == rank - 1 \
                or len(pooled) > 3:
            self.refuse(operation, "of this window (dilated, over the first or last axis, or a body other than "
                        "add or maximum) has no TensorFlow translation here")
        if padding.any():
            x = tf.pad(x, padding.tolist(), constant_values=init)
        # [batch, spatial..., channels], as tf.nn.pool wants: the axes outside the window folded into those.
        shape = _shape(x)
        outer = shape[:pooled[0]]
        inner = shape[pooled[-1] + 1:]
        folded = tf.reshape(x, tf.stack([tf.reduce_prod(tf.stack(outer))] + [shape[i] for i in pooled] +
                                        [tf.reduce_prod(tf.stack(inner))]))
        pooling = "MAX" if kind == "stablehlo.maximum" else "AVG"
        result = tf.nn.pool(folded, [window[i] for i in pooled], pooling, strides=[strides[i] for i in pooled],
                            padding="VALID")
        if pooling == "AVG":  # a window sum: every window is whole, the padding being explicit
            result = result * tf.constant(float(np.prod([window[i] for i in pooled])), result.dtype)
        out_shape = _shape(result)
        return tf.reshape(result, tf.stack(outer + out_shape[1:-1] + inner))

    def _convolution(self, operation, operands, attributes, result_types):
        x, kernel = operands
        numbers = attributes["dimension_numbers"]
        spatial = len(numbers["input_spatial_dimensions"])
        lhs_dilation = attributes.get("lhs_dilation", [1] * spatial)
        if any(d != 1 for d in lhs_dilation) or attributes.get("batch_group_count", 1) != 1 or \
                any(attributes.get("window_reversal", [False] * spatial)):
            self.refuse(operation, "with an input dilation, batch groups or window reversal (a transposed "
                        "convolution) has no TensorFlow translation here")
        x = tf.transpose(x, [numbers["input_batch_dimension"]] + numbers["input_spatial_dimensions"] +
                         [numbers["input_feature_dimension"]])
        kernel = tf.transpose(kernel, numbers["kernel_spatial_dimensions"] +
                              [numbers["kernel_input_feature_dimension"], numbers["kernel_output_feature_dimension"]])
        padding = np.asarray(attributes.get("padding", np.zeros((spatial, 2), np.int64))).reshape(spatial, 2)
        x = self._pad(operation, [x, tf.zeros((), x.dtype)], {
            "edge_padding_low": [0] + padding[:, 0].tolist() + [0],
            "edge_padding_high": [0] + padding[:, 1].tolist() + [0], "interior_padding": [0] * (spatial + 2)}, None)
        strides = attributes.get("window_strides", [1] * spatial)
        dilations = attributes.get("rhs_dilation", [1] * spatial)
        groups = attributes.get("feature_group_count", 1)
        if groups == 1:
            y = tf.nn.convolution(x, kernel, strides=strides, padding="VALID", dilations=dilations)
        elif groups == x.shape[-1] and spatial == 2 and kernel.shape[-2] == 1:
            multiplier = kernel.shape[-1] // groups
            y = tf.nn.depthwise_conv2d(x, tf.reshape(kernel, kernel.shape[:2] + [groups, multiplier]),
                                       [1] + strides + [1], "VALID", dilations=dilations)
        else:
            y = tf.concat([tf.nn.convolution(part, kernel_part, strides=strides, padding="VALID", dilations=dilations)
                           for part, kernel_part in zip(tf.split(x, groups, axis=-1),
                                                        tf.split(kernel, groups, axis=-1))], axis=-1)
        # y is [batch, spatial..., features]: put each where the output's dimension numbers say.
        layout = [numbers["output_batch_dimension"]] + numbers["output_spatial_dimensions"] + \
                 [numbers["output_feature_dimension"]]
        return tf.transpose(y, np.argsort(layout).tolist())

    def _gather(self, operation, operands, attributes, result_types):
        x, indices = operands
        numbers = attributes["dimension_numbers"]
        rank = x.shape.rank
        start_map, collapsed = numbers["start_index_map"], numbers["collapsed_slice_dims"]
        sizes, offset_dims = attributes["slice_sizes"], numbers["offset_dims"]
        index_vector = numbers["index_vector_dim"]
        batching = numbers.get("operand_batching_dims", []) + numbers.get("start_indices_batching_dims", [])
        static = x.shape.as_list()
        if (len(start_map) != 1 or collapsed != start_map or batching or
                any(sizes[d] != (1 if d == start_map[0] else static[d]) for d in range(rank))):
            self.refuse(operation, "other than a lookup along one axis (tf.gather's) has no TensorFlow "
                        "translation here")
        axis = start_map[0]
        if index_vector < indices.shape.rank:
            indices = tf.squeeze(indices, axis=index_vector)
        dimension = _shape(x)[axis]
        indices = tf.clip_by_value(indices, tf.cast(0, indices.dtype), tf.cast(dimension - 1, indices.dtype))
        gathered = tf.gather(x, indices, axis=axis)  # x's dims before axis, the batch dims, x's dims after it
        batch_rank = indices.shape.rank
        before = list(range(axis))
        batch = list(range(axis, axis + batch_rank))
        after = list(range(axis + batch_rank, rank - 1 + batch_rank))
        operand_dims = before + after  # in the order of x's non-collapsed dims, which offset_dims take
        order = [None] * (rank - 1 + batch_rank)
        for position, dim in zip(offset_dims, operand_dims):
            order[position] = dim
        remaining = iter(batch)
        order = [next(remaining) if dim is None else dim for dim in order]
        return tf.transpose(gathered, order) if order != sorted(order) else gathered


def modules_translated(graph_def):
    """Replace, in place, each XlaCallModule node with the TensorFlow ops its module computes; returns how many
    modules it translated (the rewrite then finds the GELUs they wrote as it finds any)."""
    translated_count = 0
    for node in [node for node in graph_def.node if node.op == stablehlo.XLA_CALL_MODULE]:
        name, where = node.name, f"XlaCallModule {node.name}"
        if graph.attribute(node, "has_token_input_output", False):
            raise errors.ConverterFailed(f"{where}: its module passes tokens to host callbacks, which have no "
                                         "TensorFlow translation")
        if "function_list" in node.attr and node.attr["function_list"].list.func:
            raise errors.ConverterFailed(f"{where}: its module calls TensorFlow functions back (call_tf), which "
                                         "have no translation here")
        module = stablehlo.read(node.attr["module"].s)
        entry_types = module.entry.body.argument_types
        platforms = [p.decode() for p in node.attr["platforms"].list.s]
        inputs = graph.data_inputs(node)
        leading = []
        if len(platforms) > 1:  # the module's first argument picks the platform its code runs as
            leading = [np.int32(platforms.index("CPU") if "CPU" in platforms else 0)]
        if len(entry_types) != len(leading) + len(inputs):
            raise errors.ConverterFailed(f"{where}: its module takes {len(entry_types)} arguments and the op "
                                         f"passes {len(inputs)}")

        def translated(*placeholders):
            arguments = [tf.constant(value) for value in leading] + list(placeholders)
            return _Translation(module, where).call(stablehlo.ENTRY, arguments)

        specs = [(operand, _dtype(entry_type), list(entry_type.shape))
                 for operand, entry_type in zip(inputs, entry_types[len(leading):])]
        outputs = graph.splice_many(graph_def, translated, specs, name + "/stablehlo/",
                                    control_inputs=[operand for operand in node.input if operand.startswith("^")])
        translated_count += 1
        # The op becomes an IdentityN of the translation under its own name: whatever reads its outputs by name
        # (a function's return, a signature) reads them still.
        output_types = list(node.attr["Tout"].list.type)
        node.Clear()
        node.name, node.op = name, "IdentityN"
        node.input.extend(outputs)
        node.attr["T"].list.type.extend(output_types)
    return translated_count


def holds_modules(graph_def):
    """Whether the graph or a function of its library runs a StableHLO module."""
    return any(node.op == stablehlo.XLA_CALL_MODULE for node in graph.every_node(graph_def))
