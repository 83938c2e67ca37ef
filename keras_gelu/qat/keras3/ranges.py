"""int8 ranges for quantization-aware training on Keras 3: where values are fake-quantized, and on which grid.

They mirror tfmot's quantizers, which the TFLite converter reads the same
way: both emit `tf.quantization.fake_quant_with_min_max_vars*` (through
`keras.quantizers.fake_quant_with_min_max_vars` here).

* `ActivationRange`: 8-bit asymmetric, one range per tensor, the range an
  exponential moving average (decay 0.999) of the batches' ranges widened to
  hold 0, from the first batch's range (or calibration_data's): TFLite's
  int8 activations.
* `WeightRange`: the range of a weight's current value. Symmetric narrow
  range ([-127, 127]), per tensor or per output channel: TFLite's int8
  weights; or asymmetric per tensor (`symmetric=False`): how TFLite quantizes
  a MUL/ADD constant (LearnableGELU's alpha and beta, LayerNorm's gamma and beta).

Each creates its variables on the layer that owns it (`build(layer)`), named
after it, so they save and load with the model.
"""

import contextlib

from keras_gelu.flavour import BACKEND
from keras_gelu.flavour import keras

EMA_DECAY = 0.999  # tfmot's, so that the two QATs train alike
# tfmot's [-6, 6]: where an activation range starts, until calibration_data or the first training batch sets it
# (and, as no batch's range is exactly it, the mark of a range no batch has set yet)
_INITIAL_RANGE = 6.0
_SMALLEST_RANGE = 1e-6

_calibrating = [False]


@contextlib.contextmanager
def calibrating():
    """Within the block, a training-mode call sets each activation range to that batch's range (no average)."""
    _calibrating[0] = True
    try:
        yield
    finally:
        _calibrating[0] = False


def _range_variables(layer, name, shape, initial_magnitude=_INITIAL_RANGE):
    """(low, high) variables on `layer`, also set as its attributes: tf.saved_model.save saves what is an attribute."""
    variables = []
    for end, sign in (("min", -1.0), ("max", 1.0)):
        variable = layer.add_weight(name=f"{name}_{end}", shape=shape, trainable=False,
                                    initializer=keras.initializers.Constant(sign * initial_magnitude))
        setattr(layer, f"range_{name}_{end}", variable)
        variables.append(variable)
    return variables


def _widened(low, high):
    """`high`, at least _SMALLEST_RANGE above `low`. An activation of zeros only (an unused output, DeiT's
    zero-initialized tokens) has the range [0, 0]: a zero step, which fake-quant's gradient divides by (NaN
    ranges after one training step); zeros are exact on any grid that holds 0. On the variables, not in the
    graph: the converter reads a FakeQuant's range as constants. (A constant of zeros, as a LayerNormalization's
    beta, keeps [0, 0]: the converter folds it into a zero constant, which a widened range would not.)"""
    return keras.ops.maximum(high, low + _SMALLEST_RANGE)


def _fake_quant_on(x, low, high, narrow_range=False, axis=None):
    """x fake-quantized on [low, high], a range that is not empty."""
    return keras.quantizers.fake_quant_with_min_max_vars(x, low, high, num_bits=8, narrow_range=narrow_range,
                                                         axis=axis)


def _fake_quant(x, low, high, narrow_range=False, axis=None, training=False):
    def quantize(x, low, high):
        return _fake_quant_on(x, low, high, narrow_range, axis)

    # An empty range ([0, 0]: a constant of zeros, as a fresh LearnableGELU's beta) is NaN in Keras's own fake
    # quantization (JAX, PyTorch) and in XLA's FakeQuant (TensorFlow under jit_compile=True), where TensorFlow's
    # CPU kernel gives 0 and passes the gradient straight through. So it is quantized as that kernel does, except
    # in TensorFlow's inference graph: the converter reads its FakeQuant op's constant range there as it is.
    if BACKEND == "tensorflow" and not training:
        return quantize(x, low, high)
    low, high = keras.ops.convert_to_tensor(low), keras.ops.convert_to_tensor(high)
    empty = keras.ops.less_equal(high, low)
    quantized = quantize(x, low, keras.ops.where(empty, low + 1.0, high))
    if axis is not None:
        shape = [1] * len(x.shape)
        shape[axis] = -1
        empty = keras.ops.reshape(empty, shape)
    return keras.ops.where(empty, x - keras.ops.stop_gradient(x), quantized)


class ActivationRange:
    """A tensor's moving-average int8 range; `range(x, training)` fake-quantizes x on it."""

    def __init__(self, name):
        self.name = name

    def build(self, layer):
        self.low, self.high = _range_variables(layer, self.name, ())

    def __call__(self, x, training=False):
        self.observe(x, training)
        return self.quantize(x, training)

    def observe(self, x, training=False):
        """In training, moves the range towards x's (the first batch sets it), the moving average in tfmot's
        form. A training step's trace makes these ops once for each range of the model, and the fewer they are,
        the sooner `fit` starts: with the guard `quantize` leaves out in training, 45 graph ops a range where
        there were 57 (a two-block QAT transformer's first `fit` 8.6 -> 7.2 s on an AVX-512 Xeon)."""
        if not training:
            return
        x = keras.ops.cast(x, "float32")
        # widened to hold 0 (and an empty tensor's range is [0, 0], where a bare min would fail)
        batch_low, batch_high = keras.ops.min(x, initial=0.0), keras.ops.max(x, initial=0.0)
        if _calibrating[0]:
            low, high = batch_low, batch_high
        else:
            low, high = self.low, self.high
            # The first training batch sets the range outright (no batch has, while it is still the initial
            # [-6, 6]): a moving average from [-6, 6] keeps a real model's range there for thousands of steps,
            # and its small values (a variance, a normalized row) on a grid of 12/255.
            unset = keras.ops.logical_and(keras.ops.equal(low, -_INITIAL_RANGE), keras.ops.equal(high, _INITIAL_RANGE))
            low = keras.ops.where(unset, batch_low, low - (low - batch_low) * (1.0 - EMA_DECAY))
            high = keras.ops.where(unset, batch_high, high - (high - batch_high) * (1.0 - EMA_DECAY))
        self.low.assign(low)
        self.high.assign(_widened(low, high))

    def quantize(self, x, training=False):
        """x fake-quantized on the range as it is. In training the range is never empty (observe widens it, and
        it starts at [-6, 6]), so the guard `_fake_quant` keeps for an empty range is not traced there."""
        if training:
            return _fake_quant_on(x, self.low, self.high)
        return _fake_quant(x, self.low, self.high, training=training)


class WeightRange:
    """A weight's int8 range from its current value (tfmot's last-value quantizer), per tensor or along `axis`.

    Symmetric (the default): [-m, m] with m the largest magnitude, on the narrow grid of [-127, 127] steps:
    TFLite's int8 weights. Otherwise [min, max] widened to hold 0, on the full grid: how TFLite quantizes a
    MUL/ADD constant.
    """

    def __init__(self, name, axis=None, symmetric=True):
        self.name, self.axis, self.symmetric = name, axis, symmetric

    def build(self, layer, weight):
        """`weight`: the variable, or a function giving the tensor the rule quantizes (a kernel times a constant)."""
        self.weight = weight
        shape = () if self.axis is None else (self._current().shape[self.axis],)
        self.low, self.high = _range_variables(layer, self.name, shape)
        self.update()

    def _current(self, weight=None):
        if weight is not None:
            return weight
        return self.weight() if callable(self.weight) else self.weight

    def _reduced(self, reduce, weight):
        if self.axis is None:
            return reduce(weight)
        return reduce(weight, axis=[axis for axis in range(len(weight.shape)) if axis != self.axis % len(weight.shape)])

    def update(self, weight=None):
        """Set the range to `weight`'s (by default the weight it was built for, after set_weights, say)."""
        weight = self._current(weight)
        if self.symmetric:
            magnitude = keras.ops.maximum(self._reduced(keras.ops.max, keras.ops.abs(weight)), 1e-8)  # all-zero too
            self.low.assign(-magnitude)
            self.high.assign(magnitude)
        else:
            self.low.assign(keras.ops.minimum(self._reduced(keras.ops.min, weight), 0.0))
            self.high.assign(keras.ops.maximum(self._reduced(keras.ops.max, weight), 0.0))

    def __call__(self, weight, training=False):
        if training:
            self.update(weight)
            if self.symmetric:  # [-m, m] with m at least 1e-8: never empty, no guard to trace
                return _fake_quant_on(weight, self.low, self.high, narrow_range=True, axis=self.axis)
        return _fake_quant(weight, self.low, self.high, narrow_range=self.symmetric, axis=self.axis, training=training)
