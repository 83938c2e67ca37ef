"""The Keras flavour is chosen once, the way tf.keras chooses it."""

import os

import tensorflow as tf

import keras_gelu
from conftest import keras


def test_flavour_follows_tf_use_legacy_keras():
    legacy = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
    assert keras_gelu.KERAS_FLAVOUR == ("tf_keras" if legacy else "keras3")
    assert keras.__name__ == ("tf_keras" if legacy else "keras")


def test_same_keras_as_tf_keras():
    assert tf.keras.layers.Layer is keras.layers.Layer
    assert isinstance(keras_gelu.GELU(), tf.keras.layers.Layer)
    dense = tf.keras.layers.Dense(2, activation=keras_gelu.GELU("tanh"))
    assert dense(tf.ones((1, 3))).shape == (1, 2)
