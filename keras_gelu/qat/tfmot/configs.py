"""tfmot QuantizeConfigs for keras_gelu's layers.

They compute what `keras_gelu.replacements` says each GELU becomes in the
int8 model, and swap that computation into the layer they wrap. This module
imports tfmot at once (after `support`'s checks); see
`keras_gelu.qat.tfmot` for what each config fake-quantizes and why.
"""

import tensorflow as tf

from keras_gelu.qat.tfmot.support import require_tfmot

tfmot_keras = require_tfmot()

from keras_gelu import replacements  # noqa: E402 - only after the check above
from keras_gelu import vocabulary  # noqa: E402
from keras_gelu.flavour import keras  # noqa: E402

# TFLite's int8 activations: 8 bits, asymmetric, one range per tensor.
_INT8_PER_TENSOR = {"num_bits": 8, "per_axis": False, "symmetric": False, "narrow_range": False}


def activation_quantizer():
    """8-bit asymmetric per-tensor range from moving averages: TFLite's activation scheme."""
    return tfmot_keras.quantizers.MovingAverageQuantizer(**_INT8_PER_TENSOR)


class IntermediateQuantizer(tfmot_keras.quantizers.MovingAverageQuantizer):
    """The activation quantizer, for the i-th of several intermediates of one layer.

    tfmot names an activation quantizer's range variables after its kind
    ("post_activation_min"), so a layer with several would save duplicate
    names into an .h5 file; the index keeps them apart.
    """

    def __init__(self, index):
        super().__init__(**_INT8_PER_TENSOR)
        self.index = index

    def build(self, tensor_shape, name, layer):
        return super().build(tensor_shape, f"{name}_{self.index}", layer)

    def get_config(self):
        return {"index": self.index}

    def __eq__(self, other):
        return type(other) is type(self) and other.index == self.index

    def __ne__(self, other):
        return not self == other


def constant_quantizer():
    """8-bit asymmetric per-tensor range from the current value: how TFLite quantizes a MUL/ADD constant."""
    return tfmot_keras.quantizers.LastValueQuantizer(**_INT8_PER_TENSOR)


class AllValuesQuantizerAcrossReplicas(tfmot_keras.quantizers.AllValuesQuantizer):
    """tfmot's model-input quantizer (the range of every value seen), with every replica seeing every batch.

    tfmot assigns this range in each replica from that replica's share of the
    batch, and a mirrored variable without aggregation keeps each replica's
    own assignment: under MirroredStrategy the replicas, and under
    MultiWorkerMirroredStrategy the workers, end with different ranges, and
    the model saved depends on which of them saved it. (Moving-average ranges
    agree: tfmot updates those through a cross-replica mean.) Here each
    replica first widens the range to the extremes of every replica's batch,
    gathered across replicas, so each then assigns the same values.
    """

    def __call__(self, inputs, training, weights, **kwargs):
        replicas = tf.distribute.get_replica_context()
        if training and replicas is not None and replicas.num_replicas_in_sync > 1:
            # One all-gather for both ends: the lowest value and the negated highest.
            lows = tf.stack([tf.reduce_min(inputs), -tf.reduce_max(inputs)])
            lowest = tf.reduce_min(replicas.all_gather(lows[tf.newaxis], axis=0), axis=0)
            weights["min_var"].assign(tf.minimum(weights["min_var"], lowest[0]))
            weights["max_var"].assign(tf.maximum(weights["max_var"], -lowest[1]))
        return super().__call__(inputs, training, weights, **kwargs)


def agree_across_replicas(qat_model):
    """Give every input quantizer tfmot put in `qat_model` the range every replica agrees on (in place)."""
    for layer in qat_model.layers:
        if type(getattr(layer, "quantizer", None)) is tfmot_keras.quantizers.AllValuesQuantizer:
            layer.quantizer = AllValuesQuantizerAcrossReplicas(**layer.quantizer.get_config())


class _OutputQuantizingConfig(tfmot_keras.QuantizeConfig):
    """Shared by our configs: the output quantizer, equality and serialization.

    Equality is by class and config (tfmot's own Default8BitQuantizeConfig
    compares a field with itself).

    Args:
        quantize_output: False leaves the output float, for a layer whose
            consumer quantizes it anyway.
    """

    def __init__(self, quantize_output=True):
        if not isinstance(quantize_output, bool):
            raise ValueError(
                f"Argument `quantize_output` must be a bool. Received: quantize_output={quantize_output!r}")
        self.quantize_output = quantize_output

    def get_output_quantizers(self, layer):
        return [activation_quantizer()] if self.quantize_output else []

    def get_config(self):
        return {"quantize_output": self.quantize_output}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(self.get_config().items()))))

    def __repr__(self):
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


def _computing(layer, quantized_call):
    """Make `layer` compute `quantized_call`: tfmot's QuantizeWrapper runs `layer.call`."""
    layer.call = quantized_call


class GELUQuantizeConfig(_OutputQuantizingConfig):
    """Fake-quantizes a GELU layer as the int8 model will compute it.

    The int8 model depends on the conversion: `mode` and `exact_as` are those
    of `keras-gelu-convert --int8 --mode <mode> --form <exact_as>`, and QAT
    then trains against exactly the int8 ops that conversion produces
    (`keras_gelu.replacements`).

    * native mode, exact or tanh GELU: TFLite's GELU op, an int8 lookup
      table. Only the output is fake-quantized (the input comes quantized).
    * otherwise the GELU is LOGISTIC/MUL/ADD ops (the sigmoid GELU always):
      each intermediate gets a moving-average range, the sigmoid output
      TFLite's fixed LOGISTIC grid, and the output its range.

    Args:
        mode: "builtin" (default, as the converter) or "native".
        exact_as: how builtin mode computes exact GELU: "sigmoid" (the
            default, as the converter), "tanh" or "erf" (which int8 computes as
            tanh). None in native mode.
        quantize_output: False leaves the output float.
    """

    def __init__(self, mode="builtin", exact_as=None, quantize_output=True):
        super().__init__(quantize_output)
        vocabulary.check_mode(mode, vocabulary.INT8_MODE_NAMES)
        self.mode, self.exact_as = mode, vocabulary.resolve_exact_as(mode, exact_as)

    def _intermediate_count(self, layer):
        return replacements.intermediate_count(layer.approximate, self.mode, self.exact_as)

    def get_weights_and_quantizers(self, layer):
        return []

    def get_activations_and_quantizers(self, layer):
        # tfmot fake-quantizes the output of an activation named "linear":
        # one per intermediate tensor of the int8 replacement.
        return [(keras.activations.linear, IntermediateQuantizer(index))
                for index in range(self._intermediate_count(layer))]

    def set_quantize_weights(self, layer, quantize_weights):
        if quantize_weights:
            raise ValueError(f"GELU has no weights to quantize. Received: {len(quantize_weights)} weights")

    def set_quantize_activations(self, layer, quantize_activations):
        expected = self._intermediate_count(layer)
        if len(quantize_activations) != expected:
            raise ValueError(f"GELU({layer.approximate!r}) in {self.mode} mode has {expected} int8 intermediates. "
                             f"Received: {len(quantize_activations)} activations")
        if not quantize_activations:
            return  # one lookup-table op: the float GELU, then the output quantizer
        build = replacements.int8_replacement(layer.approximate, self.mode, self.exact_as).build
        _computing(layer, lambda x: build(x, 1.0, mark=replacements.marking(quantize_activations)))

    def get_config(self):
        return {"mode": self.mode, "exact_as": self.exact_as, **super().get_config()}


class LearnableGELUQuantizeConfig(_OutputQuantizingConfig):
    """Fake-quantizes a LearnableGELU as the int8 MUL, ADD, LOGISTIC, MUL it becomes.

    alpha and beta as TFLite quantizes a MUL/ADD constant (8-bit asymmetric
    per tensor, from their current values); alpha x and alpha x + beta with
    moving-average ranges; the gate on the int8 LOGISTIC's fixed grid of
    1/256; the output. So QAT trains alpha and beta against the grids the
    int8 model will use, in every conversion mode.
    """

    def get_weights_and_quantizers(self, layer):
        return [(layer.alpha, constant_quantizer()), (layer.beta, constant_quantizer())]

    def get_activations_and_quantizers(self, layer):
        # tfmot fake-quantizes the output of an activation named "linear" and
        # the *input* of one named "sigmoid": alpha x, then alpha x + beta.
        return [(keras.activations.linear, activation_quantizer()),
                (keras.activations.sigmoid, activation_quantizer())]

    def set_quantize_weights(self, layer, quantize_weights):
        if len(quantize_weights) != 2:
            raise ValueError(f"LearnableGELU quantizes alpha and beta. Received: {len(quantize_weights)} weights")
        layer.alpha, layer.beta = quantize_weights

    def set_quantize_activations(self, layer, quantize_activations):
        if len(quantize_activations) != 2:
            raise ValueError(
                f"LearnableGELU quantizes alpha x and the gate. Received: {len(quantize_activations)} activations")
        quantized_product, quantized_sigmoid = quantize_activations

        def quantized_call(x):
            # alpha and beta are the fake-quantized values set_quantize_weights put on the layer for this call,
            # read both before the first quantizer runs: under a distribution strategy, a quantizer's range
            # update is a merge point where the next replica runs its wrapper, which puts its own values there.
            alpha, beta = layer.alpha, layer.beta
            gate = quantized_sigmoid(quantized_product(alpha * x) + beta)
            return x * replacements.on_logistic_int8_grid(gate)

        _computing(layer, quantized_call)
