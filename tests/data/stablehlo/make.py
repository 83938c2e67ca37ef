"""Models exported from JAX as SavedModels of XlaCallModule ops (StableHLO), made in a process of their own:
`python make.py FOLDER` with KERAS_BACKEND=jax. Each model's folder holds `inputs.npy` and the `outputs.npy`
JAX computed for them, the reference the converted .tflite is held to.

Keras 3 models are exported with `model.export`, as Keras's export docs lead a JAX user, the LearnableGELU one
after a training step with jit_compile=True (its alpha and beta trained away from the fixed GELU's; the others'
weights change nothing of what is converted, and each training step's compile took 1-7 s of the suite's time);
the pure-JAX functions go through jax2tf, as JAX's docs lead a JAX or Flax user.
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import keras
import numpy as np
import tensorflow as tf
from jax.experimental import jax2tf

import keras_gelu

# Each Keras model's GELU: (name, a function of no arguments that makes the activation layer).
ACTIVATIONS = {
    "keras_gelu_exact": lambda: keras_gelu.GELU(),
    "keras_gelu_tanh": lambda: keras.layers.Activation(keras_gelu.gelu_tanh),
    "keras_gelu_sigmoid": lambda: keras_gelu.GELU(approximate="sigmoid"),
    "learnable_gelu": lambda: keras_gelu.LearnableGELU(),
    "keras_exact": lambda: keras.layers.Activation("gelu"),
    "keras_tanh": lambda: keras.layers.Activation(functools.partial(keras.activations.gelu, approximate=True)),
}


def save(folder, inputs, outputs):
    np.save(os.path.join(folder, "inputs.npy"), inputs)
    np.save(os.path.join(folder, "outputs.npy"), np.asarray(outputs))


def dense_model(activation):
    """Dense -> GELU -> Dense -> GELU -> Dense, a polymorphic batch."""
    inputs = keras.Input((8,))
    hidden = activation()(keras.layers.Dense(16)(inputs))
    hidden = activation()(keras.layers.Dense(16)(hidden))
    return keras.Model(inputs, keras.layers.Dense(4)(hidden))


def conv_model():
    """The operations a vision model adds: convolutions (plain and depthwise), pooling (max and average),
    layer normalization; exact GELU in Keras's spelling and tanh GELU in keras_gelu's."""
    inputs = keras.Input((12, 12, 3))
    hidden = keras.layers.Conv2D(8, 3, padding="same", activation="gelu")(inputs)
    hidden = keras.layers.MaxPooling2D()(hidden)
    hidden = keras.layers.DepthwiseConv2D(3, strides=2, padding="same")(hidden)
    hidden = keras_gelu.GELU(approximate="tanh")(hidden)
    hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    hidden = keras.layers.LayerNormalization()(hidden)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def exported(model, folder, rng, trained=False):
    shape = (16,) + tuple(model.input_shape[1:])
    if trained:
        model.compile("adam", "mse", jit_compile=True)
        model.fit(rng.normal(size=shape), rng.normal(size=(16,) + tuple(model.output_shape[1:])), epochs=1,
                  batch_size=8, verbose=0)
    model.export(folder, verbose=False)
    inputs = rng.normal(size=(3,) + shape[1:]).astype(np.float32) * 2.0
    save(folder, inputs, model.predict(inputs, verbose=0))  # one compiled function, not an XLA compile per op


def jax2tf_saved(function, folder, example, polymorphic_shapes):
    module = tf.Module()
    module.f = tf.function(jax2tf.convert(function, polymorphic_shapes=polymorphic_shapes), autograph=False,
                           input_signature=[tf.TensorSpec((None,) + example.shape[1:], tf.float32)])
    tf.saved_model.save(module, folder, signatures=module.f)
    save(folder, example, function(example))


def pure_jax(folder, rng):
    """jax.nn.gelu in both forms, the weights closed over (constants inside the module)."""
    w1, w2 = rng.normal(size=(8, 16)).astype(np.float32), rng.normal(size=(16, 4)).astype(np.float32) * 0.3
    b1 = rng.normal(size=(16,)).astype(np.float32)

    def function(x):
        hidden = jax.nn.gelu(x @ w1 + b1, approximate=False)
        return jax.nn.gelu(hidden @ w2, approximate=True)

    jax2tf_saved(function, folder, rng.normal(size=(3, 8)).astype(np.float32), ["(b, 8)"])


def sorting(folder, rng):
    """An operation the translation does not cover (stablehlo.sort)."""
    jax2tf_saved(lambda x: jnp.sort(jax.nn.gelu(x, approximate=False), axis=-1), folder,
                 rng.normal(size=(2, 5)).astype(np.float32), ["(b, 5)"])


def native_call(folder):
    """A module that runs native code by name (a custom call), wrapped as a jax2tf export wraps one."""
    from jaxlib.mlir.dialects import stablehlo
    from tensorflow.compiler.mlir.stablehlo import stablehlo as tensorflow_stablehlo

    text = """
    func.func public @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {
      %0 = stablehlo.custom_call @some_native_kernel(%arg0) : (tensor<2xf32>) -> tensor<2xf32>
      return %0 : tensor<2xf32>
    }"""
    serialized = stablehlo.serialize_portable_artifact_str(text, tensorflow_stablehlo.get_current_version())
    module = tf.Module()
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops

    module.f = tf.function(lambda x: gen_xla_ops.xla_call_module(
        args=[x], version=9, module=serialized, Sout=[[2]], Tout=[tf.float32], dim_args_spec=[], platforms=["CPU"],
        function_list=[], has_token_input_output=False, disabled_checks=[]),
        input_signature=[tf.TensorSpec((2,), tf.float32)])
    tf.saved_model.save(module, folder, signatures=module.f)


def main(folder):
    rng = np.random.default_rng(0)
    for name, activation in ACTIVATIONS.items():
        keras.utils.set_random_seed(1)
        exported(dense_model(activation), os.path.join(folder, name), rng, trained=name == "learnable_gelu")
    keras.utils.set_random_seed(1)
    exported(conv_model(), os.path.join(folder, "conv"), rng)
    pure_jax(os.path.join(folder, "pure_jax"), rng)
    sorting(os.path.join(folder, "sorting"), rng)
    native_call(os.path.join(folder, "native_call"))


if __name__ == "__main__":
    assert keras.backend.backend() == "jax", "run with KERAS_BACKEND=jax"
    main(sys.argv[1])
