"""The rounding envelope (`converters/running/rounding_envelope.py`): the rewritten graph with one step of
rounding moved on a fraction of each activation's values, against which a QAT model's .tflite is judged where
it is beyond the default limit in steps."""

import numpy as np
import pytest
import tensorflow as tf

from keras_gelu.converters.running import rounding_envelope

pytestmark = pytest.mark.legs("tf_keras")  # TensorFlow graphs, any flavour: one leg

LOW, HIGH = -2.0, 3.0
STEP = (HIGH - LOW) / 255


def _graph():
    """x -> FakeQuant (an activation) -> x * FakeQuant(weight constant) -> FakeQuant (an activation) -> y."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 400), name="x")
        on_grid = tf.quantization.fake_quant_with_min_max_vars(x, LOW, HIGH, name="activation")
        weight = tf.quantization.fake_quant_with_min_max_vars(tf.constant(np.linspace(-1, 1, 400, dtype=np.float32)),
                                                              -1.0, 1.0, name="weight")
        tf.identity(tf.quantization.fake_quant_with_min_max_vars(on_grid * weight, -3.0, 3.0, name="output"),
                    name="y")
    return graph.as_graph_def()


def _tensor(name):
    return name if ":" in name else f"{name}:0"


def _run(graph_def, fetches, x):
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(fetches, {"x:0": x})


@pytest.mark.parametrize("fraction", [0.05, 0.3])
def test_each_activation_moves_one_step_on_the_fraction_and_weights_stay(fraction):
    graph_def = _graph()
    x = np.random.default_rng(0).uniform(LOW + 2 * STEP, HIGH - 2 * STEP, size=(50, 400)).astype(np.float32)
    clean = _run(graph_def, ["activation:0", "weight:0"], x)
    moved_def = rounding_envelope.perturbed(graph_def, fraction, seed=1)
    # the readers of each FakeQuant read its moved copy: the activation's, as the multiplication reads it
    reader = next(node for node in moved_def.node if node.op == "Mul" and not node.name.startswith("keras_gelu"))
    activation, weight = _tensor(reader.input[0]), _tensor(reader.input[1])
    moved_activation = _run(moved_def, activation, x)
    steps = (moved_activation - clean[0]) / STEP
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)  # on the grid
    assert set(np.unique(np.round(steps))) == {-1.0, 0.0, 1.0}
    moved_share = np.mean(np.round(steps) != 0)
    # 20,000 values, each moved with probability `fraction`: within 5 standard deviations
    assert abs(moved_share - fraction) <= 5 * np.sqrt(fraction * (1 - fraction) / steps.size)
    assert abs(np.mean(np.round(steps)[np.round(steps) != 0])) < 0.1  # up as often as down
    np.testing.assert_array_equal(_run(moved_def, weight, x), clean[1])  # a weight's rounding is exact
    # another seed moves other values; the same seed the same ones
    np.testing.assert_array_equal(_run(rounding_envelope.perturbed(graph_def, fraction, 1), activation, x),
                                  moved_activation)
    assert not np.array_equal(_run(rounding_envelope.perturbed(graph_def, fraction, 2), activation, x),
                              moved_activation)


def test_a_graph_without_fake_quants_is_left_as_it_is():
    graph = tf.Graph()
    with graph.as_default():
        tf.identity(tf.compat.v1.placeholder(tf.float32, (None, 3), name="x") * 2.0, name="y")
    graph_def = graph.as_graph_def()
    assert rounding_envelope.perturbed(graph_def, 0.05, seed=1) == graph_def
