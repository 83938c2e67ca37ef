"""The int8 recipes in examples/ run as the README says (shortened: one form, one epoch each), each in one flavour.

QAT is tfmot's under tf-keras (which must then be installed) and keras_gelu.qat's under Keras 3.
"""

import importlib
import os
import sys

import pytest

from conftest import IS_KERAS3

pytestmark = pytest.mark.legs("keras3", "tf_keras")

pytest.importorskip("sklearn")
if not IS_KERAS3:  # never under Keras 3: importing tfmot sets TF_USE_LEGACY_KERAS=1 for the whole session
    pytest.importorskip("tensorflow_model_optimization")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))

SHORT = ["--epochs", "1", "--qat-epochs", "1", "--calibration-samples", "32"]


# Each recipe in one flavour (`make recipes` runs every one in both): the MLP on Keras 3's engine (tfmot's
# digits MLP is test_int8_digits'), the CNN on tfmot, each transformer where its attention has a rule.
@pytest.mark.parametrize("recipe, extra, prefix", [
    pytest.param("qat_digits", ["--functions", "learnable"], "digits", id="qat_digits",
                 marks=pytest.mark.skipif(not IS_KERAS3, reason="test_int8_digits runs tfmot's digits MLP")),
    pytest.param("qat_cnn_digits", ["--functions", "tanh"], "digits_cnn", id="qat_cnn_digits",
                 marks=pytest.mark.skipif(IS_KERAS3, reason="Keras 3's engine runs the MLP recipe here, and its "
                                                            "convolutions in test_keras3_qat")),
    pytest.param("qat_transformer", ["--functions", "exact", "--train-size", "256", "--test-size", "64"], "encoder",
                 marks=pytest.mark.skipif(IS_KERAS3, reason="Keras 3 runs the recipe's multi-head encoder below: "
                                                            "this one's layers and attention's"),
                 id="qat_transformer-encoder"),
    pytest.param("qat_transformer", ["--functions", "tanh", "--train-size", "256", "--test-size", "64",
                                     "--attention", "multi_head"], "encoder",
                 marks=pytest.mark.skipif(not IS_KERAS3, reason="Keras 3's engine has the MultiHeadAttention rule"),
                 id="qat_transformer-multi_head"),
])
def test_recipe_runs_and_refuses_to_overwrite(recipe, extra, prefix, tmp_path, capsys):
    module = importlib.import_module(recipe)
    argv = [*SHORT, *extra, "--output-dir", str(tmp_path)]
    assert module.main(argv) == 0
    table = capsys.readouterr().out
    assert "| function" in table and "PTQ int8" in table
    row = next(line for line in table.splitlines() if line.startswith("|") and extra[1] in line)
    assert " yes " in row  # the int8 model is integer throughout
    written = tmp_path / f"{prefix}_{extra[1]}_int8.tflite"
    assert written.stat().st_size > 0
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 7
    assert "--force" in capsys.readouterr().err


def test_recipe_flags_are_checked(capsys):
    import qat_digits

    with pytest.raises(SystemExit) as exit_info:
        qat_digits.main(["--functions", "quadratic"])
    assert exit_info.value.code == 2
    assert "unknown GELU function(s) quadratic" in capsys.readouterr().err


@pytest.mark.skipif(IS_KERAS3, reason="tfmot's refusal: under Keras 3 the engine quantizes MultiHeadAttention")
def test_the_multi_head_encoder_is_refused_under_tfmot_before_anything_is_written(tmp_path, capsys):
    import qat_transformer

    with pytest.raises(SystemExit) as exit_info:
        qat_transformer.main(["--attention", "multi_head", "--output-dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "needs Keras 3's QAT engine (TF_USE_LEGACY_KERAS=0)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_real_model_recipe_checks_its_flags_before_anything_is_written(tmp_path, capsys):
    """examples/qat_real_models.py trains for minutes: its flags and outputs are checked first. (Its steps run in
    the suite on their own: test_swapping's keras-hub ViT swap, test_qat_real_models, test_keras3_qat's ConvNeXt.)"""
    import qat_real_models

    with pytest.raises(SystemExit) as exit_info:
        qat_real_models.main(["--families", "vit,swin", "--output-dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    if IS_KERAS3:
        assert "unknown family swin; choose from convnext, vit, bert" in message
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "vit_learnable_qat.keras").write_bytes(b"trained for an hour")
        with pytest.raises(SystemExit) as exit_info:
            qat_real_models.main(["--families", "vit", "--output-dir", str(tmp_path / "out")])
        assert exit_info.value.code == 7
        assert "already holds vit_learnable_qat.keras; pass --force" in capsys.readouterr().err
        assert (tmp_path / "out" / "vit_learnable_qat.keras").read_bytes() == b"trained for an hour"
    else:
        assert "needs Keras 3 (TF_USE_LEGACY_KERAS=0)" in message
    assert not (tmp_path / "out" / "vit_exact_int8.tflite").exists()
