"""Build every keras-hub Backbone family and keras.applications module tiny and say which compute a GELU.

For each class that `tests/keras_hub_families.py` finds under keras_hub.models,
and each keras.applications module's entry, this builds it from its tiny
config, runs it once on the random inputs, traces its call and reads the graph
for GELUs (see `keras_hub_families.gelu_forms`), then prints a markdown table
(built or the one-line error, the GELU forms found, parameters, build seconds)
and a summary line; then builds every keras.applications builder and names any
whose answer is not its module's. Offline: no presets.

    KERAS_BACKEND=tensorflow python benchmarks/sweep_families.py [--only BertBackbone ViTBackbone ...]
    KERAS_BACKEND=tensorflow python benchmarks/sweep_families.py --stages [--only ...] [--sample N --seed S]

--stages takes every family that computes a GELU through what a user would do, each in a fresh process
(build, save float.keras, quantize_model + one fit step + save qat.keras), then all its conversions in one
more fresh process (keras_gelu.converters.cli.main per argv: --mode native, builtin, --int8 --calibration,
and the QAT model --int8), and reports each stage as ok or the converter's last one-line error and exit
code; the table is appended to /tmp/sweep_stages.md family by family.

"Built" means built, called and traced; a failure says at which of the three.
Exits 1 if a class that is not in CANNOT_BUILD fails, a class has neither a
config nor a reason, a config names a class keras-hub no longer has, or a
keras.applications builder computes other GELU forms than its module's entry,
so that a keras-hub or Keras upgrade that adds, removes or breaks a family is
noticed.
"""

import argparse
import gc
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

import keras_hub_families as families  # noqa: E402


def _one_line(error):
    """An exception as one short line: its type and the first line of its message."""
    message = str(error).strip().splitlines()
    first = message[0] if message else ""
    line = f"{type(error).__name__}: {first}"
    return line if len(line) <= 150 else line[:147] + "..."


def sweep_one(class_name):
    """A row: {"class", "status", "gelu", "params", "seconds"}; status is "built" or why not."""
    import keras

    row = {"class": class_name, "status": "built", "gelu": "", "params": "", "seconds": ""}
    if class_name in families.CANNOT_BUILD:
        row["status"] = f"cannot build: {families.CANNOT_BUILD[class_name]}"
        return row
    if class_name not in families.TINY_CONFIGS:
        row["status"] = "no tiny config and no reason: add one to keras_hub_families.py"
        return row
    started = time.perf_counter()
    stage = "build"
    try:
        backbone, inputs = families.build(class_name)
        row["seconds"] = f"{time.perf_counter() - started:.1f}"  # construction and inputs, no call
        row["params"] = f"{backbone.count_params():,}"
        stage = "call"  # the inputs are accepted, values included (token ids in range)
        backbone(inputs, training=False)
        stage = "trace"
        forms = families.gelu_forms(backbone, inputs)
        row["gelu"] = ", ".join(sorted(forms)) if forms else "no"
    except Exception as error:  # noqa: BLE001 - one family's failure is a row, not the end of the sweep
        row["status"] = f"failed at {stage}: {_one_line(error)}"
        row["seconds"] = row["seconds"] or f"{time.perf_counter() - started:.1f}"
    finally:
        keras.backend.clear_session()  # free the graph and the weights before the next family
        gc.collect()
    return row


def builders_against_their_modules(rows):
    """[(builder, its GELU forms, its module entry's)] for each keras.applications builder whose traced graph
    answers otherwise than its module's entry: every builder built with the entry's weights, image side and
    head (ConvNeXtXLarge's 350 M parameters included; about 3 minutes on 2 cores)."""
    import keras

    entries = families.application_entries()
    answers = {row["class"].rsplit(".", 1)[0]: row["gelu"] for row in rows if row["class"] in entries.values()}
    differing = []
    for builder, module in sorted(families.application_builders().items()):
        if module not in answers:
            continue
        arguments = {key: value for key, value in families.TINY_CONFIGS[entries[module]].items()
                     if key in ("weights", "input_shape", "classes")}
        keras.utils.set_random_seed(families.SEED)
        forms = families.gelu_forms(getattr(keras.applications, builder)(**arguments))
        answer = ", ".join(sorted(forms)) if forms else "no"
        if answer != answers[module]:
            differing.append((builder, answer, answers[module]))
        keras.backend.clear_session()
        gc.collect()
    return differing


# --- --stages: every GELU family through the pipeline a user would take ---------------------------------------

STAGES_MARKER = "SWEEP-STAGES-JSON:"
STAGES_OUTPUT = "/tmp/sweep_stages.md"
STAGES_HEADER = ("| Family | GELU forms | native | builtin | int8 PTQ | QAT train (loss finite, NaN vars) "
                 "| QAT int8 |\n|---|---|---|---|---|---|---|\n")
CONVERTER_TIME_LIMIT = 300  # --time-limit of each conversion
BUILD_TIMEOUT = 900  # the building/QAT subprocess of one family
CONVERSION_STAGES = ("native", "builtin", "int8 PTQ", "QAT int8")

# One fresh process per family for all its conversions: keras_gelu.converters.cli.main per argv, stderr captured
# per argv, and (exit code, its last line starting with "keras-gelu-convert") for each.
_CONVERTER_SCRIPT = r"""
import io, json, sys, traceback
from keras_gelu.converters import cli
results = []
for argv in json.loads(sys.argv[1]):
    captured, real = io.StringIO(), sys.stderr
    sys.stderr = captured
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse: bad flags
        code = stop.code if isinstance(stop.code, int) else 2
    except BaseException as error:
        traceback.print_exc()
        code = -1
    finally:
        sys.stderr = real
    lines = [line for line in captured.getvalue().splitlines() if line.strip()]
    tagged = [line for line in lines if line.startswith("keras-gelu-convert")]
    results.append({"code": code, "line": tagged[-1] if tagged else (lines[-1] if lines else "")})
    print(%r + json.dumps(results[-1]), flush=True)
""" % STAGES_MARKER


def _first_line(error):
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0] if message else ''}"


def _save_inputs(inputs, path):
    import numpy as np

    if isinstance(inputs, dict):
        np.savez(path, **inputs)
    elif isinstance(inputs, (list, tuple)):
        np.savez(path, *inputs)
    else:
        np.savez(path, inputs)


def stage_family(class_name, folder):
    """In a fresh process: build, find the GELU forms, save float.keras and inputs.npz, then QAT. A dict."""
    import keras
    import numpy as np

    folder = pathlib.Path(folder)
    result = {"class": class_name, "gelu": None, "float_saved": None, "qat": None, "qat_saved": False}
    try:
        backbone, inputs = families.build(class_name)
        forms = families.gelu_forms(backbone, inputs)
    except Exception as error:  # noqa: BLE001
        result["build_error"] = _one_line(error)
        return result
    result["gelu"] = sorted(forms)
    if not forms:
        return result
    _save_inputs(inputs, folder / "inputs.npz")
    try:
        backbone.save(str(folder / "float.keras"))
        result["float_saved"] = "ok"
    except Exception as error:  # noqa: BLE001
        result["float_saved"] = f"save failed: {_one_line(error)}"
    stage = "quantize_model"
    try:
        qat = keras_gelu_qat().quantize_model(backbone)
        stage = "fit"
        qat.compile(keras.optimizers.Adam(1e-3), "mse")
        targets = keras.tree.map_structure(lambda output: np.asarray(output, np.float32),
                                           backbone(inputs, training=False))
        history = qat.fit(inputs, targets, batch_size=families.BATCH, epochs=1, verbose=0)
        loss = float(history.history["loss"][-1])
        non_finite = 0
        for variable in qat.variables:
            values = np.asarray(keras.ops.convert_to_numpy(variable.value))
            if np.issubdtype(values.dtype, np.floating) and not np.all(np.isfinite(values)):
                non_finite += 1
        result["qat"] = {"loss": loss, "loss_finite": bool(np.isfinite(loss)), "nan_vars": non_finite,
                         "vars": len(qat.variables)}
        stage = "save"
        qat.save(str(folder / "qat.keras"))
        result["qat_saved"] = True
    except Exception as error:  # noqa: BLE001
        line = _first_line(error)
        result["qat_error"] = f"{stage}: {line if len(line) <= 200 else line[:197] + '...'}"
    return result


def keras_gelu_qat():
    import keras_gelu.qat

    return keras_gelu.qat


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _conversion_cell(outcome):
    if outcome is None:
        return "-"
    if outcome["code"] == 0:
        return "ok"
    line = outcome["line"]
    return f"rc {outcome['code']}: {line}"


def stages_one(class_name, root, python):
    """A row dict for one family: its building/QAT subprocess, then its converter subprocess."""
    folder = pathlib.Path(root) / class_name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = time.perf_counter()
    row = {"class": class_name, "gelu": None, "cells": {}, "error": None}
    try:
        finished = subprocess.run([python, os.path.abspath(__file__), "--stage-family", class_name, str(folder)],
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        found = [line for line in finished.stdout.splitlines() if line.startswith(STAGES_MARKER)]
        if not found:
            tail = [line for line in finished.stderr.splitlines() if line.strip()]
            row["error"] = f"build process rc {finished.returncode}: {tail[-1] if tail else ''}"[:200]
            return row
        built = json.loads(found[-1][len(STAGES_MARKER):])
    except subprocess.TimeoutExpired:
        row["error"] = f"build/QAT process past {BUILD_TIMEOUT} s"
        return row
    if built.get("build_error"):
        row["error"] = built["build_error"]
        return row
    row["gelu"] = built["gelu"]
    if not built["gelu"]:
        return row
    cells = row["cells"]
    npz = str(folder / "inputs.npz")
    limit = ["--time-limit", str(CONVERTER_TIME_LIMIT)]
    runs, names = [], []
    if built["float_saved"] == "ok":
        model = str(folder / "float.keras")
        runs += [[model, "-o", str(folder / "native.tflite"), "--mode", "native", "--inputs", npz, *limit],
                 [model, "-o", str(folder / "builtin.tflite"), "--inputs", npz, *limit],
                 [model, "--int8", "--calibration", npz, "-o", str(folder / "int8.tflite"), *limit]]
        names += ["native", "builtin", "int8 PTQ"]
    else:
        for name in ("native", "builtin", "int8 PTQ"):
            cells[name] = built["float_saved"]
    qat = built.get("qat")
    if built.get("qat_error") and qat is None:
        cells["QAT train"] = f"failed: {built['qat_error']}"
    elif qat is not None:
        error = f"; {built['qat_error']}" if built.get("qat_error") else ""
        cells["QAT train"] = (f"{'finite' if qat['loss_finite'] else 'NOT finite'} ({qat['loss']:.3g}), "
                              f"{qat['nan_vars']} NaN vars{error}")
    if built["qat_saved"]:
        runs.append([str(folder / "qat.keras"), "--int8", "-o", str(folder / "qat.tflite"), "--inputs", npz, *limit])
        names.append("QAT int8")
    else:
        cells["QAT int8"] = "skipped (no qat.keras)"
    if runs:
        outcomes = []
        try:
            finished = subprocess.run([python, "-c", _CONVERTER_SCRIPT, json.dumps(runs)], capture_output=True,
                                      text=True, timeout=len(runs) * (CONVERTER_TIME_LIMIT + 120),
                                      env={**os.environ, "TF_USE_LEGACY_KERAS": "0"})
            outcomes = [json.loads(line[len(STAGES_MARKER):]) for line in finished.stdout.splitlines()
                        if line.startswith(STAGES_MARKER)]
            crash = [line for line in finished.stderr.splitlines() if line.strip()]
            crash = f"converter process rc {finished.returncode}: {crash[-1] if crash else ''}"[:200]
        except subprocess.TimeoutExpired as timeout:
            crash = "converter process timed out"
            stdout = timeout.stdout.decode() if isinstance(timeout.stdout, bytes) else (timeout.stdout or "")
            outcomes = [json.loads(line[len(STAGES_MARKER):]) for line in stdout.splitlines()
                        if line.startswith(STAGES_MARKER)]
        for index, name in enumerate(names):
            cells[name] = _conversion_cell(outcomes[index]) if index < len(outcomes) else crash
    row["seconds"] = time.perf_counter() - started
    return row


def _stages_line(row):
    cells = row["cells"]
    if row["error"]:
        return f"| {row['class']} | failed to build: {_cell(row['error'])} | | | | | |\n"
    return (f"| {row['class']} | {', '.join(row['gelu'])} | " +
            " | ".join(_cell(cells.get(name, "-")) for name in ("native", "builtin", "int8 PTQ", "QAT train",
                                                                   "QAT int8")) + " |\n")


def _passes(row, name):
    cell = row["cells"].get(name, "")
    if name == "QAT train":
        return cell.startswith("finite") and ", 0 NaN vars" in cell and ";" not in cell
    return cell == "ok"


def stages_main(arguments, found):
    import random

    names = list(arguments.only or found)
    if arguments.sample:
        names = random.Random(arguments.seed).sample(names, min(arguments.sample, len(names)))  # in seeded order
    root = pathlib.Path(arguments.workdir)
    root.mkdir(parents=True, exist_ok=True)
    output = pathlib.Path(arguments.output)
    output.write_text(STAGES_HEADER)
    print(STAGES_HEADER, end="", flush=True)
    started = time.perf_counter()
    rows = []
    for name in names:
        if name in families.CANNOT_BUILD or name not in families.TINY_CONFIGS:
            continue
        row = stages_one(name, root, sys.executable)
        rows.append(row)
        if row["error"] or row["gelu"]:
            line = _stages_line(row)
            with output.open("a") as stream:
                stream.write(line)
            print(line, end="", flush=True)
        if not arguments.keep:
            shutil.rmtree(root / name, ignore_errors=True)
    with_gelu = [row for row in rows if row["gelu"]]
    summary = [f"\n{len(rows)} families swept ({len(names)} asked), {len(with_gelu)} compute a GELU, "
               f"{sum(1 for row in rows if row['error'])} failed to build ({time.perf_counter() - started:.0f} s)"]
    for name in ("native", "builtin", "int8 PTQ", "QAT train", "QAT int8"):
        summary.append(f"- {name}: {sum(_passes(row, name) for row in with_gelu)}/{len(with_gelu)} pass")
    groups = {}
    for row in with_gelu:
        for name in ("native", "builtin", "int8 PTQ", "QAT train", "QAT int8"):
            if not _passes(row, name):
                error = row["cells"].get(name, "-").replace(str(root / row["class"]), "<folder>")
                groups.setdefault(error, []).append(f"{row['class']} ({name})")
    summary.append("\nFailures by error:")
    for error, where in sorted(groups.items(), key=lambda item: -len(item[1])):
        summary.append(f"- [{len(where)}] {error}: {', '.join(where)}")
    text = "\n".join(summary) + "\n"
    with output.open("a") as stream:
        stream.write(text)
    print(text, end="", flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="CLASS", help="sweep these classes only")
    parser.add_argument("--stages", action="store_true",
                        help="take every GELU family through save, native/builtin/int8 conversion and QAT")
    parser.add_argument("--sample", type=int, metavar="N",
                        help="--stages: a seeded sample of N of the classes, in seeded random order (a run cut short "
                             "is a random subset)")
    parser.add_argument("--seed", type=int, default=0, help="--stages: the seed of --sample")
    parser.add_argument("--workdir", default="/tmp/sweep_stages", help="--stages: where each family's files go")
    parser.add_argument("--output", default=STAGES_OUTPUT, help="--stages: the markdown file, appended per family")
    parser.add_argument("--keep", action="store_true", help="--stages: keep each family's files")
    parser.add_argument("--stage-family", nargs=2, metavar=("CLASS", "FOLDER"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.stage_family:  # the per-family child of --stages
        result = stage_family(*arguments.stage_family)
        print(STAGES_MARKER + json.dumps(result), flush=True)
        return 0

    started = time.perf_counter()
    found = families.family_names()
    unknown = set(arguments.only or ()) - set(found)
    if unknown:
        parser.error(f"not Backbone classes of keras_hub.models nor keras.applications entries: "
                     f"{', '.join(sorted(unknown))}")
    if arguments.stages:
        return stages_main(arguments, found)
    rows = [sweep_one(name) for name in (arguments.only or found)]
    print("| Family | Built | GELU | Params | Build s |")
    print("|---|---|---|---:|---:|")
    for row in rows:
        print(f"| {row['class']} | {row['status']} | {row['gelu']} | {row['params']} | {row['seconds']} |")

    built = [row for row in rows if row["status"] == "built"]
    with_gelu = [row["class"] for row in built if row["gelu"] != "no"]
    print()
    print(f"{len(found)} families found (Backbone classes, keras.applications modules), {len(rows)} swept, "
          f"{len(built)} built, {len(with_gelu)} compute a GELU ({time.perf_counter() - started:.0f} s)")
    print(f"GELU: {', '.join(with_gelu)}")
    print(f"No GELU: {', '.join(row['class'] for row in built if row['gelu'] == 'no')}")
    differing = builders_against_their_modules(rows)
    for builder, answer, module_answer in differing:
        print(f"keras.applications.{builder} computes GELU forms {answer}, its module's entry {module_answer}: "
              "give it an entry of its own")
    unexpected = [row for row in rows if row["status"] != "built" and row["class"] not in families.CANNOT_BUILD]
    stale = set(families.TINY_CONFIGS) | set(families.CANNOT_BUILD)
    stale -= set(found)
    if stale:
        print(f"Configs for classes keras-hub no longer has: {', '.join(sorted(stale))}")
    return 1 if unexpected or stale or differing else 0


if __name__ == "__main__":
    sys.exit(main())
