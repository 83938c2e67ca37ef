"""--int16: 16x8 models (int16 activations, int8 weights), for every GELU form, on LiteRT and in TFLite Micro.

The every-GELU model (exact, tanh, sigmoid and learnable GELUs between Dense layers) converts, in each form
builtin mode spells them and in native mode, to a model integer throughout whose every computing op outputs
int16; against the float model it is at least as close as the same model in int8 (the same int8 weights,
activations on grids 256 times finer); with --target tflm it runs in TFLite Micro. Runtimes without 16x8 refuse it
in one line.
"""

import re

import numpy as np
import pytest

import conversions
import references
import tflite_helpers
from conftest import EVERY_CASE
from conftest import IS_KERAS3
from conftest import keras
from conftest import last_error_line
from conftest import rotated
from gelu_models import every_gelu_functional
from keras_gelu import converters
from keras_gelu.converters import cli
from keras_gelu.converters import errors

pytestmark = pytest.mark.legs("keras3", "tf_keras")

# TFLite Micro's int16 kernels against LiteRT's on the same 16x8 .tflite, in int16 output steps: separate code
# (TFLM's reference kernels; LiteRT's, whose int16 LOGISTIC interpolates its table differently) rounding apart
# at each of the model's seven quantized layers. Measured: 12 steps. A quarter of an int8 step (64 int16 steps)
# still holds 16x8 four times finer than int8 can be.
TFLM_INT16_STEPS = 64.0

FORMS = rotated(conversions.REWRITING)


@pytest.fixture(scope="module")
def every_gelu_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("every_gelu") / "model.keras"
    every_gelu_functional(seed=3).save(str(path))
    return str(path)


def _computing_types(report):
    """{op: output types} of every op but the float edges (QUANTIZE of the input, DEQUANTIZE of the output)."""
    return {op: set(types) for op, types in report.op_types.items() if op not in ("QUANTIZE", "DEQUANTIZE")}


@pytest.mark.parametrize("mode, exact_as", FORMS, ids=conversions.ids(FORMS))
def test_every_form_converts_to_int16_throughout_and_no_further_from_the_float_model_than_int8(
        every_gelu_model, mode, exact_as):
    options = dict(mode=mode, exact_as=exact_as, calibration="random:16")
    _, int16 = converters.convert(every_gelu_model, int16=True, **options)
    _, int8 = converters.convert(every_gelu_model, int8=True, **options)
    assert int16.step_type == "int16" and int16.float_ops == {}, int16.op_types
    assert all(types == {"int16"} for types in _computing_types(int16).values()), int16.op_types
    assert int16.op_types["QUANTIZE"] == {"int16": 1}
    if mode == "native":
        assert "GELU" in int16.op_types, int16.op_types  # the GELU op itself, at 16x8
    cosine = {report.step_type: min(c["cosine"] for c in report.drift) for report in (int16, int8)}
    assert cosine["int16"] >= cosine["int8"] - 1e-5, cosine  # the same rounding of the weights, finer activations
    assert int16.budget["passed"] and int16.budget["min_cosine"] == 0.99


@pytest.mark.parametrize("exact_as", rotated(("sigmoid", "tanh", "erf")))
def test_every_builtin_form_at_int16_runs_in_tflite_micro(every_gelu_model, exact_as):
    pytest.importorskip("tflite_micro")
    _, report = converters.convert(every_gelu_model, target="tflm", int16=True, exact_as=exact_as,
                                   calibration="random:16")
    section = report.target
    assert section["runtime_check"].startswith("ran in TFLite Micro"), section
    assert section["figures"]["arena_bytes"] > 0
    (agreement,) = section["agreement"]
    assert agreement["steps"] <= TFLM_INT16_STEPS, agreement
    assert all(types == {"int16"} for types in _computing_types(report).values()), report.op_types


@pytest.mark.parametrize("flags, code, said", [
    (["--target", "edgetpu"], 2, "--target edgetpu: Coral Edge TPU runs no 16x8 model (int16 activations); drop "
                                 "--int16"),
    (["--target", "gpu"], 2, "runs no 16x8 model"),
    (["--float16-weights"], 2, "--int16 and --float16-weights exclude each other"),
    ([], errors.BadInputs.exit_code, "needs --calibration file.npz or random:N for --int16"),
])
def test_what_cannot_be_16x8_is_refused_in_one_line(every_gelu_model, tmp_path, capsys, flags, code, said):
    output = tmp_path / "m.tflite"
    if code == 2:
        with pytest.raises(SystemExit) as exit_info:
            cli.main([every_gelu_model, "--int16", "-o", str(output), *flags])
        assert exit_info.value.code == 2
    else:
        assert cli.main([every_gelu_model, "--int16", "-o", str(output), *flags]) == code
    assert said in last_error_line(capsys.readouterr().err) and not output.exists()


def test_a_quantization_aware_model_is_refused_for_int16(tmp_path, capsys):
    """Its ranges were trained for int8 grids: one line, and the way to 16x8."""
    from keras_gelu import qat

    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((8,), name="x"), keras.layers.Dense(8, activation="gelu"),
                              keras.layers.Dense(2)])
    x = np.random.default_rng(4).normal(size=(32, 8)).astype(np.float32)
    quantized = qat.quantize_model(model, calibration_data=x)
    path = str(tmp_path / "qat")
    quantized.export(path, verbose=False) if IS_KERAS3 else quantized.save(path)  # a SavedModel in both
    code = cli.main([path, "--int16", "-o", str(tmp_path / "m.tflite")])
    line = last_error_line(capsys.readouterr().err)
    assert code == errors.BadInputs.exit_code and re.search(r"trained for int8 ranges; drop --int16", line), line


def test_a_layer_normalization_converts_to_16x8_that_litert_runs(tmp_path):
    """A LayerNormalization's variance is a squared difference, whose LiteRT kernel has no int16 (the benchmark's
    ViT and ConvNeXt were written and left unverified): in 16x8 it is a SUB and a MUL, which LiteRT runs; and an
    integer model LiteRT cannot run is refused, not written unverified. tf-keras's is a FusedBatchNormV3 on its
    rows, which the stock converter lowered itself, into that SQUARED_DIFFERENCE and a FILL of zeros on scale 0
    (refused, exit 11): it is written as its moments first (int8.batch_statistics_as_moments)."""
    keras.utils.set_random_seed(4)
    inputs = keras.Input((8, 16), name="x")
    hidden = keras.layers.Dense(32, activation="gelu")(keras.layers.LayerNormalization()(inputs))
    path = str(tmp_path / "normalized.keras")
    keras.Model(inputs, keras.layers.Dense(4)(hidden)).save(path)
    _, report = converters.convert(path, int16=True, calibration="random:8")
    assert report.verified and report.budget["passed"], report.not_verified_reason
    assert "SQUARED_DIFFERENCE" not in report.ops and set(report.op_types["SUB"]) == {"int16"}, report.op_types


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_a_batch_normalized_by_its_own_statistics_with_a_scale_and_offset_converts_to_16x8(tmp_path, data_format):
    """The other spellings of a fused batch normalization computing its batch's statistics (the one above is
    tf-keras's, NCHW with a scale of ones and an offset of zeros): either data format, a scale and an offset of
    the channels' own, and its moments written out the same way; LiteRT runs the 16x8 model, and it stays within
    the budget of the float model, computed here in float64 as the op is defined (the batch's biased variance)."""
    import tensorflow as tf

    rng = np.random.default_rng(5)
    channels_axis = 3 if data_format == "NHWC" else 1
    scale, offset = rng.uniform(0.5, 2.0, 6).astype(np.float32), rng.normal(size=6).astype(np.float32)
    shape = [1, 4, 5, 6] if data_format == "NHWC" else [1, 6, 4, 5]

    def batch_normalized(x):
        normalized, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, epsilon=1e-3, is_training=True,
                                                             data_format=data_format)
        return {"y": tf.nn.gelu(normalized, approximate=False)}

    path = conversions.saved_function(tmp_path, "batch_norm", batch_normalized,
                                      tf.TensorSpec(shape, tf.float32, name="x"))
    x = rng.normal(2.0, 3.0, size=shape).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    tflite_model, report = converters.convert(path, int16=True, calibration=str(tmp_path / "x.npz"),
                                              inputs=str(tmp_path / "x.npz"))
    assert report.verified and report.budget["passed"], report.not_verified_reason
    assert "SQUARED_DIFFERENCE" not in report.ops and report.float_ops == {}, report.op_types
    axes = tuple(axis for axis in range(4) if axis != channels_axis)
    wide = x.astype(np.float64)
    by_channel = [1, -1, 1, 1] if data_format == "NCHW" else [-1]
    normalized = (wide - wide.mean(axes, keepdims=True)) / np.sqrt(wide.var(axes, keepdims=True) + 1e-3)
    normalized = normalized * scale.reshape(by_channel) + offset.reshape(by_channel)
    expected = references.gelu_exact(normalized)
    (actual,) = tflite_helpers.run(tflite_model, x)
    cosine = references.cosine(actual, expected)
    assert cosine > 0.999, cosine  # 16x8: a cosine of 0.99998 or more in the tests above


@pytest.mark.skipif(not IS_KERAS3, reason="keras.applications' ConvNeXt of Keras 3 (tf-keras's has no LayerScale)")
def test_keras_applications_convnext_converts_to_16x8_with_its_gamma_of_ones_on_a_grid(tmp_path, rng):
    """ConvNeXt's head normalizes with a LayerNormalization whose gamma is all ones before training. The older
    quantizer, which makes 16x8, gave that constant of one value the scale its range's span gives, 0 divided by
    0: NaN, which the validation refused (exit 11; the benchmark's ConvNeXt had no 16x8 model). Put on the grid
    whose largest step is its value (tflite/quantizer.py), it converts integer throughout, and on images the
    calibration did not see it is nearer the Keras model than its int8 conversion."""
    from keras.src.applications.convnext import ConvNeXt

    keras.utils.set_random_seed(1)
    model = ConvNeXt(depths=[1, 1, 1, 1], projection_dims=[8, 16, 24, 32], weights=None, input_shape=(32, 32, 3),
                     classes=4, name="convnext_micro")
    images = rng.uniform(0, 255, size=(12, 32, 32, 3)).astype(np.float32)  # pixels, as its Normalization takes
    np.savez(tmp_path / "calibration.npz", images[:8])
    unseen = images[8:]
    expected = np.asarray(model(unseen))
    cosines = {}
    for kind in ("int16", "int8"):
        tflite_model, report = converters.convert(model, calibration=str(tmp_path / "calibration.npz"),
                                                  **{kind: True})
        assert report.verified and report.float_ops == {}, (kind, report.not_verified_reason, report.op_types)
        actual = np.concatenate([tflite_helpers.run(tflite_model, unseen[index:index + 1])[0]
                                 for index in range(len(unseen))])
        cosines[kind] = references.cosine(actual, expected)
    # measured: 0.9973 and 0.9904 (eight calibration images clip what others reach: 0.9998 and 0.9994 with 32)
    assert cosines["int16"] >= cosines["int8"] and cosines["int16"] > 0.99, cosines


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
def test_tokens_of_zeros_tiled_over_the_batch_convert_to_16x8_and_compute_the_float_model(tmp_path, rng):
    """GroupViT's group tokens are zeros before training, tiled over the batch and concatenated with the patches.
    The older quantizer, which makes 16x8, gave the zeros scale 0, and the TILE writing them the same; the
    constant's scale was repaired and the TILE's not, which the validation refused ("scale 0.0; nothing
    written"). The TILE's output takes its input's scale (tflite/quantizer.py): integer throughout, and the
    computation is the float model's within 16x8's rounding."""
    import tensorflow as tf

    class GroupTokens(tf.Module):
        def __init__(self):
            super().__init__()
            self.tokens = tf.Variable(tf.zeros([1, 2, 4]))
            self.kernel = tf.Variable(rng.normal(size=(4, 4)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 3, 4], tf.float32, name="x")])
        def serve(self, x):
            joined = tf.concat([tf.tile(self.tokens, [tf.shape(x)[0], 1, 1]), x], axis=1)
            return {"y": tf.nn.gelu(tf.matmul(joined, self.kernel), approximate=False)}

    module = GroupTokens()
    tf.saved_model.save(module, str(tmp_path / "group_tokens"), signatures={"serving_default": module.serve})
    x = rng.normal(size=(8, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "calibration.npz", x=x)
    tflite_model, report = converters.convert(str(tmp_path / "group_tokens"), int16=True,
                                              calibration=str(tmp_path / "calibration.npz"))
    assert report.verified and report.float_ops == {}, (report.not_verified_reason, report.op_types)
    assert "TILE" in report.op_types and set(report.op_types["TILE"]) == {"int16"}, report.op_types
    tokens_then_patches = np.concatenate([np.zeros((1, 2, 4)), x[:1]], axis=1)
    expected = references.gelu_exact(tokens_then_patches @ module.kernel.numpy().astype(np.float64))
    (actual,) = tflite_helpers.run(tflite_model, x[:1])
    assert references.cosine(actual, expected) > 0.9999, references.cosine(actual, expected)


def test_int16_inputs_and_outputs_change_only_the_model_s_edges(every_gelu_model, rng):
    """--int8-io with --int16: int16 inputs and outputs, on the grids the float-I/O model quantizes to and from
    inside itself, so that both compute the same values."""
    import tflite_helpers
    from keras_gelu.converters.running import verify

    x = rng.normal(0.0, 2.0, size=(16, 12)).astype(np.float32)
    outputs = {}
    for int16_io in (False, True):
        tflite_model, report = converters.convert(every_gelu_model, int16=True, int8_io=int16_io,
                                                  calibration="random:8")
        interpreter = verify.interpreter_keeping_every_tensor(tflite_model)
        types = {detail["dtype"] for detail in interpreter.get_input_details() + interpreter.get_output_details()}
        assert types == {np.int16 if int16_io else np.float32} and report.verified, (types, report.verified)
        outputs[int16_io] = tflite_helpers.run(tflite_model, x)[0]
    np.testing.assert_array_equal(outputs[True], outputs[False])


@pytest.mark.legs("tf_keras")  # a TensorFlow graph, any flavour: one leg
def test_token_ids_read_by_integer_ops_convert_to_16x8_and_those_ops_stay_what_they_were(tmp_path, rng):
    """Token ids compared with the padding id and counted, as a language model makes its mask and positions:
    the older quantizer, which makes 16x8, asked a range of the ids ("Max and min for dynamic tensors should be
    recorded during calibration: Failed for tensor ids"; the stock converter's 16x8 fails the same way). Ops on
    integers alone are shown to it as ops it leaves alone, and have their own back: the same integer ops as in
    the int8 model, and the outputs as close to the float model's as the int8 model's or closer."""
    import tensorflow as tf
    import tflite_helpers

    vocabulary, length, width = 40, 12, 16
    table = tf.constant(rng.normal(size=(vocabulary, width)).astype(np.float32))
    kernel = tf.constant(rng.normal(0.0, 0.25, size=(width, width)).astype(np.float32))

    def embedded(ids):
        kept = tf.not_equal(ids, 0)
        positions = tf.cumsum(tf.cast(kept, tf.int32), axis=1) * tf.cast(kept, tf.int32)
        x = tf.gather(table, ids) + tf.gather(table, positions)
        x = tf.nn.gelu(tf.matmul(x, kernel), approximate=False) * tf.cast(kept, tf.float32)[..., None]
        return {"y": x}

    path = conversions.saved_function(tmp_path, "model", embedded, tf.TensorSpec([1, length], tf.int32, name="ids"))
    ids = rng.integers(0, vocabulary, size=(16, length)).astype(np.int32)
    ids[:, length - 3:] = 0
    np.savez(tmp_path / "calibration.npz", ids=ids)
    options = dict(calibration=str(tmp_path / "calibration.npz"))
    _, int16 = converters.convert(path, int16=True, **options)
    _, int8 = converters.convert(path, int8=True, **options)
    integer = {report.step_type: tflite_helpers.integer_outputs(report) for report in (int16, int8)}
    assert integer["int16"] == integer["int8"] and "NOT_EQUAL" in integer["int16"], integer
    assert int16.budget["cosine"] >= int8.budget["cosine"] - 1e-6, (int16.budget, int8.budget)


@pytest.mark.legs("tf_keras")  # TensorFlow graphs, any flavour: the leg with time to spare
def test_a_branch_no_calibration_sample_took_stays_float_at_16x8_as_at_int8(tmp_path, rng):
    """A conditional whose branch no calibration sample took has no range for what that branch computes (LED's
    global attention, where no sample has a global position): the older quantizer refused it ("Max and min for
    dynamic tensors should be recorded during calibration"), where the int8 quantizer keeps the IF float with
    what it runs. So does 16x8 now, and the rest is as close to the float model as int16 makes it."""
    import tensorflow as tf

    kernel = tf.constant(rng.normal(0.0, 0.33, size=(8, 8)).astype(np.float32))

    def branched(x, flag):
        h = tf.nn.gelu(tf.matmul(x, kernel), approximate=False)
        taken = tf.cond(tf.reduce_any(flag > 0), lambda: h * 2.0 + tf.ones_like(h), lambda: h - 0.5)
        return {"y": tf.matmul(taken, kernel)}

    path = conversions.saved_function(tmp_path, "branched", branched, tf.TensorSpec([None, 8], tf.float32, name="x"),
                                      tf.TensorSpec([None], tf.int32, name="flag"))
    np.savez(tmp_path / "samples.npz", x=rng.normal(size=(16, 8)).astype(np.float32), flag=np.zeros(16, np.int32))
    _, report = converters.convert(path, int16=True, calibration=str(tmp_path / "samples.npz"))
    assert "IF" in report.float_ops and report.budget["cosine"] >= 0.999, (report.float_ops, report.budget)


@pytest.mark.legs("tf_keras")  # TensorFlow graphs, any flavour: the leg with time to spare
def test_a_channel_of_zero_weights_keeps_a_grid_at_16x8(tmp_path, rng):
    """The older quantizer puts a weight channel of zeros on scale 0, and its bias's channel too (keras-hub's
    FNet: its Fourier transform's sines at frequency 0; Gemma 3n: a gate of zeros before training): no runtime
    takes a scale of 0, and the .tflite was refused. On the other channels' grid, zeros still: against the
    float64 product."""
    import tensorflow as tf

    kernel = rng.normal(size=(8, 4)).astype(np.float32)
    kernel[:, 0] = 0.0
    bias = np.array([0.0, 0.5, -0.5, 1.0], np.float32)

    def projected(x):
        return {"y": tf.nn.relu(tf.matmul(x, tf.constant(kernel)) + tf.constant(bias))}

    path = conversions.saved_function(tmp_path, "projected", projected, tf.TensorSpec([None, 8], tf.float32, name="x"))
    x = rng.normal(size=(16, 8)).astype(np.float32)
    np.savez(tmp_path / "samples.npz", x=x)
    tflite_model, report = converters.convert(path, int16=True, calibration=str(tmp_path / "samples.npz"))
    assert report.float_ops == {} and "FULLY_CONNECTED" in report.ops, report.op_types
    expected = np.maximum(x.astype(np.float64) @ kernel + bias, 0.0)
    (output,) = tflite_helpers.run(tflite_model, x)
    assert np.all(output[:, 0] == 0.0) and references.cosine(output, expected) >= 0.9999


@pytest.mark.legs("tf_keras")  # TensorFlow graphs, any flavour: the leg with time to spare
def test_a_sum_past_its_inputs_range_keeps_its_value_at_16x8(tmp_path, rng):
    """The older quantizer gives an int16 SUM its input's grid (LiteRT's kernel rescales 8-bit sums only): a mask
    of ones summed to a length, as Hugging Face's Wav2Vec2 counts its frames, saturated at 1, and the length less
    10 at 0. Written as the mean times the count, it keeps its value; against the float64 product."""
    import tensorflow as tf

    from keras_gelu.converters.running import verify

    def lengths(mask, x):
        return {"y": x * (tf.reduce_sum(mask, axis=-1, keepdims=True) - 10.0)}

    path = conversions.saved_function(tmp_path, "lengths", lengths, tf.TensorSpec([None, 16], tf.float32, name="mask"),
                                      tf.TensorSpec([None, 16], tf.float32, name="x"))
    mask = (np.arange(16) < rng.integers(12, 17, size=(16, 1))).astype(np.float32)  # lengths of 12 to 16
    x = rng.normal(size=(16, 16)).astype(np.float32)
    np.savez(tmp_path / "samples.npz", mask=mask, x=x)
    tflite_model, report = converters.convert(path, int16=True, calibration=str(tmp_path / "samples.npz"))
    assert "SUM" not in report.ops and report.float_ops == {}, report.op_types
    expected = x.astype(np.float64) * (mask.sum(axis=-1, keepdims=True) - 10.0)
    output = verify.interpreter_class()[0](model_content=tflite_model).get_signature_runner()(mask=mask, x=x)["y"]
    assert references.cosine(output, expected) >= 0.9999, references.cosine(output, expected)


@pytest.mark.legs("tf_keras")  # transformers' TF models are tf-keras models
@pytest.mark.through_the_sandbox  # one aborted LiteRT: in a worker, a regression is a refusal, not the leg's end
# LED (40 s) with every case (`make test-every-case`), as the Hugging Face families' slowest are
@pytest.mark.parametrize("family", ["TFViTMAEModel", "TFOpenAIGPTModel"] + (["TFLEDModel"] if EVERY_CASE else []))
def test_hugging_face_families_the_older_quantizer_failed_convert_to_16x8(tmp_path, family):
    """ViT-MAE: the older quantizer wrote a float constant's int16 values into the buffer it shared with an int32
    0 of the same four bytes (the begin and the axis of ViT-MAE's shape slices and products), which was left two
    bytes long: LiteRT refused the model ("Tensor 40 is invalidly specified in schema"). Each constant has a
    buffer of its own while it quantizes. LED: its global attention's branches, which no sample takes, kept
    float, read a constant of zeros the quantizer put on scale 0 beside one it quantized, and the float copy of
    the second met the int16 first in a SELECT_V2 LiteRT refused; each constant gets its grid before an op left
    float gets its float copies. OpenAI GPT: its added attention mask, written as a selection, adds the mask's
    other values (zeros, calibrated on a grid of 1e-9) to a product on one of 3e-5, which LiteRT's int16 ADD
    aborted on (tflite/kernel_grids.py). Each 16x8 model keeps the budget."""
    pytest.importorskip("transformers")
    import hugging_face_families

    family = hugging_face_families.traced(family)
    path, samples = hugging_face_families.save(family, tmp_path)
    _, report = converters.convert(path, int16=True, calibration=samples)
    assert report.verified and report.budget["cosine"] >= 0.99, report.budget
