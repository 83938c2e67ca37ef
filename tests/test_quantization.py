"""keras_gelu.qat: QuantizeConfigs, quantize_model, quantize_scope, and their int8 conversion.

tfmot works only with tf-keras, so most of this runs in the tf-keras leg and
where tensorflow-model-optimization is installed (not in the TF 2.18 leg).
"""

import importlib.util
import os

import numpy as np
import pytest

import keras_gelu
from conftest import BuiltOnFirstUse
from conftest import IS_KERAS3
from conftest import clear_keras_state
from conftest import keras
from conftest import keras3_only
from conftest import tf_keras_only
from conftest import todays_share
import conversions
from conversions import QAT_INT8_STEPS
from gelu_models import every_gelu_functional
from keras_gelu import converters
from keras_gelu.converters.tflite import operators
import keras_gelu.qat
from keras_gelu import vocabulary

pytestmark = pytest.mark.legs("keras3", "tf_keras")

# Whether tfmot is installed, without importing it: its import sets TF_USE_LEGACY_KERAS=1
# in os.environ, which would switch tf.keras for the rest of a Keras 3 session.
HAS_TFMOT = importlib.util.find_spec("tensorflow_model_optimization") is not None

needs_tfmot = pytest.mark.skipif(IS_KERAS3 or not HAS_TFMOT,
                                 reason="tfmot QAT needs tf-keras and tensorflow-model-optimization")
# QAT itself: tfmot under tf-keras, keras_gelu.qat under Keras 3 (needs nothing more).
HAS_QAT = IS_KERAS3 or HAS_TFMOT
needs_qat = pytest.mark.skipif(not HAS_QAT, reason="QAT under tf-keras needs tensorflow-model-optimization")


def _short_name(weight):
    return weight.name.split("/")[-1].split(":")[0]


ACTIVATIONS = {
    "exact layer": lambda: keras_gelu.GELU("exact"),
    "tanh layer": lambda: keras_gelu.GELU("tanh"),
    "sigmoid layer": lambda: keras_gelu.GELU("sigmoid"),
    "learnable layer": lambda: keras_gelu.LearnableGELU(),
    "tanh function": lambda: keras_gelu.gelu_tanh,
    "keras 'gelu' string": lambda: "gelu",
}


def _dense_model(activation, units=24, features=12, outputs=5):
    keras.utils.set_random_seed(11)
    inputs = keras.Input((features,), name="features")
    hidden = keras.layers.Dense(units, activation=activation, name="hidden")(inputs)
    return keras.Model(inputs, keras.layers.Dense(outputs, name="head")(hidden))


def _fit(model, rng, epochs=2, run_eagerly=False):
    x = rng.normal(size=(256, 12)).astype(np.float32)
    y = rng.normal(size=(256, model.output_shape[-1])).astype(np.float32)
    model.compile(keras.optimizers.Adam(1e-2), "mse", run_eagerly=run_eagerly)
    model.fit(x, y, epochs=epochs, batch_size=32, verbose=0)
    return x


def _saved(model, tmp_path, name="qat"):
    import tensorflow as tf

    path = str(tmp_path / name)
    tf.saved_model.save(model, path)
    return path


# --- the flavour guard --------------------------------------------------------


@keras3_only
def test_quantize_model_under_keras3_uses_its_own_engine_and_leaves_the_environment_alone():
    before = os.environ.get("TF_USE_LEGACY_KERAS")
    qat_model = keras_gelu.qat.quantize_model(_dense_model(keras_gelu.GELU()))
    assert any(type(layer).__name__ == "QuantizeWrapper" for layer in qat_model.layers)
    with pytest.raises(AttributeError, match="tf-keras"):
        keras_gelu.qat.GELUQuantizeConfig  # noqa: B018 - the lazy attribute is what is tested
    assert os.environ.get("TF_USE_LEGACY_KERAS") == before  # importing tfmot would have set it


def test_the_old_module_name_still_works_and_says_where_things_moved():
    import keras_gelu.quantization

    with pytest.warns(DeprecationWarning, match=r"keras_gelu\.quantization\.quantize_model moved to "
                                                r"keras_gelu\.qat\.quantize_model"):
        assert keras_gelu.quantization.quantize_model is keras_gelu.qat.quantize_model
    with pytest.raises(AttributeError):
        keras_gelu.quantization.no_such_name  # noqa: B018


@tf_keras_only
@pytest.mark.skipif(HAS_TFMOT, reason="checks the message shown when tfmot is missing")
def test_missing_tfmot_says_what_to_install():
    with pytest.raises(ImportError, match=r"keras-gelu\[qat\]"):
        keras_gelu.qat.quantize_model(_dense_model(keras_gelu.GELU()))


# --- the configs --------------------------------------------------------------


@needs_tfmot
def test_gelu_config_round_trips_and_compares_by_value():
    config_class = keras_gelu.qat.GELUQuantizeConfig
    default = config_class()
    assert default.get_config() == {"mode": "builtin", "exact_as": "sigmoid", "quantize_output": True}
    variants = [config_class(mode="native"), config_class(exact_as="tanh"), config_class(quantize_output=False)]
    for variant in variants:
        assert config_class.from_config(variant.get_config()) == variant
        assert variant != default  # tfmot's own __eq__ would call these equal
    assert default == config_class() and hash(default) == hash(config_class())
    assert default != keras_gelu.qat.LearnableGELUQuantizeConfig()
    for argument, message in (({"quantize_output": "yes"}, "Received: quantize_output='yes'"),
                              ({"mode": "select"}, "Received: mode='select'"),
                              ({"exact_as": "exact"}, "Received: exact_as='exact'"),
                              ({"mode": "native", "exact_as": "tanh"}, "applies to mode 'builtin' only")):
        with pytest.raises(ValueError, match=message):
            config_class(**argument)


@needs_tfmot
def test_learnable_config_round_trips_and_compares_by_value():
    config_class = keras_gelu.qat.LearnableGELUQuantizeConfig
    default, no_output = config_class(), config_class(quantize_output=False)
    assert default.get_config() == {"quantize_output": True}
    assert config_class.from_config(no_output.get_config()) == no_output
    assert default == config_class() and hash(default) == hash(config_class()) and default != no_output
    with pytest.raises(ValueError, match="Received: quantize_output=1"):
        config_class(quantize_output=1)


@needs_tfmot
@pytest.mark.parametrize("approximate, mode, exact_as, intermediates", [
    ("exact", "native", None, 0),  # the GELU op: one lookup table
    ("tanh", "native", None, 0),
    ("sigmoid", "native", None, 1),  # 1.702 x, then LOGISTIC and MUL
    ("exact", "builtin", "sigmoid", 1),
    ("exact", "builtin", "tanh", 4),  # u*u, c*u^2, l + c*u^2, u*(...), then LOGISTIC and MUL
    ("exact", "builtin", "erf", 4),  # int8 computes the erf form as the tanh form
    ("tanh", "builtin", "sigmoid", 4),
])
def test_gelu_config_quantizes_each_intermediate_of_the_int8_ops(approximate, mode, exact_as, intermediates):
    gelu = keras_gelu.GELU(approximate)
    config = keras_gelu.qat.GELUQuantizeConfig(mode=mode, exact_as=exact_as)
    assert config.get_weights_and_quantizers(gelu) == []
    activations = config.get_activations_and_quantizers(gelu)
    assert [fn.__name__ for fn, _ in activations] == ["linear"] * intermediates
    assert len(config.get_output_quantizers(gelu)) == 1
    assert keras_gelu.qat.GELUQuantizeConfig(quantize_output=False).get_output_quantizers(gelu) == []
    with pytest.raises(ValueError, match=f"has {intermediates} int8 intermediates"):
        config.set_quantize_activations(gelu, [lambda x: x] * (intermediates + 1))


@needs_tfmot
def test_quantized_gelu_computes_its_function_between_the_roundings(rng):
    """With identity 'quantizers' the quantized call is the form itself, but for the LOGISTIC grid.

    The gate is rounded to k/256, k <= 255: off by 1/512, or 1/256 where the
    gate nears 1 (the grid stops at 255/256), times |x|.
    """
    x = np.linspace(-6.0, 6.0, 1001).astype(np.float32)
    for approximate, exact_as in (("tanh", "sigmoid"), ("exact", "tanh"), ("sigmoid", "sigmoid")):
        gelu = keras_gelu.GELU(approximate)
        config = keras_gelu.qat.GELUQuantizeConfig(mode="builtin", exact_as=exact_as)
        config.set_quantize_activations(gelu, [lambda t: t] * len(config.get_activations_and_quantizers(gelu)))
        reference_function = "tanh" if approximate == "exact" else approximate
        reference = np.asarray(keras_gelu.gelu(x.astype(np.float64), reference_function))
        assert np.max(np.abs(gelu(x).numpy() - reference) / np.maximum(np.abs(x), 1.0)) <= 1.0 / 256 + 1e-6


@needs_tfmot
def test_learnable_config_quantizes_alpha_beta_and_both_intermediates():
    learnable = keras_gelu.LearnableGELU()
    learnable.build((None, 4))
    config = keras_gelu.qat.LearnableGELUQuantizeConfig()
    weights = [weight for weight, _ in config.get_weights_and_quantizers(learnable)]
    assert weights == [learnable.alpha, learnable.beta]
    activations = [fn.__name__ for fn, _ in config.get_activations_and_quantizers(learnable)]
    assert activations == ["linear", "sigmoid"]  # alpha x, then the gate's argument
    with pytest.raises(ValueError, match="Received: 1 weights"):
        config.set_quantize_weights(learnable, [learnable.alpha])


@needs_tfmot
def test_quantize_config_for_matches_exact_classes_only():
    class MyGELU(keras_gelu.GELU):
        pass

    qat = keras_gelu.qat
    assert qat.quantize_config_for(keras_gelu.GELU()) == qat.GELUQuantizeConfig()
    assert qat.quantize_config_for(keras_gelu.GELU(), "builtin", "tanh") == qat.GELUQuantizeConfig("builtin", "tanh")
    assert qat.quantize_config_for(keras_gelu.LearnableGELU()) == qat.LearnableGELUQuantizeConfig()
    assert qat.quantize_config_for(MyGELU()) is None  # as tfmot's registry: by exact class
    assert qat.quantize_config_for(keras.layers.Dense(3)) is None


# --- quantize_model -----------------------------------------------------------


@needs_tfmot
@pytest.mark.parametrize("name", [n for n in ACTIVATIONS if n != "keras 'gelu' string"])
def test_split_activations_keeps_the_function(name, rng):
    model = _dense_model(ACTIVATIONS[name]())
    x = rng.normal(size=(16, 12)).astype(np.float32)
    if name == "learnable layer":  # non-default alpha and beta must move with the split
        dense = model.get_layer("hidden")
        dense.activation.set_weights([w + rng.normal(scale=0.1, size=w.shape) for w in dense.activation.get_weights()])
    split = keras_gelu.qat.split_activations(model)
    names = [layer.name for layer in split.layers]
    assert names == ["features", "hidden", "hidden_gelu", "head"]
    assert split.get_layer("hidden").get_config()["activation"] == "linear"
    np.testing.assert_allclose(split(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)


@needs_tfmot
def test_split_activations_rewires_every_call_and_output_of_a_shared_layer(rng):
    keras.utils.set_random_seed(3)
    shared = keras.layers.Dense(6, activation=keras_gelu.GELU("tanh"), name="shared")
    a, b = keras.Input((6,), name="a"), keras.Input((6,), name="b")
    out_a, out_b = shared(a), shared(b)
    model = keras.Model([a, b], [out_a, keras.layers.Add(name="sum")([out_a, out_b]), out_b])
    split = keras_gelu.qat.split_activations(model)
    x = [rng.normal(size=(4, 6)).astype(np.float32) for _ in range(2)]
    for got, want in zip(split(x), model(x)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def _every_layer_sequential():
    keras.utils.set_random_seed(6)
    return keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(16, activation=keras_gelu.GELU("tanh")),
        keras_gelu.GELU("exact"),
        keras.layers.Dense(16, activation=keras_gelu.gelu_sigmoid),
        keras.layers.Dense(16),
        keras_gelu.LearnableGELU(),
        keras.layers.Dense(5),
    ])


@needs_qat
@pytest.mark.parametrize("build", [lambda: every_gelu_functional(seed=5), _every_layer_sequential],
                         ids=["functional", "sequential"])
def test_quantize_model_wraps_every_layer_and_trains(build, rng):
    model = build()
    qat = keras_gelu.qat.quantize_model(model)
    wrapped = [layer.layer for layer in qat.layers if hasattr(layer, "layer")]  # tfmot's wrapper and ours
    ours = [layer for layer in wrapped if isinstance(layer, (keras_gelu.GELU, keras_gelu.LearnableGELU))]
    # Keras 3's engine splits Keras's "gelu" out too, as our exact GELU; tfmot quantizes it in place.
    split_count = sum(isinstance(getattr(layer, "activation", None), keras_gelu.layers.GELU_ACTIVATIONS)
                      or (IS_KERAS3 and getattr(layer, "activation", None) is keras.activations.gelu)
                      for layer in model.layers)
    own_count = sum(isinstance(layer, (keras_gelu.GELU, keras_gelu.LearnableGELU)) for layer in model.layers)
    assert len(ours) == split_count + own_count
    assert all(not isinstance(getattr(layer, "activation", None), keras_gelu.layers.GELU_ACTIVATIONS)
               for layer in wrapped)
    # The float weights are kept: each Dense's kernel and bias, every alpha and beta.
    float_weights = sorted(w.numpy().tobytes() for w in model.weights)
    qat_weights = [w.numpy().tobytes() for w in qat.weights]
    assert all(w in qat_weights for w in float_weights)
    x = _fit(qat, rng, epochs=3)
    assert qat.history.history["loss"][-1] < qat.history.history["loss"][0]
    assert np.all(np.isfinite(qat(x[:4]).numpy()))


@needs_qat
def test_learnable_alpha_and_beta_change_during_qat(rng):
    qat = keras_gelu.qat.quantize_model(_dense_model(keras_gelu.LearnableGELU()))
    alpha = next(w for w in qat.weights if _short_name(w) == "alpha")
    beta = next(w for w in qat.weights if _short_name(w) == "beta")
    alpha_before, beta_before = alpha.numpy().copy(), beta.numpy().copy()
    _fit(qat, rng)
    assert np.max(np.abs(alpha.numpy() - alpha_before)) > 1e-3
    assert np.max(np.abs(beta.numpy() - beta_before)) > 1e-3


@needs_qat
def test_quantize_model_refuses_subclassed_and_unbuilt_models():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3, activation=keras_gelu.GELU())

        def call(self, x):
            return self.dense(x)

    subclassed = Subclassed()
    subclassed(np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match="Received: model=Subclassed"):
        keras_gelu.qat.quantize_model(subclassed)
    with pytest.raises(ValueError, match="not built"):
        keras_gelu.qat.quantize_model(keras.Sequential([keras.layers.Dense(3, activation=keras_gelu.GELU())]))


@needs_qat
def test_quantize_model_refuses_exact_as_in_native_mode():
    # Native mode has the GELU op: there is no exact_as to train for, as the converter's --form says.
    with pytest.raises(ValueError, match="Received: mode='native', exact_as='tanh'"):
        keras_gelu.qat.quantize_model(_dense_model(keras_gelu.GELU()), mode="native", exact_as="tanh")


@pytest.fixture(scope="module")
def every_gelu_qat_trained():
    """(a QAT model of every GELU trained an epoch, inputs), which each saved format's test saves: eagerly, as
    tracing its training step cost more than its eight steps (training in a graph: the tests above)."""
    qat = keras_gelu.qat.quantize_model(every_gelu_functional(seed=5))
    return qat, _fit(qat, np.random.default_rng(20261129), epochs=1, run_eagerly=True)[:16]


@needs_tfmot
@pytest.mark.parametrize("fmt", ["h5", "savedmodel"])
def test_quantize_scope_loads_saved_qat_models(fmt, tmp_path, every_gelu_qat_trained):
    qat, x = every_gelu_qat_trained
    path = str(tmp_path / ("qat.h5" if fmt == "h5" else "qat_savedmodel"))
    qat.save(path)
    with keras_gelu.qat.quantize_scope():
        restored = keras.models.load_model(path)
    np.testing.assert_array_equal(restored(x).numpy(), qat(x).numpy())
    configs = sorted(type(layer.quantize_config).__name__ for layer in restored.layers
                     if isinstance(getattr(layer, "layer", None), (keras_gelu.GELU, keras_gelu.LearnableGELU)))
    assert configs == sorted(type(layer.quantize_config).__name__ for layer in qat.layers
                             if isinstance(getattr(layer, "layer", None), (keras_gelu.GELU, keras_gelu.LearnableGELU)))


# --- QAT model -> int8 .tflite -------------------------------------------------

QAT_TARGETS = vocabulary.INT8_MODE_NAMES  # quantize_model(mode=...), with builtin mode's default exact_as

# A model trained for one mode and converted in the other: its exact or tanh
# GELU was trained as one lookup table and is now re-spelled in ops (or
# back), so their rounding differs. Measured on these models: up to 2 steps.
CROSS_MODE_STEPS = 3.0 + 1e-3


def _int8_ops_differ(name, qat_mode, conversion_mode):
    """Whether conversion computes a GELU with other int8 ops than QAT trained with.

    Our sigmoid and learnable forms are LOGISTIC/MUL ops in every mode; an op
    chain trained by QAT is kept by the converter as it is. A lookup-table GELU
    (ours trained for native mode, and under tfmot Keras's 'gelu' always) is
    re-spelled in ops by builtin mode.
    """
    return _trained_as_lookup_table(name, qat_mode) and conversion_mode == "builtin"


def _trained_as_lookup_table(name, qat_mode):
    """Whether QAT trained this GELU as one int8 GELU op. Keras 3's engine treats Keras's 'gelu' as our exact GELU;
    tfmot leaves it to its default, the op."""
    exact_gelus = ("exact layer", "tanh layer", "tanh function") + (("keras 'gelu' string",) if IS_KERAS3 else ())
    return (name == "keras 'gelu' string" and not IS_KERAS3) or (qat_mode == "native" and name in exact_gelus)


def _trained(key):
    """(the QAT model an activation trains to for a QAT target mode, its inputs)."""
    name, qat_mode = key
    clear_keras_state()
    qat = keras_gelu.qat.quantize_model(_dense_model(ACTIVATIONS[name]()), mode=qat_mode)
    # One epoch moves every bias off zero, where a float bias ADD would hide; eagerly, as tracing each
    # model's training step cost more than its eight steps (training in a graph: the tests above).
    x = _fit(qat, np.random.default_rng([7, list(ACTIVATIONS).index(name), QAT_TARGETS.index(qat_mode)]),
             epochs=1, run_eagerly=True)
    return qat, x[:64]


@pytest.fixture(scope="module")
def trained_qat_models():
    """The QAT models each activation trains to for each QAT target mode (module-scoped: training is the slow
    part), converted as the live model (test_quantize_scope_loads_saved_qat_models converts saved ones)."""
    if not HAS_QAT:
        pytest.skip("tfmot QAT needs tensorflow-model-optimization")
    return BuiltOnFirstUse(_trained)  # a run takes today's share of the conversions below: some of them


def _qat_conversions():
    """(activation, QAT mode, conversion mode, exact_as): the two GELU layers people train (exact, learnable) in
    every conversion; each other activation in each int8 mode (builtin in its default form), which still pairs
    every QAT mode with every int8 mode for every activation: 30 cases, of which a run takes today's share (ten,
    so every case within three days in each leg)."""
    in_each_int8_mode = [(mode, vocabulary.resolve_exact_as(mode, None)) for mode in QAT_TARGETS]
    # The thorough ones, by the GELU function each computes, in every conversion that makes ops of its own
    chosen = {name: [conversion for conversion in conversions.EVERY
                     if not conversions.made_already(function, *conversion, int8=True)]
              for name, function in (("exact layer", "exact"), ("learnable layer", None))}
    cases = [(name, qat_mode, conversion) for name in ACTIVATIONS for qat_mode in QAT_TARGETS
             for conversion in chosen.get(name, in_each_int8_mode)]
    params = [pytest.param(name, qat_mode, *conversion, id=f"{name}-{qat_mode}-{conversions.ids([conversion])[0]}")
              for name, qat_mode, conversion in cases]
    return todays_share(params, 10)


@pytest.mark.parametrize("name, qat_mode, mode, exact_as", _qat_conversions())
def test_qat_model_converts_to_a_fully_integer_tflite(name, qat_mode, mode, exact_as, trained_qat_models):
    import tflite_helpers

    qat, x = trained_qat_models[name, qat_mode]
    tflite_model, report = converters.convert(qat, mode=mode, exact_as=exact_as, int8=True)
    assert report.int8 and report.quantization_aware
    assert report.float_ops == {}, report.op_types
    assert set(report.op_types["FULLY_CONNECTED"]) == {"int8"}
    lookup_table = _trained_as_lookup_table(name, qat_mode)
    assert ("GELU" in report.ops) == (lookup_table and mode != "builtin"), report.ops
    # The .tflite against the QAT Keras model itself (not our rewritten graph).
    (scale,) = operators.output_scales(tflite_model)
    steps = np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale
    if _int8_ops_differ(name, qat_mode, mode):
        # Builtin mode's default form also swaps exact GELU for x*sigmoid(1.702x): 0.02 per activation.
        swapped = exact_as == "sigmoid" and name in ("exact layer", "keras 'gelu' string")
        assert steps <= CROSS_MODE_STEPS + (1 if swapped else 0)
    else:
        assert steps <= QAT_INT8_STEPS
        assert report.drift[0]["steps"] <= QAT_INT8_STEPS  # the converter's own check agrees
    # the rewritten graph mirrors the int8 ops: at most a rounding boundary apart (1e-3: steps are ratios of float32s)
    assert report.fidelity[0]["steps"] <= 1.0 + 1e-3


@pytest.mark.parametrize("name", ["exact layer", "learnable layer"])
def test_qat_int8_io_takes_and_returns_int8(name, trained_qat_models):
    import tflite_helpers
    from keras_gelu.converters.running import verify

    qat, x = trained_qat_models[name, "native"]
    tflite_model, report = converters.convert(qat, mode="native", int8=True, int8_io=True)
    assert "QUANTIZE" not in report.ops and "DEQUANTIZE" not in report.ops
    interpreter_class, _ = verify.interpreter_class()
    interpreter = interpreter_class(model_content=tflite_model)
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert interpreter.get_output_details()[0]["dtype"] == np.int8
    scale = interpreter.get_output_details()[0]["quantization"][0]
    # verify.invoke quantizes the float input as the float model's QUANTIZE op would, and dequantizes.
    got = tflite_helpers.run(tflite_model, x)[0]
    assert np.max(np.abs(got - qat(x).numpy())) <= QAT_INT8_STEPS * scale


def test_qat_h5_file_converts_through_the_cli(trained_qat_models, tmp_path, capsys):
    from keras_gelu.converters import cli

    qat, _ = trained_qat_models["learnable layer", "builtin"]
    path = str(tmp_path / "qat.h5")
    qat.save(path)
    output = str(tmp_path / "qat.tflite")
    assert cli.main([path, "--int8", "--mode", "native", "-o", output]) == 0
    text = capsys.readouterr().err
    assert "integer throughout" in text and "int8 steps" in text
    assert os.path.getsize(output) > 0


def test_qat_model_refuses_calibration(trained_qat_models):
    qat, _ = trained_qat_models["exact layer", "builtin"]
    with pytest.raises(converters.errors.BadInputs, match="drop --calibration"):
        converters.convert(qat, int8=True, calibration="random:4")


def test_qat_model_converted_without_int8_says_so(trained_qat_models):
    qat, _ = trained_qat_models["sigmoid layer", "builtin"]
    _, report = converters.convert(qat, verify=False)
    assert any("--int8" in warning for warning in report.warnings)


@needs_tfmot
def test_initialize_ranges_starts_every_range_at_the_data_and_keeps_the_weights(rng):
    model = every_gelu_functional(seed=5)
    x = rng.normal(0.0, 2.0, size=(128, 12)).astype(np.float32)
    untouched = keras_gelu.qat.quantize_model(model)
    qat = keras_gelu.qat.quantize_model(model)
    weights_before = {w.name: w.numpy().copy() for w in qat.weights if not w.name.endswith(("_min:0", "_max:0"))}
    keras_gelu.qat.initialize_ranges(qat, x)
    for weight in qat.weights:
        if weight.name in weights_before:
            np.testing.assert_array_equal(weight.numpy(), weights_before[weight.name], err_msg=weight.name)
    # The input's range is the data's range (widened to hold 0, as TFLite needs).
    input_layer = next(layer for layer in qat.layers if type(layer).__name__ == "QuantizeLayer")
    low, high = (next(w for w in input_layer.weights if w.name.endswith(suffix)).numpy()
                 for suffix in ("_min:0", "_max:0"))
    np.testing.assert_allclose([low, high], [min(x.min(), 0.0), max(x.max(), 0.0)], rtol=1e-6)
    # Before any training, the calibrated QAT model already computes the float model's function,
    # as post-training int8 would: 7 quantized layers each round by half a step of their own
    # scale (measured: 6.3 output steps). tfmot's [-6, 6] start is at least twice as far off.
    (head_min, head_max) = (next(w for w in qat.weights if w.name == f"quant_head/post_activation_{end}:0").numpy()
                            for end in ("min", "max"))
    step = (head_max - head_min) / 255
    reference = model(x).numpy()
    calibrated_error = np.max(np.abs(qat(x).numpy() - reference))
    assert calibrated_error <= 8 * step, calibrated_error / step
    assert np.max(np.abs(untouched(x).numpy() - reference)) > 2 * calibrated_error


@needs_tfmot
def test_conv_with_a_gelu_activation_is_split_and_converts_to_integer(tmp_path, rng):
    keras.utils.set_random_seed(12)
    model = keras.Sequential([
        keras.Input((8, 8, 1), name="image"),
        keras.layers.Conv2D(4, 3, activation=keras_gelu.GELU("tanh")),
        keras.layers.Conv2D(4, 3, activation=keras_gelu.LearnableGELU(shared_axes=[1, 2])),
        keras.layers.Flatten(),
        keras.layers.Dense(3),
    ])
    x = rng.normal(size=(64, 8, 8, 1)).astype(np.float32)
    split = keras_gelu.qat.split_activations(model)
    np.testing.assert_allclose(split(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.fit(x, rng.normal(size=(64, 3)).astype(np.float32), epochs=1, verbose=0)
    _, report = converters.convert(_saved(qat, tmp_path), int8=True)
    assert report.float_ops == {}, report.op_types
    assert set(report.op_types["CONV_2D"]) == {"int8"}


@tf_keras_only
def test_keep_float_auto_leaves_what_tfmot_cannot_quantize_float_and_names_it(rng):
    """Under tfmot, keep_float="auto" leaves float exactly the layers tfmot's default scheme has no config for
    (which tfmot itself refuses), named in a warning and in kept_float; the rest is quantized and converts."""
    keras.utils.set_random_seed(5)
    inputs = keras.Input((12,))
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Dense(16, name="first")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(keras_gelu.GELU(name="gelu")(hidden)))
    with pytest.raises(RuntimeError, match=r"Layer norm:.*LayerNormalization.* is not supported"):
        keras_gelu.qat.quantize_model(model)  # tfmot's own refusal, without "auto"
    with pytest.warns(UserWarning, match=r"kept 1 layer\(s\) float .*norm: tfmot's default 8-bit scheme has no "
                                         r"QuantizeConfig for LayerNormalization"):
        qat = keras_gelu.qat.quantize_model(model, keep_float="auto")
    assert list(qat.kept_float) == ["norm"]
    assert type(qat.get_layer("norm")) is keras.layers.LayerNormalization
    assert {type(layer).__name__ for layer in qat.layers} >= {"QuantizeWrapperV2"}
    assert {layer.layer.name for layer in qat.layers if hasattr(layer, "layer")} == {"first", "gelu", "head"}
    x = rng.normal(size=(64, 12)).astype(np.float32)
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.fit(x, rng.normal(size=(64, 3)).astype(np.float32), epochs=1, verbose=0)
    _, report = converters.convert(qat, int8=True)
    assert report.float_ops, report.op_types  # the LayerNormalization's ops, named by the report
    assert "int8" in report.op_types["FULLY_CONNECTED"], report.op_types
