"""Docs that cannot rot: every code block in README.md and docs/ runs, and the site builds with --strict.

* Each ```python block runs as it is shown, in an empty folder of its own,
  with a clean Keras state: the Keras 3 blocks in the Keras 3 leg, the blocks
  that need tf-keras (they set TF_USE_LEGACY_KERAS themselves, as a reader
  would) in the tf-keras leg.
* Each `keras-gelu-convert` line of a ```sh block runs against the bundled
  models it names (`bundled`: a SavedModel, a .keras and an .h5 file, Keras's
  LiteRT export of the same model, int8 samples, and a quantization-aware
  model, as .keras and exported).
* `mkdocs build --strict` fails on a broken link, a missing anchor or a page
  left out of the nav.
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback

import numpy as np
import pytest

from conftest import IS_KERAS3
from conftest import keras
from keras_gelu.converters import cli

pytestmark = pytest.mark.legs("keras3")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ["README.md"] + sorted(os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs"))
                                   if name.endswith(".md"))
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(language):
    """(document, line, code) of every fenced block of `language`."""
    found = []
    for document in DOCUMENTS:
        text = open(os.path.join(ROOT, document)).read()
        for match in _FENCE.finditer(text):
            if match.group(1) == language:
                found.append((document, text.count("\n", 0, match.start()) + 1, match.group(2)))
    return found


def _commands():
    """(document, line, argv) of every keras-gelu-convert line of a shell block; comments dropped."""
    found = []
    for document, line, code in _blocks("sh"):
        for offset, text in enumerate(code.splitlines()):
            if text.startswith("keras-gelu-convert "):
                found.append((document, line + 1 + offset, shlex.split(text, comments=True)[1:]))
    return found


PYTHON_BLOCKS = _blocks("python")
COMMANDS = _commands()


def test_every_page_has_what_the_tests_read():
    """The parsers see the blocks there are: a change of fence style would otherwise test nothing."""
    assert len(PYTHON_BLOCKS) >= 8 and len(COMMANDS) >= 10
    assert {document for document, _, _ in PYTHON_BLOCKS} >= {"README.md", "docs/layers.md", "docs/int8.md"}


# Each block in the leg of its flavour, in that leg's own interpreter: a fresh one per block, or per flavour,
# spent most of the time on TensorFlow's import (93 of the 100 s they took).
@pytest.mark.legs("keras3", "tf_keras")
@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[f"{document}:{line}" for document, line, _ in PYTHON_BLOCKS])
def test_python_block_runs(block, tmp_path, monkeypatch):
    """The block as a reader runs it, in an empty folder, on a clean Keras state (the suite's fixture's: Keras 3's
    own clear_session adds a full garbage collection, 0.47 s a call over the leg's heap); a tf-keras block (it
    sets TF_USE_LEGACY_KERAS itself, before TensorFlow's import, as a reader must) in the tf-keras leg, the others
    in the Keras 3 leg, where the variable is already what the block sets."""
    document, line, code = block
    legacy = "TF_USE_LEGACY_KERAS" in code
    if legacy == IS_KERAS3:
        pytest.skip(f"a {'tf-keras' if legacy else 'Keras 3'} block: runs in that flavour's leg")
    monkeypatch.chdir(tmp_path)
    environment = dict(os.environ)
    failure = None
    try:
        exec(compile(code, f"{document}:{line}", "exec"), {"__name__": "__main__"})
    except Exception:  # noqa: BLE001 - whatever the block raises is what the reader would meet
        failure = traceback.format_exc()[-3000:]
    finally:
        os.environ.clear()
        os.environ.update(environment)
    assert failure is None, f"{document}:{line} fails as shown:\n{failure}"


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """A folder holding every model the shown commands name, under the names they use."""
    import keras_gelu
    from keras_gelu import qat

    folder = tmp_path_factory.mktemp("bundled")
    keras.utils.set_random_seed(5)
    x = np.random.default_rng(5).normal(size=(256, 16)).astype(np.float32)
    model = keras.Sequential([keras.Input((16,), name="x"), keras.layers.Dense(32, activation=keras_gelu.GELU()),
                              keras.layers.Dense(32, activation=keras_gelu.gelu_tanh), keras.layers.Dense(4)])
    model.export(str(folder / "saved_model_dir"), verbose=False)
    model.save(str(folder / "model.keras"))
    model.save(str(folder / "model.h5"))
    model.export(str(folder / "gelu_op.tflite"), format="litert", verbose=False)  # a .tflite with a GELU op
    shutil.copy(os.path.join(ROOT, "tests", "data", "litert_torch", "gelu_exact.tflite"),
                folder / "torch_gelu_exact.tflite")  # PyTorch's, through litert-torch
    np.savez(folder / "samples.npz", x[:64])
    qat_model = qat.quantize_model(model, calibration_data=x)
    qat_model.compile("adam", "mse")
    qat_model.fit(x, np.zeros((256, 4), np.float32), epochs=1, verbose=0)
    qat_model.save(str(folder / "qat.keras"))
    qat_model.export(str(folder / "qat_model"), verbose=False)
    return folder


@pytest.mark.parametrize("command", COMMANDS, ids=[f"{document}:{line}" for document, line, _ in COMMANDS])
def test_shown_command_runs_against_a_bundled_model(bundled, command, monkeypatch, capsys):
    document, line, argv = command
    monkeypatch.chdir(bundled)
    before = set(os.listdir(bundled))
    code = cli.main(argv)
    stderr = capsys.readouterr().err
    for name in set(os.listdir(bundled)) - before:  # its output, so that the next command may write it again
        path = bundled / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert code == 0, f"{document}:{line}: keras-gelu-convert {shlex.join(argv)}\n{stderr}"


def test_the_site_builds_with_strict_checks(tmp_path):
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (keras-gelu[docs])")
    result = subprocess.run([mkdocs, "build", "--strict", "-f", "docs/mkdocs.yml", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)  # as `make docs` runs it
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "converter" / "index.html").exists()
