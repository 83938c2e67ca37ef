"""Activations fused into a layer, split out where int8 TFLite does not fuse them, as layers of their own."""

from keras_gelu.flavour import keras
from keras_gelu.layers import GELU
from keras_gelu.layers import GELU_ACTIVATIONS
from keras_gelu.layers import LearnableGELU
from keras_gelu.layers import layer_computing
from keras_gelu.qat.keras3.rules import ActivationRule
from keras_gelu.swapping import computed_function
from keras_gelu.vocabulary import FUNCTIONS


def gelu_layer(activation, name):
    """The GELU `activation` computes, as a new layer of ours named `name`; None if it is no GELU."""
    if isinstance(activation, GELU_ACTIVATIONS):
        layer = layer_computing(activation, name)
        layer.dtype_policy = "float32"  # a copy of a mixed-precision activation's config (see `quantize`)
        return layer
    function = computed_function(activation)  # Keras's "gelu" (exact), keras-hub's gelu_approximate (tanh)...
    if isinstance(function, str) and function.startswith("gelu_") and function[len("gelu_"):] in FUNCTIONS:
        return GELU(function[len("gelu_"):], name=name)
    return None


def split_activation(layer):
    """The activation fused into `layer` as a layer of its own (a fresh copy) where int8 TFLite does not fuse
    it: a GELU as our GELU layer, softmax as Softmax, sigmoid and tanh as Activation; else None."""
    activation = getattr(layer, "activation", None)
    if isinstance(layer, (GELU, LearnableGELU, keras.layers.Activation)) or activation is None:
        return None
    gelu = gelu_layer(activation, f"{layer.name}_gelu")
    if gelu is not None:
        return gelu
    name = keras.activations.serialize(activation)
    if not isinstance(name, str):
        return None
    if name == "softmax":
        return keras.layers.Softmax(name=f"{layer.name}_softmax")
    if name in ActivationRule.FIXED_GRIDS:
        return keras.layers.Activation(name, name=f"{layer.name}_{name}")
    return None


def activation_layer_as_gelu(layer):
    """Our GELU layer (of the same name) for an Activation layer that computes a GELU (`Activation("gelu")`);
    None for other layers and activations."""
    return gelu_layer(layer.activation, layer.name) if isinstance(layer, keras.layers.Activation) else None
