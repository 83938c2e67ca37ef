"""The GELU activation layer."""

from keras_gelu import activations
from keras_gelu import vocabulary
from keras_gelu.flavour import keras
from keras_gelu.flavour import register_serializable


@register_serializable
class GELU(keras.layers.Layer):
    """Gaussian error linear unit, exact or approximated.

    Formula, by `approximate`:
        "exact":   x * Phi(x) = 0.5 x erfc(-x / sqrt(2))
        "tanh":    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        "sigmoid": x * sigmoid(1.702 x)

    Use it as a layer or as the `activation=` of another layer:
    `keras.layers.Dense(512, activation=keras_gelu.GELU("tanh"))`.
    GELU(-inf) is 0, GELU(+inf) is +inf and the gradient is finite everywhere;
    half-precision inputs are computed in a wider dtype and rounded once.

    Args:
        approximate: "exact", "tanh" or "sigmoid"; also PyTorch's "none"
            and Keras's False and True (exact, exact, tanh). Defaults to
            "exact".
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Input shape:
        Arbitrary.

    Output shape:
        Same shape as the input.

    >>> import keras_gelu
    >>> layer = keras_gelu.GELU(approximate="sigmoid")
    >>> [round(float(v), 4) for v in layer([-1.0, 0.0, 1.0])]
    [-0.1543, 0.0, 0.8457]
    """

    def __init__(self, approximate="exact", **kwargs):
        super().__init__(**kwargs)
        self.approximate = vocabulary.gelu_function(approximate)
        self.supports_masking = True
        self._activation_fn = activations.GELUActivation(self.approximate)

    def call(self, inputs):
        return self._activation_fn(inputs)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"approximate": self.approximate})
        return config
