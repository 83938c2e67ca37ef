"""Models you did not make: refused before anything of them runs, converted with --trust-model.

Each dangerous model would leave a file behind if any of it ran; the tests
check that the file is absent after a refusal. Harmless models of every
format are checked throughout the rest of the suite, which never passes
--trust-model.
"""

import json
import os
import sys

import pytest
import tensorflow as tf

from conftest import keras
from conftest import keras3_only
from conftest import tf_keras_only
from keras_gelu import converters
from keras_gelu.converters import cli
from keras_gelu.converters import errors

FLEX_RUNS = tf.__version__.startswith(("2.18", "2.17"))


class FileWriter(tf.Module):
    """A signature that writes a file as a side effect, then computes a GELU."""

    def __init__(self, target):
        super().__init__()
        self.target = target

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def __call__(self, x):
        tf.io.write_file(self.target, tf.strings.as_string(tf.reduce_sum(x)))
        return {"y": tf.nn.gelu(x, approximate=False)}


@pytest.fixture
def side_effect(tmp_path):
    return tmp_path / "side_effect_happened"


def _refused(argv, capsys, side_effect):
    code = cli.main(argv)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == errors.UntrustedModel.exit_code, line
    assert line.startswith("keras-gelu-convert: error: ") and "refused" in line and "--trust-model" in line
    assert not side_effect.exists()
    return line


def test_saved_model_writing_a_file_is_refused_then_trusted(tmp_path, side_effect, capsys):
    module = FileWriter(str(side_effect))
    path = str(tmp_path / "writer")
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
    output = tmp_path / "writer.tflite"
    line = _refused([path, "--mode", "select", "-o", str(output)], capsys, side_effect)
    assert "op WriteFile" in line and "__call__" in line
    assert not output.exists()

    assert cli.main([path, "--mode", "select", "--trust-model", "-o", str(output)]) == 0
    assert "model trusted (--trust-model)" in capsys.readouterr().err
    assert output.exists()
    # Only TF 2.18's interpreter runs the Flex ops, so only there is the
    # model verified, which runs its WriteFile (in TensorFlow and in Flex).
    assert side_effect.exists() == FLEX_RUNS


def test_print_to_a_file_is_refused_but_print_to_stderr_is_not(tmp_path, side_effect):
    class Printer(tf.Module):
        def __init__(self, stream):
            super().__init__()
            self.stream = stream

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, x):
            tf.print(tf.reduce_max(x), output_stream=self.stream)
            return {"y": tf.nn.gelu(x, approximate=True)}

    for stream, refused in ((f"file://{side_effect}", True), (sys.stderr, False)):
        module = Printer(stream)
        path = str(tmp_path / ("printer_file" if refused else "printer_stderr"))
        tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
        if refused:
            with pytest.raises(errors.UntrustedModel, match="op PrintV2 .* prints to a file"):
                converters.convert(path, mode="select")
            assert not side_effect.exists()
        else:
            _, report = converters.convert(path, mode="select", verify=False)
            assert not report.trusted


def test_file_op_inside_a_cond_branch_is_found(tmp_path, side_effect):
    class Branchy(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, x):
            def write():
                tf.io.write_file(str(side_effect), "x")
                return x

            return {"y": tf.cond(tf.reduce_sum(x) > 1e9, write, lambda: tf.nn.gelu(x))}

    module = Branchy()
    path = str(tmp_path / "branchy")
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
    with pytest.raises(errors.UntrustedModel, match="op WriteFile"):
        converters.convert(path)


def test_ops_only_outside_the_chosen_signature_do_not_count(tmp_path, side_effect):
    """Every SavedModel holds SaveV2/RestoreV2 in its saver functions; the signature never runs them."""
    module = FileWriter(str(side_effect))
    harmless = tf.function(lambda x: {"y": tf.nn.gelu(x)},
                           input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    path = str(tmp_path / "two_signatures")
    tf.saved_model.save(module, path, signatures={"serving_default": harmless, "writes": module.__call__})
    _, report = converters.convert(path)
    assert report.verified and not side_effect.exists()
    with pytest.raises(errors.UntrustedModel):
        converters.convert(path, signature="writes")


@tf_keras_only
def test_tf_keras_h5_lambda_is_refused_before_its_code_runs(tmp_path, side_effect, capsys):
    command = f"touch {side_effect}"
    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda x: (os.system(command), x)[1]),
                              keras.layers.Dense(2, activation="gelu")])
    path = str(tmp_path / "lambda.h5")
    model.save(path)
    side_effect.unlink(missing_ok=True)  # building the model above ran the lambda once
    line = _refused([path, "-o", str(tmp_path / "m.tflite")], capsys, side_effect)
    assert "layer 'lambda' (Lambda" in line
    assert cli.main([path, "--trust-model", "-o", str(tmp_path / "m.tflite")]) == 0
    assert side_effect.exists()  # trusted: loading ran the lambda, as it would anywhere


def test_h5_config_is_read_without_deserializing(tmp_path, capsys):
    """A Lambda nested in a functional model inside a wrapper is found from the JSON alone (either Keras)."""
    import h5py

    lambda_layer = {"class_name": "Lambda", "config": {"name": "innocent_looking", "function": ["...", None, None]}}
    config = {"class_name": "Functional", "config": {"name": "outer", "layers": [
        {"class_name": "TimeDistributed", "config": {"name": "wrapper", "layer": {
            "class_name": "Functional", "config": {"name": "inner", "layers": [lambda_layer]}}}}]}}
    path = str(tmp_path / "nested.h5")
    with h5py.File(path, "w") as stream:
        stream.attrs["model_config"] = json.dumps(config)
    code = cli.main([path, "-o", str(tmp_path / "m.tflite")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == errors.UntrustedModel.exit_code
    assert "layer 'innocent_looking' (Lambda, in outer > wrapper > inner)" in line


@keras3_only
def test_keras_file_lambda_refused_by_safe_mode_with_its_whole_reason(tmp_path, capsys):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda x: x * 2.0),
                              keras.layers.Dense(2, activation=keras.activations.gelu)])
    path = str(tmp_path / "lambda.keras")
    model.save(path)
    code = cli.main([path, "-o", str(tmp_path / "m.tflite")])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == errors.UntrustedModel.exit_code
    assert "safe mode" in line and "arbitrary code execution" in line and line.rstrip().endswith(
        "trust_model=True))")
    _, report = converters.convert(path, trust_model=True)
    assert report.trusted and report.verified


def test_harmless_model_is_converted_untrusted_and_says_so_in_json(tmp_path):
    harmless = tf.function(lambda x: {"y": tf.nn.gelu(x)}, input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    path = str(tmp_path / "harmless")
    tf.saved_model.save(tf.Module(), path, signatures={"serving_default": harmless})
    _, report = converters.convert(path)
    assert report.verified and json.loads(report.to_json())["trusted"] is False


def test_file_op_in_what_loading_runs_is_refused(tmp_path, side_effect):
    """tf.saved_model.load runs the init op (table initializers): a table read from a file is refused."""
    vocabulary = tmp_path / "vocabulary.txt"
    vocabulary.write_text("a\nb\n")

    class WithTable(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
                str(vocabulary), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                tf.lookup.TextFileIndex.LINE_NUMBER), default_value=-1)

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def __call__(self, x):
            return {"y": tf.nn.gelu(x)}

    module = WithTable()
    path = str(tmp_path / "with_table")
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
    with pytest.raises(errors.UntrustedModel, match="op InitializeTableFromTextFile.* which loading runs"):
        converters.convert(path)
    _, report = converters.convert(path, trust_model=True)
    assert report.trusted and report.verified
