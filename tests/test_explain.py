"""Where the precision goes: the int8 budget against the float model, and --explain's three files.

A model with one outlier channel (a Dense layer whose channel 0 is hundreds of times the others, as
transformers have them) loses its signal to per-tensor int8: the next layer reads only the small channels,
which its grid no longer resolves. The conversion must refuse it below --min-cosine (exit 10, nothing
written), name where the signal went and the outlier behind it, and still write the explanation. A model
without the outlier passes, and its explanation's figures are checked against a second computation: the
written .tflite's own tensors against the Keras model's layer outputs, on the same inputs.

The page is opened in headless Chromium (Debian's `chromium`, which `make test` installs): it renders with
no console error, lists the worst tensor first, and shows the planted outlier.
"""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gelu_models
import references
from conftest import keras
from conftest import last_error_line
from keras_gelu.converters import cli
from keras_gelu.converters import errors
from keras_gelu.converters import explanation
from keras_gelu.converters.report import Report
from keras_gelu.converters.running import explain

pytestmark = pytest.mark.legs("keras3", "tf_keras")

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explain")
    samples = np.random.default_rng(3).normal(0.0, 1.0, size=(32, 16)).astype(np.float32)
    np.savez(folder / "calibration.npz", x=samples)
    paths = {}
    for name, outlier in (("outlier", True), ("plain", False)):
        model = gelu_models.outlier_model(outlier)
        paths[name] = str(folder / f"{name}.keras")
        model.save(paths[name])
    return folder, paths, samples


def test_an_int8_model_that_lost_its_signal_is_refused_naming_where_and_why(models, tmp_path, capsys):
    folder, paths, _ = models
    output, why = tmp_path / "m.tflite", tmp_path / "why"
    code = cli.main([paths["outlier"], "-o", str(output), "--int8", "--calibration", str(folder / "calibration.npz"),
                     "--explain", str(why)])
    line = last_error_line(capsys.readouterr().err)
    assert code == errors.ParityFailure.exit_code == 10 and not output.exists()
    cosine = float(re.search(r"reaches cosine (-?[0-9.]+) against the float model, below --min-cosine 0.99", line)[1])
    assert cosine < 0.5, line
    assert "head" in line.split("lost first in")[1].split("(")[0], line  # the layer whose output lost it
    assert re.search(r"outlier_dense\S*'s channel 0 reached \d+x the median", line), line
    assert "nothing written" in line and "--explain" not in line.split("may help")[0].split(";")[-1]
    # Written when most needed: on the refusal
    assert sorted(os.listdir(why)) == sorted(explanation.FILES)
    saved = json.loads((why / "report.json").read_text())
    assert saved["budget"] == {"min_cosine": 0.99, "cosine": pytest.approx(cosine, abs=1e-4), "passed": False,
                               "output": saved["drift"][0]["output"]}
    rows = saved["explanation"]["tensors"]
    outliers = [row for row in rows if row["outlier"]]
    assert [row["layer"].split("/")[-1].rstrip("_0123456789") for row in outliers] == ["outlier_dense"]
    assert outliers[0]["outlier"]["channel"] == 0 and outliers[0]["outlier"]["ratio"] > gelu_models.OUTLIER_SCALE / 4


def test_the_refusal_s_first_advice_recovers_the_signal(models, tmp_path, capsys):
    """--int16, which the refusal names first: the same int8 weights, activations on a grid 256 times finer, on
    which the outlier's channel leaves the others theirs."""
    folder, paths, _ = models
    output = tmp_path / "m.tflite"
    code = cli.main([paths["outlier"], "-o", str(output), "--int8", "--calibration", str(folder / "calibration.npz")])
    advice = last_error_line(capsys.readouterr().err).split("; ")[-2]
    assert code == 10 and advice.startswith("--int16 (16x8") and advice.endswith("may help"), advice
    assert cli.main([paths["outlier"], "-o", str(output), "--int16", "--calibration",
                     str(folder / "calibration.npz")]) == 0
    budget = re.search(r"budget +\S+: cosine ([0-9.]+) against the float model, --min-cosine 0.99 ok",
                       capsys.readouterr().err)
    assert budget and float(budget[1]) >= 0.99


def test_a_budget_of_zero_writes_the_model_that_lost_its_signal(models, tmp_path, capsys):
    folder, paths, _ = models
    output = tmp_path / "m.tflite"
    assert cli.main([paths["outlier"], "-o", str(output), "--int8", "--calibration",
                     str(folder / "calibration.npz"), "--min-cosine", "0"]) == 0
    assert output.read_bytes()[4:8] == b"TFL3" and not re.search(r"^ +budget ", capsys.readouterr().err, re.M)


def _tensors(tflite_path, x):
    """{tensor name: float values} of every tensor a .tflite computes on `x`, dequantized: LiteRT run on its
    own, as Model Explorer's graph names them."""
    from keras_gelu.converters.running import verify

    interpreter = verify.interpreter_class()[0](model_path=str(tflite_path), experimental_preserve_all_tensors=True)
    runner = interpreter.get_signature_runner("serving_default")
    runner(**{name: verify.input_value(detail, x) for name, detail in runner.get_input_details().items()})
    values = {}
    for detail in interpreter.get_tensor_details():
        try:
            value = interpreter.get_tensor(detail["index"])
        except ValueError:
            continue
        scale, zero_point = detail["quantization"]
        values[detail["name"]] = (value.astype(np.float64) - zero_point) * scale if scale else value
    return values


def test_the_explanation_s_figures_are_the_tflite_s_tensors_against_the_keras_layers(models, tmp_path, capsys):
    """A second computation of the figures: each Dense layer's output in Keras (float, exact GELU), against the
    written .tflite's tensor of that name, on the same inputs (--inputs). The explanation's reference is another
    model (the float .tflite), so the cosines agree to float32 rounding and GELU's form, not bit for bit."""
    folder, paths, samples = models
    np.savez(tmp_path / "inputs.npz", x=samples[:8])
    output, why = tmp_path / "m.tflite", tmp_path / "why"
    assert cli.main([paths["plain"], "-o", str(output), "--int8", "--calibration", str(folder / "calibration.npz"),
                     "--inputs", str(tmp_path / "inputs.npz"), "--explain", str(why)]) == 0
    stderr = capsys.readouterr().err
    assert re.search(r"budget +\S+: cosine 0\.99\d+ against the float model, --min-cosine 0.99 ok", stderr)
    assert f"explained: {why}/index.html" in stderr
    saved = json.loads((why / "report.json").read_text())["explanation"]
    tflite_tensors = _tensors(output, samples[:8])
    # Model Explorer colours nodes by the names of their output tensors: every name is one of the .tflite's
    node_data = json.loads((why / "model_explorer.json").read_text())
    assert set(node_data["results"]) == {row["name"] for row in saved["tensors"]} <= set(tflite_tensors)
    model = keras.models.load_model(paths["plain"])
    checked = 0
    for layer in ("up", "outlier_dense"):
        row = next(row for row in saved["tensors"] if row["layer"].split("/")[-1].rstrip("_0123456789") == layer)
        expected = keras.Model(model.inputs, model.get_layer(layer).output).predict(samples[:8], verbose=0)
        actual = tflite_tensors[row["name"]]
        cosine = references.cosine(actual, expected)
        # float32 Keras against the float .tflite: within 1e-6 relative, far below int8's effect on the cosine
        assert row["cosine"] == pytest.approx(cosine, abs=1e-5), (layer, row)
        assert row["max_abs"] == pytest.approx(np.abs(actual - expected).max(), rel=1e-3, abs=1e-5)
        assert row["steps"] == pytest.approx(row["max_abs"] / row["scale"])
        checked += 1
    assert checked == 2
    gelus = saved["gelus"]
    assert len(gelus) == 1 and "->" in gelus[0]["gelu"] and "Gelu" in gelus[0]["layer"]


def test_a_gelu_ending_the_model_is_compared_as_its_output_not_by_what_its_rewrite_computes_before(models, tmp_path):
    # Where a GELU ends the model its last op writes the model's output, under the output's name; the int8
    # model's LOGISTIC before it was taken for the GELU and compared with the float model's clamp of x (cosine
    # 0.01, errors past 1, beyond what a LOGISTIC can be off by)
    folder, _, samples = models
    keras.utils.set_random_seed(5)
    inputs = keras.Input((16,), name="x")
    model = keras.Model(inputs, keras.layers.Activation("gelu")(keras.layers.Dense(16)(inputs)))
    path = str(tmp_path / "ending.keras")
    model.save(path)
    why = tmp_path / "why"
    assert cli.main([path, "-o", str(tmp_path / "m.tflite"), "--int8", "--calibration", str(folder / "calibration.npz"),
                     "--explain", str(why), "-q"]) == 0
    rows = json.loads((why / "report.json").read_text())["explanation"]["tensors"]
    # an int8 model at cosine 0.999 to the float model: no tensor compared with its own counterpart is far off
    assert rows and all(row["cosine"] > 0.99 for row in rows), [(row["op"], row["cosine"]) for row in rows]

def test_a_mean_of_rows_already_centred_is_not_blamed_for_what_float_rounding_left_of_it(models, tmp_path):
    """A LayerNormalization after another (CLIP's vision tower) takes the mean of rows the first centred: float32
    leaves about 1e-7 of them, which the int8 model computes as 0, and against which its error is as large as
    its values (a signal-to-noise ratio of -32 dB). It was named where the signal was lost, 67 dB of it, in a
    model that keeps cosine 0.9996 to the float one. Such a tensor, 100 dB or more below the tensors it is
    computed from, is blamed for nothing, nor is what is computed from it alone."""
    _, _, samples = models
    keras.utils.set_random_seed(3)
    inputs = keras.Input((16,), name="x")
    normalized = keras.layers.LayerNormalization()(keras.layers.LayerNormalization()(keras.layers.Dense(16)(inputs)))
    model = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Dense(32, activation="gelu")(normalized)))
    path = str(tmp_path / "twice.keras")
    model.save(path)
    np.savez(tmp_path / "samples.npz", x=samples)
    why = tmp_path / "why"
    assert cli.main([path, "-o", str(tmp_path / "m.tflite"), "--int8", "--calibration", str(tmp_path / "samples.npz"),
                     "--explain", str(why), "-q"]) == 0
    explained = json.loads((why / "report.json").read_text())["explanation"]
    rows = explained["tensors"]
    residues = [row for row in rows if row["snr_db"] < 0]
    assert residues and all(row["lost_db"] == 0 for row in residues), [(row["op"], row["lost_db"]) for row in rows]
    (worst,) = [row for row in rows if row["name"] == explained["worst"]]
    assert worst["snr_db"] > 0, worst


def test_explain_refuses_to_write_over_its_files_without_force(models, tmp_path, capsys):
    _, paths, _ = models
    why = tmp_path / "why"
    why.mkdir()
    (why / "index.html").write_text("the user's page")
    code = cli.main([paths["plain"], "-o", str(tmp_path / "m.tflite"), "--explain", str(why)])
    assert code == errors.OutputExists.exit_code and "index.html: exists; pass --force" in last_error_line(
        capsys.readouterr().err)
    assert (why / "index.html").read_text() == "the user's page" and not (tmp_path / "m.tflite").exists()


@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=2, max_size=64),
       st.lists(st.floats(-0.01, 0.01, allow_nan=False), min_size=64, max_size=64))
def test_running_statistics_are_the_whole_arrays_figures(reference, noise):
    """The statistics gathered batch by batch against the same figures of the whole arrays, in float64."""
    reference = np.array(reference)
    value = reference + np.array(noise[:len(reference)])
    statistic = explain._Statistics()
    half = len(reference) // 2
    statistic.add(value[:half], reference[:half])
    statistic.add(value[half:], reference[half:])
    error = value - reference
    assert statistic.max_abs == pytest.approx(np.abs(error).max())
    norms = np.linalg.norm(value) * np.linalg.norm(reference)
    if norms > 0:
        assert statistic.cosine() == pytest.approx(value @ reference / norms, abs=1e-12)
    assert statistic.rms() == pytest.approx(np.sqrt(reference @ reference / len(reference)))
    if error @ error > 0 and reference @ reference > 0:
        expected = 10 * np.log10((reference @ reference) / (error @ error))
        assert statistic.snr_db() == pytest.approx(min(explain.EXACT_DB, expected), abs=1e-9)


def test_a_forged_explanation_cannot_put_markup_in_the_page():
    """The rows come from the process that ran the model: every string is escaped in the page."""
    row = {"name": "<script>alert(1)</script>", "layer": "<img src=x onerror=alert(1)>", "op": "FULLY_CONNECTED",
           "position": 0, "type": "int8", "scale": 0.1, "max_abs": 1.0, "steps": 10.0, "cosine": 0.5, "snr_db": 3.0,
           "lost_db": 30.0, "gelu": "</td><script>x</script>", "outlier": None}
    data = {"input": "m", "kind": "SavedModel", "signature": "serving_default", "mode": "builtin",
            "exact_as": "sigmoid", "explanation": {"tensors": [row], "gelus": [row], "worst": row["name"],
                                                   "histogram": None, "samples": 1, "reference": "<b>float</b>"}}
    report = Report.from_untrusted(data)
    page = explanation.page(report)
    assert "<script" not in page and "<img" not in page and "<b>float" not in page
    assert "&lt;script&gt;" in page
    with pytest.raises(ValueError, match="explanation"):
        Report.from_untrusted({**data, "explanation": {**data["explanation"], "tensors": [{"name": 1}]}})


def test_a_forged_report_leaving_out_what_may_be_empty_reads_as_a_conversion_gives_it():
    """What a conversion writes as None or leaves empty, a worker may leave out: read as absent, not as a key the
    text form or the page then cannot find (a traceback and exit 1, the .tflite already written, before)."""
    row = {"name": "dense", "layer": "dense", "op": "FULLY_CONNECTED", "position": 0, "type": "int8",
           "max_abs": 1.0, "cosine": 0.5, "snr_db": 3.0, "lost_db": 30.0}  # no scale, steps, gelu nor outlier
    data = {"input": "m", "kind": "SavedModel", "signature": "serving_default", "mode": "builtin",
            "exact_as": "sigmoid", "int8": True, "lifted": {}, "ranges_repaired": {},
            "explanation": {"tensors": [row], "gelus": [], "samples": 1, "reference": "float"}}
    report = Report.from_untrusted(data)
    assert report.lifted is None and report.ranges_repaired is None
    assert report.explanation["worst"] is None and report.explanation["tensors"][0]["outlier"] is None
    assert "int8" in report.to_text(verbose=True)
    assert explanation.where_lost(report.explanation) == ""
    assert "dense" in explanation.page(report)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium as root, headless, with nothing to reach: no sandbox (root), no GPU, no background connections
_CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
                   "--disable-background-networking", "--disable-component-update", "--enable-logging=stderr",
                   "--v=0")


def _chromium(tmp_path, *arguments):
    result = subprocess.run([CHROMIUM, *_CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *arguments],
                            capture_output=True, text=True, timeout=120)
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    return result, console


@pytest.mark.legs("tf_keras")  # the page is drawn outside the sandbox, the same in either flavour
@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (make test installs Debian's chromium)")
def test_the_page_renders_in_chromium_worst_first_with_the_outlier_and_no_console_error(models, tmp_path, capsys):
    folder, paths, _ = models
    why = tmp_path / "why"
    cli.main([paths["outlier"], "-o", str(tmp_path / "m.tflite"), "--int8", "--calibration",
              str(folder / "calibration.npz"), "--explain", str(why)])
    capsys.readouterr()
    # The console check sees an error where there is one: a page with a failing script, first
    broken = tmp_path / "broken.html"
    broken.write_text("<!DOCTYPE html><html><body><script>undefined_function()</script></body></html>")
    _, console = _chromium(tmp_path, "--dump-dom", broken.as_uri())
    assert any("undefined_function" in line for line in console), console
    result, console = _chromium(tmp_path, "--dump-dom", (why / "index.html").as_uri())
    assert result.returncode == 0 and console == [], console
    dom = result.stdout
    assert re.search(r'id="worst">The signal is lost first in [^<]*head[^<]*, after [^<]*outlier_dense[^<]*'
                     r"'s channel 0 reached \d+x the median", dom), dom[:1500]
    table = dom.split("Tensors, the worst first", 1)[1]
    first_row = re.search(r"<tr><td[^>]*>1</td><td[^>]*>([^<]*)</td>", table)[1]
    layer_cell = re.compile(r'<td class="name" title="[^"]*">([^<]*)</td>')
    outlier_rows = [row for row in table.split("<tr>") if "outlier_dense" in (layer_cell.search(row) or ["", ""])[1]]
    assert "head" in first_row and len(outlier_rows) == 1 and re.search(r"<td>0 \(\d+x median\)</td>",
                                                                         outlier_rows[0]), table[:2000]
    screenshot = tmp_path / "explain.png"
    result, _ = _chromium(tmp_path, "--window-size=1000,1500", f"--screenshot={screenshot}",
                          (why / "index.html").as_uri())
    png = screenshot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000  # a drawn page, not a blank one
    if os.environ.get("KG_UPDATE_SCREENSHOT") == "1":  # `make screenshot`: the picture docs/int8.md shows
        shutil.copyfile(screenshot, os.path.join(os.path.dirname(__file__), "..", "docs", "images", "explain.png"))


def test_every_kind_of_conversion_explains_itself(models, tmp_path, capsys):
    """A float conversion (the approximation's error, tensor by tensor) and a .tflite given as input (the
    rewrite's own error against the .tflite as given) write the three files too, each GELU shown as what it
    became."""
    _, paths, _ = models
    native = tmp_path / "native.tflite"
    assert cli.main([paths["plain"], "-o", str(native), "--mode", "native"]) == 0
    for source, flags in ((paths["plain"], []), (str(native), ["--form", "tanh"])):
        why = tmp_path / f"why-{os.path.basename(source)}"
        assert cli.main([source, "-o", str(tmp_path / "out.tflite"), "--force", "--explain", str(why), *flags]) == 0
        saved = json.loads((why / "report.json").read_text())["explanation"]
        assert sorted(os.listdir(why)) == sorted(explanation.FILES) and saved["tensors"], source
        # float32 throughout: every tensor close to the float model, the GELU's the approximation's error
        assert all(row["cosine"] > 0.999 for row in saved["tensors"]), saved["tensors"]
    capsys.readouterr()
