"""examples/relu_to_gelu.py: the study runs end to end in its short mode, and its measurements mean what they say."""

import os
import sys

import numpy as np
import pytest

from conftest import keras

pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))

import relu_to_gelu  # noqa: E402

pytestmark = pytest.mark.legs("tf_keras")  # the script is the same code in both flavours; this leg is the shorter

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_short_study_prints_its_tables_writes_its_plots_and_refuses_to_overwrite(tmp_path, capsys):
    """One task end to end (the tasks differ only in data and model: the digits MLP's are checked below): the
    sequence task's attention encoder, where the swap reaches a Dense inside a transformer block."""
    argv = ["--short", "--tasks", "sequence", "--plots-dir", str(tmp_path)]
    assert relu_to_gelu.main(argv) == 0
    output = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in output.splitlines()
            if line.startswith("|")]
    first_cells = {tuple(row[:2]) for row in rows}
    assert {("sequence", run) for run in relu_to_gelu.RUNS} <= first_cells
    assert "training-step time / ReLU's" in output and "revived" in output
    assert "ffn_in.activation: relu -> gelu_exact" in output
    written = {name: (tmp_path / name).read_bytes() for name in relu_to_gelu.PLOTS}
    assert all(data.startswith(PNG_SIGNATURE) and len(data) > 10_000 for data in written.values())

    with pytest.raises(SystemExit) as exit_info:
        relu_to_gelu.main(argv)
    assert exit_info.value.code == 7
    assert "--force" in capsys.readouterr().err
    assert {name: (tmp_path / name).read_bytes() for name in relu_to_gelu.PLOTS} == written


def test_dead_units_are_those_whose_relu_output_is_zero_on_every_input(rng):
    model = relu_to_gelu.build_mlp("relu", seed=3)
    hidden = model.get_layer("hidden_2")
    kernel, bias = hidden.get_weights()
    hidden.set_weights([kernel, bias - 3.0 * (np.arange(bias.size) % 4 == 0)])  # push a quarter of the units off
    x = rng.uniform(0, 1, size=(200, 64)).astype(np.float32)
    task = relu_to_gelu.TASKS["digits"]
    dead = relu_to_gelu.dead_unit_share(model, task, x)
    outputs = keras.Model(model.inputs[0], [model.get_layer(name).output for name in task.hidden_layers])(x)
    expected = np.concatenate([np.all(np.asarray(output) == 0, axis=0) for output in outputs])
    np.testing.assert_array_equal(dead, expected)
    assert 0 < dead.mean() < 1


def test_steps_to_a_threshold_is_the_first_step_at_or_below_it():
    curve = [(0, 2.0), (10, 0.5), (20, 0.3), (30, 0.35), (40, 0.1)]
    assert relu_to_gelu.steps_to(curve, 0.3) == 20
    assert relu_to_gelu.steps_to(curve, 0.3, after=20) == 20  # 40 - 20: the first step after 20 at or below it
    assert relu_to_gelu.steps_to(curve, 0.05) is None


def test_bad_flags_exit_with_one_line(capsys, tmp_path):
    for argv, message in ((["--tasks", "mnist"], "unknown task(s) mnist"), (["--seeds", "0"], "--seeds must be >= 1")):
        with pytest.raises(SystemExit) as exit_info:
            relu_to_gelu.main([*argv, "--plots-dir", str(tmp_path)])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
