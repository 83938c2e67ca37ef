"""Keras layers of keras_gelu."""

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


__all__ = ["GELU", "GELU_LAYER_FUNCTIONS", "LearnableGELU", "gelu_layer"]
