"""keras-gelu-convert through main([...]): outputs, reports and every bad input."""

import importlib
import json
import os
import re
import runpy
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import spelling_models
import tflite_helpers
from conftest import run_command
from conversions import convert_here
from keras_gelu.converters import cli
from keras_gelu.converters import errors

pytestmark = pytest.mark.legs("tf_keras")  # TensorFlow graphs, any flavour: one leg


# The module, not the convert() function that keras_gelu.converters exports under its name.
pipeline = importlib.import_module("keras_gelu.converters.running.pipeline")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return spelling_models.save("x_half_plus_half_erf", str(tmp_path_factory.mktemp("cli") / "gelu_model"))


def _run(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.err


def _one_line_error(stderr):
    lines = [line for line in stderr.strip().splitlines() if line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("keras-gelu-convert: error: ")
    assert "Traceback" not in stderr
    return lines[0]


def test_converts_with_default_output_beside_the_input(model_dir, capsys, tmp_path):
    copy = tmp_path / "copy"
    os.system(f"cp -r {model_dir} {copy}")
    code, stderr = _run([str(copy)], capsys)
    assert code == 0, stderr
    output = tmp_path / "copy.tflite"
    assert output.read_bytes()[4:8] == b"TFL3"
    assert "1 x erf -> x*sigmoid(1.702x) from LOGISTIC/MUL" in stderr
    assert "fidelity" in stderr and "drift" in stderr and "size:" in stderr and "time:" in stderr
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_report_json_and_quiet(model_dir, capsys, tmp_path):
    output, report_path = tmp_path / "m.tflite", tmp_path / "report.json"
    code, stderr = _run([model_dir, "-o", str(output), "--mode", "native", "--report-json", str(report_path), "-q"],
                        capsys)
    assert code == 0 and stderr == ""
    report = json.loads(report_path.read_text())
    assert report["mode"] == "native" and report["ops"]["GELU"] == 1
    assert report["gelus"][0]["became"] == "GELU op"
    assert report["size_bytes"] == output.stat().st_size
    assert report["verified"] and report["fidelity"][0]["passed"]
    # Where the time went: the four stages, in order, each timed once, within the total.
    stages = report["stage_seconds"]
    assert list(stages) == ["load", "rewrite", "convert", "verify"]
    assert all(seconds > 0.0 for seconds in stages.values())
    assert sum(stages.values()) <= report["seconds"]
    # The peak memory seen in each step, sampled by the zygote: within the worker's whole peak.
    peaks = report["stage_peak_bytes"]
    assert peaks and all(0 < peak <= report["peak_bytes"] for peak in peaks.values()), peaks
    assert all(step in ("start-up", "confinement", *stages) or step.startswith("verify: ") for step in peaks), peaks


@pytest.mark.legs("tf_keras")  # the command's own code: one leg
def test_progress_shows_on_a_terminal_and_is_gone_before_the_report(model_dir, tmp_path):
    """From a few seconds in, one line on the terminal names the step and the time so far, rewritten in place,
    and is cleared before the report. On a pipe or a file (the other tests here), nothing of it; under -q,
    nothing either (test_sandbox's quiet probe). The worker sleeps for 4 s once confined (the suite's payload
    hook), so one step lasts past the first few seconds however fast TensorFlow imports here (with its
    bytecode, the whole command took under 3 s)."""
    payload = tmp_path / "sleep.py"
    payload.write_text("import time\ntime.sleep(4)\n")
    code, shown = run_command(model_dir, "-o", str(tmp_path / "m.tflite"), terminal=True,
                              KERAS_GELU_TEST_PAYLOAD=str(payload))
    assert code == 0, shown
    progress, cleared, after = shown.rpartition("\r\x1b[K")
    assert cleared and "\n" not in progress, shown  # rewritten in place: never a second line
    updates = progress.split("\r")[1:]
    assert updates and all(re.fullmatch(r"keras-gelu-convert: [^\r\n\x1b]+, \d+ s\x1b\[K", u) for u in updates), updates
    seconds = [int(re.search(r", (\d+) s", update).group(1)) for update in updates]
    assert seconds == sorted(seconds) and seconds[0] >= 3 and seconds[-1] >= 4, seconds
    assert "keras-gelu-convert: confinement, " in progress, progress  # the step the sleeping worker is in
    assert f"{model_dir} (SavedModel, signature serving_default) -> " in after and "\r" not in after, after


def test_verbose_shows_tolerances_and_stage_times(model_dir, capsys, tmp_path):
    code, stderr = _run([model_dir, "-o", str(tmp_path / "m.tflite"), "-v"], capsys)
    assert code == 0 and "tolerance: {'atol': 0.0001" in stderr
    assert re.search(r"^time: [\d.]+ s \(load [\d.]+, rewrite [\d.]+, convert [\d.]+, verify [\d.]+\), peak memory "
                     r"[\d.]+ GiB \(([\w:' -]+ [\d.]+(, )?)+\)$", stderr, re.MULTILINE), stderr
    assert "\r" not in stderr and "\x1b" not in stderr  # no progress line: stderr is not a terminal


def test_inputs_file_is_used(model_dir, capsys, tmp_path):
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, x=np.ones((3, 16), np.float32))
    code, stderr = _run([model_dir, "-o", str(tmp_path / "m.tflite"), "--inputs", str(inputs)], capsys)
    assert code == 0 and f"inputs from {inputs}" in stderr


def _converter_with_weights_off_by_one_percent(to_tflite):
    """A faulty TFLite converter: every float weight matrix of the .tflite is 1% larger than in the graph.

    The .tflite then really differs from the rewritten graph, by far more than
    the default tolerance, on every machine.
    """
    return lambda *args, **kwargs: tflite_helpers.with_weight_matrices_scaled(to_tflite(*args, **kwargs), 1.01)


def test_a_tflite_that_differs_from_the_rewritten_graph_fails_parity(model_dir, monkeypatch):
    """The fidelity check, the pipeline run here with a converter that is wrong on purpose."""
    monkeypatch.setattr(pipeline, "to_tflite", _converter_with_weights_off_by_one_percent(pipeline.to_tflite))
    with pytest.raises(errors.ParityFailure, match="the .tflite differs from the rewritten graph") as failure:
        convert_here(model_dir)
    assert "FAIL" in failure.value.report.to_text()


def _no_output_left(tmp_path, name="m.tflite"):
    leftovers = [p for p in os.listdir(tmp_path) if p == name or p.endswith(".tmp") or p.startswith(".keras_gelu_")]
    assert leftovers == [], leftovers


@pytest.mark.parametrize("case, exit_code, message", [
    ("missing", errors.MissingPath.exit_code, "no such file or directory"),
    ("not_a_model_file", errors.NotAModel.exit_code, "not a SavedModel directory"),
    ("empty_dir", errors.NotAModel.exit_code, "without saved_model.pb"),
    ("corrupt_pb", errors.CorruptModel.exit_code, "cannot read the SavedModel"),
    ("corrupt_keras", errors.CorruptModel.exit_code, "cannot read the .keras archive"),
    ("unknown_signature", errors.UnknownSignature.exit_code, "no signature 'nope'; available: serving_default"),
    ("output_folder_missing", errors.OutputNotWritable.exit_code, "does not exist"),
    ("output_folder_read_only", errors.OutputNotWritable.exit_code, "cannot write in"),
    ("output_exists", errors.OutputExists.exit_code, "exists; pass --force"),
    ("inputs_missing_key", errors.BadInputs.exit_code, "missing input(s) x"),
    ("inputs_wrong_shape", errors.BadInputs.exit_code, "has shape (2, 5), the model expects (?, 16)"),
    ("inputs_wrong_dtype", errors.BadInputs.exit_code, "has dtype float64, the model expects float32"),
    ("parity_drift", errors.ParityFailure.exit_code, "drifts from the original model"),
])
def test_bad_input(case, exit_code, message, model_dir, capsys, tmp_path):
    output = str(tmp_path / "m.tflite")
    model = model_dir
    extra = []
    if case == "missing":
        model = str(tmp_path / "nowhere")
    elif case == "not_a_model_file":
        model = str(tmp_path / "notes.txt")
        open(model, "w").write("hello")
    elif case == "empty_dir":
        model = str(tmp_path / "empty")
        os.mkdir(model)
    elif case == "corrupt_pb":
        model = str(tmp_path / "corrupt")
        os.mkdir(model)
        open(os.path.join(model, "saved_model.pb"), "wb").write(b"\x00garbage\xff" * 10)
    elif case == "corrupt_keras":
        model = str(tmp_path / "broken.keras")
        open(model, "wb").write(b"not a zip")
    elif case == "unknown_signature":
        extra = ["--signature", "nope"]
    elif case == "output_folder_missing":
        output = str(tmp_path / "no" / "such" / "m.tflite")
    elif case == "output_folder_read_only":
        output = "/proc/m.tflite"  # not writable even for root
    elif case == "output_exists":
        open(output, "wb").write(b"precious")
    elif case.startswith("inputs_"):
        arrays = {"inputs_missing_key": {"y": np.zeros((2, 16), np.float32)},
                  "inputs_wrong_shape": {"x": np.zeros((2, 5), np.float32)},
                  "inputs_wrong_dtype": {"x": np.zeros((2, 16), np.float64)}}[case]
        np.savez(tmp_path / "in.npz", **arrays)
        extra = ["--inputs", str(tmp_path / "in.npz")]
    elif case == "parity_drift":
        extra = ["--max-drift", "1e-6"]
    code, stderr = _run([model, "-o", output, *extra], capsys)
    assert code == exit_code, stderr
    last_line = stderr.strip().splitlines()[-1]
    assert message in last_line, last_line
    if case.startswith("parity"):
        assert "FAIL" in stderr  # the report is shown before the error line
        assert last_line.startswith("keras-gelu-convert: error: ")
    else:
        _one_line_error(stderr)
    if case == "output_exists":
        assert open(output, "rb").read() == b"precious"
    elif not case.startswith("output_folder"):
        _no_output_left(tmp_path)


def test_force_overwrites(model_dir, capsys, tmp_path):
    output = tmp_path / "m.tflite"
    output.write_bytes(b"old")
    code, _ = _run([model_dir, "-o", str(output), "--force", "-q"], capsys)
    assert code == 0 and output.read_bytes()[4:8] == b"TFL3"


def test_the_output_gets_the_mode_of_any_new_file(model_dir, capsys, tmp_path):
    import os
    import stat

    umask = os.umask(0o027)
    try:
        code, _ = _run([model_dir, "-o", str(tmp_path / "m.tflite"), "-q"], capsys)
        untouched = tmp_path / "plain"
        untouched.write_bytes(b"")  # how the user's own new files come out under this umask
    finally:
        os.umask(umask)
    assert code == 0
    assert stat.S_IMODE((tmp_path / "m.tflite").stat().st_mode) == stat.S_IMODE(untouched.stat().st_mode) == 0o640


@pytest.mark.parametrize("argv, message", [
    (["--mode", "native", "--form", "erf"], "--form applies to --mode builtin only"),
    (["--no-verify", "--max-drift", "0.1"], "need verification"),
    (["--atol", "-1"], "--atol must be >= 0"),
    (["--mode", "fast"], "invalid choice"),
    (["--max-steps", "0"], "--max-steps applies to --int8 only"),  # 0 is a value given, not "no value"
])
def test_invalid_flag_combinations_are_argparse_errors(argv, message, model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([model_dir, *argv])
    assert exit_info.value.code == errors.USAGE_EXIT_CODE
    assert message in capsys.readouterr().err


def test_no_verify_says_so(model_dir, capsys, tmp_path):
    code, stderr = _run([model_dir, "-o", str(tmp_path / "m.tflite"), "--no-verify"], capsys)
    assert code == 0 and "not verified: verification switched off" in stderr


@pytest.mark.legs("keras3")  # python -m runs the same code on any TensorFlow
def test_module_entry_point(model_dir, tmp_path, monkeypatch, capsys):
    """`python -m keras_gelu.converters` converting, run as python -m runs it (the package's __main__ with its
    argv), in this process, whose sandbox has its zygote ready: a new process would start one of its own
    (its start as a shell runs it: test_python_m_is_the_command_under_any_keras_backend_...)."""
    output = tmp_path / "m.tflite"
    monkeypatch.setattr(sys, "argv", ["python -m keras_gelu.converters", model_dir, "-o", str(output),
                                      "--mode", "native"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("keras_gelu.converters", run_name="__main__", alter_sys=True)
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 0, stderr
    assert "1 x erf -> GELU op" in stderr
    assert output.read_bytes()[4:8] == b"TFL3"
    assert tflite_helpers.ops(output.read_bytes()).get("GELU") == 1


@pytest.mark.legs("keras3")
def test_tf_keras_qat_h5_under_keras3_says_which_flavour_to_use(tmp_path, capsys):
    import h5py

    path = str(tmp_path / "qat.h5")
    config = {"class_name": "Sequential", "config": {"name": "qat", "layers": [
        {"class_name": "QuantizeWrapperV2", "config": {"name": "quant_dense", "layer": {}}}]}}
    with h5py.File(path, "w") as stream:
        stream.attrs["model_config"] = json.dumps(config)
        stream.attrs["keras_version"] = "2.21.0"
        stream.attrs["backend"] = "tensorflow"
    output = tmp_path / "qat.tflite"
    assert cli.main([path, "--int8", "-o", str(output)]) == errors.CorruptModel.exit_code
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "set TF_USE_LEGACY_KERAS=1" in line
    assert not output.exists()


def test_unnamed_npz_array_feeds_a_one_input_signature(model_dir, capsys, tmp_path):
    inputs = tmp_path / "unnamed.npz"
    np.savez(inputs, np.ones((3, 16), np.float32))  # stored as arr_0
    code, stderr = _run([model_dir, "-o", str(tmp_path / "m.tflite"), "--inputs", str(inputs)], capsys)
    assert code == 0, stderr


def test_unnamed_npz_arrays_feed_inputs_in_signature_order(tmp_path):
    from keras_gelu.converters.running import verify
    from keras_gelu.converters.reading.loading import TensorInfo

    signature = [TensorInfo("b_second", "b:0", tf.float32, (None, 2)),
                 TensorInfo("a_first", "a:0", tf.float32, (None, 3))]
    first, second = np.zeros((1, 2), np.float32), np.ones((1, 3), np.float32)
    np.savez(tmp_path / "positional.npz", first, second)
    arrays = verify.load_npz(str(tmp_path / "positional.npz"), signature)
    assert arrays["b_second"] is not None and np.array_equal(arrays["b_second"], first)
    assert np.array_equal(arrays["a_first"], second)
    np.savez(tmp_path / "one_too_few.npz", first)
    with pytest.raises(errors.BadInputs, match=r"expected keys: b_second, a_first, or 2 unnamed array\(s\)"):
        verify.load_npz(str(tmp_path / "one_too_few.npz"), signature)


@pytest.mark.parametrize("argv, exit_code", [
    (["/nonexistent/model"], errors.MissingPath.exit_code),
    (["{tmp}"], errors.NotAModel.exit_code),
    (["{model}", "-o", "/no/such/folder/m.tflite"], errors.OutputNotWritable.exit_code),
    (["{model}", "--inputs", "/no/such.npz"], errors.BadInputs.exit_code),
])
def test_path_errors_come_before_tensorflow_is_imported(argv, exit_code, model_dir, tmp_path):
    """The launcher answers path mistakes without importing TensorFlow (the command's 5 s start-up)."""
    argv = [arg.format(tmp=tmp_path, model=model_dir) for arg in argv]
    probe = ("import sys\nfrom keras_gelu_launcher import main\nsys.argv = ['keras-gelu-convert'] + sys.argv[1:]\n"
             "code = main()\nprint('tensorflow' in sys.modules, code)")
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=600)
    assert result.stdout.split() == ["False", str(exit_code)], result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("keras-gelu-convert: error: ")


def test_native_warnings_that_are_not_start_up_chatter_are_kept():
    from keras_gelu.converters import native_logs

    log = ["I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on.",
           "W0000 00:00:1.0 1 something.cc:12] a real warning about the model",
           "W0000 00:00:1.0 1 bfc_allocator.cc:482] Allocator (mklcpu) ran out of memory trying to allocate 6.0GiB",
           "Traceback (most recent call last):", '  File "fingerprinting.py", line 1, in read', "    raise",
           "DecodeError: Error parsing message", "and a line printed after it"]
    assert native_logs.worth_showing(log) == ["W0000 00:00:1.0 1 something.cc:12] a real warning about the model",
                                              "and a line printed after it"]


def test_integer_input_of_unknown_range_asks_for_samples(tmp_path, capsys):
    """An integer input that indexes no table and is no mask: no guessing, a one-line request for samples."""

    class Counts(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.int32, name="counts")])
        def __call__(self, counts):
            return {"y": tf.nn.gelu(tf.cast(counts, tf.float32) * 0.5)}

    module = Counts()
    path = str(tmp_path / "counts")
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
    output = tmp_path / "m.tflite"
    code, stderr = _run([path, "-o", str(output)], capsys)
    assert code == errors.BadInputs.exit_code
    assert "integer input 'counts'" in _one_line_error(stderr) and "--inputs file.npz" in stderr
    code, stderr = _run([path, "-o", str(output), "--int8", "--calibration", "random:4"], capsys)
    assert code == errors.BadInputs.exit_code and "--calibration file.npz" in _one_line_error(stderr)
    np.savez(tmp_path / "counts.npz", np.arange(8, dtype=np.int32).reshape(2, 4))
    code, stderr = _run([path, "-o", str(output), "--inputs", str(tmp_path / "counts.npz")], capsys)
    assert code == 0, stderr


def _help_and_version(run):
    """(the help's text, the version's) from `run(argv) -> (exit code, stdout, stderr)`, each checked: exit 0,
    no traceback or error."""
    shown = []
    for flag in ("--help", "--version"):
        code, stdout, stderr = run([flag])
        assert code == 0 and "Traceback" not in stderr and "error" not in stderr, stderr
        shown.append(stdout)
    return shown


def _check_help_and_version(help_text, version_text):
    from importlib import metadata

    for flag in ("--memory-limit", "--trust-model", "--int8", "--int16", "--min-cosine", "--explain", "--target",
                 "--version"):
        assert flag in help_text
    flowing = " ".join(help_text.split())
    assert "(default 75% of the machine's)" in flowing and "23 its scratch folder could not be removed" in flowing
    assert version_text.strip() == f"keras-gelu-convert {metadata.version('keras-gelu')}"


@pytest.mark.legs("keras3")
def test_help_and_version_render_for_the_installed_command():
    """The first commands a newcomer types, as a shell runs them: the whole help (every flag's text, the exit
    codes) and the installed version, exit 0, no traceback (argparse formats help with %, which a default's text
    once broke)."""
    command = os.path.join(os.path.dirname(sys.executable), "keras-gelu-convert")

    def run(argv):
        result = subprocess.run([command, *argv], capture_output=True, text=True, timeout=300)
        return result.returncode, result.stdout, result.stderr

    _check_help_and_version(*_help_and_version(run))


@pytest.mark.legs("keras3")
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_python_m_is_the_command_under_any_keras_backend_and_shows_only_its_own_lines(backend):
    """`python -m keras_gelu.converters`, as a shell runs it, is the command `keras-gelu-convert` is, under any
    backend (it converts on TensorFlow in a process of its own): where the shell names JAX, the package's import
    refused JAX with a traceback; under TensorFlow, its help came after TensorFlow's start-up lines (7 of them
    with TF_CPP_MIN_LOG_LEVEL=0, as a newcomer's shell has it), 5 s of importing what the command never uses."""

    def run(argv):
        result = subprocess.run([sys.executable, "-m", "keras_gelu.converters", *argv], capture_output=True,
                                text=True, timeout=300, env={**os.environ, "KERAS_BACKEND": backend,
                                                             "TF_CPP_MIN_LOG_LEVEL": "0"})
        assert result.stderr == "", result.stderr
        return result.returncode, result.stdout, result.stderr

    _check_help_and_version(*_help_and_version(run))


@pytest.mark.legs("keras3")
@pytest.mark.parametrize("argv, orig_argv, starting", [
    (["-m", "--help"], ["python", "-m", "keras_gelu.converters", "--help"], True),
    (["-m"], ["python", "-W", "ignore", "-m", "keras_gelu.converters"], True),
    (["-m", "m.keras"], ["python", "-Imkeras_gelu.converters", "m.keras"], True),
    # another module, whose own arguments name the command's
    (["-m", "keras_gelu.converters"], ["python", "-m", "tool", "keras_gelu.converters"], False),
    (["-m"], ["python", "-m", "keras_gelu.converters.cli"], False),
    (["-m"], ["python", "-m", "keras_gelu"], False),
    (["-c", "keras_gelu.converters"], ["python", "-c", "import keras_gelu", "keras_gelu.converters"], False),
    (["/bin/keras-gelu-convert"], ["python", "/bin/keras-gelu-convert"], False),
])
def test_the_command_is_told_from_any_other_start_by_the_module_python_locates(monkeypatch, argv, orig_argv,
                                                                                starting):
    """Python's own argv while it locates a module to run (sys.argv[0] "-m", the module's arguments after it),
    against the command line as given: only keras_gelu.converters, however the flag holds it, leaves keras_gelu's
    imports out. (A process that imports keras_gelu and finds it empty would fail far from the cause.)"""
    from keras_gelu import command_start

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert command_start.the_command_is_starting() is starting

