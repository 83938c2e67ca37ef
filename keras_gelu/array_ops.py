"""The array operations GELU's formulas are written in, for whichever framework's tensors they are given.

`formulas.py` is written once, against the namespace `of(x)` returns for its
input: TensorFlow tensors get TensorFlow's own ops (the converter builds its
TFLite graphs from these very formulas, op for op), JAX arrays jax.numpy's and
PyTorch tensors torch's. So the layers compute on every Keras 3 backend with
one spelling of the math, and a JAX or PyTorch process never imports
TensorFlow: each framework is imported when the first tensor of it arrives.
NumPy arrays get NumPy's, so that what needs no tensor at all (counting an
int8 replacement's intermediates) runs in no framework.

Why not `keras.ops`: it has no erfc (1 - erf cancels for negative x, where
exact GELU needs full relative accuracy), and under tf-keras the converter's
graphs must hold exactly the TensorFlow ops these spell.

`fuses(x)` says whether the formulas are compiled into one loop over memory
here (XLA, torch.compile), where a dozen cheap operations cost less than one
erfc; op by op each is a pass over memory. `converters_read_the_spelling`:
TensorFlow graphs of these formulas are read by TFLite converters, which
know exact GELU by its erfc.

`clip` keeps NaN as NaN in every framework: TensorFlow's with selects (XLA
before TF 2.19 lets min/max turn NaN into the bound), the others with their
own clip, which propagates NaN: PyTorch's `where` was the slow op of its
backward pass (measured on 2048 x 2048 float32: 7.9 ms against 1.0 ms for
`torch.clamp`, a pass over memory).
"""

class _TensorFlow:
    converters_read_the_spelling = True

    def __init__(self):
        import tensorflow as tf

        self.tf = tf
        self.maximum, self.minimum, self.where, self.erfc = tf.maximum, tf.minimum, tf.where, tf.math.erfc
        self.sigmoid, self.exp, self.abs = tf.math.sigmoid, tf.exp, tf.abs
        self.zeros_like, self.equal = tf.zeros_like, tf.equal

    def constant(self, value, like):
        return self.tf.constant(value, dtype=like.dtype)

    def clip(self, x, low, high):
        return self.where(x > high, high, self.where(x < low, low, x))

    def is_float64(self, like):
        return like.dtype == self.tf.float64

    def fuses(self, x):
        return True  # keras_gelu runs its TensorFlow formulas in XLA (`xla_kernels`)

    def lowest(self, like):
        return self.constant(like.dtype.min, like)

    def highest(self, like):
        return self.constant(like.dtype.max, like)

    def full_like(self, like, value):
        return self.tf.fill(self.tf.shape(like), self.constant(value, like))

    def fake_quant(self, x, low, high):
        # The op the converter reads as a fixed range (tf-keras's QAT, which has no keras.quantizers, too).
        return self.tf.quantization.fake_quant_with_min_max_args(x, min=low, max=high, num_bits=8)


def _keras_fake_quant(x, low, high):
    """Keras 3's fake quantization (a straight-through gradient inside the range), on JAX and PyTorch."""
    import keras

    return keras.quantizers.fake_quant_with_min_max_vars(x, low, high, num_bits=8)


class _ArrayModule:
    """What jax.numpy and NumPy spell alike, on the module `self.xp`."""

    converters_read_the_spelling = False

    def constant(self, value, like):
        return self.xp.asarray(value, dtype=like.dtype)

    def lowest(self, like):
        return self.constant(self.xp.finfo(like.dtype).min, like)

    def highest(self, like):
        return self.constant(self.xp.finfo(like.dtype).max, like)

    def full_like(self, like, value):
        return self.xp.full_like(like, value)

    def is_float64(self, like):
        return like.dtype == self.xp.float64


class _Jax(_ArrayModule):
    def __init__(self):
        import jax
        import jax.numpy as jnp

        self.xp = jnp
        self.maximum, self.minimum, self.where, self.erfc = jnp.maximum, jnp.minimum, jnp.where, jax.scipy.special.erfc
        self.sigmoid, self.exp, self.abs = jax.nn.sigmoid, jnp.exp, jnp.abs
        self.clip, self.zeros_like, self.equal = jnp.clip, jnp.zeros_like, jnp.equal
        self.tracer = jax.core.Tracer

    def fuses(self, x):
        return isinstance(x, self.tracer)  # traced for jax.jit, as Keras runs every step

    fake_quant = staticmethod(_keras_fake_quant)


class _Torch:
    converters_read_the_spelling = False

    def __init__(self):
        import torch

        self.torch = torch
        self.maximum, self.minimum, self.where = torch.maximum, torch.minimum, torch.where
        self.erfc = torch.special.erfc
        self.sigmoid, self.exp, self.abs = torch.sigmoid, torch.exp, torch.abs
        self.zeros_like, self.equal = torch.zeros_like, torch.eq

    def constant(self, value, like):
        return self.torch.tensor(value, dtype=like.dtype, device=like.device)

    def lowest(self, like):
        return self.constant(self.torch.finfo(like.dtype).min, like)

    def highest(self, like):
        return self.constant(self.torch.finfo(like.dtype).max, like)

    def clip(self, x, low, high):
        return self.torch.clamp(x, low, high)

    def is_float64(self, like):
        return like.dtype == self.torch.float64

    def fuses(self, x):
        return self.torch.compiler.is_compiling()

    def full_like(self, like, value):
        return self.torch.full_like(like, value)

    fake_quant = staticmethod(_keras_fake_quant)


class _NumPy(_ArrayModule):
    def __init__(self):
        import math

        import numpy as np

        self.xp = np
        self.maximum, self.minimum, self.where, self.exp, self.abs = np.maximum, np.minimum, np.where, np.exp, np.abs
        self.erfc = np.vectorize(math.erfc, otypes=[np.float64])
        self.clip, self.zeros_like, self.equal = np.clip, np.zeros_like, np.equal

    def sigmoid(self, x):
        return 1.0 / (1.0 + self.xp.exp(-x))

    def fuses(self, x):
        return False


# A tensor's framework, from the module its type lives in (tracers and symbolic tensors included).
_NAMESPACES = {"tensorflow": _TensorFlow, "jax": _Jax, "jaxlib": _Jax, "torch": _Torch, "numpy": _NumPy}


_MADE = {}  # a plain dict, not functools.lru_cache: PyTorch's compiler (dynamo) traces through it


def of(x):
    """The array operations for `x`'s framework."""
    framework = type(x).__module__.split(".", 1)[0]
    namespace = _MADE.get(framework)
    if namespace is None:
        if framework not in _NAMESPACES:
            raise TypeError(f"keras_gelu's formulas take TensorFlow, JAX or PyTorch tensors or NumPy arrays. "
                            f"Received: x of type {type(x).__module__}.{type(x).__qualname__}")
        namespace = _MADE[framework] = _NAMESPACES[framework]()
    return namespace
