"""The one place that decides which Keras this package builds on.

TensorFlow's own `tf.keras` routes to tf-keras when `TF_USE_LEGACY_KERAS` is
"1", "true" or "True" and to Keras 3 otherwise (see
`tensorflow/python/util/lazy_loader.py`). We make the same choice, once, at
import time, so that a model mixing `tf.keras` layers with ours never mixes two
Keras implementations. Every other module imports `keras` from here.
"""

import os

LEGACY_KERAS_VALUES = ("true", "True", "1")

USE_LEGACY_KERAS = os.environ.get("TF_USE_LEGACY_KERAS") in LEGACY_KERAS_VALUES

if USE_LEGACY_KERAS:
    try:
        import tf_keras as keras
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError(
            "TF_USE_LEGACY_KERAS is set, so keras_gelu builds on tf-keras, "
            "but tf-keras is not installed. Install the tf-keras release that "
            "matches your TensorFlow (`pip install 'tf-keras~=X.Y.0'` for "
            "TensorFlow X.Y) or unset TF_USE_LEGACY_KERAS."
        ) from error
    KERAS_FLAVOUR = "tf_keras"
else:
    import keras

    if not keras.__version__.startswith("3."):  # pragma: no cover
        raise ImportError(
            "keras_gelu needs Keras 3 (or tf-keras with TF_USE_LEGACY_KERAS=1); "
            f"found keras {keras.__version__}."
        )
    if keras.backend.backend() != "tensorflow":
        raise ImportError(
            "keras_gelu computes with TensorFlow ops and targets TFLite, so it "
            "needs the TensorFlow backend of Keras 3. Set KERAS_BACKEND=tensorflow "
            f"before importing keras. Received: backend={keras.backend.backend()}"
        )
    KERAS_FLAVOUR = "keras3"



def register_serializable(obj):
    """Register a class or function with Keras under the "keras_gelu" package.

    On tf-keras, its legacy loaders resolve an object nested in another layer's
    config (our GELU as a Dense's `activation`) by its bare class name, not by
    its registered "keras_gelu>GELU" name, so there we also register the bare
    name, unless the user already has something registered under it.
    """
    registered = keras.saving.register_keras_serializable(package="keras_gelu")(obj)
    if USE_LEGACY_KERAS:
        keras.saving.get_custom_objects().setdefault(obj.__name__, obj)
    return registered


__all__ = ["KERAS_FLAVOUR", "USE_LEGACY_KERAS", "keras", "register_serializable"]
