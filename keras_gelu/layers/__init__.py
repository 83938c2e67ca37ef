"""Keras layers of keras_gelu."""

from keras_gelu.layers.gelu import GELU
from keras_gelu.layers.learnable_gelu import LearnableGELU

# Layer forms by the names scripts and tables use; "exact" is GELU("none").
GELU_LAYER_FORMS = ("exact", "tanh", "sigmoid", "learnable")


def gelu_layer(form, **kwargs):
    """A new GELU layer of the named form: "exact", "tanh", "sigmoid" or "learnable".

    "learnable" is a LearnableGELU; the others are GELU with that
    `approximate` ("exact" meaning "none"). `kwargs` go to the layer.
    """
    if form not in GELU_LAYER_FORMS:
        raise ValueError(f"Argument `form` must be one of {GELU_LAYER_FORMS}. Received: form={form!r}")
    if form == "learnable":
        return LearnableGELU(**kwargs)
    return GELU("none" if form == "exact" else form, **kwargs)


__all__ = ["GELU", "GELU_LAYER_FORMS", "LearnableGELU", "gelu_layer"]
