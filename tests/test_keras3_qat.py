"""Keras 3's QAT engine (keras_gelu.qat): ranges, rules, saving, errors; CNNs to a fully integer .tflite.

The engine-independent QAT tests (every GELU, every mode, to int8 within
QAT_INT8_STEPS) live in test_quantization.py and run under both engines.
"""

import numpy as np
import pytest

import keras_gelu
import references
from conftest import IS_KERAS3
from conftest import keras
from conftest import todays_seed
from conversions import DEPTHWISE_INT8_STEPS
from conversions import QAT_INT8_STEPS

if not IS_KERAS3:
    pytest.skip("Keras 3's QAT engine (under tf-keras, quantize_model is tfmot's)", allow_module_level=True)

from keras_gelu import converters  # noqa: E402
from keras_gelu.converters.tflite import operators  # noqa: E402
import keras_gelu.qat  # noqa: E402
from keras_gelu.qat.keras3 import ranges  # noqa: E402
from keras_gelu.qat.keras3 import rules  # noqa: E402

pytestmark = pytest.mark.legs("keras3")
# TF 2.18's converter on a cheap model of each kind of int8 op the rules make (the activations' fixed grids
# and the saved model's load are TensorFlow's version's no more than the rest); the larger models run once.
on_tf218_too = pytest.mark.legs("keras3", "tf218")


def _mlp(seed=3):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((12,), name="features")
    hidden = keras.layers.Dense(16, activation=keras_gelu.GELU("tanh"), name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(4, name="head")(hidden), name="mlp")


def _range_of(layer, name):
    return float(getattr(layer, f"range_{name}_min").numpy()), float(getattr(layer, f"range_{name}_max").numpy())


def _converted(model):
    return converters.convert(model, int8=True)


def _quantized_and_trained(model, x, rng):
    """The QAT copy of `model` (ranges from `x`), checked to compute the float model's function up to int8
    rounding (10 output steps: a few per layer, not a shifted convolution or a lost scale), then trained one
    epoch: a zero bias, as initialized, hides a bias ADD the conversion leaves in float. Eagerly: tracing a
    training step cost seconds per model, its two steps a fraction of one (training in a graph: the tests that
    call fit themselves, test_quantization's, test_distribute's)."""
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    low, high = _range_of(qat.layers[-1], "output")
    assert np.max(np.abs(qat(x).numpy() - model(x).numpy())) <= 10 * (high - low) / 255
    qat.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=True)
    qat.fit(x, rng.normal(size=(64,) + tuple(model.output_shape[1:])).astype(np.float32), epochs=1, verbose=0)
    return qat


def _cnn(pooling):
    keras.utils.set_random_seed(4)
    return keras.Sequential([
        keras.Input((8, 8, 1), name="image"),
        keras.layers.Conv2D(8, 3, padding="same", activation=keras_gelu.GELU("tanh")),
        keras.layers.DepthwiseConv2D(3, padding="same", dilation_rate=2, activation="relu"),
        pooling,
        keras.layers.Conv2D(8, 3, activation=keras_gelu.LearnableGELU(shared_axes=[1, 2])),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])


@pytest.mark.parametrize("pooling", ["MaxPooling2D", "AveragePooling2D"])
def test_a_small_cnn_converts_to_a_fully_integer_tflite_within_qat_int8_steps(pooling, rng):
    import tflite_helpers

    x = rng.uniform(0, 1, size=(128, 8, 8, 1)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(_cnn(getattr(keras.layers, pooling)(2)), calibration_data=x)
    qat.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                run_eagerly=True)  # as _quantized_and_trained says why
    qat.fit(x, rng.integers(0, 10, size=128), epochs=1, verbose=0)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    assert set(report.op_types["CONV_2D"]) == set(report.op_types["DEPTHWISE_CONV_2D"]) == {"int8"}
    # Average pooling runs as a second depthwise convolution (1/window kernel), which rescales as the rule does.
    assert sum(report.op_types["DEPTHWISE_CONV_2D"].values()) == 1 + (pooling == "AveragePooling2D")
    (scale,) = operators.output_scales(tflite_model)
    steps = np.max(np.abs(tflite_helpers.run(tflite_model, x[:64])[0] - qat(x[:64]).numpy())) / scale
    assert steps <= QAT_INT8_STEPS


def test_average_pooling_computes_the_average_and_refuses_same_padding_that_pads(rng):
    x = rng.normal(size=(4, 6, 6, 3)).astype(np.float32)
    inputs = keras.Input((6, 6, 3))
    model = keras.Model(inputs, keras.layers.AveragePooling2D(3, strides=1, name="pool")(inputs))
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    # within the input's and the output's int8 steps of the float average
    tolerance = sum(np.abs(x).max() / 127 for _ in range(2))
    np.testing.assert_allclose(qat(x).numpy(), model(x).numpy(), atol=tolerance)
    padded = keras.Model(inputs, keras.layers.AveragePooling2D(4, padding="same", name="edge_pool")(inputs))
    with pytest.raises(ValueError, match=r"edge_pool: .*'same' padding pads.*Received: padding='same'"):
        keras_gelu.qat.quantize_model(padded)


@pytest.mark.parametrize("padding, dilation", [("same", 1), ("valid", 2), ("causal", 2)])
def test_conv1d_computes_the_float_function_and_converts_within_qat_int8_steps(padding, dilation, rng):
    import tflite_helpers

    keras.utils.set_random_seed(8)
    model = keras.Sequential([keras.Input((16, 3)), keras.layers.Conv1D(8, 3, padding=padding, dilation_rate=dilation,
                                                                      activation=keras_gelu.GELU("sigmoid")),
                              keras.layers.Conv1D(8, 1, activation="relu"), keras.layers.AveragePooling1D(2),
                              keras.layers.Flatten(), keras.layers.Dense(4)])
    x = rng.normal(size=(64, 16, 3)).astype(np.float32)
    qat = _quantized_and_trained(model, x, rng)
    tflite_model, report = _converted(qat)
    (scale,) = operators.output_scales(tflite_model)
    assert report.float_ops == {} and set(report.op_types["CONV_2D"]) == {"int8"}
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def _separable_cnn(one_dimensional):
    keras.utils.set_random_seed(3)
    if one_dimensional:
        return keras.Sequential([
            keras.Input((20, 4)), keras.layers.DepthwiseConv1D(3, strides=2, padding="same", activation="relu"),
            keras.layers.DepthwiseConv1D(3, dilation_rate=2, padding="same"),
            keras.layers.SeparableConv1D(6, 3, activation="relu6"), keras.layers.Flatten(), keras.layers.Dense(4)])
    return keras.Sequential([
        keras.Input((12, 12, 3)), keras.layers.SeparableConv2D(8, 3, strides=2, padding="same", activation="relu"),
        keras.layers.SeparableConv2D(8, 3, dilation_rate=2, activation=keras_gelu.GELU("tanh")),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])


@pytest.mark.parametrize("one_dimensional", [False, True], ids=["separable-2d", "depthwise-separable-1d"])
def test_depthwise_and_separable_convolutions_train_and_convert_within_qat_int8_steps(one_dimensional, rng):
    import tflite_helpers

    model = _separable_cnn(one_dimensional)
    x = rng.normal(size=(64,) + tuple(model.input_shape[1:])).astype(np.float32)
    qat = _quantized_and_trained(model, x, rng)  # strides, dilation and the separable pair as the float layers
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    # a separable convolution is a DEPTHWISE_CONV_2D and a 1x1 CONV_2D
    assert sum(report.op_types["DEPTHWISE_CONV_2D"].values()) == (3 if one_dimensional else 2)
    assert sum(report.op_types["CONV_2D"].values()) == (1 if one_dimensional else 2)
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= DEPTHWISE_INT8_STEPS


def _encoder_block(layer_normalization):
    keras.utils.set_random_seed(9)
    inputs = keras.Input((6, 8), name="tokens")
    hidden = keras.layers.EinsumDense("abc,cd->abd", output_shape=(6, 16), bias_axes="d",
                                      activation=keras_gelu.GELU("tanh"))(inputs)
    hidden = keras.layers.Add()([inputs, keras.layers.EinsumDense("abc,cd->abd", output_shape=(6, 8),
                                                                  bias_axes="d")(hidden)])
    if layer_normalization:
        hidden = keras.layers.LayerNormalization(gamma_initializer=keras.initializers.RandomUniform(0.5, 1.5),
                                                 beta_initializer="ones")(hidden)
    return keras.Model(inputs, keras.layers.Softmax()(hidden))


@on_tf218_too
@pytest.mark.parametrize("layer_normalization", [False, True], ids=["residual", "residual+LayerNormalization"])
def test_einsum_dense_layer_normalization_and_softmax_convert_to_integer(layer_normalization, rng):
    import tflite_helpers

    x = rng.normal(size=(64, 6, 8)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(_encoder_block(layer_normalization), calibration_data=x)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    for op in ("SOFTMAX", "FULLY_CONNECTED") + (("MEAN", "SQUARED_DIFFERENCE", "RSQRT", "SUB") if layer_normalization
                                                 else ()):
        assert set(report.op_types[op]) == {"int8"}, op
    (scale,) = operators.output_scales(tflite_model)
    assert scale == pytest.approx(1 / 256)  # SOFTMAX's fixed int8 output grid, which QAT trained against
    steps = np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy()) / scale
    if not layer_normalization:
        assert steps.max() <= QAT_INT8_STEPS
        return
    # Op for op: each of LayerNormalization's int8 ops is its exact function on its own int8 inputs, rounded
    # once (a kernel's fixed-point arithmetic may land one step off on a rounding boundary; RSQRT's does on
    # about 1.5 % of values).
    ops = tflite_helpers.op_rounding_steps(tflite_model, x,
                                           ("MEAN", "SQUARED_DIFFERENCE", "RSQRT", "MUL", "SUB", "ADD"))
    assert [name for name, _ in ops].count("SUB") == 1 and max(steps for _, steps in ops) <= 1, ops
    # The normalization then multiplies a one-step difference of 1/std by (x - mean) * gamma, several output
    # steps where x is far from the mean: measured up to 3 on 0.03 % of outputs with TF 2.21, 5 on 0.7 % with
    # TF 2.18's converter and runtime; so the bound is on the share beyond QAT_INT8_STEPS, and the largest.
    assert np.mean(steps > QAT_INT8_STEPS) <= 0.01 and steps.max() <= 8


def test_layer_normalization_over_other_axes_or_rms_is_refused_by_name():
    inputs = keras.Input((6, 8))
    model = keras.Model(inputs, keras.layers.LayerNormalization(axis=1, name="across_tokens")(inputs))
    with pytest.raises(ValueError, match=r"across_tokens.*last axis.*Received: axis=\[1\]"):
        keras_gelu.qat.quantize_model(model)


def test_the_qat_model_saves_and_loads_as_keras_without_custom_objects_and_trains_on(tmp_path, rng):
    qat = keras_gelu.qat.quantize_model(_mlp(), mode="native")
    x = rng.normal(size=(64, 12)).astype(np.float32)
    qat.compile(keras.optimizers.Adam(1e-2), "mse")
    qat.fit(x, rng.normal(size=(64, 4)).astype(np.float32), epochs=1, verbose=0)
    path = str(tmp_path / "qat.keras")
    qat.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(restored(x).numpy(), qat(x).numpy())
    assert restored.get_layer("quant_hidden_gelu").rule == rules.GELURule("native", None)
    restored.compile(keras.optimizers.Adam(1e-2), "mse")
    history = restored.fit(x, rng.normal(size=(64, 4)).astype(np.float32), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])


def test_weight_ranges_are_symmetric_per_tensor_for_dense_and_per_channel_for_convolutions():
    dense_qat = keras_gelu.qat.quantize_model(_mlp())
    kernel = dense_qat.get_layer("quant_hidden").layer.kernel.numpy()
    np.testing.assert_allclose(_range_of(dense_qat.get_layer("quant_hidden"), "kernel"),
                               [-np.abs(kernel).max(), np.abs(kernel).max()], rtol=1e-6)
    conv_qat = keras_gelu.qat.quantize_model(_cnn(keras.layers.MaxPooling2D()))
    conv = next(layer for layer in conv_qat.layers if type(getattr(layer, "layer", None)) is keras.layers.Conv2D)
    np.testing.assert_allclose(conv.range_kernel_max.numpy(), np.abs(conv.layer.kernel.numpy()).max(axis=(0, 1, 2)),
                               rtol=1e-6)
    depthwise = next(layer for layer in conv_qat.layers
                     if type(getattr(layer, "layer", None)) is keras.layers.DepthwiseConv2D)
    np.testing.assert_allclose(depthwise.range_kernel_max.numpy(),
                               np.abs(depthwise.layer.kernel.numpy()).max(axis=(0, 1, 3)), rtol=1e-6)


def test_calibration_sets_each_range_to_the_data_and_keeps_every_weight(rng):
    model = _mlp()
    x = rng.normal(2.0, 1.5, size=(128, 12)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model)
    weights = [weight.numpy().copy() for weight in model.weights]
    keras_gelu.qat.initialize_ranges(qat, x)
    np.testing.assert_allclose(_range_of(qat.get_layer("quantize_features"), "input"),
                               [min(x.min(), 0.0), max(x.max(), 0.0)], rtol=1e-6)
    hidden = x @ model.get_layer("hidden").kernel.numpy() + model.get_layer("hidden").bias.numpy()
    low, high = _range_of(qat.get_layer("quant_hidden"), "output")
    # the Dense output is computed from the fake-quantized input and kernel: within a few of their steps
    assert abs(low - min(hidden.min(), 0.0)) < 0.05 and abs(high - hidden.max()) < 0.05
    qat_weights = [weight for name in ("quant_hidden", "quant_head") for weight in qat.get_layer(name).layer.weights]
    assert len(qat_weights) == len(weights)
    for before, after in zip(weights, qat_weights):
        np.testing.assert_array_equal(before, after.numpy())


def test_the_first_training_batch_sets_a_range_and_each_later_one_moves_it_a_thousandth(rng):
    """Without calibration data a range starts at [-6, 6], which a real model's activations overflow and its
    small values (a variance) round to zero on: the first training batch sets it, as calibration would; the
    moving average takes over from there."""
    qat = keras_gelu.qat.quantize_model(_mlp())
    first, second = (rng.normal(size=(32, 12)).astype(np.float32) * scale for scale in (10, 3))
    assert list(_range_of(qat.get_layer("quantize_features"), "input")) == [-6.0, 6.0]
    qat.compile(keras.optimizers.SGD(0.0), "mse")
    qat.fit(first, np.zeros((32, 4), np.float32), batch_size=32, epochs=1, verbose=0)
    low, high = _range_of(qat.get_layer("quantize_features"), "input")
    np.testing.assert_allclose([low, high], [min(first.min(), 0.0), max(first.max(), 0.0)], rtol=1e-6)
    qat.fit(second, np.zeros((32, 4), np.float32), batch_size=32, epochs=1, verbose=0)
    expected = [ranges.EMA_DECAY * low + (1 - ranges.EMA_DECAY) * min(second.min(), 0.0),
                ranges.EMA_DECAY * high + (1 - ranges.EMA_DECAY) * max(second.max(), 0.0)]
    np.testing.assert_allclose(_range_of(qat.get_layer("quantize_features"), "input"), expected, rtol=1e-6)


def test_a_composite_with_a_sublayer_no_rule_covers_is_named_with_how_to_add_one():
    """A layer without a rule is quantized through the keras.ops it computes (operations.py); a
    BatchNormalization that no Conv/Dense takes in is not, and a composite holding one is refused, named."""

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.normalization = keras.layers.BatchNormalization()

        def call(self, x):
            return self.normalization(x * 2.0)

    inputs = keras.Input((12,))
    model = keras.Model(inputs, Block(name="block")(keras.layers.Dense(12)(inputs)))
    with pytest.raises(ValueError, match=r"no rule for layer block \(Block\), nor for each of its "
                                         r"sublayers: register one with keras_gelu\.qat\.register_rule.*"
                                         r"keep_float=\['block'\]"):
        keras_gelu.qat.quantize_model(model)


def test_keep_float_leaves_the_named_layer_as_it_is(rng):
    inputs = keras.Input((12,))
    model = keras.Model(inputs, keras.layers.BatchNormalization(name="norm")(keras.layers.Dense(8)(inputs)))
    qat = keras_gelu.qat.quantize_model(model, keep_float=["norm"])
    assert type(qat.get_layer("norm")) is keras.layers.BatchNormalization
    x = rng.normal(size=(8, 12)).astype(np.float32)
    np.testing.assert_allclose(qat(x).numpy(), model(x).numpy(), atol=0.2)  # only the Dense is fake-quantized
    with pytest.raises(ValueError, match=r"Received: keep_float=\['nrom'\]"):
        keras_gelu.qat.quantize_model(model, keep_float=["nrom"])


def test_keep_float_auto_keeps_exactly_the_refused_layers_float_names_them_and_converts(tmp_path, rng):
    """keep_float="auto": each layer the engine refuses stays float, named with its refusal (an activation with
    no int8 form; a composite whose sublayer is one, whole; a BatchNormalization no Dense takes in); every
    other layer is quantized as without it, and the int8 model is float only where those layers are."""

    @keras.saving.register_keras_serializable(package="test_keras3_qat")
    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense, self.smooth = keras.layers.Dense(16), keras.layers.Activation("softplus")

        def call(self, x):
            return self.smooth(self.dense(x)) + x

    keras.utils.set_random_seed(4)
    inputs = keras.Input((12,))
    hidden = keras.layers.Activation("softplus", name="soft")(keras.layers.Dense(16, name="first")(inputs))
    hidden = Block(name="block")(hidden)
    hidden = keras.layers.BatchNormalization(name="norm")(keras.layers.Dense(8, activation="relu",
                                                                            name="third")(hidden))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(keras_gelu.GELU(name="gelu")(hidden)))
    kept = {"soft", "block", "norm"}
    with pytest.warns(UserWarning, match=r"kept 3 layer\(s\) float \(keep_float=\"auto\"\): .*"
                                         r"soft: Activation soft: no int8 rule for its function"):
        qat = keras_gelu.qat.quantize_model(model, keep_float="auto")
    assert set(qat.kept_float) == kept
    assert "BatchNormalization" in qat.kept_float["norm"] and "softplus" in qat.kept_float["block"]
    named = keras_gelu.qat.quantize_model(model, keep_float=sorted(kept))
    assert [(layer.name, type(layer)) for layer in qat.layers] == [(layer.name, type(layer)) for layer in named.layers]
    for name in kept:
        assert type(qat.get_layer(name)) is type(model.get_layer(name))  # the float layer, not a wrapper
    quantized = {layer.layer.name for layer in qat.layers if isinstance(layer, keras_gelu.qat.keras3.QuantizeWrapper)}
    assert quantized == {"first", "third", "gelu", "head"}
    x = rng.normal(size=(64, 12)).astype(np.float32)
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.fit(x, rng.normal(size=(64, 3)).astype(np.float32), epochs=1, verbose=0)
    _, report = _converted(qat)
    assert report.float_ops, report.op_types  # the kept layers' ops, named by the report
    assert {"FULLY_CONNECTED", "LOGISTIC"} <= {op for op, types in report.op_types.items() if "int8" in types}
    with pytest.raises(ValueError, match=r"folds a BatchNormalization .*keep_float=\['norm'\]"):
        keras_gelu.qat.quantize_model(model)  # the default is integer throughout, or a refusal


@on_tf218_too
def test_a_registered_rule_quantizes_a_layer_and_converts_to_integer(rng):
    inputs = keras.Input((12,), name="features")
    left, right = keras.layers.Dense(8)(inputs), keras.layers.Dense(8)(inputs)
    model = keras.Model(inputs, keras.layers.Subtract(name="difference")([left, right]))
    # without a rule of its own, the layer is quantized through the keras.ops it computes
    assert keras_gelu.qat.quantize_model(model).get_layer("quant_difference").operation_ranges
    keras_gelu.qat.register_rule(keras.layers.Subtract, rules.OutputRule())
    try:
        x = rng.normal(size=(64, 12)).astype(np.float32)
        qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
        _, report = _converted(qat)
    finally:
        rules._RULES.pop(keras.layers.Subtract)
    assert report.float_ops == {} and set(report.op_types["SUB"]) == {"int8"}


@pytest.mark.parametrize("layer_class, rule, message", [
    (int, rules.OutputRule(), r"Keras layer class\. Received: layer_class=<class 'int'>"),
    (keras.layers.Subtract, "output", r"QuantizeRule\. Received: rule='output'"),
])
def test_register_rule_refuses_what_is_not_a_layer_class_and_a_rule(layer_class, rule, message):
    with pytest.raises(ValueError, match=message):
        keras_gelu.qat.register_rule(layer_class, rule)


@on_tf218_too
def test_a_mixed_precision_model_is_quantized_in_float32_and_converts_to_integer(rng):
    x = rng.normal(size=(64, 12)).astype(np.float32)
    float32_twin = _mlp()
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = _mlp()
    model.set_weights(float32_twin.get_weights())
    with pytest.warns(UserWarning, match=r"computes in float32.*2 layer\(s\) of mlp had a mixed-precision policy"):
        qat = keras_gelu.qat.quantize_model(model, mode="native", calibration_data=x)
    assert keras.mixed_precision.global_policy().name == "mixed_float16"  # left as it was
    assert {layer.dtype_policy.name for layer in qat.layers if not isinstance(layer, keras.layers.InputLayer)} \
        == {"float32"}
    assert qat(x).dtype == "float32"
    keras.mixed_precision.set_global_policy("float32")
    # the QAT model the float32 twin gives: the same computation, to the bit
    twin_qat = keras_gelu.qat.quantize_model(float32_twin, mode="native", calibration_data=x)
    np.testing.assert_array_equal(qat(x).numpy(), twin_qat(x).numpy())
    _, report = _converted(qat)
    assert report.float_ops == {}, report.op_types


def test_a_subclassed_nested_model_is_quantized_through_its_layers_or_refused_by_name(rng):
    class Residual(keras.Model):
        def __init__(self, normalization=None, **kwargs):
            super().__init__(**kwargs)
            self.dense = keras.layers.Dense(12)
            self.normalization = normalization or keras.layers.LayerNormalization()

        def call(self, x):
            return self.normalization(x + self.dense(x))

    inputs = keras.Input((12,))
    qat = keras_gelu.qat.quantize_model(keras.Model(inputs, Residual(name="inner")(inputs)))
    assert isinstance(qat.get_layer("quant_inner").layer.dense, keras_gelu.qat.keras3.composite.QuantizeSublayer)
    class Opaque(keras.Model):  # a subclassed model of no sublayers: nothing to quantize it through
        def call(self, x):
            return keras.ops.softplus(x)

    grouped = Residual(Opaque(), name="inner")
    with pytest.raises(ValueError, match=r"inner is a subclassed model.*Register a rule for Residual.*"
                                         r"keep_float=\['inner'\]"):
        keras_gelu.qat.quantize_model(keras.Model(inputs, grouped(inputs)))


def test_a_non_finite_loss_stops_training_naming_the_first_layer_whose_variables_went(tmp_path, rng):
    """A NaN loss (here a NaN target) used to train on in silence, every variable NaN after a step: fit stops
    at that batch and names the first layer, in the order the model computes, whose variables went. A loaded
    QAT model stops the same way; callbacks of the caller's still run."""
    qat = keras_gelu.qat.quantize_model(_mlp())
    x = rng.normal(size=(16, 12)).astype(np.float32)
    y = np.zeros((16, 4), np.float32)
    y[9, 2] = np.nan  # in the second batch of 8
    seen = []
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    with pytest.raises(keras_gelu.qat.NonFiniteTraining, match=r"QAT stopped at epoch 1, batch 2: the loss is nan; "
                                                                r"the first layer whose variables went non-finite is "
                                                                r"quant_hidden \(quant_hidden/"):
        qat.fit(x, y, batch_size=8, epochs=2, verbose=0,
                callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))])
    assert seen == [0, 1]
    qat.save(str(tmp_path / "qat.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "qat.keras"))
    loaded.compile(keras.optimizers.Adam(1e-3), "mse")
    with pytest.raises(keras_gelu.qat.NonFiniteTraining, match="epoch 1, batch 1"):
        loaded.fit(x, y, batch_size=8, verbose=0)


def test_the_ranges_calibrating_block_ends_even_on_error(rng):
    with pytest.raises(RuntimeError):
        with ranges.calibrating():
            raise RuntimeError("boom")
    qat = keras_gelu.qat.quantize_model(_mlp())
    qat(rng.normal(size=(4, 12)).astype(np.float32), training=True)  # the first batch sets the range
    before = _range_of(qat.get_layer("quantize_features"), "input")
    qat(rng.normal(size=(4, 12)).astype(np.float32) * 100, training=True)
    after = _range_of(qat.get_layer("quantize_features"), "input")
    assert abs(after[1] - before[1]) < 0.01 * 100  # a moving average, not the batch's range


# The two loads in a process of their own (TensorFlow and Keras imported again, 13 s) take turns, a day each; the
# rest of each test runs every day.
_FRESH_PROCESS_TODAY = ("saved", "composite")[todays_seed() % 2]


def test_a_saved_qat_model_loads_in_a_fresh_process_and_converts_from_keras_and_export(tmp_path, rng):
    import subprocess
    import sys

    from keras_gelu.converters import cli

    qat = keras_gelu.qat.quantize_model(_mlp(), calibration_data=rng.normal(size=(64, 12)).astype(np.float32))
    x = rng.normal(size=(8, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "expected.npy", qat(x).numpy())
    qat.save(str(tmp_path / "qat.keras"))
    check = ("import numpy as np, keras, keras_gelu; "  # nothing of keras_gelu.qat imported by hand
             f"model = keras.models.load_model({str(tmp_path / 'qat.keras')!r}); "
             f"np.testing.assert_array_equal(model(np.load({str(tmp_path / 'x.npy')!r})).numpy(), "
             f"np.load({str(tmp_path / 'expected.npy')!r}))")
    if _FRESH_PROCESS_TODAY == "saved":
        subprocess.run([sys.executable, "-c", check], check=True, env={**__import__("os").environ,
                                                                        "TF_USE_LEGACY_KERAS": "0"})
    qat.export(str(tmp_path / "exported"))
    for source in ("qat.keras", "exported"):
        _, report = converters.convert(str(tmp_path / source), int8=True)
        assert report.quantization_aware and report.float_ops == {}, (source, report.op_types)
    output = tmp_path / "qat.tflite"
    assert cli.main([str(tmp_path / "qat.keras"), "--int8", "-o", str(output), "-q"]) == 0
    assert output.read_bytes()[4:8] == b"TFL3"


def test_a_composite_that_builds_its_sublayers_from_tuple_shapes_loads_from_keras(tmp_path, rng):
    """Keras calls `build` with tuple shapes, a loaded file's build config gives JSON lists: a composite that adds
    to its input shape as to a tuple (keras-hub's BLIP-2 Q-Former) is built from tuples either way."""

    @keras.saving.register_keras_serializable(package="test_keras3_qat")
    class TupleShaped(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner, self.outer = keras.layers.Dense(8, name="inner"), keras.layers.Dense(4, name="outer")

        def build(self, input_shape):
            self.inner.build(input_shape)
            self.outer.build(input_shape[:-1] + (8,))

        def call(self, x):
            return self.outer(self.inner(x))

    keras.utils.set_random_seed(9)
    inputs = keras.Input((6,))
    qat = keras_gelu.qat.quantize_model(keras.Model(inputs, TupleShaped(name="block")(inputs)))
    x = rng.normal(size=(8, 6)).astype(np.float32)
    qat.save(str(tmp_path / "qat.keras"))
    loaded = keras.models.load_model(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(loaded(x).numpy(), qat(x).numpy())


def test_a_qat_file_that_does_not_load_is_not_taken_for_a_tf_keras_one(tmp_path):
    """The engine's wrapper shares tfmot's class name (QuantizeWrapper): a Keras 3 QAT file that does not load
    (here: it names a class nothing defines) says why, and does not send its user to tf-keras."""
    import zipfile

    path = tmp_path / "qat.keras"
    keras_gelu.qat.quantize_model(_mlp()).save(str(path))
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = members["config.json"].decode()
    assert config.count('"class_name": "Dense"') == 2
    members["config.json"] = config.replace('"class_name": "Dense"', '"class_name": "NoSuchDense"', 1).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(converters.errors.CorruptModel) as refusal:
        converters.convert(str(path), int8=True)
    assert "cannot load the Keras model" in refusal.value.message and "NoSuchDense" in refusal.value.message
    assert "tf-keras" not in refusal.value.message and "TF_USE_LEGACY_KERAS" not in refusal.value.message


def _attention_block(cross):
    keras.utils.set_random_seed(5)
    if cross:
        tokens = keras.Input((6, 16), name="tokens")
        inputs = [tokens]
    else:  # token ids through an Embedding (a GATHER from the int8 table)
        inputs = [keras.Input((6,), dtype="int32", name="ids")]
        tokens = keras.layers.Embedding(40, 16, name="embedding")(inputs[0])
    memory, extra = tokens, {}
    if cross:  # a second input, read as value and, through a Dense, as key; values of another width
        memory = keras.Input((5, 12), name="memory")
        inputs.append(memory)
        extra = {"key": keras.layers.Dense(10, name="key_source")(memory)}
    attention = keras.layers.MultiHeadAttention(2, 8, value_dim=4 if cross else None, dropout=0.1, name="attention")
    hidden = keras.layers.Add()([tokens, attention(tokens, memory, **extra)])
    return keras.Model(inputs, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(hidden)))


@pytest.mark.parametrize("cross", [False, True], ids=["self-attention", "cross-attention"])
def test_multi_head_attention_trains_saves_and_converts_to_integer_within_qat_int8_steps(cross, tmp_path, rng):
    import tflite_helpers

    model = _attention_block(cross)
    x = [rng.normal(size=(64,) + tuple(tensor.shape[1:])).astype(np.float32) if tensor.dtype == "float32"
         else rng.integers(0, 40, size=(64,) + tuple(tensor.shape[1:])).astype(np.int32) for tensor in model.inputs]
    qat = _quantized_and_trained(model, x, rng)  # MHA's function, 1/sqrt(key_dim) folded into the query kernel
    qat.save(str(tmp_path / "attention.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "attention.keras"))(x).numpy(),
                                  qat(x).numpy())
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    for op in ("FULLY_CONNECTED", "BATCH_MATMUL", "SOFTMAX") + (() if cross else ("GATHER",)):
        assert set(report.op_types[op]) == {"int8"}, op
    (scale,) = operators.output_scales(tflite_model)
    outputs = tflite_helpers.run_matched_by_shape(tflite_model, x)
    assert np.max(np.abs(outputs[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


@pytest.mark.parametrize("masking", ["padding", "padding with a heads axis", "causal"])
def test_masked_attention_converts_to_a_select_and_stays_within_qat_int8_steps(masking, rng):
    """A mask of (batch, query, value) steps, or of (batch, 1, query, value) (keras-hub's SAM3 text encoder),
    which Keras's attention broadcasts over the heads as it is."""
    import tflite_helpers

    keras.utils.set_random_seed(2)
    steps = 8
    heads_axis = (1,) if masking == "padding with a heads axis" else ()
    masking = masking.replace(" with a heads axis", "")
    ids = keras.Input((steps,), dtype="int32", name="ids")
    padding = keras.Input(heads_axis + (steps, steps), dtype="bool", name="padding")
    hidden = keras.layers.Embedding(30, 16)(ids)
    attended = keras.layers.MultiHeadAttention(2, 8)(hidden, hidden, attention_mask=padding if masking == "padding"
                                                     else None, use_causal_mask=masking == "causal")
    outputs = keras.layers.Dense(3)(keras.layers.Flatten()(keras.layers.Add()([hidden, attended])))
    model = keras.Model([ids, padding] if masking == "padding" else ids, outputs)
    lengths = rng.integers(2, steps + 1, size=64)
    x = [rng.integers(0, 30, size=(64, steps)).astype(np.int32),
         np.repeat((np.arange(steps) < lengths[:, None])[:, None, :], steps, axis=1).reshape(
             (64,) + heads_axis + (steps, steps))]
    x = x if masking == "padding" else x[0]
    # Keras masks with -1e9; the rule with a SELECT 16 below the scores' range (e^-16 of a weight): the same
    # attention up to int8 rounding, checked against the float model inside
    qat = _quantized_and_trained(model, x, rng)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {} and set(report.op_types["SELECT_V2"]) >= {"int8"}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    outputs = tflite_helpers.run_matched_by_shape(tflite_model, x if masking == "padding" else [x])[0]
    assert np.max(np.abs(outputs - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def test_a_softmax_layer_called_with_a_mask_masks_in_int8_as_keras_does_in_float(rng):
    """An attention layer of a library's own (keras-hub's decoders) calls a Softmax sublayer with the causal
    mask. Keras sets the masked-off scores to -1e9; on the scores' int8 grid that is the range's low end, where
    a masked-off score weighs e^(low - score): a causal row's first position then shared its weight with seven
    masked ones (keras-hub GPT-2: 224 steps of the probabilities' grid, 25 of its output)."""
    import tflite_helpers

    keras.utils.set_random_seed(4)
    steps = 8
    tokens = keras.Input((steps, 16), name="tokens")
    causal = keras.Input((steps, steps), dtype="bool", name="causal")
    scores = keras.layers.Dense(steps, name="scores")(tokens)
    weights = keras.layers.Softmax(name="softmax")(scores, mask=causal)
    model = keras.Model([tokens, causal], keras.layers.Dense(3, name="head")(weights))
    x = [rng.normal(size=(64, steps, 16)).astype(np.float32),
         np.broadcast_to(np.tril(np.ones((steps, steps), bool)), (64, steps, steps)).copy()]
    qat = _quantized_and_trained(model, x, rng)  # the float model's function up to int8 rounding, inside
    tflite_model, report = _converted(qat)
    assert report.float_ops == {} and set(report.op_types["SELECT_V2"]) == {"int8"}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    outputs = tflite_helpers.run_matched_by_shape(tflite_model, x)[0]
    # SOFTMAX's int8 kernel (a table of exponentials) lands each probability within a step of 1/256 of its
    # rounded float value, and the head sums a row of them: up to sum|w| / 256 on an output, besides its own
    # rounding. (With the masked-off scores at the low end of their grid: 25 steps from the rewritten graph.)
    head_kernel = model.get_layer("head").kernel.numpy()
    softmax_steps = np.abs(head_kernel).sum(axis=0).max() / 256 / scale
    assert np.max(np.abs(outputs - qat(x).numpy())) / scale <= QAT_INT8_STEPS + softmax_steps


def test_multi_head_attention_returning_its_scores_is_refused_by_name():
    tokens = keras.Input((6, 16))
    outputs, _ = keras.layers.MultiHeadAttention(2, 8, name="scored")(tokens, tokens, return_attention_scores=True)
    with pytest.raises(ValueError, match=r"scored: the int8 rule covers attention masks passed as attention_mask or "
                                         r"use_causal_mask, not .*returned scores\. "
                                         r"Received: return_attention_scores=True$"):
        keras_gelu.qat.quantize_model(keras.Model(tokens, outputs))


@pytest.mark.parametrize("activation, op", [
    (lambda: keras.layers.Activation("gelu", name="activation"), "GELU"),  # Keras's "gelu": exact, our GELU's rule
    (lambda: keras.layers.Activation("tanh", name="activation"), "TANH"),
    (lambda: keras.layers.Activation("sigmoid", name="activation"), "LOGISTIC"),
    (lambda: keras.layers.ReLU(max_value=6.0, name="activation"), "FULLY_CONNECTED"),  # fused into the Dense
    (lambda: keras.layers.Activation("silu", name="activation"), "LOGISTIC"),  # then MUL
    # CLIP's quick_gelu, which no name identifies: by its values, our sigmoid-form GELU
    (lambda: keras.layers.Activation(lambda x: x * keras.ops.sigmoid(1.702 * x), name="activation"), "LOGISTIC"),
], ids=["gelu", "tanh", "sigmoid", "relu6", "silu", "quick_gelu"])
def test_an_activation_layer_takes_its_int8_grid_and_converts_within_qat_int8_steps(activation, op, tmp_path, rng):
    import tensorflow as tf
    import tflite_helpers

    keras.utils.set_random_seed(6)
    inputs = keras.Input((12,))
    model = keras.Model(inputs, keras.layers.Dense(4)(activation()(keras.layers.Dense(16)(inputs))))
    x = rng.normal(size=(256, 12)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, mode="native", calibration_data=x)
    if op == "GELU":
        assert type(qat.get_layer("quant_activation").layer) is keras_gelu.GELU
        assert qat.get_layer("quant_activation").layer.approximate == "exact"
    if getattr(getattr(model.get_layer("activation"), "activation", None), "__name__", "") == "<lambda>":
        assert type(qat.get_layer("quant_activation").layer) is keras_gelu.GELU
        assert qat.get_layer("quant_activation").layer.approximate == "sigmoid"
    qat.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=True)  # as _quantized_and_trained says why
    qat.fit(x, rng.normal(size=(256, 4)).astype(np.float32), epochs=1, verbose=0)
    tf.saved_model.save(qat, str(tmp_path / "activation"))
    tflite_model, report = converters.convert(str(tmp_path / "activation"), int8=True, mode="native")
    assert report.float_ops == {} and set(report.op_types[op]) == {"int8"}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


@pytest.mark.parametrize("layer, message", [
    (keras.layers.Activation("softplus", name="soft"),
     r"Activation soft: no int8 rule for its function.*keep_float=\['soft'\]\. Received: activation=softplus$"),
    (keras.layers.ReLU(threshold=0.5, name="shifted"),
     r"Activation shifted: no int8 rule .*Received: max_value=None, negative_slope=0.0, threshold=0.5$"),
])
def test_an_activation_without_an_int8_form_is_refused_by_name(layer, message):
    inputs = keras.Input((12,))
    with pytest.raises(ValueError, match=message):
        keras_gelu.qat.quantize_model(keras.Model(inputs, layer(keras.layers.Dense(8)(inputs))))


def test_an_embedding_with_mask_zero_is_refused_by_name():
    ids = keras.Input((6,), dtype="int32")
    hidden = keras.layers.Embedding(40, 8, mask_zero=True, name="padded")(ids)
    with pytest.raises(ValueError, match=r"Embedding padded: .*without a mask.*Received: mask_zero=True$"):
        keras_gelu.qat.quantize_model(keras.Model(ids, keras.layers.GlobalAveragePooling1D()(hidden)))


@pytest.mark.parametrize("make_layer, shape", [
    (lambda: keras.layers.Conv2D(6, 3, use_bias=False), (9, 9, 3)),
    (lambda: keras.layers.DepthwiseConv2D(3, depth_multiplier=2), (9, 9, 3)),
    (lambda: keras.layers.SeparableConv1D(5, 3), (12, 3)),
    (lambda: keras.layers.Dense(7), (4,)),
], ids=["conv2d-no-bias", "depthwise-multiplier-2", "separable-1d", "dense"])
def test_folded_weights_compute_the_layer_then_its_batch_normalization(make_layer, shape, rng):
    from keras_gelu.qat.keras3 import folding

    keras.utils.set_random_seed(1)
    inputs = keras.Input(shape)
    layer, batch_norm = make_layer(), keras.layers.BatchNormalization(epsilon=1e-3)
    model = keras.Model(inputs, batch_norm(layer(inputs)))
    channels = batch_norm.gamma.shape[0]
    for weight in (batch_norm.gamma, batch_norm.beta, batch_norm.moving_mean):
        weight.assign(rng.normal(size=channels))
    batch_norm.moving_variance.assign(rng.uniform(0.2, 3.0, size=channels))
    assert folding.scales_to_fold(model) == {layer.name: batch_norm}
    folded = type(layer).from_config({**layer.get_config(), "use_bias": True})
    folded.build((None, *shape))
    folded.set_weights(folding.folded_weights(layer, batch_norm))
    x = rng.normal(size=(8, *shape)).astype(np.float32)
    # Keras's own batch normalization (inference) is the reference; float32 rounding of two computations
    np.testing.assert_allclose(folded(x).numpy(), model(x, training=False).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("build, reason", [
    (lambda x: keras.layers.BatchNormalization(name="norm")(keras.layers.Dense(8, activation="relu")(x)),
     "relu between"),
    (lambda x: (lambda h: keras.layers.Add()([h, keras.layers.BatchNormalization(name="norm")(h)]))(
        keras.layers.Dense(8)(x)), "a second reader"),
    (lambda x: keras.layers.BatchNormalization(name="norm")(x), "no layer before it"),
])
def test_a_batch_normalization_that_cannot_fold_is_refused_by_name(build, reason):
    inputs = keras.Input((12,))
    with pytest.raises(ValueError, match=r"folds a BatchNormalization into the Conv/Dense right before it.*norm "
                                         r"has none such.*keep_float=\['norm'\]"):
        keras_gelu.qat.quantize_model(keras.Model(inputs, build(inputs)))


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _ConvNorm(keras.layers.Layer):
    """keras-hub's HGNetV2 conv block, in small: padding, a bias-free Conv2D, BatchNormalization, ReLU and a max
    pool in one layer's call; `residual` adds the convolution's output again, a second reader of it."""

    def __init__(self, filters=6, residual=False, **kwargs):
        super().__init__(**kwargs)
        self.filters, self.residual = filters, residual
        self.padding = keras.layers.ZeroPadding2D(((1, 1), (1, 1)))
        self.convolution = keras.layers.Conv2D(filters, 3, use_bias=False)
        self.normalization = keras.layers.BatchNormalization(epsilon=1e-5)
        self.activation = keras.layers.ReLU()
        self.pool = keras.layers.MaxPooling2D(2, strides=1)

    def call(self, x, training=None):
        hidden = self.convolution(self.padding(x))
        normalized = self.normalization(hidden, training=training)
        return self.pool(self.activation(normalized + hidden if self.residual else normalized))

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "residual": self.residual}


def _with_trained_statistics(batch_norm, rng):
    channels = batch_norm.gamma.shape[0]
    batch_norm.set_weights([rng.uniform(0.5, 1.5, channels), rng.normal(0, 0.2, channels),
                            rng.normal(0, 0.2, channels), rng.uniform(0.5, 2.0, channels)])


def test_a_batch_normalization_inside_a_composite_folds_into_its_convolution_as_a_models_own_does(tmp_path, rng):
    """A composite's BatchNormalization after its Conv2D (HGNetV2's blocks) folds into the convolution's kernel
    and bias, as a functional model's does: the same int8 grids, the same QAT model's function, an integer .tflite
    with no BatchNormalization arithmetic left (no MUL, ADD or RSQRT)."""
    import tflite_helpers

    keras.utils.set_random_seed(5)
    inputs = keras.Input((9, 9, 3))
    model = keras.Model(inputs, _ConvNorm(name="block")(inputs))
    block = model.get_layer("block")
    _with_trained_statistics(block.normalization, rng)
    # the same layers as a functional model: the engine's own fold is the reference
    layers = [keras.layers.ZeroPadding2D(((1, 1), (1, 1))), keras.layers.Conv2D(6, 3, use_bias=False),
              keras.layers.BatchNormalization(epsilon=1e-5), keras.layers.ReLU(), keras.layers.MaxPooling2D(2, 1)]
    reference = keras.Sequential([keras.Input((9, 9, 3))] + layers)
    reference.set_weights(model.get_weights())
    x = rng.uniform(-1, 1, size=(16, 9, 9, 3)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    reference_qat = keras_gelu.qat.quantize_model(reference, calibration_data=x)
    stand_ins = qat.get_layer("quant_block").layer
    assert stand_ins.normalization.folded and stand_ins.convolution.folded_scaling is not None
    low, high = _range_of(qat.get_layer("quant_block"), "output")
    step = (high - low) / 255
    # One grid per tensor in both; the kernels folded in float32 (rsqrt) against float64 (numpy) may round a
    # value to the neighbouring step, no further.
    assert np.max(np.abs(qat(x).numpy() - reference_qat(x).numpy())) <= step * 1.001
    assert np.max(np.abs(qat(x).numpy() - model(x, training=False).numpy())) <= 10 * step  # int8 rounding
    qat.save(tmp_path / "qat.keras")  # the fold is found again as the model loads
    loaded = keras.saving.load_model(tmp_path / "qat.keras")
    np.testing.assert_array_equal(loaded(x).numpy(), qat(x).numpy())
    tflite_model, report = _converted(qat)
    assert report.float_ops == {} and set(report.op_types["CONV_2D"]) == {"int8"}, report.op_types
    assert not {"MUL", "ADD", "RSQRT"} & set(report.ops), report.ops
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def test_a_batch_normalization_inside_a_composite_that_cannot_fold_refuses_the_composite_by_name(rng):
    """Its convolution's output read again (a residual): folding would change what that reader sees."""
    inputs = keras.Input((9, 9, 3))
    model = keras.Model(inputs, _ConvNorm(residual=True, name="block")(inputs))
    with pytest.raises(ValueError, match=r"no rule for layer block \(_ConvNorm\).*keep_float=\['block'\]\. Its "
                                         r"BatchNormalization \S+ folds only into a Conv/Dense sublayer"):
        keras_gelu.qat.quantize_model(model)
    assert "block" in keras_gelu.qat.quantize_model(model, keep_float="auto").kept_float


def test_mobilenet_v2_folds_its_batch_norms_and_converts_to_integer_within_qat_int8_steps(rng):
    import tflite_helpers

    # keras.applications' MobileNetV2, no weights (nothing downloaded): Conv/Depthwise + BatchNormalization +
    # ReLU(6), ZeroPadding2D, residual Adds; the smallest width and input it takes.
    keras.utils.set_random_seed(0)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10,
                                           classifier_activation=None)
    x = rng.uniform(-1, 1, size=(64, 32, 32, 3)).astype(np.float32)
    batch_norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for batch_norm in batch_norms:  # statistics and affine terms away from 0 and 1, as training leaves them
        channels = batch_norm.gamma.shape[0]
        batch_norm.gamma.assign(rng.uniform(0.5, 1.5, size=channels))
        batch_norm.beta.assign(rng.normal(0, 0.2, size=channels))
        batch_norm.moving_mean.assign(rng.normal(0, 0.2, size=channels))
        batch_norm.moving_variance.assign(rng.uniform(0.5, 2.0, size=channels))
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    assert len(batch_norms) == 52 and not any("BatchNormalization" in type(getattr(layer, "layer", layer)).__name__
                                               for layer in qat.layers)
    low, high = _range_of(qat.layers[-1], "output")
    assert np.max(np.abs(qat(x).numpy() - model(x, training=False).numpy())) <= 10 * (high - low) / 255
    tflite_model, report = _converted(qat)  # the folded biases are not zero: no training needed
    assert report.float_ops == {}, report.op_types
    assert sum(report.op_types["CONV_2D"].values()) == 35 and sum(report.op_types["DEPTHWISE_CONV_2D"].values()) == 17
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


@on_tf218_too
def test_fused_softmax_sigmoid_and_tanh_are_split_out_onto_their_grids(rng):
    import tflite_helpers

    keras.utils.set_random_seed(7)
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(16, activation="tanh", name="squash")(inputs)
    hidden = keras.layers.Dense(16, activation="sigmoid", name="gate")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax", name="probabilities")(hidden))
    x = rng.normal(size=(256, 12)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    split = {layer.name: type(layer.layer).__name__ for layer in qat.layers
             if isinstance(getattr(layer, "layer", None), (keras.layers.Activation, keras.layers.Softmax))}
    assert split == {"quant_squash_tanh": "Activation", "quant_gate_sigmoid": "Activation",
                     "quant_probabilities_softmax": "Softmax"}
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    for op in ("TANH", "LOGISTIC", "SOFTMAX"):
        assert set(report.op_types[op]) == {"int8"}, op
    (scale,) = operators.output_scales(tflite_model)
    assert scale == pytest.approx(1 / 256)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


# --- models as they come: nested models, operations on tensors, ConvNeXt's layers ----------------------------


def _nested_model():
    """Three levels: the outer functional model holds a Sequential (a convolution and the BatchNormalization
    that folds into it) and a functional model holding another Sequential; two layers named alike."""
    keras.utils.set_random_seed(8)
    stem = keras.Sequential([keras.layers.Conv2D(6, 3, name="stem_conv"),
                             keras.layers.BatchNormalization(name="stem_norm")], name="stem")
    features = keras.Input((6, 6, 6))
    innermost = keras.Sequential([keras.layers.Dense(8, activation=keras_gelu.GELU(), name="head")], name="innermost")
    pooled = keras.layers.GlobalAveragePooling2D(name="pool")(features)
    body = keras.Model(features, keras.layers.Dense(5, name="body_out")(innermost(pooled)), name="body")
    image = keras.Input((8, 8, 3), name="image")
    return keras.Model(image, keras.layers.Dense(3, name="head")(body(stem(image))), name="outer")


def test_a_flattened_model_computes_the_nested_one_and_leaves_it_untouched(rng):
    from keras_gelu.qat.keras3 import nesting

    model = _nested_model()
    for weight in model.get_layer("stem").get_layer("stem_norm").weights:  # statistics that change the output
        weight.assign(rng.uniform(0.5, 1.5, size=weight.shape))
    weights = [weight.numpy() for weight in model.weights]
    nodes = {layer.name: len(layer._inbound_nodes) for layer in model.layers}
    flat = nesting.flattened(model)
    names = [layer.name for layer in flat.layers]
    assert not any(isinstance(layer, keras.Model) for layer in flat.layers)
    assert len(names) == len(set(names)) and {"head", "innermost_head", "stem_norm"} <= set(names)
    x = rng.normal(size=(4, 8, 8, 3)).astype(np.float32)
    np.testing.assert_array_equal(flat(x).numpy(), model(x).numpy())  # the same layers, the same order of ops
    assert all(np.array_equal(weight.numpy(), before) for weight, before in zip(model.weights, weights))
    assert {layer.name: len(layer._inbound_nodes) for layer in model.layers} == nodes
    assert not any(flat_weight is weight for flat_weight in flat.weights for weight in model.weights)


def test_nested_models_at_any_depth_are_quantized_through_and_convert_to_integer(rng):
    import tflite_helpers

    x = rng.normal(size=(64, 8, 8, 3)).astype(np.float32)
    qat = _quantized_and_trained(_nested_model(), x, rng)
    assert not any(isinstance(layer, keras.Model) for layer in qat.layers)
    assert not any(isinstance(getattr(layer, "layer", None), keras.layers.BatchNormalization) for layer in qat.layers)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def test_keep_float_keeps_a_nested_model_whole_and_float(rng):
    model = _nested_model()
    qat = keras_gelu.qat.quantize_model(model, keep_float=["body"])
    (body,) = [layer for layer in qat.layers if isinstance(layer, keras.Model)]
    assert body.name == "body"
    assert not any(isinstance(layer, keras_gelu.qat.keras3.QuantizeWrapper) for layer in body.layers)
    for kept, original in zip(body.weights, model.get_layer("body").weights):
        np.testing.assert_array_equal(kept.numpy(), original.numpy())


def test_operations_on_tensors_get_a_range_save_and_convert_to_integer(tmp_path, rng):
    import tflite_helpers

    keras.utils.set_random_seed(9)
    inputs = keras.Input((6, 4), name="tokens")
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    mixed = inputs + hidden * 0.5  # Multiply and Add operations, no layers
    first = keras.ops.reshape(mixed, (-1, 24))[:, :12]  # value-keeping operations
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(first))
    x = rng.normal(size=(64, 6, 4)).astype(np.float32)
    qat = _quantized_and_trained(model, x, rng)
    operations = [layer.operation for layer in qat.layers if isinstance(layer, keras_gelu.qat.keras3.QuantizeOperation)]
    assert sorted(type(operation).__name__ for operation in operations) == ["Add", "Multiply"]
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


class _FusedProjection(keras.layers.Layer):
    """One Dense for two projections, split with the backend tensor's own slicing, which no interception of
    keras.ops sees, and half of one rotated, the other half passed on (keras-hub GPT-NeoX's fused query-key-value
    and its rotary embedding)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.projection = keras.layers.Dense(16, name="projection")

    def call(self, x):
        both = self.projection(x)
        query, key = both[..., :8], both[..., 8:]
        rotated = keras.ops.multiply(query[..., :4], key[..., :4])
        return keras.ops.concatenate([rotated, query[..., 4:]], axis=-1)


def test_slices_no_interception_sees_keep_their_tensors_grid_in_int8(rng):
    """TFLite holds a STRIDED_SLICE's output on its input's scale: the slices of the projection's output, put on
    ranges of their own where the operations read them, failed to convert ("the same scale constraint"). The
    int8 model rounds them once, on the projection's grid, where the QAT model rounds them again on their own
    (half a step of theirs at most): the .tflite computes the rewritten graph within QAT_INT8_STEPS (the
    converter's parity check, at that bound), and the QAT model up to those half steps."""
    import tflite_helpers

    keras.utils.set_random_seed(6)
    inputs = keras.Input((5, 12), name="tokens")
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(_FusedProjection(name="fused")(inputs)))
    x = rng.normal(size=(64, 5, 12)).astype(np.float32)
    qat = _quantized_and_trained(model, x, rng)
    tflite_model, report = converters.convert(qat, int8=True, max_steps=QAT_INT8_STEPS)
    assert report.float_ops == {} and set(report.op_types["STRIDED_SLICE"]) == {"int8"}, report.op_types
    outputs, expected = tflite_helpers.run(tflite_model, x)[0], qat(x).numpy()
    assert references.cosine(outputs, expected) >= 0.999


def test_a_layer_normalization_without_beta_before_an_einsum_dense_converts_to_integer(rng):
    """Without beta, the normalized values' range and the output's are set from one batch's values, the second
    from the first's rounded ones: one grid, whose scales differ in float32's last bits, which TFLite refused for
    the RESHAPE of the EinsumDense reading them (keras-hub Moonshine)."""
    import tflite_helpers

    keras.utils.set_random_seed(7)
    inputs = keras.Input((5, 12), name="tokens")
    normalized = keras.layers.LayerNormalization(center=False, name="norm")(inputs)
    projected = keras.layers.EinsumDense("abc,cd->abd", output_shape=(5, 8), name="key")(normalized)
    model = keras.Model(inputs, projected)
    x = rng.normal(size=(64, 5, 12)).astype(np.float32)
    qat = _quantized_and_trained(model, x, rng)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def test_an_embedding_shared_by_two_inputs_gathers_both_in_int8(rng):
    """A shared Embedding (Bart's encoder and decoder tokens) rounds one table for two GATHERs: TFLite computes
    both in float from one quantized table, and gathers from two grids an ulp apart in int8."""
    import tflite_helpers

    keras.utils.set_random_seed(5)
    first, second = keras.Input((6,), dtype="int32", name="first"), keras.Input((6,), dtype="int32", name="second")
    tokens = keras.layers.Embedding(50, 8, name="tokens")
    summed = keras.layers.Add()([tokens(first), keras.layers.Dense(8)(tokens(second))])
    model = keras.Model([first, second], keras.layers.Dense(3)(summed))
    ids = {name: rng.integers(0, 50, (16, 6)).astype(np.int32) for name in ("first", "second")}
    qat = keras_gelu.qat.quantize_model(model)
    qat.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=True)
    qat.fit(ids, rng.normal(size=(16, 6, 3)).astype(np.float32), epochs=1, verbose=0)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {} and report.op_types["GATHER"] == {"int8": 2}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    outputs = tflite_helpers.run(tflite_model, ids["first"], ids["second"])[0]
    assert np.max(np.abs(outputs - qat(ids).numpy())) / scale <= QAT_INT8_STEPS


class _Routed(keras.layers.Layer):
    """Each row's value at its chosen index kept, the rest zeroed, by a one-hot of the index (GPT-OSS's router
    weights its experts so)."""

    def call(self, inputs):
        values, choices = inputs
        return keras.ops.one_hot(choices, values.shape[-1]) * values


def test_a_one_hot_of_indices_computed_in_a_layer_converts_to_integer(rng):
    """TFLite's ONE_HOT takes no quantized values: the rounded one-hot rows are an int32 comparison with their
    positions and an int8 SELECT_V2 (the QAT model of GPT-OSS's router was refused)."""
    import tflite_helpers

    keras.utils.set_random_seed(6)
    tokens, choices = keras.Input((4, 8), name="tokens"), keras.Input((4,), dtype="int32", name="choices")
    routed = _Routed(name="router")([keras.layers.Dense(8)(tokens), choices])
    model = keras.Model([tokens, choices], keras.layers.Dense(3)(routed))
    inputs = {"tokens": rng.normal(size=(64, 4, 8)).astype(np.float32),
              "choices": rng.integers(0, 8, (64, 4)).astype(np.int32)}
    qat = keras_gelu.qat.quantize_model(model)
    qat.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=True)
    qat.fit(inputs, rng.normal(size=(64, 4, 3)).astype(np.float32), epochs=1, verbose=0)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {} and "ONE_HOT" not in report.op_types, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    outputs = tflite_helpers.run(tflite_model, inputs["choices"], inputs["tokens"])[0]  # the .tflite's order
    assert np.max(np.abs(outputs - qat(inputs).numpy())) / scale <= QAT_INT8_STEPS


class _DropPath(keras.layers.Layer):
    """A residual branch dropped per sample in training, the identity at inference (as keras-hub's DropPath)."""

    def call(self, x, training=False):
        if not training:
            return x
        keep = keras.ops.floor(0.8 + keras.random.uniform((keras.ops.shape(x)[0], 1)))
        return x / 0.8 * keep


class _Doubling(keras.layers.Layer):
    def call(self, x):
        return 2.0 * x


class _NnAttention(keras.layers.Layer):
    """Self-attention through `keras.ops.nn`, the public submodule that holds keras.ops's functions under another
    path (keras-hub DINOv3's `ops.nn.dot_product_attention`)."""

    def call(self, x):
        heads = keras.ops.reshape(x, (-1, 5, 2, 4))
        return keras.ops.reshape(keras.ops.nn.dot_product_attention(heads, heads, heads), (-1, 5, 8))


def test_functions_called_through_the_public_ops_submodules_are_intercepted():
    """keras.ops.nn.dot_product_attention is keras.ops.dot_product_attention: the same int8 ops, each on a range
    (DINOv3's attention scores, softmax and matmuls stayed float)."""
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, _NnAttention(name="attention")(keras.layers.Dense(8)(inputs)))
    places = keras_gelu.qat.quantize_model(model).get_layer("quant_attention").operation_ranges
    assert any(key.split("@")[0].startswith("dot_product_attention") for key in places), list(places)


def test_a_layer_that_is_the_identity_at_inference_is_kept_as_it_is_and_another_is_quantized(rng):
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(12, name="dense")(inputs)
    model = keras.Model(inputs, keras.layers.Add(name="add")([inputs, _DropPath(name="drop_path")(hidden)]))
    qat = keras_gelu.qat.quantize_model(model)
    assert type(qat.get_layer("drop_path")) is _DropPath  # not wrapped: nothing of it in the int8 model
    x = rng.normal(size=(256, 12)).astype(np.float32)
    branch = keras.Model(qat.inputs, qat.get_layer("drop_path").output)
    dropped = np.all(branch(x, training=True).numpy() == 0, axis=1)
    assert 0.1 < dropped.mean() < 0.3  # still dropping paths in QAT training
    doubled = keras_gelu.qat.quantize_model(keras.Model(inputs, _Doubling(name="doubling")(hidden)))
    doubling = doubled.get_layer("quant_doubling")  # its 2 * x, a Python operator on the backend's tensors, ranged
    assert [key.split("@")[0] for key in doubling.operation_ranges] == ["multiply"] and "output" in doubling.ranges
    assert len(np.unique(doubled(x).numpy())) <= 256  # on an int8 grid


def test_rescaling_normalization_and_a_layer_scale_train_as_int8_mul_and_add(rng):
    import tflite_helpers

    from keras_gelu.qat.keras3.keras_classes import LayerScale

    keras.utils.set_random_seed(10)
    inputs = keras.Input((6, 6, 3), name="image")
    hidden = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="rescaling")(inputs)
    hidden = keras.layers.Normalization(mean=[0.1, -0.2, 0.3], variance=[0.5, 2.0, 1.0], name="normalization")(hidden)
    hidden = keras.layers.Conv2D(4, 3, activation=keras_gelu.GELU(), name="conv")(hidden)
    hidden = LayerScale(0.5, 4, name="layer_scale")(hidden)  # after the GELU: nothing to fold it into
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(keras.layers.Flatten()(hidden)))
    model.get_layer("layer_scale").gamma.assign(rng.uniform(0.1, 2.0, size=4))
    x = rng.uniform(0, 255, size=(64, 6, 6, 3)).astype(np.float32)
    qat = _quantized_and_trained(model, x, rng)
    affine = {layer.layer.name for layer in qat.layers if isinstance(getattr(layer, "rule", None),
                                                                       rules.ChannelAffineRule)}
    assert affine == {"rescaling", "normalization", "layer_scale"}
    tflite_model, report = _converted(qat)
    assert report.float_ops == {}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def test_folded_weights_compute_the_layer_then_its_layer_scale(rng):
    from keras_gelu.qat.keras3 import folding
    from keras_gelu.qat.keras3.keras_classes import LayerScale

    inputs = keras.Input((5,))
    dense, layer_scale = keras.layers.Dense(6), LayerScale(1e-6, 6)
    model = keras.Model(inputs, layer_scale(dense(inputs)))
    layer_scale.gamma.assign(rng.normal(size=6))
    assert folding.scales_to_fold(model) == {dense.name: layer_scale}
    folded = keras.layers.Dense(6)
    folded.build((None, 5))
    folded.set_weights(folding.folded_weights(dense, layer_scale))
    x = rng.normal(size=(8, 5)).astype(np.float32)
    np.testing.assert_allclose(folded(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)  # float32 rounding


def test_a_grouped_convolution_with_a_channel_per_group_is_a_depthwise_one_and_others_are_refused(rng):
    import tflite_helpers

    keras.utils.set_random_seed(12)
    inputs = keras.Input((8, 8, 4), name="image")
    grouped = keras.layers.Conv2D(4, 3, padding="same", groups=4, name="grouped")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(grouped)))
    x = rng.normal(size=(64, 8, 8, 4)).astype(np.float32)
    qat = _quantized_and_trained(model, x, rng)
    tflite_model, report = _converted(qat)
    assert report.float_ops == {} and "CONV_2D" not in report.ops, report.op_types
    assert report.op_types["DEPTHWISE_CONV_2D"] == {"int8": 1}
    (scale,) = operators.output_scales(tflite_model)
    steps = np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale
    assert steps <= DEPTHWISE_INT8_STEPS
    pairs = keras.Model(inputs, keras.layers.Conv2D(4, 3, groups=2, name="pairs")(inputs))
    with pytest.raises(ValueError, match=r"pairs: .*one input and one output channel per group.*groups=2"):
        keras_gelu.qat.quantize_model(pairs)


def test_a_lookup_of_constant_positions_is_folded_and_a_lookup_of_the_inputs_ids_is_kept(rng):
    """A position embedding gathers rows at constant ids (keras.ops.arange): the converter folds that lookup
    into the rows, on the table's grid, where TFLite kept a GATHER (which the Ethos-U55 has not); a token
    embedding's ids come from the input and keep theirs. Integer throughout, within QAT_INT8_STEPS."""
    import tflite_helpers

    @keras.saving.register_keras_serializable(package="test_keras3_qat")
    class Positions(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.table = keras.layers.Embedding(6, 8, name="table")

        def call(self, x):
            return x + self.table(keras.ops.arange(6))[None]

    keras.utils.set_random_seed(8)
    ids = keras.Input((6,), dtype="int32", name="ids")
    hidden = Positions(name="positions")(keras.layers.Embedding(20, 8, name="tokens")(ids))
    model = keras.Model(ids, keras.layers.Dense(3)(keras_gelu.GELU()(hidden)))
    x = rng.integers(0, 20, size=(64, 6)).astype(np.int32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    tflite_model, report = _converted(qat)
    assert report.ops.get("GATHER") == 1 and report.float_ops == {}, report.op_types  # the tokens' lookup only
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def _trained_saved_and_loaded(model, x, tmp_path, rng):
    """`_quantized_and_trained` (within 10 output steps of the float model), then saved as .keras and loaded: the
    loaded model computes what the trained one does."""
    qat = _quantized_and_trained(model, x, rng)
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())
    return qat


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _RMSNormalization(keras.layers.Layer):
    """keras.ops alone, as keras-hub's Gemma normalization (a composite with no sublayers)."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")

    def call(self, x):
        x = keras.ops.cast(x, "float32")
        variance = keras.ops.mean(keras.ops.square(x), axis=-1, keepdims=True)
        return x * keras.ops.reciprocal(keras.ops.sqrt(variance + 1e-6)) * self.scale

    def compute_output_shape(self, input_shape):  # the float model never traces call(), as Gemma's blocks
        return input_shape


def test_a_product_with_a_constant_is_dense_for_the_composite_reading_it(tmp_path, rng):
    """Keras's Multiply spec takes a constant (no `sparse` attribute) for sparse and marks `x * c` sparse, as in
    keras-hub's Gemma embeddings (`x * sqrt(hidden_dim)`): the QuantizeOperation's output is dense, so the
    composite after it is traced on a dense tensor, which its fake-quant ops take."""
    keras.utils.set_random_seed(11)
    inputs = keras.Input((6, 8), name="tokens")
    scaled = keras.layers.Dense(8, name="embed")(inputs) * keras.ops.cast(keras.ops.sqrt(8.0), "float32")
    assert scaled.sparse  # Keras's own spec, the cause
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(_RMSNormalization(name="norm")(scaled)))
    x = rng.normal(size=(64, 6, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    assert not qat.get_layer("quant_norm").input.sparse


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _Shifted(keras.layers.Layer):
    """A composite called with a tensor and a Python value by keyword, as keras-hub's ViTDet attention
    (`queries=q, query_size=(8, 8)`) and PARSeq's decoder (`memory=m, update_content=False`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(8, name="dense")

    def call(self, x, shift=None, weight=1.0):
        return self.dense(x) + weight * shift


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _CallsByKeyword(keras.layers.Layer):
    """Calls its sublayers by keywords alone (keras-hub's PaliGemma attention: `query_proj(inputs=x)`), and
    `_Shifted` with a tensor and a Python value."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.project = keras.layers.Dense(8, name="project")
        self.shifted = _Shifted(name="shifted")

    def call(self, x):
        return self.shifted(x, shift=self.project(inputs=x), weight=0.5)


def test_sublayers_called_by_keywords_and_with_python_values_beside_tensors_are_quantized(tmp_path, rng):
    """A wrapper hands keyword tensors apart from other keyword values (Keras refuses one `**kwargs` mixing
    them), a sublayer called by keywords alone takes its first as its input; at the model's top level too."""
    keras.utils.set_random_seed(12)
    inputs = keras.Input((6, 8), name="tokens")
    hidden = _CallsByKeyword(name="block")(inputs)
    shifted = _Shifted(name="top")(hidden, shift=inputs, weight=0.25)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(shifted))
    x = rng.normal(size=(64, 6, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    block = qat.get_layer("quant_block").layer
    assert type(block.project).__name__ == "QuantizeSublayer" and type(block.shifted).__name__ == "QuantizeSublayer"


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _ClassToken(keras.layers.Layer):
    """A token prepended from an Embedding's table read as a weight, as keras-hub's SAM3 geometry encoder reads
    `self.cls_embed._embeddings`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.token = keras.layers.Embedding(1, 8, name="token")

    def build(self, input_shape):
        self.token.build()

    def call(self, x):
        token = keras.ops.tile(keras.ops.reshape(self.token._embeddings, (1, 1, 8)), (keras.ops.shape(x)[0], 1, 1))
        return keras.ops.concatenate([token, x], axis=1)


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _WithAHelper(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(8, name="dense")

    def _halved(self, x):
        return x * 0.5

    def call(self, x):
        return self.dense(x)


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _CallsAPrivateMethod(keras.layers.Layer):
    """Calls a sublayer's private method, as keras-hub's Gemma 4 decoder `self.attention._mask_sliding_window`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = _WithAHelper(name="inner")

    def call(self, x):
        return self.inner._halved(self.inner(x))


def test_a_composite_reading_a_sublayers_private_weight_or_method_through_its_stand_in_is_quantized(tmp_path, rng):
    """The stand-in answers for its layer's private weights and for what the layer's class defines, not for the
    names of Keras's base Layer (which Keras probes on the wrapper, a layer itself) nor for what nothing has."""
    keras.utils.set_random_seed(13)
    inputs = keras.Input((5, 8), name="tokens")
    tokens = _ClassToken(name="class_token")(keras.layers.Dense(8, name="embed")(inputs))
    tokens = _CallsAPrivateMethod(name="block")(tokens)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(keras.layers.Flatten()(tokens)))
    x = rng.normal(size=(64, 5, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    stand_in = qat.get_layer("quant_class_token").layer.token
    assert stand_in._embeddings is stand_in.layer._embeddings
    inner = qat.get_layer("quant_block").layer.inner
    assert inner._halved.__self__ is inner.layer and inner._tracker is not inner.layer._tracker
    with pytest.raises(AttributeError):
        stand_in._no_such_attribute  # noqa: B018


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _ConfiguredBadly(keras.layers.Layer):
    """A get_config that leaves out an argument deciding its sublayers (keras-hub's MiT encoder block: its
    `sr_ratio`) and gives a weight for another (keras-hub's D-FINE decoder: its `upsampling_factor`, made a
    weight of that name in build())."""

    def __init__(self, units, reduce=False, factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.units, self.factor = units, factor
        self.dense = keras.layers.Dense(units, name="dense")
        self.reduction = keras.layers.Dense(units, name="reduction") if reduce else None

    def build(self, input_shape):
        self.dense.build(input_shape)
        if self.reduction is not None:
            self.reduction.build(input_shape[:-1] + (self.units,))
        self.factor = self.add_weight(name="factor", shape=(), trainable=False,
                                      initializer=keras.initializers.Constant(self.factor))

    def call(self, x):
        x = self.dense(x)
        return (x if self.reduction is None else self.reduction(x)) * self.factor

    def get_config(self):
        return {**super().get_config(), "units": self.units, "factor": self.factor}


def test_a_layer_whose_config_leaves_out_or_mistakes_an_argument_is_copied_as_it_was_made(tmp_path, rng):
    """The copy takes the arguments Keras recorded at construction where get_config leaves them out, or gives
    a weight for one: the same sublayers and weights, in the QAT model and in its saved file."""
    keras.utils.set_random_seed(14)
    inputs = keras.Input((5, 8), name="tokens")
    block = _ConfiguredBadly(6, reduce=True, factor=0.5, name="block")
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(keras.layers.Flatten()(block(inputs))))
    x = rng.normal(size=(64, 5, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    copy = qat.get_layer("quant_block").layer
    assert copy.reduction is not None and float(copy.factor.numpy()) == 0.5
    float_weights = [weight.path for weight in copy.weights if "/quant_" not in weight.path]  # not the ranges
    assert float_weights == [weight.path for weight in block.weights] and len(float_weights) == 5


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _FrequencyScaled(keras.layers.Layer):
    """Divides by powers computed from constants alone, 10000 ** (i / 8) from 1 up, as keras-hub's YaRN rotary
    embedding (GPT-OSS: `1 / base ** (i / d)`) and SAM3's sine positions (`x / temperature ** (2i / d)`)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(8, name="dense")

    def call(self, x):
        powers = keras.ops.power(10000.0, keras.ops.arange(0, 8, dtype="float32") / 8.0)
        hidden = self.dense(x)
        return keras.ops.divide(hidden, powers) + hidden * (1.0 / powers)


def test_what_a_composite_computes_from_constants_alone_is_left_to_the_converter_to_fold(tmp_path, rng):
    """A range on such a power (up to 3162) rounded its 1 to 0, and the division by it made the model NaN: the
    converter folds constants, so no range is made for them, as results or as inputs. Within 10 output steps."""
    keras.utils.set_random_seed(15)
    inputs = keras.Input((5, 8), name="tokens")
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(_FrequencyScaled(name="scaled")(inputs)))
    x = rng.normal(size=(64, 5, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    assert np.all(np.isfinite(qat(x).numpy()))
    places = qat.get_layer("quant_scaled").operation_ranges
    assert not any(place.startswith("power@") for place in places), places  # the power, a constant
    assert any(place.startswith("divide@") and not place.endswith("/input_1") for place in places), places


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _TwoStreams(keras.layers.Layer):
    """Gives its second stream as None where it was given none, and two output shapes (keras-hub's XLNet encoder:
    the query stream)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(8, name="dense")

    def call(self, x, query=None):
        return self.dense(x), (None if query is None else self.dense(query))

    def compute_output_shape(self, x_shape, query_shape=None):
        return [tuple(x_shape[:-1]) + (8,)] * 2


def test_an_output_a_composite_gives_as_none_stands_in_the_graph_as_an_empty_tensor(tmp_path, rng):
    keras.utils.set_random_seed(16)
    inputs = keras.Input((5, 8), name="tokens")
    content, _ = _TwoStreams(name="streams")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(content))
    x = rng.normal(size=(64, 5, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    assert tuple(qat.get_layer("quant_streams").output[1].shape) == (0,)


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class Embedder(keras.Model):
    """A subclassed model whose constructor takes its width alone, not even a name (keras-hub's Flux
    MLPEmbedder)."""

    def __init__(self, units):
        super().__init__()
        self.units = units
        self.first, self.second = keras.layers.Dense(units, name="first"), keras.layers.Dense(units, name="second")

    def call(self, x):
        return self.second(self.first(x))

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class Unrecorded(keras.Model):
    """A subclassed model without a get_config, whose `units` Keras does not record (keras-hub's Flux blocks)."""

    def __init__(self, units, scale):
        super().__init__()
        self.dense = keras.layers.Dense(units * scale, name="dense")

    def call(self, x):
        return self.dense(x)


def test_a_subclassed_model_layer_is_copied_with_what_its_constructor_takes_or_refused_naming_what_is_missing(
        tmp_path, rng):
    keras.utils.set_random_seed(17)
    inputs = keras.Input((5, 8), name="tokens")
    embedder = Embedder(8)  # named by Keras
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(embedder(inputs)))
    x = rng.normal(size=(64, 5, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    assert qat.get_layer(f"quant_{embedder.name}").layer.name == embedder.name  # as keep_float names it
    block = Unrecorded(4, 2)
    unrecorded = keras.Model(inputs, block(inputs))
    with pytest.raises(ValueError, match=rf"{block.name} \(Unrecorded\) cannot be copied or saved from a config: "
                                         r".*constructor's units, scale are neither recorded"):
        keras_gelu.qat.quantize_model(unrecorded)


@keras.saving.register_keras_serializable(package="test_keras3_qat")
def _gelu_by_another_name(x):
    """A GELU no name says is one: found by its values."""
    return keras.activations.gelu(x, approximate=True)


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _CrossAttention(keras.layers.MultiHeadAttention):
    """Keras's attention under a class of its own (keras-hub's CachedMultiHeadAttention): a composite."""


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _LazyDecoder(keras.layers.Layer):
    """Makes its sublayers in build() and leaves them to build at their first call, its cross-attention from the
    memory's shape too (keras-hub's EdRec decoder)."""

    def build(self, input_shape):
        self.attention = _CrossAttention(2, 4, name="attention")
        self.mlp = keras.layers.Dense(8, activation=_gelu_by_another_name, name="mlp")

    def call(self, x, memory=None):
        return self.mlp(x + self.attention(x, memory))


def test_a_composite_building_its_sublayers_at_their_first_call_loads_in_a_fresh_process(tmp_path, rng):
    """Loading, the composite is built by a call with every argument before its stand-ins (its build from the
    first shape alone left the cross-attention without its value's), and the GELU found by its values is probed
    eagerly while Keras traces the model (a graph tensor has no values to compare)."""
    import subprocess
    import sys

    keras.utils.set_random_seed(18)
    tokens, memory = keras.Input((5, 8), name="tokens"), keras.Input((3, 6), name="memory")
    model = keras.Model([tokens, memory], keras.layers.Dense(3, name="head")(
        _LazyDecoder(name="decoder")(tokens, memory=memory)))
    x = [rng.normal(size=(64, 5, 8)).astype(np.float32), rng.normal(size=(64, 3, 6)).astype(np.float32)]
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    np.savez(tmp_path / "data.npz", tokens=x[0], memory=x[1], expected=qat(x).numpy())
    check = ("import sys, numpy as np, keras; "
             f"sys.path.insert(0, {str(__import__('pathlib').Path(__file__).parent)!r}); "
             "import test_keras3_qat; "  # the layers and the activation of this test, registered
             f"data = np.load({str(tmp_path / 'data.npz')!r}); "
             f"model = keras.models.load_model({str(tmp_path / 'qat.keras')!r}); "
             "np.testing.assert_array_equal(model([data['tokens'], data['memory']]).numpy(), data['expected'])")
    if _FRESH_PROCESS_TODAY == "composite":
        subprocess.run([sys.executable, "-c", check], check=True, env={**__import__("os").environ,
                                                                        "TF_USE_LEGACY_KERAS": "0"})


@keras.saving.register_keras_serializable(package="test_keras3_qat")
class _NormalizedBy(keras.layers.Layer):
    """Takes a layer class, whose get_config Keras calls unbound while serializing it (a TypeError), as keras-hub's
    Swin patch embedding takes `norm_layer=LayerNormalization`; its from_config deserializes what it saved."""

    def __init__(self, norm_layer=None, **kwargs):
        super().__init__(**kwargs)
        self.norm_layer = norm_layer
        self.dense = keras.layers.Dense(8, name="dense")
        self.norm = norm_layer(epsilon=1e-5, name="norm")

    def call(self, x):
        return self.norm(self.dense(x))

    def get_config(self):
        return {**super().get_config(), "norm_layer": keras.saving.serialize_keras_object(self.norm_layer)}

    @classmethod
    def from_config(cls, config):
        return cls(**{**config, "norm_layer": keras.saving.deserialize_keras_object(config["norm_layer"])})


def test_a_layer_holding_a_layer_class_is_copied_and_saved_with_the_class_by_name(tmp_path, rng):
    keras.utils.set_random_seed(19)
    inputs = keras.Input((5, 8), name="tokens")
    block = _NormalizedBy(keras.layers.LayerNormalization, name="block")
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(block(inputs)))
    x = rng.normal(size=(64, 5, 8)).astype(np.float32)
    qat = _trained_saved_and_loaded(model, x, tmp_path, rng)
    assert qat.get_layer("quant_block").layer.norm_layer is keras.layers.LayerNormalization
