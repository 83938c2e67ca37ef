"""Per-channel scales folded into the convolution or Dense before them, as the int8 model holds them.

TFLite has no int8 batch normalization after a convolution: the converter
folds it into the convolution's kernel and bias. QAT must then train the
folded kernel, on the grid it will have. `quantize_model` folds each
BatchNormalization that directly follows a Conv*/Dense with a linear
activation (the output read by nothing else) with its moving statistics, and
the QAT model has no BatchNormalization left: its statistics are frozen
during QAT, the usual practice for a fine-tune after float training.

A LayerScale (ConvNeXt's per-channel x * gamma after its second Dense) folds
the same way, exactly: the kernel's columns and the bias times gamma. Its
gamma then trains as part of the kernel, as the int8 model holds it.
"""

import numpy as np

from keras_gelu.flavour import keras
from keras_gelu.qat.keras3.keras_classes import LayerScale

_FOLDS_INTO = (keras.layers.Dense, keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.DepthwiseConv1D,
               keras.layers.DepthwiseConv2D, keras.layers.SeparableConv1D, keras.layers.SeparableConv2D)


def _producer(layer):
    """The layer whose output `layer` reads, if it is called once on one tensor; else None."""
    if len(layer._inbound_nodes) != 1:
        return None
    tensors = keras.tree.flatten(layer._inbound_nodes[0].input_tensors)
    return tensors[0]._keras_history[0] if len(tensors) == 1 else None


def _batch_norm_affine(batch_norm):
    """(scale, shift) with batch_norm(x) = x * scale + shift: s = gamma / sqrt(moving variance + epsilon),
    shift = beta - mean * s."""
    scale = 1.0 / np.sqrt(batch_norm.moving_variance.numpy().astype(np.float64) + batch_norm.epsilon)
    if batch_norm.scale:
        scale = scale * batch_norm.gamma.numpy()
    shift = -batch_norm.moving_mean.numpy() * scale
    if batch_norm.center:
        shift = shift + batch_norm.beta.numpy()
    return scale, shift


def _layer_scale_affine(layer_scale):
    gamma = layer_scale.gamma.numpy().astype(np.float64)
    return gamma, np.zeros_like(gamma)


# Per-channel affine layers that fold into a linear layer before them: class -> (scale, shift) of the layer.
CHANNEL_AFFINE = {keras.layers.BatchNormalization: _batch_norm_affine, LayerScale: _layer_scale_affine}


def scales_to_fold(model, keep_float=()):
    """{name of the layer folded into: the BatchNormalization or LayerScale after it}, for every one that folds."""
    folds = {}
    for layer in model.layers:
        if type(layer) not in CHANNEL_AFFINE or layer.name in keep_float:
            continue
        producer = _producer(layer)
        if (type(producer) not in _FOLDS_INTO or producer.name in keep_float
                or keras.activations.serialize(producer.activation) != "linear"
                or len(producer._inbound_nodes) != 1 or len(producer._outbound_nodes) != 1
                or getattr(producer, "data_format", "channels_last") != "channels_last"
                or getattr(layer, "axis", -1) % len(producer.output.shape) != len(producer.output.shape) - 1):
            continue
        folds[producer.name] = layer
    return folds


def folded_weights(layer, scaling):
    """`layer`'s weights with `scaling` (a layer of CHANNEL_AFFINE) folded in: kernel * scale along the output
    channels, and bias * scale + shift. The bias is added if absent."""
    scale, shift = CHANNEL_AFFINE[type(scaling)](scaling)
    weights = [weight.numpy().astype(np.float64) for weight in layer.weights]
    separable = isinstance(layer, (keras.layers.SeparableConv1D, keras.layers.SeparableConv2D))
    kernel_index = 1 if separable else 0  # a separable convolution's output channels are its pointwise kernel's
    kernel = weights[kernel_index]
    if isinstance(layer, (keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D)):
        weights[kernel_index] = kernel * scale.reshape(kernel.shape[-2:])  # output channel: (in, multiplier)
    else:
        weights[kernel_index] = kernel * scale
    if layer.use_bias:
        weights[-1] = weights[-1] * scale + shift
    else:
        weights.append(shift)
    return [weight.astype(np.float32) for weight in weights]
