"""GELU as plain callables, usable wherever Keras takes an activation.

`gelu(x, approximate=...)` picks a GELU function by name. `gelu_exact`, `gelu_tanh` and
`gelu_sigmoid` are the three fixed forms as one-argument activations that
survive saving and loading, so `Dense(64, activation=keras_gelu.gelu_tanh)`
round-trips through .keras, .h5 and SavedModel.

Why they are instances of a registered class and not plain functions: tf-keras
saves a registered *function* used as an activation as {"class_name":
"function", ...}, which its own .h5 and SavedModel loaders cannot read back.
A registered class with a config loads in Keras 3 and tf-keras alike.
"""

from keras_gelu import kernels
from keras_gelu import vocabulary
from keras_gelu.flavour import register_serializable

_KERNELS = {"exact": kernels.exact, "tanh": kernels.tanh, "sigmoid": kernels.sigmoid}


@register_serializable
class GELUActivation:
    """A fixed GELU form as a serializable one-argument activation.

    Args:
        approximate: "exact", "tanh" or "sigmoid"; also PyTorch's "none"
            and Keras's False and True (exact, exact, tanh).
    """

    def __init__(self, approximate="exact"):
        self.approximate = vocabulary.gelu_function(approximate)
        self._kernel = _KERNELS[self.approximate]

    def __call__(self, x):
        return self._kernel(x)

    def __eq__(self, other):
        return type(other) is type(self) and other.approximate == self.approximate

    def __hash__(self):
        return hash((type(self), self.approximate))

    def __repr__(self):
        return f"GELUActivation(approximate={self.approximate!r})"

    def get_config(self):
        return {"approximate": self.approximate}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


gelu_exact = GELUActivation("exact")
"""Exact GELU, x * Phi(x) = 0.5 x erfc(-x / sqrt(2)).

Within 2e-7 relative + 1e-7 absolute of the float64 value in float32.
gelu_exact(-inf) is 0 and its gradient is finite everywhere.
Reference: Hendrycks & Gimpel, https://arxiv.org/abs/1606.08415
"""

gelu_tanh = GELUActivation("tanh")
"""0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as tf.nn.gelu(approximate=True).

Computed as x * sigmoid(1.5957691 (x + 0.044715 x^3)), the same function
without cancellation for negative x. Differs from exact GELU by <= 4.7e-4.
"""

gelu_sigmoid = GELUActivation("sigmoid")
"""x * sigmoid(1.702 x). Differs from exact GELU by <= 2.0e-2 (at |x| ~ 2.27)."""


def gelu(x, approximate="exact"):
    """Gaussian error linear unit.

    Args:
        x: Input tensor. float16 inputs are computed in float32 and bfloat16
            inputs in float64, then rounded once.
        approximate: "exact" (x * Phi(x)), "tanh" or "sigmoid"
            (x * sigmoid(1.702 x)); also PyTorch's "none" and Keras's False
            and True (exact, exact, tanh). Unlike Keras, where
            `keras.ops.gelu` defaults to the tanh form and
            `keras.activations.gelu` to the exact one, the default here is
            always exact.

    Returns:
        A tensor of the same shape and dtype as `x`.

    >>> import keras_gelu
    >>> [round(float(v), 4) for v in keras_gelu.gelu([-1.0, 0.0, 1.0])]
    [-0.1587, 0.0, 0.8413]
    """
    return _KERNELS[vocabulary.gelu_function(approximate)](x)
