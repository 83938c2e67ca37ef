"""Which values of a tensor an output reads, where the others only ever meet a multiplication by exact zero
(converters/running/multiplied_by_zero.py), against the definition: a value is read where changing it changes an
output."""

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_gelu.converters.running import multiplied_by_zero
from keras_gelu.converters.running import verify

pytestmark = pytest.mark.legs("tf_keras")  # TensorFlow graphs, any flavour: one leg

GAIN = np.array([0.5, -2.0, 1.5, 3.0], np.float32)  # nonzero: a factor that discards nothing


def _layer_norm_like(variance, centred, other):
    """rsqrt(variance) [2, 3, 1] times a constant gain [4], read by two products: with `centred` [2, 3, 4] (zero
    rows: what a normalization of a row of zeros multiplies its factor by) and `other` [3, 4] (broadcast over the
    batch), whose sum is the output."""
    factor = tf.math.rsqrt(variance, name="factor")
    scaled = tf.multiply(factor, GAIN, name="scaled")
    return scaled * centred + scaled * other


@pytest.fixture(scope="module")
def float_model():
    specs = [tf.TensorSpec([2, 3, 1], tf.float32), tf.TensorSpec([2, 3, 4], tf.float32),
             tf.TensorSpec([3, 4], tf.float32)]
    function = tf.function(_layer_norm_like, input_signature=specs)
    return tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()], function).convert()


def _read_by_definition(variance, centred, other):
    """{"factor": [2, 3, 1], "scaled": [2, 3, 4]}: where changing that value changes the output (float64)."""
    factor = 1.0 / np.sqrt(variance.astype(np.float64))
    scaled = factor * GAIN

    def output(scaled):
        return scaled * centred + scaled * other

    read = {}
    for name, values, compute in (("factor", factor, lambda changed: output(changed * GAIN)),
                                  ("scaled", scaled, output)):
        mask = np.zeros(values.shape, bool)
        for position in np.ndindex(values.shape):
            changed = values.copy()
            changed[position] += 1e3
            mask[position] = not np.array_equal(compute(changed), compute(values))
        read[name] = mask
    return read


def _zero_rows(shape):
    """Arrays of `shape` whose last axis' rows are each all zeros or all nonzero."""
    rows = hnp.arrays(bool, shape[:-1] + (1,))
    values = hnp.arrays(np.float32, shape, elements=st.floats(0.25, 4.0, width=32))
    return st.tuples(rows, values).map(lambda pair: np.where(pair[0], pair[1], np.float32(0.0)))


@settings(max_examples=40, deadline=None)
@given(centred=_zero_rows((2, 3, 4)), other=_zero_rows((3, 4)),
       variance=hnp.arrays(np.float32, (2, 3, 1), elements=st.floats(2.0 ** -40, 4.0, width=32)))
def test_the_values_read_are_those_whose_change_changes_the_output(float_model, centred, other, variance):
    interpreter = verify.interpreter_keeping_every_tensor(float_model)
    interpreter.allocate_tensors()
    names = {detail["name"]: detail["index"] for detail in interpreter.get_tensor_details()}
    for detail, array in zip(interpreter.get_input_details(), (variance, centred, other)):
        interpreter.set_tensor(detail["index"], array)
    interpreter.invoke()
    read = multiplied_by_zero.DiscardedValues(float_model).read_in(interpreter)
    expected = _read_by_definition(variance, centred, other)
    for name, mask in expected.items():
        (index,) = [index for tensor, index in names.items() if tensor.split(";")[0].endswith(name)]
        found = read.get(index)
        assert np.array_equal(mask, np.ones(mask.shape, bool) if found is None else found), name


@pytest.mark.parametrize("factor_of", [lambda value: value, lambda value: tf.nn.relu(value - 2.0)],
                         ids=["x * x", "x * relu(x - 2)"])
def test_a_product_by_a_factor_computed_from_the_value_reads_it_wherever_the_factor_is_zero(factor_of):
    # x * x is 0 where x is, and relu(x - 2) is 0 for x below 2, yet changing x there changes the product
    function = tf.function(lambda inputs: (lambda value: value * factor_of(value))(tf.nn.relu(inputs)),
                           input_signature=[tf.TensorSpec([6], tf.float32)])
    float_model = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()],
                                                                  function).convert()
    interpreter = verify.interpreter_keeping_every_tensor(float_model)
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"],
                           np.array([-1.0, 0.0, 0.5, 1.0, 3.0, 16.0], np.float32))
    interpreter.invoke()
    value = interpreter._get_ops_details()[0]["outputs"][0]  # the first op's, the RELU's
    read = multiplied_by_zero.DiscardedValues(float_model).read_in(interpreter).get(value)
    assert read is None or read.all(), read
