"""The GELU kernels the layers and activations run: TensorFlow's fused XLA kernels (`xla_kernels`) on
TensorFlow (Keras 3's TensorFlow backend, and tf-keras), `keras.ops.custom_gradient` ones
(`portable_kernels`) on JAX and PyTorch. The one place that chooses, by `flavour.BACKEND`."""

from keras_gelu.flavour import BACKEND

if BACKEND == "tensorflow":
    from keras_gelu.xla_kernels import compute_dtype_for
    from keras_gelu.xla_kernels import exact
    from keras_gelu.xla_kernels import learnable
    from keras_gelu.xla_kernels import sigmoid
    from keras_gelu.xla_kernels import tanh
else:
    from keras_gelu.portable_kernels import compute_dtype_for
    from keras_gelu.portable_kernels import exact
    from keras_gelu.portable_kernels import learnable
    from keras_gelu.portable_kernels import sigmoid
    from keras_gelu.portable_kernels import tanh

__all__ = ["compute_dtype_for", "exact", "learnable", "sigmoid", "tanh"]
