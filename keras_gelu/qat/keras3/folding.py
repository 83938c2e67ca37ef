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

Inside a composite layer (keras-hub's HGNetV2 conv blocks: padding, Conv2D,
BatchNormalization, activation in one layer's call) the layers cannot be
rebuilt: the convolution's rule computes with the kernel and bias the
BatchNormalization's frozen statistics give it (`folded_parameters`), from
the two layers' own variables, which the converter folds into one constant
each, and the BatchNormalization's stand-in hands its input on
(`composite.FoldedAwayRule`).
"""

import numpy as np

from keras_gelu.flavour import keras
from keras_gelu.qat.keras3.keras_classes import LayerScale

FOLDS_INTO = (keras.layers.Dense, keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.DepthwiseConv1D,
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


def pair_folds(producer, scaling, rank):
    """Whether `scaling` (a layer of CHANNEL_AFFINE) folds into `producer`, whose output it reads, of `rank`: a
    Conv*/Dense with a linear activation, channels last, scaled along its output channels."""
    return (type(producer) in FOLDS_INTO and type(scaling) in CHANNEL_AFFINE
            and keras.activations.serialize(producer.activation) == "linear"
            and getattr(producer, "data_format", "channels_last") == "channels_last"
            and _channel_axis(scaling, rank) == rank - 1)


def _channel_axis(scaling, rank):
    axis = getattr(scaling, "axis", -1)
    axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
    return axis % rank if isinstance(axis, int) else None


def _batch_norm_affine_tensors(batch_norm):
    """_batch_norm_affine in the backend's ops, from the layer's variables: trained through (gamma, beta) and
    folded by the converter, whose graph holds them as constants."""
    ops = keras.ops
    scale = ops.rsqrt(ops.cast(batch_norm.moving_variance, "float32") + batch_norm.epsilon)
    if batch_norm.scale:
        scale = scale * batch_norm.gamma
    shift = -ops.cast(batch_norm.moving_mean, "float32") * scale
    if batch_norm.center:
        shift = shift + batch_norm.beta
    return scale, shift


def folded_parameters(layer, scaling=None):
    """{name: tensor} of a Conv*/Dense `layer`'s kernels ("kernel", or a separable one's "depthwise_kernel" and
    "pointwise_kernel") and "bias" (None where it has none), with the BatchNormalization `scaling` after it
    folded in (its moving statistics frozen), or as they are without one."""
    separable = isinstance(layer, (keras.layers.SeparableConv1D, keras.layers.SeparableConv2D))
    names = ("depthwise_kernel", "pointwise_kernel") if separable else ("kernel",)
    parameters = {name: getattr(layer, name) for name in names}
    parameters["bias"] = layer.bias if layer.use_bias else None
    if scaling is None:
        return parameters
    scale, shift = _batch_norm_affine_tensors(scaling)
    name = names[-1]  # a separable convolution's output channels are its pointwise kernel's
    kernel = parameters[name]
    if isinstance(layer, (keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D)):
        parameters[name] = kernel * keras.ops.reshape(scale, tuple(kernel.shape[-2:]))  # (in, multiplier)
    else:
        parameters[name] = kernel * scale
    bias = parameters["bias"]
    parameters["bias"] = shift if bias is None else bias * scale + shift
    return parameters


def scales_to_fold(model, keep_float=()):
    """{name of the layer folded into: the BatchNormalization or LayerScale after it}, for every one that folds."""
    folds = {}
    for layer in model.layers:
        if type(layer) not in CHANNEL_AFFINE or layer.name in keep_float:
            continue
        producer = _producer(layer)
        if (type(producer) not in FOLDS_INTO or producer.name in keep_float
                or len(producer._inbound_nodes) != 1 or len(producer._outbound_nodes) != 1
                or not pair_folds(producer, layer, len(producer.output.shape))):
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
