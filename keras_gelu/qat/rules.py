"""What each layer kind fake-quantizes under Keras 3 QAT, op for op as the int8 .tflite computes it.

A `QuantizeRule` says which int8 ranges a layer has (`build`) and computes
the layer with them (`call`); `QuantizeWrapper` holds a layer, its rule and
the ranges' variables. The rules here:

* `DenseRule`: FULLY_CONNECTED. The kernel on a symmetric per-tensor range
  (as tfmot, which TFLite's converter turns into per-tensor int8 weights),
  the bias left to the converter (int32 from the input and kernel scales),
  the fused ReLU/ReLU6/linear kept fused, the output on a moving-average range.
* `ConvolutionRule`: CONV_2D and DEPTHWISE_CONV_2D (Conv1D is computed as
  the CONV_2D it becomes): the kernel per output channel, symmetric; the
  output as Dense's.
* `GELURule`, `LearnableGELURule`: what `keras_gelu.replacements` says the
  GELU becomes in the conversion's mode, each intermediate on a range and
  sigmoid outputs on TFLite's fixed LOGISTIC grid (k/256).
* `OutputRule`: the layer as it is, its output on a range (Add, pooling...).

Add a rule for a layer of yours with `register_rule(YourLayer, YourRule())`.
"""

from keras_gelu import replacements
from keras_gelu.flavour import keras
from keras_gelu.flavour import register_serializable
from keras_gelu.layers import GELU
from keras_gelu.layers import LearnableGELU

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

    A rule has no state of its own (one instance serves every layer of its
    kind) and is saved by its config: register its class with
    `keras.saving.register_keras_serializable`.
    """

    def build(self, wrapper, layer):
        raise NotImplementedError

    def call(self, wrapper, layer, inputs, training, **kwargs):
        raise NotImplementedError

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
        raise ValueError(f"Layer {layer.name} has a fused activation TFLite does not fuse in int8; quantize_model "
                         f"splits GELUs out, other activations need their own layer. Received: "
                         f"activation={layer.activation!r}")


@register_serializable
class OutputRule(QuantizeRule):
    """The layer as it is, its output (each of them) on a moving-average range."""

    def build(self, wrapper, layer):
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        return keras.tree.map_structure(lambda output: wrapper.ranges["output"](output, training),
                                        layer(inputs, **kwargs))


@register_serializable
class DenseRule(QuantizeRule):
    """FULLY_CONNECTED: kernel per tensor, symmetric; fused ReLU/ReLU6 kept; output on a moving-average range."""

    def build(self, wrapper, layer):
        _check_fused_activation(layer)
        wrapper.add_weight_range("kernel", layer.kernel)
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        outputs = keras.ops.matmul(inputs, wrapper.ranges["kernel"](layer.kernel, training))
        if layer.use_bias:
            outputs = outputs + layer.bias
        return wrapper.ranges["output"](layer.activation(outputs), training)


@register_serializable
class EinsumDenseRule(QuantizeRule):
    """EinsumDense, which the converter turns into FULLY_CONNECTED or BATCH_MATMUL: as Dense."""

    def build(self, wrapper, layer):
        if layer.activation is not None:
            _check_fused_activation(layer)
        wrapper.add_weight_range("kernel", layer.kernel)
        wrapper.add_activation_range("output")

    def call(self, wrapper, layer, inputs, training, **kwargs):
        outputs = keras.ops.einsum(layer.equation, inputs, wrapper.ranges["kernel"](layer.kernel, training))
        if layer.bias is not None:
            outputs = outputs + layer.bias
        if layer.activation is not None:
            outputs = layer.activation(outputs)
        return wrapper.ranges["output"](outputs, training)


@register_serializable
class LayerNormalizationRule(QuantizeRule):
    """LayerNormalization as the int8 ops it becomes: MEAN, SQUARED_DIFFERENCE, MEAN, ADD (epsilon), RSQRT,
    MUL (gamma), MUL (by -1), MUL, ADD (beta), MUL, ADD: Keras 3's formula, x * inv + (beta - mean * inv), with
    inv = gamma / sqrt(variance + epsilon), each intermediate on a range and gamma and beta as MUL/ADD constants."""

    INTERMEDIATES = ("mean", "squared_difference", "variance", "variance_epsilon", "inverse_root", "inverse",
                     "negative_mean", "mean_shift", "shift", "scaled")

    def build(self, wrapper, layer):
        rank = len(wrapper.layer_input_shape)
        if layer.rms_scaling or [axis % rank for axis in layer.axis] != [rank - 1]:
            raise ValueError(f"LayerNormalization {layer.name}: the int8 rule covers normalizing over the last "
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
        ops = keras.ops
        ranges = {name: (lambda tensor, name=name: wrapper.ranges[name](tensor, training)) for name in wrapper.ranges}
        mean = ranges["mean"](ops.mean(inputs, axis=-1, keepdims=True))
        squared_difference = ranges["squared_difference"](ops.square(inputs - ops.stop_gradient(mean)))
        variance = ranges["variance"](ops.mean(squared_difference, axis=-1, keepdims=True))
        inverse = ranges["inverse_root"](ops.rsqrt(ranges["variance_epsilon"](variance + layer.epsilon)))
        if layer.gamma is not None:
            inverse = ranges["inverse"](inverse * ranges["gamma"](layer.gamma))
        shift = ranges["mean_shift"](ranges["negative_mean"](mean * -1.0) * inverse)
        if layer.beta is not None:
            shift = ranges["shift"](shift + ranges["beta"](layer.beta))
        return ranges["output"](ranges["scaled"](inputs * inverse) + shift)


@register_serializable
class SoftmaxRule(QuantizeRule):
    """SOFTMAX: its int8 output is on TFLite's fixed grid of k/256, as LOGISTIC's; no range to learn."""

    def build(self, wrapper, layer):
        pass

    def call(self, wrapper, layer, inputs, training, **kwargs):
        return replacements.on_logistic_int8_grid(layer(inputs, **kwargs))


@register_serializable
class ConvolutionRule(QuantizeRule):
    """CONV_2D, DEPTHWISE_CONV_2D: kernel per output channel, symmetric; output on a moving-average range."""

    def build(self, wrapper, layer):
        _check_fused_activation(layer)
        wrapper.add_weight_range("kernel", layer.kernel, axis=self._channel_axis(layer))
        wrapper.add_activation_range("output")

    @staticmethod
    def _depthwise(layer):
        return isinstance(layer, keras.layers.DepthwiseConv2D)

    def _channel_axis(self, layer):
        # Conv kernels are (..., in, out): out is the last axis. A depthwise kernel is (h, w, in, multiplier),
        # and TFLite's DEPTHWISE_CONV_2D has one output channel per (in, multiplier): per-channel along `in`
        # is exact for multiplier 1, the only depthwise TFLite quantizes per channel.
        return 2 if self._depthwise(layer) else -1

    def call(self, wrapper, layer, inputs, training, **kwargs):
        if isinstance(layer, keras.layers.Conv1D):
            outputs = self._conv1d_as_conv2d(wrapper, layer, inputs, training)
        else:
            kernel = wrapper.ranges["kernel"](layer.kernel, training)
            convolve = keras.ops.depthwise_conv if self._depthwise(layer) else keras.ops.conv
            outputs = convolve(inputs, kernel, strides=layer.strides, padding=layer.padding,
                               data_format=layer.data_format, dilation_rate=layer.dilation_rate)
        if layer.use_bias:
            channel_axis = -1 if layer.data_format == "channels_last" else 1
            bias_shape = [1] * len(outputs.shape)
            bias_shape[channel_axis] = -1
            outputs = outputs + keras.ops.reshape(layer.bias, bias_shape)
        return wrapper.ranges["output"](layer.activation(outputs), training)

    @staticmethod
    def _conv1d_as_conv2d(wrapper, layer, inputs, training):
        """Conv1D as TFLite runs it, a CONV_2D over a height-1 image: its kernel quantized as that 4-D kernel
        (per-channel ranges on the 3-D kernel sit on an axis the converter's reshape to 4-D would move)."""
        padding = layer.padding
        if padding == "causal":
            steps_axis = 1 if layer.data_format == "channels_last" else 2
            pad = [[0, 0], [0, 0], [0, 0]]
            pad[steps_axis] = [layer.dilation_rate[0] * (layer.kernel_size[0] - 1), 0]
            inputs, padding = keras.ops.pad(inputs, pad), "valid"
        height_axis = 1 if layer.data_format == "channels_last" else 2
        kernel = wrapper.ranges["kernel"](keras.ops.expand_dims(layer.kernel, 0), training)
        outputs = keras.ops.conv(keras.ops.expand_dims(inputs, height_axis), kernel, strides=(1, layer.strides[0]),
                                 padding=padding, data_format=layer.data_format,
                                 dilation_rate=(1, layer.dilation_rate[0]))
        return keras.ops.squeeze(outputs, height_axis)


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
        if replacement is None:
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


_RULES = {}


def register_rule(layer_class, rule):
    """Quantize layers of exactly `layer_class` (not subclasses, as tfmot) with `rule`, a QuantizeRule."""
    if not (isinstance(layer_class, type) and issubclass(layer_class, keras.layers.Layer)):
        raise ValueError(f"Argument `layer_class` must be a Keras layer class. Received: layer_class={layer_class!r}")
    if not isinstance(rule, QuantizeRule):
        raise ValueError(f"Argument `rule` must be a keras_gelu QuantizeRule. Received: rule={rule!r}")
    _RULES[layer_class] = rule


# Layers whose int8 op outputs values of its input's grid (a max picks one; reshapes and dropout, gone at
# inference, change none): not wrapped, no range of their own. Average pooling is not one of them: TFLite's
# int8 AVERAGE_POOL_2D rounds the average onto its input's grid, which a rule would need the producer's range for.
UNCHANGED_VALUES = (keras.layers.InputLayer, keras.layers.Dropout, keras.layers.Flatten, keras.layers.Reshape,
                    keras.layers.MaxPooling1D, keras.layers.MaxPooling2D, keras.layers.GlobalMaxPooling1D,
                    keras.layers.GlobalMaxPooling2D)


def rule_for(layer, mode, exact_as):
    """The rule for this layer: a GELU rule for the conversion's mode, a registered one, or None."""
    if type(layer) is GELU:
        return GELURule(mode, exact_as)
    if type(layer) is LearnableGELU:
        return LearnableGELURule()
    return _RULES.get(type(layer))


for _layer_class, _rule in ((keras.layers.Dense, DenseRule()), (keras.layers.Conv1D, ConvolutionRule()),
                            (keras.layers.Conv2D, ConvolutionRule()), (keras.layers.DepthwiseConv2D, ConvolutionRule()),
                            # MEAN rescales to an output range of its own.
                            (keras.layers.GlobalAveragePooling1D, OutputRule()),
                            (keras.layers.GlobalAveragePooling2D, OutputRule()),
                            (keras.layers.EinsumDense, EinsumDenseRule()), (keras.layers.Softmax, SoftmaxRule()),
                            (keras.layers.LayerNormalization, LayerNormalizationRule()),
                            (keras.layers.Add, OutputRule())):
    register_rule(_layer_class, _rule)
