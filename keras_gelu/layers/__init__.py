"""Keras layers of keras_gelu."""

from keras_gelu.layers.gelu import GELU
from keras_gelu.layers.learnable_gelu import LearnableGELU

__all__ = ["GELU", "LearnableGELU"]
