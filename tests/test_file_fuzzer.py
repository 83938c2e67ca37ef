"""Malformed files: honest models' bytes mutated, each mutant converted as a user would: a clean refusal or a
conversion, never a signal, a traceback, a hang or an internal error.

Mutations: a bit flipped, a byte set to a boundary value (0x00, 0x7f, 0x80, 0xff), a span deleted or repeated,
the file cut short. Formats: a .keras archive (Keras 3; half its mutants keep the archive whole and mutate a
member: the config's text, the weights' HDF5), an .h5 file (the leg's Keras); a SavedModel
(saved_model.pb, its variables' data and index, fingerprint.pb); a .tflite, float and int8. The seed is fixed;
KG_FILE_FUZZ_MUTANTS mutants per format (default 8), `KG_FILE_FUZZ_MUTANTS=200 make test-keras3` runs the
deeper run by hand. A mutant may not hang (60 s), but may use memory up to its limit (a shape made huge).
"""

import os
import shutil
import zipfile
import zlib

import numpy as np
import pytest

import spelling_models
from conftest import IS_KERAS3
from conftest import keras
from keras_gelu import converters
from keras_gelu.converters import cli
from keras_gelu.converters import errors

pytestmark = [pytest.mark.legs("keras3", "tf_keras"), pytest.mark.through_the_sandbox]

MUTANTS = int(os.environ.get("KG_FILE_FUZZ_MUTANTS", "8"))
SEED = 20261202
# What no input may lead to: an internal error, a hang, a dead conversion process.
NEVER = {errors.InternalError.exit_code: "an internal error", errors.TimeLimitExceeded.exit_code: "a hang",
         errors.ConversionCrashed.exit_code: "a dead conversion process"}


def mutated(data, rng):
    """`data` (bytes) with one mutation, chosen by `rng`."""
    data = bytearray(data)
    kind = rng.integers(5)
    position = int(rng.integers(len(data)))
    if kind == 0:
        data[position] ^= 1 << int(rng.integers(8))
    elif kind == 1:
        data[position] = int(rng.choice([0x00, 0x7F, 0x80, 0xFF]))
    elif kind == 2:
        del data[position:position + int(rng.integers(1, 64))]
    elif kind == 3:
        span = data[position:position + int(rng.integers(1, 64))]
        data[position:position] = span
    else:
        del data[position:]
    return bytes(data)


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """{format: path} of small honest models with a GELU, each of which converts."""
    folder = tmp_path_factory.mktemp("honest")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="gelu"), keras.layers.Dense(2)])
    models = {"h5": str(folder / "model.h5"), "saved_model": spelling_models.save("tf_nn_gelu", str(folder / "sm"))}
    model.save(models["h5"])
    if IS_KERAS3:
        models["keras"] = str(folder / "model.keras")
        model.save(models["keras"])
        for name, options in (("tflite", {}), ("tflite_int8", {"int8": True, "calibration": "random:4"})):
            models[name] = str(folder / f"{name}.tflite")
            with open(models[name], "wb") as stream:
                stream.write(converters.convert(models["saved_model"], mode="native", **options)[0])
    return models


_SAVED_MODEL_FILES = ("saved_model.pb", "variables/variables.data-00000-of-00001", "variables/variables.index",
                      "fingerprint.pb")


def _mutant(honest, model_format, number, folder):
    """The number-th mutant of a format: its path."""
    # zlib.crc32, not hash(): a str's hash changes with each process (PYTHONHASHSEED), and with it the mutants
    rng = np.random.default_rng((SEED, zlib.crc32(model_format.encode()), number))
    source = honest[model_format]
    if model_format == "saved_model":
        target = os.path.join(folder, "mutant")
        shutil.copytree(source, target)
        file = os.path.join(target, _SAVED_MODEL_FILES[number % len(_SAVED_MODEL_FILES)])
    elif model_format == "keras" and number % 2:  # inside the archive: a member's bytes, the archive intact
        target = os.path.join(folder, "mutant.keras")
        with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as archive:
            members = original.infolist()
            chosen = members[number // 2 % len(members)].filename
            for member in members:
                data = original.read(member)
                archive.writestr(member, mutated(data, rng) if member.filename == chosen else data)
        return target
    else:
        target = file = os.path.join(folder, "mutant" + os.path.splitext(source)[1])
        shutil.copyfile(source, target)
    with open(file, "rb") as stream:
        data = stream.read()
    with open(file, "wb") as stream:
        stream.write(mutated(data, rng))
    return target


@pytest.mark.parametrize("model_format", ["keras", "h5", "saved_model", "tflite", "tflite_int8"])
def test_a_mutated_model_is_converted_or_refused_cleanly(honest, model_format, tmp_path, capsys):
    if model_format not in honest:
        pytest.skip("the .keras and .tflite mutants run in the Keras 3 leg")
    assert cli.main([honest[model_format], "-o", str(tmp_path / "honest.tflite")]) == 0  # the mutants' origin
    capsys.readouterr()
    outcomes = {}
    for number in range(MUTANTS):
        folder = tmp_path / str(number)
        folder.mkdir()
        output = folder / "m.tflite"
        code = cli.main([_mutant(honest, model_format, number, str(folder)), "-o", str(output), "--time-limit", "60",
                         "--memory-limit", "6"])
        stderr = capsys.readouterr().err
        assert code not in NEVER, (number, NEVER.get(code), stderr)
        assert "Traceback" not in stderr, (number, stderr)
        assert (code == 0) == output.exists(), (number, stderr)
        if code != 0:
            assert stderr.strip().splitlines()[-1].startswith("keras-gelu-convert: error: "), (number, stderr)
        outcomes[code] = outcomes.get(code, 0) + 1
    print(f"{model_format}: exit codes {dict(sorted(outcomes.items()))} over {MUTANTS} mutants")
