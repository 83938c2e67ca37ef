"""Keras models built with this package's layers, through the converter in every mode."""

import numpy as np
import pytest

import keras_gelu
from conftest import IS_KERAS3
from conftest import keras
from keras_gelu import converters

MODES = [("builtin", "sigmoid"), ("builtin", "tanh"), ("builtin", "erf"), ("native", "sigmoid")]


def _save(model, tmp_path, as_file):
    """Save as the flavour's file format or as a SavedModel directory."""
    if as_file:
        path = str(tmp_path / ("model.keras" if IS_KERAS3 else "model.h5"))
        model.save(path)
    else:
        path = str(tmp_path / "saved_model")
        if IS_KERAS3:
            model.export(path, verbose=False)
        else:
            model.save(path)
    return path


def _assert_converted(report, mode, gelu_ops_expected):
    assert report.verified, report.not_verified_reason
    assert all(c["passed"] for c in report.fidelity), report.fidelity
    assert not report.flex_ops
    if mode == "builtin":
        assert "GELU" not in report.ops
    else:
        assert report.ops.get("GELU", 0) == gelu_ops_expected, report.ops


def _every_layer_sequential():
    keras.utils.set_random_seed(4)
    return keras.Sequential([
        keras.Input((12,)),
        keras.layers.Dense(16, activation=keras_gelu.GELU("none")),
        keras.layers.Dense(16, activation=keras_gelu.GELU("tanh")),
        keras.layers.Dense(16, activation=keras_gelu.GELU("sigmoid")),
        keras.layers.Dense(16, activation=keras_gelu.gelu_exact),
        keras.layers.Dense(16),
        keras_gelu.LearnableGELU(beta_initializer=keras.initializers.Constant(0.1)),
        keras.layers.Dense(3),
    ])


@pytest.mark.parametrize("as_file", [False, True], ids=["savedmodel", "file"])
@pytest.mark.parametrize("mode, form", MODES, ids=[f"{m}-{f}" for m, f in MODES])
def test_every_layer_in_every_mode(tmp_path, mode, form, as_file):
    path = _save(_every_layer_sequential(), tmp_path, as_file)
    _, report = converters.convert(path, mode=mode, form=form)
    spellings = {g["spelling"]: g["count"] for g in report.gelus}
    # Our exact layers (2), tanh layer (1, written with a sigmoid) and sigmoid layer (1);
    # the learnable gate has per-unit parameters, so it is not a fixed GELU.
    assert spellings == {"erf": 2, "tanh via sigmoid": 1, "sigmoid": 1}, report.gelus
    _assert_converted(report, mode, gelu_ops_expected=3)
    exact_kept = mode == "native" or form == "erf"
    assert max(c["max_abs"] for c in report.drift) <= (1e-4 if exact_kept else 0.2)


def test_functional_multi_input_multi_output_dynamic_batch(tmp_path):
    keras.utils.set_random_seed(5)
    a, b = keras.Input((6,), name="a"), keras.Input((4,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(8, activation=keras_gelu.GELU())(a),
                                    keras.layers.Dense(8, activation=keras_gelu.gelu_tanh)(b)])
    model = keras.Model([a, b], [keras.layers.Dense(2, name="first")(h),
                                 keras.layers.Dense(3, activation=keras_gelu.GELU(), name="second")(h)])
    path = _save(model, tmp_path, as_file=False)
    _, report = converters.convert(path, mode="native", dynamic_size=5)
    assert len(report.fidelity) == 2
    _assert_converted(report, "native", gelu_ops_expected=3)
    assert "dynamic dimensions = 5" in report.inputs_used


def test_subclassed_model(tmp_path):
    class Residual(keras.Model):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(8)
            self.gelu = keras_gelu.GELU("tanh")
            self.learnable = keras_gelu.LearnableGELU(shared_axes=None)

        def call(self, x):
            return x + self.learnable(self.gelu(self.inner(x)))

    model = Residual()
    model(np.zeros((1, 8), np.float32))
    if IS_KERAS3:
        path = str(tmp_path / "sm")
        model.export(path, verbose=False)
    else:
        import tensorflow as tf

        path = str(tmp_path / "sm")
        tf.saved_model.save(model, path, signatures=tf.function(model.call).get_concrete_function(
            tf.TensorSpec([None, 8], tf.float32, name="x")))
    _, report = converters.convert(path, mode="builtin", form="erf")
    assert {g["spelling"] for g in report.gelus} == {"tanh via sigmoid"}
    _assert_converted(report, "builtin", 0)


def test_transformer_encoder_block(tmp_path):
    keras.utils.set_random_seed(6)
    tokens = keras.Input((10, 32), name="tokens")
    attention = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(tokens, tokens)
    h = keras.layers.LayerNormalization()(tokens + attention)
    ffn = keras.layers.Dense(64, activation=keras_gelu.GELU())(h)
    ffn = keras.layers.Dense(32)(ffn)
    model = keras.Model(tokens, keras.layers.LayerNormalization()(h + ffn))
    path = _save(model, tmp_path, as_file=False)
    for mode, form in (("builtin", "erf"), ("native", "sigmoid"), ("builtin", "sigmoid")):
        _, report = converters.convert(path, mode=mode, form=form)
        assert sum(g["count"] for g in report.gelus) == 1
        _assert_converted(report, mode, gelu_ops_expected=1)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("mode, form", [("builtin", "erf"), ("native", "sigmoid"), ("builtin", "sigmoid")])
def test_mixed_precision_models_convert(tmp_path, policy, mode, form):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(7)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation=keras_gelu.GELU()),
        keras.layers.Dense(16, activation="gelu"),
        keras_gelu.LearnableGELU(),
        keras.layers.Dense(2, activation=keras_gelu.gelu_tanh, dtype="float32"),
    ])
    keras.mixed_precision.set_global_policy("float32")
    path = _save(model, tmp_path, as_file=True)
    for float16_weights in (False, True):
        _, report = converters.convert(path, mode=mode, form=form, float16_weights=float16_weights)
        assert report.promoted_to_float32
        assert sum(g["count"] for g in report.gelus) == 3  # ours, Keras's 'gelu', our tanh function
        _assert_converted(report, mode, gelu_ops_expected=3)
        if float16_weights:
            assert "DEQUANTIZE" in report.ops  # float16 weights are dequantized at load time


def test_model_without_gelu_converts_and_reports_zero(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu")])
    _, report = converters.convert(_save(model, tmp_path, as_file=False))
    assert report.gelus == [] and report.leftover_erf == {}
    _assert_converted(report, "builtin", 0)
