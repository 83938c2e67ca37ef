"""GELU spelled every way people write it, as tiny SavedModels for converter tests.

Each entry: name -> (function of x, the GELU it computes: "exact", "tanh",
"sigmoid" or None for a no-op case, alpha). The functions are written the way
they appear in the wild, not derived from keras_gelu.
"""

import math

import tensorflow as tf

SQRT2 = math.sqrt(2.0)
erf, erfc, tanh, sigmoid = tf.math.erf, tf.math.erfc, tf.math.tanh, tf.math.sigmoid

SPELLINGS = {
    "half_x_one_plus_erf_div_sqrt2": (lambda x: 0.5 * x * (1.0 + erf(x / SQRT2)), "exact", 1.0),
    "x_half_one_plus_erf_mul": (lambda x: x * 0.5 * (1.0 + erf(x * 0.70710677)), "exact", 1.0),
    "x_half_plus_half_erf": (lambda x: x * (0.5 + 0.5 * erf(x * 0.7071067811865476)), "exact", 1.0),
    "x_one_plus_erf_times_half": (lambda x: x * (1.0 + erf(x / SQRT2)) * 0.5, "exact", 1.0),
    "half_x_erfc_neg": (lambda x: 0.5 * x * erfc(-x / SQRT2), "exact", 1.0),
    "x_one_minus_half_erfc": (lambda x: x * (1.0 - 0.5 * erfc(x / SQRT2)), "exact", 1.0),
    "tf_nn_gelu": (lambda x: tf.nn.gelu(x, approximate=False), "exact", 1.0),
    "inexact_0_7071": (lambda x: 0.5 * x * (1.0 + erf(x * 0.7071)), "exact", 0.7071 * SQRT2),
    "scaled_1_3": (lambda x: x * 0.5 * (1.0 + erf(1.3 * x / SQRT2)), "exact", 1.3),
    "tanh_pow": (lambda x: 0.5 * x * (1.0 + tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3.0)))),
                 "tanh", 1.0),
    "tanh_x_x_x": (lambda x: 0.5 * x * (1.0 + tanh(0.7978845608 * (x + 0.044715 * x * x * x))), "tanh", 1.0),
    "tanh_coefficient_first": (lambda x: 0.5 * x * (1.0 + tanh(0.7978845608 * x + 0.0356774 * x ** 3)),
                               "tanh", 1.0),
    "tf_nn_gelu_tanh": (lambda x: tf.nn.gelu(x, approximate=True), "tanh", 1.0),
    "sigmoid_1_702": (lambda x: x * sigmoid(1.702 * x), "sigmoid", 1.0),
    # Coefficients computed in the graph, as tutorials write them.
    "tutorial_tf_sqrt": (lambda x: x * 0.5 * (1.0 + erf(x / tf.sqrt(2.0))), "exact", 1.0),
    "tanh_computed_constants": (
        lambda x: 0.5 * x * (1.0 + tanh(tf.sqrt(2.0 / tf.constant(math.pi)) * (x + 0.044715 * tf.pow(x, 3.0)))),
        "tanh", 1.0),
    # A GELU in a tf.function of its own, called from the signature.
    "nested_tf_function": (tf.function(lambda x: 0.5 * x * (1.0 + erf(x / SQRT2))), "exact", 1.0),
    # No-op cases: not GELU, must keep their function.
    "silu": (lambda x: x * sigmoid(x), None, 1.0),
    "twice_gelu_shape": (lambda x: x * (1.0 + erf(x / SQRT2)), None, 1.0),
    "bare_erf": (lambda x: erf(x) + 0.25 * x, None, 1.0),
    "bare_erfc": (lambda x: erfc(x) * x, None, 1.0),
}


class Block(tf.Module):
    """Dense -> spelling -> Dense, so the GELU sits between real ops."""

    def __init__(self, spelling, width=16, seed=0):
        super().__init__()
        rng = tf.random.Generator.from_seed(seed)
        self.w1 = tf.Variable(rng.normal([width, width]) * 0.5)
        self.w2 = tf.Variable(rng.normal([width, 4]) * 0.5)
        self.spelling = spelling

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": tf.matmul(self.spelling(tf.matmul(x, self.w1)), self.w2)}


def save(name, directory):
    block = Block(SPELLINGS[name][0])
    tf.saved_model.save(block, directory, signatures={"serving_default": block.__call__})
    return directory
