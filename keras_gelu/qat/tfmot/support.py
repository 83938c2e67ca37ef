"""tensorflow-model-optimization, imported on first use, with one clear error when it cannot be."""

import functools

from keras_gelu.flavour import USE_LEGACY_KERAS


@functools.lru_cache(maxsize=None)
def require_tfmot():
    """tfmot's Keras quantization API, imported on first use with a clear error.

    The flavour is checked first: importing tfmot sets TF_USE_LEGACY_KERAS=1
    in os.environ, which must not happen behind a Keras 3 user's back.
    """
    if not USE_LEGACY_KERAS:
        raise RuntimeError(
            "keras_gelu.qat's tfmot engine needs tf-keras, because tensorflow-model-optimization "
            "works only with tf-keras: set TF_USE_LEGACY_KERAS=1 before importing keras_gelu "
            "(and tensorflow). Keras 3 is active now."
        )
    try:
        import tensorflow_model_optimization as tfmot
    except ImportError as error:
        raise ImportError(
            "keras_gelu.qat under tf-keras needs tensorflow-model-optimization: "
            "pip install 'keras-gelu[qat]' (or 'tensorflow-model-optimization>=0.8,<0.9')."
        ) from error
    return tfmot.quantization.keras
