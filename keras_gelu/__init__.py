"""keras_gelu: GELU layers for Keras 3 and tf-keras that ship to TFLite.

Which Keras is used follows `tf.keras`: tf-keras when TF_USE_LEGACY_KERAS is
set to 1/true, Keras 3 otherwise (see `keras_gelu.flavour`).
"""

from keras_gelu import command_start

# `python -m keras_gelu.converters` (the command) needs none of what follows: see command_start.
if not command_start.the_command_is_starting():
    from keras_gelu.activations import GELUActivation
    from keras_gelu.activations import gelu
    from keras_gelu.activations import gelu_exact
    from keras_gelu.activations import gelu_sigmoid
    from keras_gelu.activations import gelu_tanh
    from keras_gelu.fine_tuning import fine_tune_swapped
    from keras_gelu.flavour import BACKEND
    from keras_gelu.flavour import KERAS_FLAVOUR
    from keras_gelu.layers import GELU
    from keras_gelu.layers import GELU_LAYER_FUNCTIONS
    from keras_gelu.layers import LearnableGELU
    from keras_gelu.layers import gelu_layer
    from keras_gelu.swapping import Swap
    from keras_gelu.swapping import swap_activations
    from keras_gelu.swapping import when

    if KERAS_FLAVOUR == "keras3":
        # Registers the Keras 3 QAT layers, on every backend, so a saved QAT model loads after `import keras_gelu`
        # alone. (Under tf-keras QAT models are tfmot's, loaded within qat.quantize_scope.)
        from keras_gelu import qat as _qat  # noqa: F401

__version__ = "0.1.0"

__all__ = [
    "BACKEND",
    "GELU",
    "GELUActivation",
    "GELU_LAYER_FUNCTIONS",
    "KERAS_FLAVOUR",
    "LearnableGELU",
    "Swap",
    "fine_tune_swapped",
    "gelu",
    "gelu_exact",
    "gelu_layer",
    "gelu_sigmoid",
    "gelu_tanh",
    "swap_activations",
    "when",
]
