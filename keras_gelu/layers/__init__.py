"""Keras layers of keras_gelu."""

from keras_gelu import activations
from keras_gelu import vocabulary
from keras_gelu.layers.gelu import GELU
from keras_gelu.layers.learnable_gelu import LearnableGELU

# The GELU functions a layer can compute: GELU's three, and LearnableGELU's.
GELU_LAYER_FUNCTIONS = (*vocabulary.FUNCTIONS, "learnable")


def gelu_layer(function, **kwargs):
    """A new GELU layer computing `function`: "exact", "tanh", "sigmoid" or "learnable".

    "learnable" is a LearnableGELU, the others GELU(approximate=function).
    `kwargs` go to the layer.
    """
    if function not in GELU_LAYER_FUNCTIONS:
        raise ValueError(
            f"Argument `function` must be one of {GELU_LAYER_FUNCTIONS}. Received: function={function!r}"
        )
    if function == "learnable":
        return LearnableGELU(**kwargs)
    return GELU(function, **kwargs)


# The GELUs of this package that can be another layer's `activation=`.
GELU_ACTIVATIONS = (activations.GELUActivation, GELU, LearnableGELU)


def layer_computing(activation, name):
    """A new stand-alone layer named `name` computing `activation`, one of GELU_ACTIVATIONS (a fresh copy of a
    layer: a LearnableGELU's weights are left to the caller)."""
    if isinstance(activation, activations.GELUActivation):
        return GELU(activation.approximate, name=name)
    return type(activation).from_config({**activation.get_config(), "name": name})


__all__ = ["GELU", "GELU_ACTIVATIONS", "GELU_LAYER_FUNCTIONS", "LearnableGELU", "gelu_layer", "layer_computing"]
