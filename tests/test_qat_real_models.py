"""Keras 3 QAT of real model families as they come: keras.applications' ConvNeXt and keras-hub's BERT and
DeiT backbones (tiny random configs; DeiT is ViT with class and distillation tokens, and every keras-hub family
takes its turn in test_every_family), quantized without flattening anything by hand, trained a step, saved
as .keras, loaded, converted in a fresh process to a .tflite that is integer throughout and agrees with the QAT
model, for TFLite Micro (and ConvNeXt for Ethos-U55): today's family of the three (conftest.todays_share, each
within three days; they are one mechanism on three models, 28 CPU-s together). The recipes measure accuracy on
real data.
"""

import importlib.util
import json

import numpy as np
import pytest

import keras_gelu
import references
from conftest import IS_KERAS3
from conftest import keras
from conftest import todays_share

if not IS_KERAS3:
    pytest.skip("Keras 3's QAT engine (keras-hub models are Keras 3 models)", allow_module_level=True)
keras_hub = pytest.importorskip("keras_hub")

from keras_gelu import converters  # noqa: E402
from keras_gelu.converters import cli  # noqa: E402
from keras_gelu.converters.tflite import operators  # noqa: E402
import keras_gelu.qat  # noqa: E402
from keras_gelu.qat.keras3 import composite  # noqa: E402

pytestmark = pytest.mark.legs("keras3")

SEQUENCE, VOCABULARY = 16, 50
# The bar for an untrained backbone: the int8 .tflite's outputs against the QAT model's.
INT8_COSINE = 0.99


def _bert(rng):
    """As built: the backbone's two outputs (the sequence and the tanh pooler's), no head."""
    model = keras_hub.models.BertBackbone(vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=32,
                                          intermediate_dim=64, max_sequence_length=SEQUENCE)
    lengths = rng.integers(4, SEQUENCE + 1, size=(64, 1))
    mask = (np.arange(SEQUENCE) < lengths).astype(np.int32)
    inputs = {"token_ids": (rng.integers(1, VOCABULARY, size=(64, SEQUENCE)) * mask).astype(np.int32),
              "segment_ids": (np.arange(SEQUENCE) >= lengths // 2).astype(np.int32) * mask, "padding_mask": mask}
    return model, inputs


def _with_a_head(backbone, rng):
    """An image backbone and a Dense head on its class token."""
    head = keras.layers.Dense(4, name="head")(backbone.output[:, 0, :])
    return keras.Model(backbone.input, head), rng.uniform(0, 1, size=(64, 32, 32, 3)).astype(np.float32)


def _convnext(rng):
    """keras.applications' ConvNeXt as it is built (nested Sequential stem and downsampling blocks, LayerScale,
    StochasticDepth, grouped 7x7 convolutions, ImageNet Normalization), at depth 1 per stage and small widths."""
    from keras.src.applications.convnext import ConvNeXt

    model = ConvNeXt(depths=[1, 1, 1, 1], projection_dims=[8, 16, 24, 32], drop_path_rate=0.1, weights=None,
                     input_shape=(32, 32, 3), classes=4, name="convnext_micro")
    return model, rng.uniform(0, 255, size=(32, 32, 32, 3)).astype(np.float32)


FAMILIES = {
    "convnext": _convnext,
    "bert": _bert,
    "deit": lambda rng: _with_a_head(keras_hub.models.DeiTBackbone(
        image_shape=(32, 32, 3), patch_size=8, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64), rng),
}
# The int8 .tflite against the QAT graph, in output steps, where the converter's default of 10 is too tight:
# DeiT's roundings (three LayerNormalizations and an attention on the path to its class token, each op within
# a step or two of its own grid) add up to 19 steps of its untrained head's narrow output range, 3.7 on average
# (measured on an AVX-512 CPU, at cosine 0.999): the cosine is the bar.
MAX_STEPS = {"deit": 32}
# keras-hub's backbones are made of composite layers (TransformerEncoder, the embeddings), quantized through
# their sublayers; ConvNeXt's nested models are inlined.
COMPOSITE = {"bert", "deit"}
ON_ETHOS_U = {"convnext"}  # converted for Ethos-U55 too (Vela's operator counts)
FAMILIES_TODAY = todays_share(sorted(FAMILIES), 1)


def _first(values, count):
    return {key: value[:count] for key, value in values.items()} if isinstance(values, dict) else values[:count]


def _as_dict(outputs):
    return {key: np.asarray(value) for key, value in outputs.items()} if isinstance(outputs, dict) \
        else {"output_0": np.asarray(outputs)}


@pytest.fixture(scope="module")
def trained_and_converted(tmp_path_factory):
    """{family: (float model, QAT model, inputs, the QAT model's outputs before training, folder)}: each family
    quantized, trained two steps (eagerly) and saved as .keras; then every .keras file converted by
    keras-gelu-convert's main, which loads each in the converter's own sandboxed process (one that made none of
    them: what it loads, it loads as a fresh process would)."""
    trained, runs = {}, []
    for family in FAMILIES_TODAY:
        folder = tmp_path_factory.mktemp(family)
        keras.utils.set_random_seed(21)
        model, x = FAMILIES[family](np.random.default_rng(20261129))  # the same draws whichever runs today
        qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
        untrained = _as_dict(qat(_first(x, 16)))
        # Eagerly: tracing the training step of a QAT ConvNeXt and optimizing that graph took 29 s for its two
        # steps, eagerly they take 1.6 s; training in graphs, layer kind by layer kind, is test_keras3_qat's.
        qat.compile(keras.optimizers.Adam(1e-3), "mse", run_eagerly=True)
        # Two steps towards the float model's outputs (zeros would shrink the outputs until a cosine says nothing)
        float_outputs = keras.tree.map_structure(lambda output: np.asarray(output, np.float32), model(x))
        qat.fit(x, float_outputs, batch_size=32, epochs=1, verbose=0)
        qat.save(str(folder / "qat.keras"))
        sample = _first(x, 8)
        np.savez(folder / "inputs.npz", **sample) if isinstance(sample, dict) else np.savez(folder / "inputs.npz",
                                                                                            sample)
        trained[family] = (model, qat, x, untrained, folder)
        # For TFLite Micro: int8, as the model is quantization-aware, and run there where tflite-micro is
        # installed (BERT too: its token lookups are plain GATHERs of the ids it is given)
        command = [str(folder / "qat.keras"), "--target", "tflm",
                   "-o", str(folder / "qat.tflite"), "--inputs", str(folder / "inputs.npz"),
                   "--report-json", str(folder / "report.json"),
                   *(["--max-steps", str(MAX_STEPS[family])] if family in MAX_STEPS else [])]
        if isinstance(sample, dict):  # TFLite Micro needs static shapes
            command += [argument for name, values in sample.items()
                        for argument in ("--input-shape", f"{name}=1,{values.shape[1]}")]
        runs.append(command)
        if family in ON_ETHOS_U:
            runs.append([str(folder / "qat.keras"), "--target", "ethos-u55", "-o", str(folder / "ethos_u.tflite"),
                         "--report-json", str(folder / "ethos_u.json")])
    for argv in runs:
        assert cli.main(argv) == 0, argv
    return trained


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES_TODAY)
def test_a_real_family_trains_saves_loads_and_converts_integer_throughout(family, trained_and_converted):
    model, qat, x, untrained, folder = trained_and_converted[family]
    wrapped = [layer for layer in qat._flatten_layers() if isinstance(layer, composite.QuantizeSublayer)]
    assert wrapped or family not in COMPOSITE, "the backbone's composite layers are quantized through their sublayers"
    # The QAT model computed the float model's function, int8 rounding aside (its GELUs, its pooler's tanh...)
    for name, values in untrained.items():
        cosine = references.cosine(values, _as_dict(model(_first(x, 16)))[name])
        assert cosine >= INT8_COSINE, (name, cosine)
    loaded = keras.models.load_model(str(folder / "qat.keras"))
    sample = _first(x, 8)
    expected = _as_dict(loaded(sample))
    for name, values in _as_dict(qat(sample)).items():
        np.testing.assert_array_equal(expected[name], values)  # the ranges and weights as trained
    report = json.loads((folder / "report.json").read_text())
    assert report["quantization_aware"] and report["float_ops"] == {}, report["op_types"]
    assert not any(op.startswith("Flex") or op == "GELU" for op in report["ops"]), report["ops"]
    assert all(entry["cosine"] >= INT8_COSINE for entry in report["drift"]), report["drift"]
    if importlib.util.find_spec("tflite_micro") is not None:
        assert report["target"]["figures"]["arena_bytes"] > 0
    if family in ON_ETHOS_U and importlib.util.find_spec("ethosu") is not None:
        figures = json.loads((folder / "ethos_u.json").read_text())["target"]["figures"]
        assert figures["cpu_operators"] == 0 < figures["npu_operators"], figures


def test_a_composite_layer_without_a_rule_for_a_sublayer_is_refused_naming_it():
    """A layer of keras.ops alone is quantized op by op (test_backends); a BatchNormalization that no
    convolution takes in is not, and the composite holding one is refused, named."""

    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.dense, self.normalization = keras.layers.Dense(8), keras.layers.BatchNormalization()

        def call(self, x):
            return self.normalization(self.dense(x) + x)

    inputs = keras.Input((8,))
    with pytest.raises(ValueError, match=r"no rule for layer block \(Block\), nor for each of its sublayers"):
        keras_gelu.qat.quantize_model(keras.Model(inputs, Block(name="block")(inputs)))


def test_a_custom_composite_layer_is_quantized_through_and_its_own_arithmetic_gets_ranges(tmp_path, rng):
    """A residual block of yours: sublayers with rules, a fused GELU, an `x + residual` of its own."""
    import tflite_helpers
    from conversions import QAT_INT8_STEPS

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class Residual(keras.layers.Layer):
        def __init__(self, units, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.inner = keras.layers.Dense(2 * units, activation="gelu")
            self.outer = keras.layers.Dense(units)
            self.norm = keras.layers.LayerNormalization()

        def call(self, x):
            return self.norm(x + self.outer(self.inner(x)))

        def get_config(self):
            return {**super().get_config(), "units": self.units}

    keras.utils.set_random_seed(22)
    inputs = keras.Input((8,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(Residual(8, name="residual")(inputs)))
    x = rng.normal(size=(64, 8)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    block = qat.get_layer("quant_residual").layer
    assert isinstance(block.inner, composite.QuantizeSublayer) and block.inner.activation is not None
    # its input is the block's own x + ..., a Python operator on the backend's tensors, on the range of that add
    assert not block.norm.input_ranges
    assert [key.split("@")[0] for key in qat.get_layer("quant_residual").operation_ranges] == ["add"]
    qat.compile(keras.optimizers.Adam(1e-2), "mse")
    qat.fit(x, rng.normal(size=(64, 3)).astype(np.float32), epochs=1, verbose=0)
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())
    qat.export(str(tmp_path / "exported"), verbose=False)
    tflite_model, report = converters.convert(str(tmp_path / "exported"), int8=True)
    assert report.float_ops == {}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    assert np.max(np.abs(tflite_helpers.run(tflite_model, x)[0] - qat(x).numpy())) / scale <= QAT_INT8_STEPS


def test_a_composites_operators_selections_and_concatenations_convert_integer_throughout(tmp_path, rng):
    """keras-hub's layers compute with Python operators on the backend's tensors and its variables (EdRec's RMS
    normalization by 1 + scale, a rotary embedding's products), select between a tensor and zeros_like of it
    (Gemma's attention), concatenate a computed part with a slice (GPT-NeoX's rotated query), and call a
    function through a namespace of keras.ops (MiT's `ops.nn.gelu`, tanh: a cube in TensorFlow's own code): each ranged
    where TFLite computes, the selection and the concatenation on one scale, as TFLite holds them; SQUARE, POW
    and ZEROS_LIKE, which TFLite computes in float only, as MULs. A model loading calls the layer before its
    weights are set, and makes the same ranges."""
    import tflite_helpers

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class Normalization(keras.layers.Layer):
        def build(self, input_shape):
            self.scale = self.add_weight(name="scale", shape=(input_shape[-1],),
                                         initializer=keras.initializers.RandomUniform(-0.5, 0.5))

        def call(self, h):
            h = h * keras.ops.rsqrt(keras.ops.mean(keras.ops.square(h), axis=-1, keepdims=True) + 1e-6)
            return h * keras.ops.cast(1.0 + self.scale, h.dtype)

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.projection = keras.layers.Dense(8)
            self.normalization = Normalization()

        def call(self, x):
            h = keras.ops.nn.gelu(self.normalization(self.projection(x)))  # a keras.ops namespace (MiT's)
            rotated = keras.ops.concatenate([h[..., :4] * 0.5 - h[..., 4:] ** 2 * 0.25, h[..., 4:]], axis=-1)
            return keras.ops.where(x[..., :1] > 0.5, keras.ops.zeros_like(rotated), rotated)

    keras.utils.set_random_seed(23)
    inputs = keras.Input((6, 8), name="tokens")
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(Block(name="block")(inputs)))
    x = rng.normal(size=(64, 6, 8)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model)
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.fit(x, rng.normal(size=(64, 6, 3)).astype(np.float32), batch_size=16, epochs=1, verbose=0)
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())
    tflite_model, report = converters.convert(qat, int8=True)
    assert report.float_ops == {}, report.op_types
    assert {"CONCATENATION", "SELECT_V2", "RSQRT"} <= set(report.op_types)
    # A row's int8 RSQRT a step off QAT's float one moves the whole row, and the head sums it: the cosine is the bar
    values, qat_values = tflite_helpers.run(tflite_model, x)[0], qat(x).numpy()
    assert references.cosine(values, qat_values) >= INT8_COSINE


def test_a_composite_calling_dot_product_attention_converts_integer_throughout(tmp_path, rng):
    """keras.ops.dot_product_attention, which each backend computes in one call of its own (keras-hub's ESM, and
    every MultiHeadAttention subclass with a call of its own, through Keras's `_compute_attention`), as int8
    ops: grouped query heads, a padding mask (a sample padded from its first step, whose rows are masked off
    entirely), causal or not. The QAT model computes what the backend's own attention does, within rounding; its
    .tflite is integer throughout."""
    import tflite_helpers

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class GroupedAttention(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.query = keras.layers.Dense(8, name="query")  # 4 heads of 2
            self.key = keras.layers.Dense(4, name="key")  # 2 heads of 2, each read by two query heads
            self.value = keras.layers.Dense(4, name="value")
            self.projection = keras.layers.Dense(8, name="projection")

        def call(self, x, padding):
            def heads(h, count):
                return keras.ops.reshape(h, (-1, x.shape[1], count, 2))

            q, k, v = heads(self.query(x), 4), heads(self.key(x), 2), heads(self.value(x), 2)
            keep = keras.ops.cast(padding, "bool")[:, None, None, :]
            causal = keras.ops.dot_product_attention(q, k, v, mask=keep, is_causal=True)
            plain = keras.ops.dot_product_attention(q, k, v, scale=0.25)
            return self.projection(keras.ops.reshape(causal + plain, (-1, x.shape[1], 8)))

    keras.utils.set_random_seed(31)
    tokens, padding = keras.Input((6, 8), name="tokens"), keras.Input((6,), dtype="int32", name="padding")
    model = keras.Model([tokens, padding], GroupedAttention(name="attention")(tokens, padding))
    x = rng.normal(size=(64, 6, 8)).astype(np.float32)
    lengths = rng.integers(1, 7, size=64)
    lengths[0] = 0
    mask = (np.arange(6) < lengths[:, None]).astype(np.int32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=[x, mask])
    expected, computed = model([x, mask]).numpy(), qat([x, mask]).numpy()
    assert references.cosine(expected, computed) >= INT8_COSINE
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.fit([x, mask], rng.normal(size=(64, 6, 8)).astype(np.float32), batch_size=16, epochs=1, verbose=0)
    assert all(np.isfinite(variable.numpy()).all() for variable in qat.variables)
    qat.save(str(tmp_path / "qat.keras"))
    loaded = keras.models.load_model(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(loaded([x, mask]).numpy(), qat([x, mask]).numpy())
    tflite_model, report = converters.convert(qat, int8=True, input_shapes={"tokens": (1, 6, 8), "padding": (1, 6)})
    assert report.float_ops == {}, report.op_types
    assert {"BATCH_MATMUL", "SOFTMAX", "SELECT_V2"} <= set(report.op_types)
    # the .tflite's inputs in the order of their names: padding, tokens
    values = np.concatenate([tflite_helpers.run(tflite_model, mask[i:i + 1], x[i:i + 1])[0] for i in range(8)])
    assert references.cosine(values, qat([x[:8], mask[:8]]).numpy()) >= INT8_COSINE


def test_a_group_normalization_computing_its_moments_in_one_call_converts_integer_throughout(tmp_path, rng):
    """Keras's GroupNormalization calls keras.ops.moments, which each backend computes in one call of its own
    (keras-hub's Moonshine): its MEAN and SQUARED_DIFFERENCE stayed float. Computed as those int8 ops, each on
    a range, the QAT model is within rounding of the float one, and its .tflite integer throughout."""
    import tflite_helpers

    keras.utils.set_random_seed(33)
    inputs = keras.Input((12, 16), name="frames")
    hidden = keras.layers.GroupNormalization(groups=4, name="norm")(keras.layers.Conv1D(16, 3, name="conv")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(hidden))
    x = rng.normal(size=(64, 12, 16)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    expected, computed = model(x).numpy(), qat(x).numpy()
    assert references.cosine(expected, computed) >= INT8_COSINE
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.fit(x, rng.normal(size=(64, 10, 4)).astype(np.float32), batch_size=16, epochs=1, verbose=0)
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())
    tflite_model, report = converters.convert(qat, int8=True, input_shapes={"frames": (1, 12, 16)})
    assert report.float_ops == {}, report.op_types
    values = np.concatenate([tflite_helpers.run(tflite_model, x[i:i + 1])[0] for i in range(8)])
    qat_values = qat(x[:8]).numpy()
    assert references.cosine(values, qat_values) >= INT8_COSINE


def test_a_composite_mixing_tokens_with_a_fourier_transform_converts_integer_throughout(rng):
    """keras.ops.fft2, which TFLite has no op for (nor complex numbers), as products with cosine and sine
    matrices on ranges: FNet's token mixing (the real part, of a real input) and a transform of a complex
    input. The QAT model computes what the backend's FFT does, within rounding; its .tflite is integer."""
    import tflite_helpers

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class FourierMixing(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.projection = keras.layers.Dense(8, name="projection")

        def call(self, x):
            mixed, _ = keras.ops.fft2((x, keras.ops.zeros_like(x)))  # FNet's
            real, imaginary = keras.ops.fft2((x, self.projection(x)))
            return mixed + 0.5 * real - 0.25 * imaginary

    keras.utils.set_random_seed(34)
    inputs = keras.Input((6, 8), name="tokens")
    model = keras.Model(inputs, keras.layers.Dense(4, name="head")(FourierMixing(name="mixing")(inputs)))
    x = rng.normal(size=(64, 6, 8)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    expected, computed = model(x).numpy(), qat(x).numpy()
    assert references.cosine(expected, computed) >= INT8_COSINE
    tflite_model, report = converters.convert(qat, int8=True, input_shapes={"tokens": (1, 6, 8)})
    assert report.float_ops == {}, report.op_types
    values = np.concatenate([tflite_helpers.run(tflite_model, x[i:i + 1])[0] for i in range(8)])
    qat_values = qat(x[:8]).numpy()
    assert references.cosine(values, qat_values) >= INT8_COSINE


def test_beyond_the_default_steps_a_qat_tflite_is_judged_by_its_graphs_rounding_envelope(monkeypatch, rng):
    """Where a QAT model's .tflite is beyond the default limit in steps (here the limit is 0), the rewritten
    graph's own rounding envelope judges it. A converter off by 0.2 % in its weights' scales is within it (as
    the rounding of TFLite's kernels is), and the report says by how much; one off by 5 % is far outside it,
    and the message says so; with a limit of the user's own, that limit alone judges."""
    import tflite_helpers
    from keras_gelu.converters import errors
    from keras_gelu.converters import options as conversion_options
    from keras_gelu.converters.running import pipeline

    keras.utils.set_random_seed(32)
    inputs = keras.Input((16,), name="features")
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Dense(32, activation="gelu")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(8, name="head")(keras.layers.Dense(32, activation="gelu")(hidden)))
    qat = keras_gelu.qat.quantize_model(model, calibration_data=rng.normal(size=(64, 16)).astype(np.float32))
    monkeypatch.setattr(conversion_options, "DEFAULT_QAT_STEPS", 0.0)
    to_tflite = pipeline.to_tflite

    def converter_off_by(factor):
        monkeypatch.setattr(pipeline, "to_tflite", lambda *args, **kwargs: (
            tflite_helpers.with_int8_weight_scales_scaled(to_tflite(*args, **kwargs), factor)))

    converter_off_by(1.002)
    _, report = converters.convert(qat, int8=True)
    (fidelity,) = report.fidelity
    envelope = report.tolerance["rounding_envelope"]
    assert fidelity["passed"] and 0 < fidelity["steps"] <= envelope["steps"][fidelity["output"]] + 1e-3
    assert "rounding envelope" in report.to_text()
    with pytest.raises(errors.ParityFailure, match=r"> 0\.0 int8 steps; pass --max-steps"):
        converters.convert(qat, int8=True, max_steps=0.0)
    converter_off_by(1.05)
    with pytest.raises(errors.ParityFailure, match=r"nor within the rounding envelope of \d+\.\d steps"):
        converters.convert(qat, int8=True)


def test_a_composite_keeps_the_activation_layer_it_takes_as_an_argument_through_save_and_load(tmp_path, rng):
    """As keras-hub's TransformerEncoder after swap_activations gives it our GELU layer: the layer holds its
    `activation` argument and hands it to a Dense. The QAT copy must save that argument, not the stand-in its
    QAT copy holds (which, on load, was built into the Dense). A Wrapper's `layer` is such an argument too."""

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class FeedForward(keras.layers.Layer):
        def __init__(self, activation, **kwargs):
            super().__init__(**kwargs)
            self.activation = keras.activations.get(activation) if isinstance(activation, str) else activation
            self.inner = keras.layers.Dense(16, activation=self.activation)
            self.outer = keras.layers.Dense(4)

        def call(self, x):
            return self.outer(self.inner(x))

        def get_config(self):
            return {**super().get_config(), "activation": keras.saving.serialize_keras_object(self.activation)}

        @classmethod
        def from_config(cls, config):
            return cls(**{**config, "activation": keras.saving.deserialize_keras_object(config["activation"])})

    inputs = keras.Input((8,))
    model = keras.Model(inputs, FeedForward(keras_gelu.GELU("tanh"), name="ffn")(inputs))
    x = rng.normal(size=(32, 8)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    saved = qat.get_layer("quant_ffn").get_config()["layer"]["config"]["activation"]
    assert saved["class_name"] == "GELU", saved  # the argument as it was given, not the QAT stand-in
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())


def test_a_layer_whose_own_gelu_was_swapped_quantizes_saves_and_loads(tmp_path, rng):
    """swap_activations wraps a layer whose own code builds its activation (keras-hub ViT's MLP) in
    InnerActivations: QAT goes through the wrapper to the layer and its Dense, whose LearnableGELU gets its rule."""

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class Block(keras.layers.Layer):
        def build(self, input_shape):
            self.inner = keras.layers.Dense(16, activation="gelu")  # made in build(), as keras-hub's MLP does
            self.inner.build(input_shape)
            self.outer = keras.layers.Dense(4)
            self.outer.build((*input_shape[:-1], 16))

        def call(self, x):
            return self.outer(self.inner(x)) + x[..., :4]

    inputs = keras.Input((8,))
    model = keras.Model(inputs, Block(name="block")(inputs))
    swapped = keras_gelu.swap_activations(model, {"gelu": keras_gelu.LearnableGELU})
    x = rng.normal(size=(32, 8)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(swapped, calibration_data=x)
    names = [weight.path for weight in qat.weights]
    assert any(name.endswith("_gelu/alpha_min") for name in names), names  # the LearnableGELU, quantized through
    assert "quant_block/output_min" in names  # ... and the block's own `... + x[..., :4]` on a range
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())


def test_a_model_a_composite_holds_is_quantized_through_its_layers_at_the_shape_it_is_called_at(tmp_path, rng):
    """A Sequential a composite holds, built at one shape and called at another, as keras-hub's SAM builds its
    mask downscaler for masks of 4 times the image embedding and calls it at the masks' own size: each of its
    layers is quantized with its rule (its convolutions' kernels on ranges), the model runs at the shape it is
    called at, in a training step too (its __call__'s input check refused that shape), saves, loads and converts
    integer throughout."""
    import tflite_helpers

    @keras.saving.register_keras_serializable(package="test_qat_real_models")
    class Downscaled(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.downscaler = keras.Sequential([
                keras.layers.Conv2D(4, 2, strides=2, name="reduce"), keras.layers.LayerNormalization(name="norm"),
                keras.layers.Activation("gelu", name="gelu"), keras.layers.Conv2D(3, 1, name="project")],
                name="downscaler")

        def build(self, input_shape):
            self.downscaler.build((None, 16, 16, 1))

        def call(self, x):
            return self.downscaler(x) + 1.0

    keras.utils.set_random_seed(37)
    inputs = keras.Input((8, 8, 1), name="mask")
    model = keras.Model(inputs, Downscaled(name="block")(inputs))
    x = rng.normal(size=(16, 8, 8, 1)).astype(np.float32)
    qat = keras_gelu.qat.quantize_model(model, calibration_data=x)
    downscaler = qat.get_layer("quant_block").layer.downscaler
    assert [stand_in.layer.name for stand_in in downscaler.stand_ins] == ["reduce", "norm", "gelu", "project"]
    names = [variable.path for variable in qat.variables]
    assert {"block/quant_downscaler/quant_reduce/kernel_min", "block/quant_downscaler/quant_project/kernel_min"} \
        <= set(names), names
    # calibrated, untrained: the QAT model computes the float one within int8 rounding
    expected, computed = model(x).numpy(), qat(x).numpy()
    assert references.cosine(expected, computed) >= INT8_COSINE
    qat.compile(keras.optimizers.Adam(1e-3), "mse")
    qat.train_on_batch(x, rng.normal(size=(16, 4, 4, 3)).astype(np.float32))
    assert all(np.isfinite(variable.numpy()).all() for variable in qat.variables)
    qat.save(str(tmp_path / "qat.keras"))
    np.testing.assert_array_equal(keras.models.load_model(str(tmp_path / "qat.keras"))(x).numpy(), qat(x).numpy())
    tflite_model, report = converters.convert(qat, int8=True)
    assert report.float_ops == {}, report.op_types
    values, qat_values = tflite_helpers.run(tflite_model, x)[0], qat(x).numpy()
    assert references.cosine(values, qat_values) >= INT8_COSINE
