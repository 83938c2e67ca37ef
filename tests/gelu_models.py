"""A model with every way of using this package's GELUs, for the int8 tests."""

import keras_gelu
from conftest import keras


def every_gelu_functional(seed):
    """12 features -> six Dense layers, each with a different GELU use -> 4 outputs ("head")."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12,), name="features")
    h = keras.layers.Dense(16, activation=keras_gelu.GELU("exact"))(inputs)
    h = keras.layers.Dense(16, activation=keras_gelu.gelu_tanh)(h)
    h = keras_gelu.GELU("sigmoid")(keras.layers.Dense(16)(h))
    h = keras_gelu.LearnableGELU(beta_initializer=keras.initializers.Constant(0.1))(keras.layers.Dense(16)(h))
    h = keras.layers.Dense(16, activation=keras_gelu.LearnableGELU())(h)
    h = keras.layers.Dense(16, activation="gelu")(h)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(h))


OUTLIER_SCALE = 300.0


def outlier_model(outlier):
    """x -> Dense(64) -> GELU -> Dense(8) (channel 0 scaled by OUTLIER_SCALE when `outlier`) -> Dense(8), whose
    kernel reads nothing of channel 0: all it reads is what per-tensor int8 rounds away next to the outlier."""
    keras.utils.set_random_seed(7)
    inputs = keras.Input((16,), name="x")
    hidden = keras.layers.Dense(64, name="up")(inputs)
    hidden = keras.layers.Activation("gelu", name="act")(hidden)
    wide = keras.layers.Dense(8, name="outlier_dense")(hidden)
    outputs = keras.layers.Dense(8, name="head")(wide)
    model = keras.Model(inputs, outputs)
    kernel, bias = model.get_layer("outlier_dense").get_weights()
    if outlier:
        kernel[:, 0] *= OUTLIER_SCALE
    model.get_layer("outlier_dense").set_weights([kernel, bias])
    head_kernel, head_bias = model.get_layer("head").get_weights()
    head_kernel[0, :] = 0.0
    model.get_layer("head").set_weights([head_kernel, head_bias])
    return model
