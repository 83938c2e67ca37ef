"""The one place that decides which Keras this package builds on, and on which backend.

TensorFlow's own `tf.keras` routes to tf-keras when `TF_USE_LEGACY_KERAS` is
"1", "true" or "True" and to Keras 3 otherwise (see
`tensorflow/python/util/lazy_loader.py`). We make the same choice, once, at
import time, so that a model mixing `tf.keras` layers with ours never mixes two
Keras implementations. Every other module imports `keras` from here.
"""

import contextlib
import functools
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
    BACKEND = "tensorflow"
else:
    try:
        import keras
    except ImportError as error:  # pragma: no cover - depends on the install
        backend = os.environ.get("KERAS_BACKEND", "tensorflow")
        raise ImportError(
            f"keras_gelu runs on Keras 3, whose {backend} backend did not import ({error}). keras-gelu brings "
            "no framework of its own: install one, e.g. `pip install 'keras-gelu[tensorflow]'` (or [jax], "
            "[torch]), and choose it with KERAS_BACKEND."
        ) from error

    if not keras.__version__.startswith("3."):  # pragma: no cover
        raise ImportError(
            "keras_gelu needs Keras 3 (or tf-keras with TF_USE_LEGACY_KERAS=1); "
            f"found keras {keras.__version__}."
        )
    BACKEND = keras.backend.backend()
    if BACKEND not in ("tensorflow", "jax", "torch"):
        raise ImportError(
            "keras_gelu runs on Keras 3's TensorFlow, JAX and PyTorch backends. "
            f"Set KERAS_BACKEND to one of them. Received: backend={BACKEND}"
        )
    KERAS_FLAVOUR = "keras3"


def flatten(structure):
    """The leaves of a nested structure, as the Keras in use flattens it (tf-keras: tf.nest)."""
    if USE_LEGACY_KERAS:
        import tensorflow as tf

        return tf.nest.flatten(structure)
    return keras.tree.flatten(structure)


def is_variable(value):
    """Whether `value` is a variable of the Keras in use (tf-keras's are TensorFlow's, and it exports no class)."""
    if USE_LEGACY_KERAS:
        import tensorflow as tf

        return isinstance(value, tf.Variable)
    return isinstance(value, keras.Variable)


@contextlib.contextmanager
def outside_any_trace():
    """Within the block, the backend computes eagerly even inside a traced call (a TensorFlow graph, a JAX
    trace), so that values can be read: a QAT model loading splits its composites' activations out, and probes
    what they compute, while Keras traces it. PyTorch computes eagerly anyway, as tf-keras's callers do here."""
    if USE_LEGACY_KERAS or BACKEND == "torch":
        yield
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.init_scope():
            yield
    else:
        import jax

        with jax.ensure_compile_time_eval():
            yield


@functools.cache
def tensor_classes():
    """The classes whose Python operators (`x * y`) a layer's call runs on the backend's own tensors, each the
    class to set an operator on: TensorFlow's tensors (graph and eager), JAX's arrays and tracers (a trace, a
    jit, Keras's shape inference), PyTorch's tensors (whose base class, in C, takes no attribute)."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return (tf.Tensor,)
    if BACKEND == "jax":
        import jax
        import jax.numpy as jnp

        return (type(jnp.zeros(())), jax.core.Tracer)
    import torch

    return (torch.Tensor,)


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


__all__ = ["BACKEND", "KERAS_FLAVOUR", "USE_LEGACY_KERAS", "flatten", "keras", "outside_any_trace",
           "register_serializable", "tensor_classes"]
