"""What each layer kind fake-quantizes under Keras 3 QAT, op for op as the int8 .tflite computes it.

A `QuantizeRule` says which int8 ranges a layer has (`build`) and computes
the layer with them (`call`); `QuantizeWrapper` holds a layer, its rule and
the ranges' variables. The rules here:

* `DenseRule`: FULLY_CONNECTED (on a 2-D view of N-D inputs). The kernel on a symmetric per-tensor range
  (as tfmot, which TFLite's converter turns into per-tensor int8 weights),
  the bias left to the converter (int32 from the input and kernel scales),
  the fused ReLU/ReLU6/linear kept fused, the output on a moving-average range.
  `EinsumDenseRule`: the same, computed as a 2-D matmul.
* `ConvolutionRule`: CONV_2D and DEPTHWISE_CONV_2D, 1-D ones computed as
  the 2-D ones they become, separable ones as both: kernels per output
  channel, symmetric; the output as Dense's. `AveragePoolingRule`: a
  depthwise convolution. `EmbeddingRule`: the table on a range, gathered.
* `GELURule`, `LearnableGELURule`: what `keras_gelu.replacements` says the
  GELU becomes in the conversion's mode, each intermediate on a range and
  sigmoid outputs on TFLite's fixed LOGISTIC grid (k/256).
* `MultiHeadAttentionRule`, `LayerNormalizationRule`: the int8 ops they
  become, every intermediate on a range. `SoftmaxRule`, `ActivationRule`:
  fixed output grids where TFLite has them.
* `OutputRule`: the layer as it is, its output on a range (pooling...). `AddRule`: each partial sum too.

Everything a rule computes must convert to int8 ops with a range right after
each: an op the converter puts between an op and its range (a RESHAPE before
a bias ADD, say) leaves that op float. So rules compute some layers in
another, equal form (see `_einsum_dense`, `_spread_taps`).

Add a rule for a layer of yours with `register_rule(YourLayer, YourRule())`.
"""

import inspect
import math

import numpy as np

from keras_gelu import layer_configs
from keras_gelu import replacements
from keras_gelu.flavour import keras
from keras_gelu.flavour import register_serializable
from keras_gelu.layers import GELU
from keras_gelu.layers import LearnableGELU
from keras_gelu.qat.keras3 import attention
from keras_gelu.qat.keras3 import folding
from keras_gelu.qat.keras3.keras_classes import LayerScale
from keras_gelu.qat.keras3.refusals import refusal

# Activations TFLite fuses into FULLY_CONNECTED / CONV_2D, and keeps fused in int8.
FUSABLE_ACTIVATIONS = ("linear", "relu", "relu6")


class QuantizeRule:
    """How one layer kind is fake-quantized.

    Subclass it, and register an instance with `register_rule`:

    * `build(wrapper, layer)`: create the layer's ranges on the wrapper (whose
      `layer_input_shape` is the layer's input shape), with
      `wrapper.add_activation_range(name)`, `wrapper.add_weight_range(name,
      weight, axis=None)` and `wrapper.add_constant_range(name, weight)`;
    * `call(wrapper, layer, inputs, training, **kwargs)`: compute the layer
      with its weights and outputs passed through those ranges
      (`wrapper.ranges[name](tensor, training)`); `kwargs` are the layer
      call's other arguments (a mask, say).

    A layer called on more than one tensor (attention on a query and a
    value) also says how its call's arguments become the wrapper's one
    `inputs` (`call_arguments`) and how `inputs`, or their shapes, become the
    layer's `build` arguments again (`layer_arguments`).

    A rule has no state of its own (one instance serves every layer of its
    kind) and is saved by its config: register its class with
    `keras.saving.register_keras_serializable`.
    """

    def build(self, wrapper, layer):
        raise NotImplementedError

    def call(self, wrapper, layer, inputs, training, **kwargs):
        raise NotImplementedError

    def call_arguments(self, layer, args, kwargs):
        """A functional call `layer(*args, **kwargs)` as (inputs, kwargs): what the wrapper is called with."""
        args, kwargs = self.first_argument_positional(layer, args, kwargs)
        if len(args) != 1:
            raise refusal(layer, f"{type(self).__name__} covers layers called on one input (a tensor or a list); "
                                 f"{layer.name} is called on {len(args)}. Received: args of {len(args)} tensors")
        return args[0], kwargs

    @staticmethod
    def first_argument_positional(layer, args, kwargs):
        """(args, kwargs) of a call by keywords alone (keras-hub's BART decoder; PaliGemma's attention calls its
        Dense layers as `query_proj(inputs=x)`) with its call's first parameter made positional, as Keras builds
        the layer from it; any other call as it is."""
        if args:
            return args, kwargs
        first = next(iter(inspect.signature(layer.call).parameters))
        if first not in kwargs:
            return args, kwargs
        kwargs = dict(kwargs)
        return (kwargs.pop(first),), kwargs

    def layer_arguments(self, inputs):
        """The wrapper's `inputs` (or their shapes) as the positional arguments of the layer's `build`."""
        return (inputs,)

    def layer_config(self, layer):
        """The layer as the QAT model's file saves it (`keras.saving.serialize_keras_object`'s form)."""
        return layer_configs.serialized(layer)

    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        return f"{type(self).__name__}({self.get_config()})"


def _check_fused_activation(layer):
    name = keras.activations.serialize(layer.activation)
    name = name if isinstance(name, str) else None
    if name not in FUSABLE_ACTIVATIONS:
        raise refusal(layer, f"Layer {layer.name} has a fused activation TFLite does not fuse in int8; quantize_model "
                             f"splits GELU, softmax, sigmoid and tanh out, others need a layer of their own. Received: "
                             f"activation={getattr(layer.activation, '__name__', layer.activation)}")


@register_serializable
class OutputRule(QuantizeRule):
    """The layer as it is, its output (each of them) on a moving-average range."""

    def build(self, wrapper, layer):
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        return keras.tree.map_structure(lambda output: wrapper.ranges["output"](output, training),
                                        layer(inputs, **kwargs))


@register_serializable
class AddRule(QuantizeRule):
    """Add of n inputs as the n - 1 int8 ADDs it becomes, each sum on a range (BERT's embeddings: token,
    position and segment, where one range on the last sum would leave the first ADD float)."""

    def build(self, wrapper, layer):
        for index in range(1, len(wrapper.layer_input_shape) - 1):
            wrapper.add_activation_range(f"sum_{index}")
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        total = inputs[0]
        for index, addend in enumerate(inputs[1:], start=1):
            total = total + addend
            name = f"sum_{index}" if index < len(inputs) - 1 else "output"
            total = wrapper.ranges[name](total, training)
        return total


@register_serializable
class DenseRule(QuantizeRule):
    """FULLY_CONNECTED: kernel per tensor, symmetric; fused ReLU/ReLU6 kept; output on a moving-average range."""

    def build(self, wrapper, layer):
        _check_fused_activation(layer)
        wrapper.add_weight_range("kernel", lambda: _parameters(wrapper, layer)["kernel"])
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        parameters = _parameters(wrapper, layer)
        # the kernel's rows, not the input's last axis: a reshape to [b, s, -1] leaves that unknown (keras-hub's ESM)
        rows = inputs if len(inputs.shape) == 2 else keras.ops.reshape(inputs, (-1, layer.kernel.shape[0]))
        outputs = keras.ops.matmul(rows, wrapper.ranges["kernel"](parameters["kernel"], training))
        if parameters["bias"] is not None:
            outputs = outputs + parameters["bias"]
        outputs = wrapper.ranges["output"](layer.activation(outputs), training)
        return outputs if len(inputs.shape) == 2 else _unflattened(outputs, inputs, len(inputs.shape) - 1,
                                                                   (layer.units,))


def _parameters(wrapper, layer):
    """A Conv*/Dense layer's kernels and bias as its rule computes with them: with the BatchNormalization after it
    folded in where a composite's call folds one (`composite`: the wrapper's `folded_scaling`)."""
    return folding.folded_parameters(layer, getattr(wrapper, "folded_scaling", None))


def _unflattened(rows, inputs, leading_axes, free_shape):
    """A 2-D matmul's `rows` back to `inputs`' first `leading_axes` axes, then `free_shape`.

    Where the leading axes but the batch are static, the shape is -1 and those sizes: Keras's own N-D matmul,
    or a shape read from the tensor, leaves SHAPE, GATHER, REDUCE_PROD and PACK ops around every FULLY_CONNECTED
    in the .tflite, which TFLite Micro and NPUs run poorly or not at all."""
    leading = list(inputs.shape[:leading_axes])
    if all(size is not None for size in leading[1:]):
        return keras.ops.reshape(rows, [-1] + leading[1:] + list(free_shape))
    return keras.ops.reshape(rows, [keras.ops.shape(inputs)[axis] for axis in range(leading_axes)] + list(free_shape))


def _matmul_form(equation):
    """(batch, contracted, free) axis letters when `equation` is batch+contracted, contracted+free ->
    batch+free (a FULLY_CONNECTED on flattened axes), else None."""
    if "..." in equation:
        return None
    inputs, output = equation.split("->")
    source, kernel = inputs.split(",")
    free = "".join(letter for letter in kernel if letter not in source)
    contracted = kernel[:len(kernel) - len(free)]
    batch = source[:len(source) - len(contracted)]
    if not contracted or kernel != contracted + free or source != batch + contracted or output != batch + free:
        return None
    return batch, contracted, free


def _einsum_dense(wrapper, layer, inputs, training, kernel_range="kernel", output_range="output", scale=1.0):
    """An EinsumDense as FULLY_CONNECTED, its kernel and output on the named ranges; `scale` multiplies
    kernel and bias (folded into the constants, not an int8 MUL).

    Keras's einsum on more than one free axis converts to FULLY_CONNECTED, RESHAPE, then the bias ADD, which
    then stays float: computed here on flattened axes instead, the bias fused, the output reshaped after."""
    kernel = layer.kernel if scale == 1.0 else layer.kernel * scale
    bias = None if layer.bias is None else (layer.bias if scale == 1.0 else layer.bias * scale)
    activation = layer.activation or keras.activations.linear
    form = _matmul_form(layer.equation)
    free_shape = tuple(layer.kernel.shape[len(layer.kernel.shape) - len(form[2]):]) if form else None
    if form is None or (bias is not None and len(bias.shape) > len(free_shape)):
        outputs = keras.ops.einsum(layer.equation, inputs, wrapper.ranges[kernel_range](kernel, training))
        return wrapper.ranges[output_range](activation(outputs if bias is None else outputs + bias), training)
    contracted_size, free_size = math.prod(layer.kernel.shape[:len(form[1])]), math.prod(free_shape)
    # A 2-D matmul: one of higher rank becomes Tensordot's reshapes around it, and the bias ADD would follow one.
    outputs = keras.ops.matmul(keras.ops.reshape(inputs, (-1, contracted_size)),
                               wrapper.ranges[kernel_range](keras.ops.reshape(kernel, (contracted_size, free_size)),
                                                            training))
    if bias is not None:
        outputs = outputs + keras.ops.reshape(keras.ops.broadcast_to(bias, free_shape), (free_size,))
    outputs = wrapper.ranges[output_range](activation(outputs), training)
    # The batch shape read from the tensor (not _unflattened's static one): TF 2.18's converter gives a static
    # reshape here another int8 scale than its input's where a split-out GELU reads it, and fails.
    batch_shape = [keras.ops.shape(inputs)[axis] for axis in range(len(form[0]))]
    return keras.ops.reshape(outputs, batch_shape + list(free_shape))


@register_serializable
class EinsumDenseRule(QuantizeRule):
    """EinsumDense as FULLY_CONNECTED (on flattened axes, so that the bias stays fused): as Dense."""

    def build(self, wrapper, layer):
        if layer.activation is not None:
            _check_fused_activation(layer)
        wrapper.add_weight_range("kernel", layer.kernel)
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        return _einsum_dense(wrapper, layer, inputs, training)


@register_serializable
class LayerNormalizationRule(QuantizeRule):
    """LayerNormalization as the int8 ops it becomes: MEAN, SQUARED_DIFFERENCE, MEAN, ADD (epsilon), RSQRT,
    MUL (gamma), SUB, MUL, ADD (beta): (x - mean) * inv + beta, inv = gamma / sqrt(variance + epsilon), each
    intermediate on a range and gamma and beta as MUL/ADD constants.

    Centred first (not Keras 3's x * inv + (beta - mean * inv)): x - mean is the normalized value's scale,
    where x * inv and mean * inv grow with the mean, and their int8 grids with them; two ops fewer. A 4-D
    input (ConvNeXt's channels-last images) is normalized as a 3-D view of itself."""

    INTERMEDIATES = ("mean", "squared_difference", "variance", "variance_epsilon", "inverse_root", "inverse",
                     "centred", "normalized")

    def build(self, wrapper, layer):
        rank = len(wrapper.layer_input_shape)
        if layer.rms_scaling or [axis % rank for axis in layer.axis] != [rank - 1]:
            raise refusal(layer, f"LayerNormalization {layer.name}: the int8 rule covers normalizing over the last "
                                 f"axis without rms_scaling. Received: axis={layer.axis}, "
                                 f"rms_scaling={layer.rms_scaling}")
        for name in self.INTERMEDIATES:
            wrapper.add_activation_range(name)
        if layer.gamma is not None:
            wrapper.add_constant_range("gamma", layer.gamma)
        if layer.beta is not None:
            wrapper.add_constant_range("beta", layer.beta)
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        shape = inputs.shape
        if len(shape) > 3 and None not in shape[1:]:
            # Over a (batch, positions, channels) view, the same values: Ethos-U's Vela runs a MEAN over the
            # channels of a 4-D tensor only where its height or width is 1, and leaves ConvNeXt's on the CPU.
            rows = keras.ops.reshape(inputs, (-1, math.prod(shape[1:-1]), shape[-1]))
            return keras.ops.reshape(self._normalized(wrapper, layer, rows, training), (-1,) + tuple(shape[1:]))
        return self._normalized(wrapper, layer, inputs, training)

    @staticmethod
    def _normalized(wrapper, layer, inputs, training):
        ops = keras.ops
        ranges = {name: (lambda tensor, name=name: wrapper.ranges[name](tensor, training)) for name in wrapper.ranges}
        mean = ranges["mean"](ops.mean(inputs, axis=-1, keepdims=True))
        squared_difference = ranges["squared_difference"](ops.square(inputs - ops.stop_gradient(mean)))
        variance = ranges["variance"](ops.mean(squared_difference, axis=-1, keepdims=True))
        # A variance below half its grid's step rounds to 0 (DeiT's zero-initialized tokens, rows of near-equal
        # values beside rows of large ones): int8 RSQRT's input is 0 or at least one step, and at 0 its output
        # saturates at its range's top. Here rsqrt(0) was inf (NaN gradients, 0 x inf), and at epsilon 1/sqrt(eps)
        # (1000), which then set that top and blew such rows up a thousandfold, where the centred values had not
        # rounded to 0. Taken no lower than one step, as if 0 were the smallest value int8 holds above it, the top
        # is what the smallest variance gives, and the int8 model saturates to the same value.
        variance_epsilon = ranges["variance_epsilon"](variance + layer.epsilon)
        quantizer = wrapper.ranges["variance_epsilon"]
        one_step = ops.stop_gradient((quantizer.high - quantizer.low) / 255.0)
        variance_epsilon = ops.maximum(variance_epsilon, ops.maximum(one_step, layer.epsilon))
        inverse = ranges["inverse_root"](ops.rsqrt(variance_epsilon))
        if layer.gamma is not None:
            inverse = ranges["inverse"](inverse * ranges["gamma"](layer.gamma))
        outputs = ranges["normalized"](ranges["centred"](inputs - mean) * inverse)
        if layer.beta is not None:
            outputs = outputs + ranges["beta"](layer.beta)
        return ranges["output"](outputs)


@register_serializable
class SoftmaxRule(QuantizeRule):
    """SOFTMAX: its int8 output is on TFLite's fixed grid of k/256, as LOGISTIC's; without a mask, no range to
    learn.

    Called with a mask (as attention layers of their own call it), the masked-off inputs are set below the
    inputs' range (`attention.masked_scores`), and their outputs to 0 after it, as
    Keras's Softmax does (a row masked off entirely then gives zeros)."""

    def build(self, wrapper, layer):
        wrapper.add_activation_range("scores")  # both used when the layer is called with a mask
        wrapper.add_activation_range("masked_scores")

    def call_arguments(self, layer, args, kwargs):
        if len(args) == 2 and "mask" not in kwargs:  # Softmax's call(inputs, mask=None), the mask positional
            return args[0], {**kwargs, "mask": args[1]}
        return super().call_arguments(layer, args, kwargs)

    def call(self, wrapper, layer, inputs, training, mask=None, **kwargs):
        if mask is None:
            return replacements.on_logistic_int8_grid(layer(inputs, **kwargs))
        keep = attention.kept(mask)  # as Keras's Softmax reads a mask
        # the inputs' range observed, not applied: the inputs are on their producer's grid already, and a second
        # grid before the SELECT_V2 would be a requantization the converter cannot take into its same scale
        wrapper.ranges["scores"](inputs, training)
        scores = attention.masked_scores(wrapper.ranges["scores"], wrapper.ranges["masked_scores"], inputs, keep,
                                         training)
        probabilities = replacements.on_logistic_int8_grid(layer(scores, **kwargs))
        return keras.ops.where(keep, probabilities, 0.0)


def _spread_taps(kernel, dilation_rate):
    """A dilated kernel as the undilated one it equals: rate - 1 zeros between taps along each spatial axis.

    Keras's dilated convolution is SpaceToBatchND, the convolution, BatchToSpaceND, and the bias ADD after it
    stays float in the int8 model; TensorFlow's own dilated ops train on CPU only with oneDNN. The int8
    model then holds the spread kernel (its zeros are exact in int8): more multiply-adds, the same result."""
    for axis, rate in enumerate(dilation_rate):
        if rate == 1:
            continue
        taps = keras.ops.expand_dims(kernel, axis + 1)
        spread = keras.ops.concatenate([taps] + [keras.ops.zeros_like(taps)] * (rate - 1), axis=axis + 1)
        shape = list(kernel.shape)
        size = shape[axis]
        shape[axis] = size * rate
        kernel = keras.ops.take(keras.ops.reshape(spread, shape), list(range((size - 1) * rate + 1)), axis=axis)
    return kernel


def _width_axis(data_format):
    """Where a 1-D layer's (steps, 1) image has its size-1 axis: TFLite runs 1-D convolutions and pooling as
    2-D ones, and TensorFlow's CPU depthwise kernel takes equal strides only, which a stride over this axis
    (one position either way) allows."""
    return 2 if data_format == "channels_last" else 3


@register_serializable
class ConvolutionRule(QuantizeRule):
    """Convolutions, 1-D and 2-D, as CONV_2D and DEPTHWISE_CONV_2D (a separable one is both): kernels per
    output channel, symmetric; a separable convolution's depthwise output on a range of its own; the output
    on a moving-average range.

    A 1-D convolution is computed as the 2-D one over a (steps, 1) image it becomes, kernel included:
    per-channel ranges on the 3-D kernel would sit on an axis the converter's reshape moves, and a bias ADD
    after the squeeze back stays float. Strides are equal on both axes (the size-1 axis has one position
    either way): TensorFlow's CPU depthwise kernel takes no others."""

    def build(self, wrapper, layer):
        _check_fused_activation(layer)
        groups = getattr(layer, "groups", 1)
        if groups > 1 and not self._grouped_depthwise(layer):
            raise refusal(layer, f"{type(layer).__name__} {layer.name}: the int8 rule covers grouped convolutions with "
                                 f"one input and one output channel per group (depthwise, as DEPTHWISE_CONV_2D); "
                                 f"TFLite's runtimes have no other grouped convolution. Received: groups={groups}, "
                                 f"filters={layer.filters}, kernel shape={tuple(layer.kernel.shape)}")
        parameter = lambda name: lambda: _parameters(wrapper, layer)[name]  # noqa: E731
        if self._separable(layer):
            wrapper.add_weight_range("depthwise_kernel", parameter("depthwise_kernel"), axis=-2)
            wrapper.add_activation_range("depthwise")
            wrapper.add_weight_range("pointwise_kernel", parameter("pointwise_kernel"), axis=-1)
        else:
            # A conv kernel is (..., in, out); a depthwise one (..., in, multiplier), and TFLite's
            # DEPTHWISE_CONV_2D has one output channel per (in, multiplier): per channel along `in` is exact
            # for multiplier 1, the only depthwise TFLite quantizes per channel.
            # A grouped depthwise kernel (ConvNeXt's) is (..., 1, out), per channel along `out` as a convolution's.
            wrapper.add_weight_range("kernel", parameter("kernel"), axis=-2 if self._depthwise(layer) else -1)
        wrapper.add_activation_range("output")

    @staticmethod
    def _depthwise(layer):
        return isinstance(layer, (keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D))

    @staticmethod
    def _grouped_depthwise(layer):
        """A Conv with a group per input channel and one output channel per group (ConvNeXt's 7x7): the
        depthwise convolution of multiplier 1 whose kernel is the (..., in, 1) transpose of its (..., 1, out)."""
        groups = getattr(layer, "groups", 1)
        return groups > 1 and layer.kernel.shape[-2] == 1 and layer.filters == groups

    @staticmethod
    def _separable(layer):
        return isinstance(layer, (keras.layers.SeparableConv1D, keras.layers.SeparableConv2D))

    def call(self, wrapper, layer, inputs, training, **kwargs):
        one_dimensional = len(layer.kernel_size) == 1
        channels_last = layer.data_format == "channels_last"
        padding, strides, dilation_rate = layer.padding, tuple(layer.strides), tuple(layer.dilation_rate)
        if one_dimensional:
            if padding == "causal":
                pad = [[0, 0], [0, 0], [0, 0]]
                pad[1 if channels_last else 2] = [dilation_rate[0] * (layer.kernel_size[0] - 1), 0]
                inputs, padding = keras.ops.pad(inputs, pad), "valid"
            inputs = keras.ops.expand_dims(inputs, _width_axis(layer.data_format))
            strides, dilation_rate = strides * 2, dilation_rate + (1,)

        parameters = _parameters(wrapper, layer)

        def kernel(name):
            weight = keras.ops.expand_dims(parameters[name], 1) if one_dimensional else parameters[name]
            return wrapper.ranges[name](_spread_taps(weight, dilation_rate), training)

        convolve = dict(strides=strides, padding=padding, data_format=layer.data_format)
        if self._separable(layer):
            outputs = keras.ops.depthwise_conv(inputs, kernel("depthwise_kernel"), **convolve)
            outputs = keras.ops.conv(wrapper.ranges["depthwise"](outputs, training), kernel("pointwise_kernel"),
                                     strides=1, padding="valid", data_format=layer.data_format)
        elif self._depthwise(layer):
            outputs = keras.ops.depthwise_conv(inputs, kernel("kernel"), **convolve)
        elif self._grouped_depthwise(layer):
            outputs = keras.ops.depthwise_conv(inputs, keras.ops.swapaxes(kernel("kernel"), -2, -1), **convolve)
        else:
            outputs = keras.ops.conv(inputs, kernel("kernel"), **convolve)
        if parameters["bias"] is not None:
            bias_shape = [1] * len(outputs.shape)
            bias_shape[-1 if channels_last else 1] = -1
            outputs = outputs + keras.ops.reshape(parameters["bias"], bias_shape)
        outputs = wrapper.ranges["output"](layer.activation(outputs), training)
        return keras.ops.squeeze(outputs, _width_axis(layer.data_format)) if one_dimensional else outputs


def on_tanh_int8_grid(values):
    """A tanh's output rounded as TFLite's int8 TANH rounds it: the fixed grid of k/128 (zero point 0)."""
    return keras.quantizers.fake_quant_with_min_max_vars(values, -1.0, 127.0 / 128.0, num_bits=8)


@register_serializable
class ActivationRule(QuantizeRule):
    """Activation and ReLU layers. ReLU/ReLU6/linear: the output on a range (RELU rescales); sigmoid and tanh:
    LOGISTIC's k/256 and TANH's k/128 fixed grids. (quantize_model makes a GELU one of our GELU layers.)"""

    FIXED_GRIDS = {"sigmoid": replacements.on_logistic_int8_grid, "tanh": on_tanh_int8_grid}
    # x sigmoid(x), which TFLite computes as LOGISTIC (its fixed grid) then MUL (a range of its own)
    GATED = ("silu", "swish")

    @staticmethod
    def _name(layer):
        if isinstance(layer, keras.layers.ReLU):  # as RELU or RELU6; a threshold or slope is other ops
            plain = not layer.threshold and not layer.negative_slope and layer.max_value in (None, 6.0)
            return ("relu" if layer.max_value is None else "relu6") if plain else None
        name = keras.activations.serialize(layer.activation)
        return name if isinstance(name, str) else None

    def build(self, wrapper, layer):
        name = self._name(layer)
        if name not in FUSABLE_ACTIVATIONS and name not in self.FIXED_GRIDS and name not in self.GATED:
            if isinstance(layer, keras.layers.ReLU):
                received = f"max_value={layer.max_value}, negative_slope={layer.negative_slope}, " \
                           f"threshold={layer.threshold}"
            else:
                received = f"activation={getattr(layer.activation, '__name__', layer.activation)}"
            raise refusal(layer, f"Activation {layer.name}: no int8 rule for its function (covered: GELU, "
                                 f"{', '.join(FUSABLE_ACTIVATIONS + tuple(self.FIXED_GRIDS) + self.GATED)}, ReLU up "
                                 f"to 6); keep it "
                                 f"float with keep_float=[{layer.name!r}]. Received: {received}")
        if name in FUSABLE_ACTIVATIONS or name in self.GATED:
            wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        name = self._name(layer)
        if name in self.GATED:
            gate = replacements.on_logistic_int8_grid(keras.ops.sigmoid(inputs))
            return wrapper.ranges["output"](inputs * gate, training)
        outputs = layer(inputs)
        if name in self.FIXED_GRIDS:
            return self.FIXED_GRIDS[name](outputs)
        return wrapper.ranges["output"](outputs, training)


@register_serializable
class AveragePoolingRule(QuantizeRule):
    """AveragePooling1D/2D as a DEPTHWISE_CONV_2D whose kernel is 1/window (exact on the int8 grid), output on a
    range of its own. TFLite's int8 AVERAGE_POOL_2D keeps its input's scale and rounds the average onto it,
    which a rule cannot mirror without the producing layer's range; the convolution rescales, once, as here.
    Covered: windows that never cross the edge (valid padding, or same padding that pads nothing): a
    window over padding averages fewer values, which the fixed kernel would not."""

    def build(self, wrapper, layer):
        spatial = wrapper.layer_input_shape[1:-1] if layer.data_format == "channels_last" \
            else wrapper.layer_input_shape[2:]
        if layer.padding == "same" and any(
                size is None or max((-(-size // stride) - 1) * stride + window - size, 0)
                for size, window, stride in zip(spatial, layer.pool_size, layer.strides)):
            raise refusal(layer, f"{type(layer).__name__} {layer.name}: the int8 rule covers windows inside the input; "
                                 f"this 'same' padding pads, and an edge window averages fewer values. Use "
                                 f"padding='valid'. Received: padding={layer.padding!r}, input_shape="
                                 f"{tuple(wrapper.layer_input_shape)}")
        if len(set(layer.strides)) > 1:
            raise refusal(layer, f"{type(layer).__name__} {layer.name}: the int8 rule runs it as a depthwise "
                                 f"convolution, which TensorFlow's CPU kernel strides equally only. "
                                 f"Received: strides={layer.strides}")
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        channels_axis = -1 if layer.data_format == "channels_last" else 1
        pool_size, strides = tuple(layer.pool_size), tuple(layer.strides)
        if len(pool_size) == 1:
            inputs = keras.ops.expand_dims(inputs, _width_axis(layer.data_format))
            pool_size, strides = pool_size + (1,), strides * 2
        weight = 1.0 / (pool_size[0] * pool_size[1])
        kernel = keras.ops.full(pool_size + (inputs.shape[channels_axis], 1), weight)
        kernel = keras.quantizers.fake_quant_with_min_max_vars(kernel, -weight, weight, num_bits=8,
                                                               narrow_range=True)
        outputs = keras.ops.depthwise_conv(inputs, kernel, strides=strides, padding="valid",
                                           data_format=layer.data_format)
        outputs = wrapper.ranges["output"](outputs, training)
        if len(layer.pool_size) == 1:
            outputs = keras.ops.squeeze(outputs, _width_axis(layer.data_format))
        return outputs


@register_serializable
class GELURule(QuantizeRule):
    """A GELU as the int8 conversion computes it (`mode`, `exact_as`: the converter's --mode and --form).

    Native mode, exact or tanh: one int8 GELU op (a lookup table), so only
    the output has a range. Otherwise the LOGISTIC/MUL/ADD ops of
    `keras_gelu.replacements`, each intermediate on a range.
    """

    def __init__(self, mode="builtin", exact_as=None):
        self.mode, self.exact_as = mode, exact_as

    def _replacement(self, layer):
        return replacements.int8_replacement(layer.approximate, self.mode, self.exact_as)

    def build(self, wrapper, layer):
        for index in range(replacements.intermediate_count(layer.approximate, self.mode, self.exact_as)):
            wrapper.add_activation_range(f"intermediate_{index}")
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        replacement = self._replacement(layer)
        if replacement.fused:  # one int8 op, whose float function is the layer's own (on every backend)
            outputs = layer(inputs)
        else:
            count = replacements.intermediate_count(layer.approximate, self.mode, self.exact_as)
            quantizers = [lambda tensor, index=index: wrapper.ranges[f"intermediate_{index}"](tensor, training)
                          for index in range(count)]
            outputs = replacement.build(inputs, 1.0, mark=replacements.marking(quantizers))
        return wrapper.ranges["output"](outputs, training)

    def get_config(self):
        return {"mode": self.mode, "exact_as": self.exact_as}


@register_serializable
class LearnableGELURule(QuantizeRule):
    """x * sigmoid(alpha x + beta) as MUL, ADD, LOGISTIC, MUL: alpha and beta as MUL/ADD constants, alpha x and
    alpha x + beta on ranges, the gate on the LOGISTIC grid, the output on a range."""

    def build(self, wrapper, layer):
        wrapper.add_constant_range("alpha", layer.alpha)
        wrapper.add_constant_range("beta", layer.beta)
        wrapper.add_activation_range("product")
        wrapper.add_activation_range("gate_input")
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        ranges = wrapper.ranges
        product = ranges["product"](ranges["alpha"](layer.alpha, training) * inputs, training)
        gate_input = ranges["gate_input"](product + ranges["beta"](layer.beta, training), training)
        gate = replacements.on_logistic_int8_grid(keras.ops.sigmoid(gate_input))
        return ranges["output"](inputs * gate, training)


def _layer_scale_affine(layer):
    return layer.gamma, None


def _normalization_affine(layer):
    if layer.invert:
        raise refusal(layer, f"Normalization {layer.name}: the int8 rule covers normalizing, not its inverse. "
                             f"Received: invert=True")
    scale = 1.0 / keras.ops.maximum(keras.ops.sqrt(layer.variance), keras.config.epsilon())  # as the layer computes
    return scale, -layer.mean * scale


def _rescaling_affine(layer):
    offset = keras.ops.convert_to_tensor(layer.offset, "float32") if np.any(layer.offset) else None
    return keras.ops.convert_to_tensor(layer.scale, "float32"), offset


# Layers computing x * scale + shift with constants: class -> (scale, shift or None) of a layer.
CHANNEL_AFFINE = {LayerScale: _layer_scale_affine, keras.layers.Normalization: _normalization_affine,
                  keras.layers.Rescaling: _rescaling_affine}


@register_serializable
class ChannelAffineRule(QuantizeRule):
    """x * scale + shift with constants per channel or per tensor (LayerScale where it does not fold into the
    layer before it, Normalization, Rescaling): a MUL and an ADD whose constant operands are on asymmetric
    ranges, as TFLite quantizes them, each output on a range."""

    def build(self, wrapper, layer):
        _, shift = CHANNEL_AFFINE[type(layer)](layer)
        wrapper.add_constant_range("scale", lambda: CHANNEL_AFFINE[type(layer)](layer)[0])
        if shift is not None:
            wrapper.add_activation_range("scaled")
            wrapper.add_constant_range("shift", lambda: CHANNEL_AFFINE[type(layer)](layer)[1])
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        scale, shift = CHANNEL_AFFINE[type(layer)](layer)
        outputs = inputs * wrapper.ranges["scale"](scale, training)
        if shift is not None:
            outputs = wrapper.ranges["scaled"](outputs, training) + wrapper.ranges["shift"](shift, training)
        return wrapper.ranges["output"](outputs, training)


@register_serializable
class EmbeddingRule(QuantizeRule):
    """Embedding as GATHER from an int8 table: the table on an asymmetric per-tensor range, whose grid the
    gathered rows keep (GATHER has no output range of its own). `mask_zero` is refused: the wrapper would drop
    the mask that later layers read."""

    def build(self, wrapper, layer):
        if layer.mask_zero:
            raise refusal(layer, f"Embedding {layer.name}: the int8 rule covers embeddings without a mask (a mask "
                                 f"would not reach the layers after it). Received: mask_zero=True")
        wrapper.add_constant_range("embeddings", layer.embeddings)

    def call(self, wrapper, layer, inputs, training, reverse=False, **kwargs):
        if reverse:
            raise refusal(layer, f"{type(layer).__name__} {layer.name}: the int8 rule covers the table lookup, not "
                                 f"the reverse projection onto the table. Received: reverse=True")
        table = wrapper.ranges["embeddings"](layer.embeddings, training)
        return keras.ops.take(table, keras.ops.cast(inputs, "int32"), axis=0)


@register_serializable
class MultiHeadAttentionRule(QuantizeRule):
    """MultiHeadAttention as the int8 ops it becomes: the query, key, value and output projections as
    EinsumDense (kernels symmetric per tensor), the scores and the attended values as BATCH_MATMULs on ranges,
    SOFTMAX on its k/256 grid. 1/sqrt(key_dim) is folded into the query projection (one int8 MUL fewer).

    Covered: attention over one axis, with an `attention_mask` or `use_causal_mask`, masked as
    `attention.masked_scores` masks. Not covered: Keras masks on the inputs (Embedding's mask_zero), returned
    scores; gated attention and multi-axis softmax, which are not TFLite ops."""

    PROJECTIONS = ("query", "key", "value", "output")
    TENSORS = ("query", "value", "key", "attention_mask")
    UNCOVERED = ("return_attention_scores", "query_mask", "value_mask", "key_mask")

    def call_arguments(self, layer, args, kwargs):
        bound = dict(zip(("query", "value", "key"), args), **kwargs)
        for name in self.UNCOVERED:
            value = bound.get(name)
            if value is not None and value is not False:
                shown = value if isinstance(value, bool) else f"a tensor of shape {tuple(value.shape)}"
                raise refusal(layer, f"MultiHeadAttention {layer.name}: the int8 rule covers attention masks passed "
                                     f"as attention_mask or use_causal_mask, not Keras masks on the inputs or "
                                     f"returned scores. Received: {name}={shown}")
        # the tensors (an attention mask too) as one dict: Keras refuses tensors and flags mixed in **kwargs
        inputs = {name: bound.pop(name) for name in self.TENSORS if bound.get(name) is not None}
        return inputs, {name: value for name, value in bound.items() if name not in self.UNCOVERED}

    def layer_arguments(self, inputs):
        return inputs["query"], inputs["value"], inputs.get("key")

    def build(self, wrapper, layer):
        if layer._use_gate or len(layer._attention_axes) != 1:
            raise refusal(layer, f"MultiHeadAttention {layer.name}: the int8 rule covers ungated attention over "
                                 f"one axis. Received: use_gate={layer._use_gate}, "
                                 f"attention_axes={layer._attention_axes}")
        for name in self.PROJECTIONS:
            dense, scale = getattr(layer, f"{name}_dense"), self._scale(layer, name)
            wrapper.add_weight_range(f"{name}_kernel", lambda dense=dense, scale=scale: dense.kernel * scale)
            wrapper.add_activation_range(name)
        wrapper.add_activation_range("scores")
        wrapper.add_activation_range("masked_scores")  # used when the layer is called with a mask
        wrapper.add_activation_range("attended")

    def call(self, wrapper, layer, inputs, training, mask=None, use_causal_mask=False, **kwargs):
        if mask is not None:
            raise refusal(layer, f"MultiHeadAttention {layer.name}: the int8 rule covers attention masks passed as "
                                 f"attention_mask or use_causal_mask. Received: inputs with a Keras mask")
        query, value = inputs["query"], inputs["value"]
        key = inputs.get("key", value)
        keep = self._kept(layer, query, value, inputs.get("attention_mask"), use_causal_mask)
        query, key, value = (self._projected(wrapper, layer, name, tensor, training)
                             for name, tensor in (("query", query), ("key", key), ("value", value)))
        scores = wrapper.ranges["scores"](keras.ops.einsum(layer._dot_product_equation, key, query), training)
        if keep is not None:
            scores = attention.masked_scores(wrapper.ranges["scores"], wrapper.ranges["masked_scores"], scores,
                                             keep, training)
        probabilities = replacements.on_logistic_int8_grid(keras.ops.softmax(scores, axis=-1))
        probabilities = layer._dropout_layer(probabilities, training=training)
        attended = wrapper.ranges["attended"](keras.ops.einsum(layer._combine_equation, probabilities, value),
                                              training)
        return self._projected(wrapper, layer, "output", attended, training)

    @staticmethod
    def _kept(layer, query, value, attention_mask, use_causal_mask):
        """Which scores count, (batch, heads or 1, query steps, value steps), as Keras combines them; None for
        all. A mask is given the heads' axis only where it has none (keras-hub's SAM3 text encoder hands one of
        (batch, 1, query steps, value steps)), as Keras's own expands it up to the scores' rank."""
        keep = None if attention_mask is None else attention.kept(attention_mask)
        if use_causal_mask:
            causal = layer._compute_causal_mask(query, value)
            keep = causal if keep is None else keras.ops.logical_and(keep, causal)
        if keep is None:
            return None
        for _ in range(len(query.shape) + 1 - len(keep.shape)):  # the scores: the query's axes and the heads'
            keep = keras.ops.expand_dims(keep, -3)
        return keep

    @staticmethod
    def _scale(layer, name):
        return layer._inverse_sqrt_key_dim if name == "query" else 1.0

    def _projected(self, wrapper, layer, name, inputs, training):
        return _einsum_dense(wrapper, getattr(layer, f"{name}_dense"), inputs, training, f"{name}_kernel", name,
                             self._scale(layer, name))


_RULES = {}


def register_rule(layer_class, rule):
    """Quantize layers of exactly `layer_class` (not subclasses, as tfmot) with `rule`, a QuantizeRule."""
    if not (isinstance(layer_class, type) and issubclass(layer_class, keras.layers.Layer)):
        raise ValueError(f"Argument `layer_class` must be a Keras layer class. Received: layer_class={layer_class!r}")
    if not isinstance(rule, QuantizeRule):
        raise ValueError(f"Argument `rule` must be a keras_gelu QuantizeRule. Received: rule={rule!r}")
    _RULES[layer_class] = rule


# Layers whose int8 op outputs values of its input's grid (a max picks one; reshapes and dropout, gone at
# inference, change none): not wrapped, no range of their own.
UNCHANGED_VALUES = (keras.layers.InputLayer, keras.layers.Dropout, keras.layers.Flatten, keras.layers.Reshape,
                    keras.layers.MaxPooling1D, keras.layers.MaxPooling2D, keras.layers.GlobalMaxPooling1D,
                    keras.layers.GlobalMaxPooling2D,
                    # PAD's zeros are the zero point (every range holds 0); a crop drops values
                    keras.layers.ZeroPadding1D, keras.layers.ZeroPadding2D, keras.layers.Cropping1D,
                    keras.layers.Cropping2D)


# Layers of libraries keras_gelu does not import, by (module, class name): their rules apply to such a layer
# when a model holds one. keras-hub's PositionEmbedding's output is a slice of its table, a constant to the
# converter, on a range as it is.
_LIBRARY_RULES = {
    ("keras_hub.src.layers.modeling.position_embedding", "PositionEmbedding"): OutputRule(),
}


def rule_for(layer, mode, exact_as):
    """The rule for this layer: a GELU rule for the conversion's mode, a registered one, or None."""
    if type(layer) is GELU:
        return GELURule(mode, exact_as)
    if type(layer) is LearnableGELU:
        return LearnableGELURule()
    return _RULES.get(type(layer)) or _LIBRARY_RULES.get((type(layer).__module__, type(layer).__name__))


_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D,
                 keras.layers.SeparableConv1D, keras.layers.SeparableConv2D)
for _layer_class, _rule in ((keras.layers.Dense, DenseRule()),
                            *((convolution, ConvolutionRule()) for convolution in _CONVOLUTIONS),
                            # MEAN rescales to an output range of its own.
                            (keras.layers.GlobalAveragePooling1D, OutputRule()),
                            (keras.layers.GlobalAveragePooling2D, OutputRule()),
                            (keras.layers.EinsumDense, EinsumDenseRule()), (keras.layers.Softmax, SoftmaxRule()),
                            (keras.layers.LayerNormalization, LayerNormalizationRule()),
                            (keras.layers.MultiHeadAttention, MultiHeadAttentionRule()),
                            (keras.layers.Embedding, EmbeddingRule()),
                            # an Embedding tied to an output projection (keras-hub's BERT); in reverse, refused
                            (keras.layers.ReversibleEmbedding, EmbeddingRule()),
                            (keras.layers.AveragePooling1D, AveragePoolingRule()),
                            (keras.layers.AveragePooling2D, AveragePoolingRule()),
                            (keras.layers.Activation, ActivationRule()), (keras.layers.ReLU, ActivationRule()),
                            (keras.layers.Add, AddRule()),
                            *((affine, ChannelAffineRule()) for affine in CHANNEL_AFFINE)):
    register_rule(_layer_class, _rule)
