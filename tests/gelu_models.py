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
