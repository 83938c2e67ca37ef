"""Keras models built with this package's layers, through the converter in every mode."""

import math

import numpy as np
import pytest
import tensorflow as tf

import conversions
import keras_gelu
import references
import tflite_helpers
from conftest import IS_KERAS3
from conftest import keras
from conftest import rotated
from keras_gelu import converters
from keras_gelu.converters import errors
from keras_gelu.converters.report import Report
from keras_gelu.converters.running import verify

pytestmark = pytest.mark.legs("keras3", "tf_keras")


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
        keras.layers.Dense(16, activation=keras_gelu.GELU("exact")),
        keras.layers.Dense(16, activation=keras_gelu.GELU("tanh")),
        keras.layers.Dense(16, activation=keras_gelu.GELU("sigmoid")),
        keras.layers.Dense(16, activation=keras_gelu.gelu_exact),
        keras.layers.Dense(16),
        keras_gelu.LearnableGELU(beta_initializer=keras.initializers.Constant(0.1)),
        keras.layers.Dense(3),
    ])


# Each flavour's models in half the modes (the modes' arithmetic is the flavour's no more than the model is the
# mode's); both forms of the model in each.
MODES_HERE = rotated(conversions.REWRITING)


@pytest.mark.parametrize("as_file", [False, True], ids=["savedmodel", "file"])
@pytest.mark.parametrize("mode, exact_as", MODES_HERE, ids=conversions.ids(MODES_HERE))
def test_every_layer_in_every_mode(tmp_path, mode, exact_as, as_file):
    path = _save(_every_layer_sequential(), tmp_path, as_file)
    _, report = converters.convert(path, mode=mode, exact_as=exact_as)
    found = {g["pattern"]: g["count"] for g in report.gelus}
    # Our exact layers (2), tanh layer (1, written with a sigmoid) and sigmoid layer (1);
    # the learnable gate has per-unit parameters, so it is not a fixed GELU.
    assert found == {"erf": 2, "tanh via sigmoid": 1, "sigmoid": 1}, report.gelus
    _assert_converted(report, mode, gelu_ops_expected=3)
    exact_kept = conversions.keeps_exact_gelu(mode, exact_as)
    assert max(c["max_abs"] for c in report.drift) <= (1e-4 if exact_kept else 0.2)


@pytest.mark.parametrize("mode, exact_as", conversions.REWRITING, ids=conversions.ids(conversions.REWRITING))
def test_huge_finite_inputs_stay_finite_in_the_tflite(tmp_path, mode, exact_as):
    """Every layer alone, at inputs far beyond any activation's saturation: LiteRT's XNNPACK LOGISTIC
    returns NaN for finite inputs beyond about 4.3e26, so every sigmoid's input must be bounded."""
    import tflite_helpers

    layers = {"exact": keras_gelu.GELU("exact"), "tanh": keras_gelu.GELU("tanh"),
              "sigmoid": keras_gelu.GELU("sigmoid"), "learnable": keras_gelu.LearnableGELU(shared_axes=[1])}
    x = np.float32([[1e30, -1e30, 3e38, -3e38, 1e27, -1e27, 1e20, -1e20]])
    for name, layer in layers.items():
        model = keras.Sequential([keras.Input((x.shape[1],)), layer])
        tflite_model, _ = converters.convert(model, mode=mode, exact_as=exact_as, verify=False)
        (y,) = tflite_helpers.run(tflite_model, x)
        expected = np.where(x > 0, x, 0.0)  # GELU(x) for |x| >= 1e20, and the learnable's sigmoid-form start
        np.testing.assert_array_equal(y, expected, err_msg=name)


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


@pytest.mark.skipif(not IS_KERAS3, reason="Keras 3's export of nested outputs (tf-keras saves its own signature)")
def test_nested_outputs_convert_one_tensor_per_path(rng):
    """A model whose outputs nest a tuple under a key (keras-hub's D-FINE) converts: a signature takes only
    tensors, so each leaf is an output of its own, named by its path."""
    keras.utils.set_random_seed(6)
    x = keras.Input((6,), name="x")
    hidden = keras.layers.Dense(8, activation=keras_gelu.GELU())(x)
    model = keras.Model(x, {"logits": keras.layers.Dense(2)(hidden),
                            "states": (hidden, keras.layers.Dense(3)(hidden))})
    tflite_model, report = converters.convert(model, mode="native")  # TFLite's GELU op: the function itself
    assert sorted(info["output"] for info in report.fidelity) == ["logits", "states_0", "states_1"]
    values = rng.normal(size=(4, 6)).astype(np.float32)
    outputs, expected = verify.run_signature(tflite_model, "serving_default", {"x": values}), model(values)
    for name, value in (("logits", expected["logits"]), ("states_0", expected["states"][0]),
                        ("states_1", expected["states"][1])):
        np.testing.assert_allclose(outputs[name], keras.ops.convert_to_numpy(value), atol=1e-5)


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
    _, report = converters.convert(path, mode="builtin", exact_as="erf")
    assert {g["pattern"] for g in report.gelus} == {"tanh via sigmoid"}
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
    for mode, exact_as in (("builtin", "erf"), ("native", None), ("builtin", "sigmoid")):
        _, report = converters.convert(path, mode=mode, exact_as=exact_as)
        assert sum(g["count"] for g in report.gelus) == 1
        _assert_converted(report, mode, gelu_ops_expected=1)


def _mixed_precision_model(policy):
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
    return model


@pytest.mark.parametrize("policy, mode, exact_as", rotated(
    (policy, *conversion) for policy in ("mixed_float16", "mixed_bfloat16")
    for conversion in (("builtin", "erf"), ("native", None), ("builtin", "sigmoid"))))
def test_mixed_precision_models_convert(tmp_path, policy, mode, exact_as):
    path = _save(_mixed_precision_model(policy), tmp_path, as_file=True)
    for float16_weights in (False, True):
        _, report = converters.convert(path, mode=mode, exact_as=exact_as, float16_weights=float16_weights)
        assert policy.removeprefix("mixed_") in report.retyped_to_float32, report.retyped_to_float32
        assert sum(g["count"] for g in report.gelus) == 3  # ours, Keras's 'gelu', our tanh function
        _assert_converted(report, mode, gelu_ops_expected=3)
        if float16_weights:
            assert "DEQUANTIZE" in report.ops  # float16 weights are dequantized at load time


def test_model_without_gelu_converts_and_reports_zero(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu")])
    _, report = converters.convert(_save(model, tmp_path, as_file=False))
    assert report.gelus == [] and report.leftover_erf == {}
    _assert_converted(report, "builtin", 0)


def _signature_reference(model, tmp_path):
    """The serving signature as TensorFlow's own loader gives it, for an independent comparison."""
    import tensorflow as tf

    directory = str(tmp_path / "reference_export")
    if IS_KERAS3:
        model.export(directory, verbose=False)
    else:
        tf.saved_model.save(model, directory)
    return tf.saved_model.load(directory).signatures["serving_default"]


def _two_named_outputs_model():
    keras.utils.set_random_seed(9)
    features, mask = keras.Input((6,), name="features"), keras.Input((3,), name="mask")
    h = keras.layers.Dense(8, activation=keras_gelu.GELU())(keras.layers.Concatenate()([features, mask]))
    return keras.Model({"features": features, "mask": mask},
                       {"scores": keras.layers.Dense(2, name="scores")(h),
                        "embedding": keras.layers.Dense(4, activation=keras_gelu.gelu_tanh, name="embedding")(h)})


@pytest.mark.parametrize("source, int8", rotated((source, int8) for int8 in (False, True)
                                                 for source in ("savedmodel", "file", "live")))
def test_signature_is_kept_by_name(tmp_path, source, int8):
    """The .tflite runs through get_signature_runner() with the source signature's own names."""
    import tensorflow as tf

    model = _two_named_outputs_model()
    reference = _signature_reference(model, tmp_path)
    model_input = model if source == "live" else _save(model, tmp_path, as_file=source == "file")
    options = {"int8": True, "calibration": "random:16"} if int8 else {}
    tflite_model, _ = converters.convert(model_input, mode="native", **options)
    _, input_specs = reference.structured_input_signature
    rng = np.random.default_rng(1)
    arrays = {name: rng.normal(size=(1, *spec.shape[1:])).astype(np.float32) for name, spec in input_specs.items()}
    outputs = reference(**{k: tf.constant(v) for k, v in arrays.items()})
    expected = {name: value.numpy() for name, value in outputs.items()}
    actual = verify.run_signature(tflite_model, "serving_default", arrays)
    assert sorted(actual) == sorted(expected) and len(expected) == 2
    # float: kernel rounding (see options.DEFAULT_ATOL); int8: a few steps of outputs of range ~2.
    tolerance = 0.1 if int8 else 1e-4
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], atol=tolerance, err_msg=name)


def test_where_keras_moved_its_export_helper_the_model_is_exported_and_converts_the_same(monkeypatch):
    """The converter traces a Keras model with the internal helper Keras's own export uses; where a Keras release
    has moved it, the model is exported to a SavedModel and read back instead: the same signature, by name, and
    the same .tflite outputs."""
    from keras_gelu.converters.reading import loading

    model = _two_named_outputs_model()
    arrays = {"features": np.random.default_rng(2).normal(size=(3, 6)).astype(np.float32),
              "mask": np.ones((3, 3), np.float32)}
    traced, _ = converters.convert(model, mode="native")
    flavour = "keras3" if IS_KERAS3 else "tf_keras"
    module_name, _ = loading._KERAS_EXPORT_HELPERS[flavour]
    monkeypatch.setitem(loading._KERAS_EXPORT_HELPERS, flavour, (module_name, "moved_elsewhere"))
    exports = []
    export = loading._exported_signatures
    monkeypatch.setattr(loading, "_exported_signatures", lambda *args: exports.append(args) or export(*args))
    exported, report = converters.convert(model, mode="native")
    assert len(exports) == 1 and report.verified and report.ops.get("GELU") == 2, report.ops
    expected = verify.run_signature(traced, "serving_default", arrays)
    actual = verify.run_signature(exported, "serving_default", arrays)
    assert sorted(actual) == sorted(expected) == ["embedding", "scores"]
    for name in expected:  # the same layers' graph either way; TFLite may order a sum differently
        np.testing.assert_allclose(actual[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


def test_live_subclassed_model_must_be_built_first():
    class Tiny(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(4, activation=keras_gelu.GELU())

        def call(self, x):
            return self.dense(x)

    model = Tiny()
    with pytest.raises(converters.errors.NotAModel, match="not built; call it on a batch"):
        converters.convert(model)
    model(np.zeros((1, 3), np.float32))
    _, report = converters.convert(model, mode="native")
    assert report.kind == "Keras model" and report.input == "<Tiny 'tiny'>"
    _assert_converted(report, "native", gelu_ops_expected=1)


def test_not_a_model_object_is_refused():
    with pytest.raises(converters.errors.NotAModel, match="not a Keras model"):
        converters.convert(object())


def test_reference_graph_computes_layer_normalization_as_written():
    """The fidelity reference against float64 numpy, for the pattern oneDNN's remapper fuses.

    tf-keras's LayerNormalization with constant (frozen) gamma and beta is
    what grappler turns into _MklLayerNorm when oneDNN is on; that kernel was
    2.5e-4 away from float64 here, the ops as written 5e-8.
    """
    from keras_gelu.converters.reading import loading

    keras.utils.set_random_seed(10)
    inputs = keras.Input((16, 32), batch_size=4, name="x")
    dense = keras.layers.Dense(32)
    norm = keras.layers.LayerNormalization(epsilon=1e-12, gamma_initializer="random_normal",
                                           beta_initializer="random_normal")
    source = loading.load(keras.Model(inputs, norm(dense(inputs))))
    x = np.random.default_rng(2).normal(size=(4, 16, 32)).astype(np.float32)
    (output,) = verify.run_graph(source.graph_def, source, {source.inputs[0].name: x}).values()
    h = x.astype(np.float64) @ dense.kernel.numpy().astype(np.float64) + dense.bias.numpy()
    mean, variance = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    expected = (h - mean) / np.sqrt(variance + 1e-12) * norm.gamma.numpy() + norm.beta.numpy()
    # float32 rounding of a 32-term matmul and mean/variance on values ~3: 1e-6.
    assert np.max(np.abs(output - expected)) <= 1e-6


def test_a_saved_model_s_jit_compiled_functions_run_as_written_and_a_live_model_s_are_left_alone(tmp_path):
    """The original model runs its ops as written (verify.run_source): a SavedModel keeps the XLA mark of the
    jit-compiled functions it was saved from (keras_gelu's kernels), which the conversion registers again
    without it, for the model and for the SavedModel rewritten in place that parity runs; a live model's
    functions are its caller's, and keep theirs."""
    from tensorflow.python.eager import context

    from keras_gelu.converters.reading import loading

    def marked(function):
        eager = context.context()
        names = [definition.signature.name for definition in function.graph.as_graph_def().library.function]
        definitions = [eager.get_function_def(name) for name in names if eager.has_function(name)]
        return sum("_XlaMustCompile" in attributes for definition in definitions
                   for attributes in (definition.attr, *(node.attr for node in definition.node_def)))

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras_gelu.GELU("exact")])
    x = np.random.default_rng(3).normal(size=(4, 8)).astype(np.float32) * 3
    live = loading.load(model)
    saved = loading.load(_save(model, tmp_path, as_file=False), kind="SavedModel", freeze=False)
    assert marked(saved.function) >= 1 and marked(live.function) >= 1  # the kernels' functions and their calls
    (from_file,) = verify.run_source(saved, {saved.inputs[0].name: x}).values()
    (from_live,) = verify.run_source(live, {live.inputs[0].name: x}).values()
    assert marked(saved.function) == 0 and marked(live.function) >= 1
    # the SavedModel rewritten in place (rewriting.saved_model), which parity runs, keeps them as this one does (which
    # stands in for it here): loaded as written too
    rewritten = verify.signature_as_written(saved.path, saved.signature)
    assert marked(rewritten) == 0
    (from_rewritten,) = rewritten(**{saved.inputs[0].name: tf.constant(x)}).values()
    h = x.astype(np.float64) @ model.layers[0].kernel.numpy().astype(np.float64) + model.layers[0].bias.numpy()
    expected = references.gelu_exact(h)
    # float32 rounding of an 8-term matmul and of each kernel's erfc: a few float32 eps of values up to ~10
    np.testing.assert_allclose(from_file, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(from_live, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(from_rewritten, expected, rtol=1e-5, atol=1e-6)


def test_exact_as_is_refused_where_the_mode_has_the_gelu_op(tmp_path):
    # As the command's "--form applies to --mode builtin only", before any model is read.
    with pytest.raises(ValueError, match="applies to mode 'builtin' only. Received: mode='native', exact_as='erf'"):
        converters.convert(str(tmp_path / "never_read"), mode="native", exact_as="erf")


def test_a_mixed_precision_saved_model_is_frozen_and_retyped_like_a_keras_file(tmp_path):
    """A SavedModel is loaded for the route that keeps its weights in its variables; one that computes in float16
    is then frozen and retyped to float32 (loading.freeze_graph), as a Keras file is."""
    path = _save(_mixed_precision_model("mixed_float16"), tmp_path, as_file=False)
    _, report = converters.convert(path, mode="native")
    assert "float16" in report.retyped_to_float32, report.retyped_to_float32
    assert sum(g["count"] for g in report.gelus) == 3
    _assert_converted(report, "native", gelu_ops_expected=3)


class _RelativePositionBuckets(tf.Module):
    """Hugging Face's TF MPNet and T5 put a relative distance n in a bucket by its logarithm, computed in float64 (an
    int32 tensor divided by a Python int) and truncated: each of 128 distances scales one input."""

    @tf.function(input_signature=[tf.TensorSpec([128], tf.float32, name="x")])
    def __call__(self, x):
        n = tf.range(128)
        large = 8 + tf.cast(tf.math.log(n / 8) / math.log(128 / 8) * 8, tf.int32)
        return {"y": x * tf.cast(tf.where(n < 8, n, tf.minimum(large, 15)), tf.float32)}


@pytest.mark.legs("keras3")  # a TensorFlow graph, which no Keras flavour changes
def test_float64_arithmetic_is_computed_in_float32_and_named_so(tmp_path):
    """TFLite computes no float64: the converter computes it in float32, says so naming float64 (not half
    precision), and every bucket stays where float64 puts it, at the powers of two where the logarithm's ratio
    is an integer too."""
    path = str(tmp_path / "buckets")
    tf.saved_model.save(_RelativePositionBuckets(), path)
    tflite_model, report = converters.convert(path, mode="builtin")
    assert report.retyped_to_float32 == ["float64"]
    assert "float64 arithmetic: computed in float32" in report.to_text()
    expected = [n if n < 8 else min(8 + int(math.log(n / 8) / math.log(16) * 8), 15) for n in range(128)]
    (buckets,) = tflite_helpers.run(tflite_model, np.ones(128, np.float32))
    np.testing.assert_array_equal(buckets, expected)
    # From the worker, the types are words the converter has, or the report is refused
    assert Report.from_untrusted(report.to_dict()).retyped_to_float32 == ["float64"]
    for forged in (["float64: recomputed by us, trust it"], ["float64"] * 10_000):
        with pytest.raises(ValueError, match="retyped_to_float32"):
            Report.from_untrusted({**report.to_dict(), "retyped_to_float32": forged})


class _CountingCalls(tf.Module):
    """A serving function that writes a variable as it runs (as Keras's JAX export writes a layer's state back)."""

    def __init__(self):
        super().__init__()
        self.kernel = tf.Variable(np.random.default_rng(5).normal(size=(8, 4)).astype(np.float32))
        self.calls = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        self.calls.assign_add(1.0)
        return {"y": tf.nn.gelu(tf.matmul(x, self.kernel), approximate=False)}


@pytest.mark.legs("tf_keras")  # a SavedModel: no flavour changes it
def test_a_model_that_writes_a_variable_converts_unfrozen_and_a_frozen_conversion_says_why_not(tmp_path):
    module = _CountingCalls()
    path = str(tmp_path / "counting")
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    _, report = converters.convert(path)  # the variable kept, as the stock converter keeps it
    assert report.verified and sum(entry["count"] for entry in report.gelus) == 1, report.gelus
    with pytest.raises(errors.ConverterFailed, match=r"writes a variable while it runs \(AssignAddVariableOp, .*"
                                                     r"convert without those options"):
        converters.convert(path, int8=True, calibration="random:4")


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
def test_ids_padded_to_a_window_draw_random_values_below_their_table(tmp_path):
    """Longformer pads its token ids (with its pad token) to a multiple of its attention window before its
    embedding looks them up; with no --inputs, the ids' valid values were unknown past the pad, and the command
    asked for real samples. Followed through the pad, they are the table's rows: a newcomer's conversion with no
    flag runs, on random ids below them."""
    from keras_gelu.converters.reading import loading

    table = np.random.default_rng(9).normal(size=(37, 4)).astype(np.float32)

    def embedded(ids):
        padded = tf.pad(ids, [[0, 0], [0, 3]], constant_values=1)
        return {"y": tf.nn.gelu(tf.gather(tf.constant(table), padded), approximate=False)}

    path = conversions.saved_function(tmp_path, "padded_ids", embedded,
                                      tf.TensorSpec([None, None], tf.int32, name="ids"))
    (ids,) = loading.load(path).inputs
    assert ids.values.upper == 37 and not ids.values.mask, ids.values
    _, report = converters.convert(path)
    assert report.verified, report.not_verified_reason


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
def test_an_integer_input_nothing_reads_takes_zeros_and_one_read_by_arithmetic_asks_for_samples(tmp_path):
    """DeBERTa has no token-type table by default, and its token_type_ids reach nothing but its signature: any
    value will do, and a newcomer's conversion with no flag runs. An integer input that arithmetic reads, whose
    valid values nothing tells, still asks for real samples in one line."""
    from keras_gelu.converters.reading import loading

    def unread(x, token_type_ids):
        return {"y": tf.nn.gelu(x, approximate=False) * tf.cast(tf.shape(token_type_ids)[1], tf.float32)}

    def read(x, offsets):
        return {"y": tf.nn.gelu(x + tf.cast(offsets, tf.float32)[:, :, None], approximate=False)}

    paths = {name: conversions.saved_function(tmp_path, name, function,
                                              tf.TensorSpec([None, 5, 4], tf.float32, name="x"),
                                              tf.TensorSpec([None, 5], tf.int32, name=input_name))
             for name, function, input_name in (("unread", unread, "token_type_ids"), ("read", read, "offsets"))}
    values = {info.name: info.values for info in loading.load(paths["unread"]).inputs}
    assert values["token_type_ids"].upper == 1 and not values["token_type_ids"].mask, values
    assert converters.convert(paths["unread"])[1].verified
    with pytest.raises(errors.BadInputs, match="cannot make random values for integer input 'offsets'"):
        converters.convert(paths["read"])


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
@pytest.mark.parametrize("batch", [None, 1], ids=["open batch", "a batch of one"])
def test_a_model_that_fails_on_random_inputs_says_to_pass_real_samples(tmp_path, batch):
    """LayoutLM's boxes index its position tables by their corners and by their sides (a corner less the other):
    random corners below the table break the sides' lookups, and the original model fails when run. The line says
    the inputs were random and what to pass; with boxes in order, the model converts. Exported with a batch of
    one, run sample by sample, the same (the samples had lost what said they were random, and the line its
    advice)."""
    table = np.random.default_rng(10).normal(size=(20, 4)).astype(np.float32)

    def boxed(boxes):
        corners, sides = tf.gather(table, boxes[:, 0]), tf.gather(table, boxes[:, 1] - boxes[:, 0])
        return {"y": tf.nn.gelu(corners + sides, approximate=False)}

    path = conversions.saved_function(tmp_path, "boxes", boxed, tf.TensorSpec([batch, 2], tf.int32, name="boxes"))
    with pytest.raises(errors.CorruptModel, match=r"the original model fails when run \(.*\); on seeded random "
                                                  r"inputs: pass real samples with --inputs file\.npz$"):
        converters.convert(path)
    np.savez(tmp_path / "boxes.npz", boxes=np.array([[1, 5], [0, 19], [7, 7]], np.int32))
    assert converters.convert(path, inputs=str(tmp_path / "boxes.npz"))[1].verified


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
def test_random_calibration_samples_take_the_dynamic_size_the_parity_inputs_take(tmp_path):
    """SigLIP leaves its sequence open in its signature and adds a position table of fixed length: `--dynamic-size`
    at that length makes the parity check's random inputs fit (the refusal without it says so), and `--calibration
    random:N` must draw its samples at the same size (they took the default size, and the calibration failed in
    the model's addition)."""
    positions = np.random.default_rng(11).normal(size=(6, 4)).astype(np.float32)

    def positioned(x):
        return {"y": tf.nn.gelu(x + positions, approximate=False)}

    path = conversions.saved_function(tmp_path, "positions", positioned,
                                      tf.TensorSpec([None, None, 4], tf.float32, name="x"))
    with pytest.raises(errors.CorruptModel, match=r"pass real samples with --inputs file\.npz, or the length its "
                                                  r"dynamic dimensions need with --dynamic-size \(they took 2\)$"):
        converters.convert(path)
    tflite_model, report = converters.convert(path, int8=True, calibration="random:3", dynamic_size=6)
    assert report.verified, report.not_verified_reason
    assert report.inputs_used == "the first 3 calibration samples (random:3)"


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
def test_a_model_exported_with_a_batch_of_one_is_judged_on_every_sample_one_by_one(tmp_path, rng):
    """A model exported for a phone often fixes its batch at 1. Parity refused an --inputs of several samples,
    and an int8 model was judged on one calibration sample alone: keras-hub's SAM 3 has an output of one value per
    sample (its presence logit), whose cosine on one sample is 1 or -1. Both run sample by sample now, against the
    original model run the same way, and the float .tflite's outputs match float64's on every sample."""
    weights = rng.normal(size=(6, 1)).astype(np.float32)

    def scored(x):
        return {"score": tf.matmul(tf.nn.gelu(x, approximate=False), weights)}

    path = conversions.saved_function(tmp_path, "batch_of_one", scored, tf.TensorSpec([1, 6], tf.float32, name="x"))
    x = rng.normal(size=(5, 6)).astype(np.float32)
    np.savez(tmp_path / "samples.npz", x=x)
    tflite_model, report = converters.convert(path, exact_as="erf", inputs=str(tmp_path / "samples.npz"))
    assert report.verified and report.inputs_used == f"inputs from {tmp_path / 'samples.npz'}", report.inputs_used
    gelu = x.astype(np.float64) * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    scores = [verify.run_signature(tflite_model, "serving_default", {"x": sample[None]})["score"] for sample in x]
    np.testing.assert_allclose(np.concatenate(scores), gelu @ weights, atol=1e-5)  # float32 sums of six terms
    np.savez(tmp_path / "calibration.npz", x=rng.normal(size=(16, 6)).astype(np.float32))
    _, report = converters.convert(path, int8=True, calibration=str(tmp_path / "calibration.npz"))
    assert report.inputs_used == f"the first 8 calibration samples ({tmp_path / 'calibration.npz'})"
    assert report.verified and report.budget["passed"], report.budget


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
def test_a_model_exported_with_a_batch_of_four_is_calibrated_on_batches_of_four(tmp_path, rng):
    """Calibration samples went to the model one by one whatever batch it fixed: a model exported with a batch of
    4 ended in an internal error ("Cannot feed value of shape (1, 6) for Tensor x:0, which has shape (4, 6)").
    They go in batches of the batch the model fixes, the rows past the last whole batch left out, and fewer rows
    than one batch is a user's error in one line."""
    weights = rng.normal(size=(6, 3)).astype(np.float32)

    def projected(x):
        return {"y": tf.matmul(tf.nn.gelu(x, approximate=False), weights)}

    path = conversions.saved_function(tmp_path, "batch_of_four", projected, tf.TensorSpec([4, 6], tf.float32, name="x"))
    np.savez(tmp_path / "ten.npz", x=rng.normal(size=(10, 6)).astype(np.float32))
    _, report = converters.convert(path, int8=True, calibration=str(tmp_path / "ten.npz"))
    assert report.int8_ranges == (f"post-training, calibrated on 8 samples in 2 batches of 4, the batch the model "
                                  f"fixes ({tmp_path / 'ten.npz'})"), report.int8_ranges
    assert report.inputs_used == f"the first 4 calibration samples ({tmp_path / 'ten.npz'})", report.inputs_used
    assert report.verified and report.budget["passed"], report.budget
    np.savez(tmp_path / "three.npz", x=rng.normal(size=(3, 6)).astype(np.float32))
    with pytest.raises(errors.BadInputs, match=r"three\.npz: 3 samples, fewer than the batch of 4 the model fixes$"):
        converters.convert(path, int8=True, calibration=str(tmp_path / "three.npz"))
