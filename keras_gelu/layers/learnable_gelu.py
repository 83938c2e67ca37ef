"""The learnable GELU layer, x * sigmoid(alpha x + beta)."""

from keras_gelu import formulas
from keras_gelu import kernels
from keras_gelu.flavour import keras
from keras_gelu.flavour import register_serializable


def _normalize_shared_axes(shared_axes):
    if shared_axes is None:
        return None
    axes = list(shared_axes) if isinstance(shared_axes, (list, tuple)) else [shared_axes]
    if not all(isinstance(axis, int) and not isinstance(axis, bool) and axis >= 1 for axis in axes):
        raise ValueError(
            "Argument `shared_axes` must be None, a positive int or a list of "
            "positive ints (axis 0 is the batch axis, which is always shared). "
            f"Received: shared_axes={shared_axes!r}"
        )
    return sorted(set(axes))


@register_serializable
class LearnableGELU(keras.layers.Layer):
    """GELU with a learned gate: x * sigmoid(alpha x + beta).

    It starts as the sigmoid form of GELU (alpha = 1.702, beta = 0) and lets
    training move the gate's slope and offset, which helps int8 models adapt
    the curve to the quantization grid. Parameters follow `keras.layers.PReLU`:
    one per input element, unless `shared_axes` shares them (for per-channel
    parameters after a Conv2D with output (batch, height, width, channels),
    use `shared_axes=[1, 2]`). The weights stay float32 under mixed precision.

    Args:
        alpha_initializer: Initializer for the slope `alpha`. Defaults to
            `Constant(1.702)`.
        beta_initializer: Initializer for the offset `beta`. Defaults to
            "zeros".
        alpha_regularizer: Regularizer for `alpha`.
        beta_regularizer: Regularizer for `beta`.
        alpha_constraint: Constraint for `alpha`.
        beta_constraint: Constraint for `beta`.
        shared_axes: Axes along which the parameters are shared.
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Input shape:
        Arbitrary, with known sizes on the axes not shared.

    Output shape:
        Same shape as the input.
    """

    def __init__(
        self,
        alpha_initializer=None,
        beta_initializer="zeros",
        alpha_regularizer=None,
        beta_regularizer=None,
        alpha_constraint=None,
        beta_constraint=None,
        shared_axes=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.supports_masking = True
        if alpha_initializer is None:
            alpha_initializer = keras.initializers.Constant(formulas.SIGMOID_SLOPE)
        self.alpha_initializer = keras.initializers.get(alpha_initializer)
        self.beta_initializer = keras.initializers.get(beta_initializer)
        self.alpha_regularizer = keras.regularizers.get(alpha_regularizer)
        self.beta_regularizer = keras.regularizers.get(beta_regularizer)
        self.alpha_constraint = keras.constraints.get(alpha_constraint)
        self.beta_constraint = keras.constraints.get(beta_constraint)
        self.shared_axes = _normalize_shared_axes(shared_axes)

    def _parameter_shape(self, input_shape):
        input_shape = tuple(input_shape)
        shared = self.shared_axes or []
        if any(axis >= len(input_shape) for axis in shared):
            raise ValueError(
                f"Argument `shared_axes` names an axis beyond the input's rank "
                f"{len(input_shape)}. Received: shared_axes={list(shared)}"
            )
        shape = [1 if axis in shared else size for axis, size in enumerate(input_shape)][1:]
        if any(size is None for size in shape):
            raise ValueError(
                "LearnableGELU needs a known size on every axis that is not "
                "shared; share the dynamic axes with `shared_axes`. "
                f"Received: input_shape={input_shape}"
            )
        return shape

    def build(self, input_shape):
        shape = self._parameter_shape(input_shape)
        # autocast=False: under mixed precision the layer reads them as float32.
        self.alpha = self.add_weight(
            name="alpha",
            shape=shape,
            initializer=self.alpha_initializer,
            regularizer=self.alpha_regularizer,
            constraint=self.alpha_constraint,
            autocast=False,
        )
        self.beta = self.add_weight(
            name="beta",
            shape=shape,
            initializer=self.beta_initializer,
            regularizer=self.beta_regularizer,
            constraint=self.beta_constraint,
            autocast=False,
        )
        self.built = True

    def call(self, inputs):
        return kernels.learnable(inputs, self.alpha, self.beta)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "alpha_initializer": keras.initializers.serialize(self.alpha_initializer),
                "beta_initializer": keras.initializers.serialize(self.beta_initializer),
                "alpha_regularizer": keras.regularizers.serialize(self.alpha_regularizer),
                "beta_regularizer": keras.regularizers.serialize(self.beta_regularizer),
                "alpha_constraint": keras.constraints.serialize(self.alpha_constraint),
                "beta_constraint": keras.constraints.serialize(self.beta_constraint),
                "shared_axes": None if self.shared_axes is None else list(self.shared_axes),
            }
        )
        return config
