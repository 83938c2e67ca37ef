"""Every Hugging Face TensorFlow model family, found by enumerating transformers' own table rather than by naming
families (`hugging_face_families`).

* every class transformers' TF auto-model table names is recorded here: as computing no GELU, as passing, as
  not passing a stage yet (with its one-line refusal), or as one that cannot be built, so that a family a
  transformers release adds fails this test until it is swept;
* today's family of those that compute a GELU (`KG_HF_FAMILIES`, default 1, today's share: conftest.todays_share,
  every family within seven weeks; `KG_HF_FAMILIES=all` (or KG_EVERY_CASE=1) takes every one, and
  `KG_HF_FAMILIES=TFBertModel,TFFunnelModel` those) is built, checked to compute a GELU (read from its traced
  serving function), saved as a user's export saves it, and converted as a newcomer would: in builtin mode with
  no flag but its inputs, and `--int8` calibrated on its inputs. A stage a family does not pass yet is listed in
  `NOT_YET` with its one-line refusal, strictly: the refusal must be the one listed, and a stage that passes
  while listed fails, so that the table shrinks as the mechanisms grow.

The sweep over all of them, with each family's cosines and time, is `benchmarks/sweep_hugging_face.py`.
"""

import pytest

import family_outcomes
import hugging_face_families

pytest.importorskip("transformers")

from keras_gelu import converters  # noqa: E402

# transformers' TF models are tf-keras models whichever Keras is active: both flavour legs would convert the very
# same graphs, so they run in the tf-keras leg (where test_real_models.py runs Hugging Face's BERT and GPT-2).
pytestmark = pytest.mark.legs("tf_keras")

# As benchmarks/sweep_hugging_face.py recorded them on 2026-12-07 (transformers 4.57, TF 2.21): of 69 classes, 10
# compute no GELU, 1 cannot be built, 58 compute one, and every one of those passes both stages.
WITHOUT_GELU = {
    "TFCTRLModel", "TFMistralModel", "TFMobileBertModel", "TFMobileViTModel", "TFOPTModel", "TFRegNetModel",
    "TFResNetModel", "TFSpeech2TextModel", "TFT5Model", "TFTransfoXLModel",
}
PASSING = {
    "TFAlbertModel", "TFBartModel", "TFBertModel", "TFBlenderbotModel", "TFBlenderbotSmallModel", "TFBlipModel",
    "TFCLIPModel", "TFCamembertModel", "TFConvBertModel", "TFConvNextModel", "TFConvNextV2Model", "TFCvtModel",
    "TFDPRQuestionEncoder", "TFData2VecVisionModel", "TFDebertaModel", "TFDebertaV2Model", "TFDeiTModel",
    "TFDistilBertModel", "TFEfficientFormerModel", "TFElectraModel", "TFEsmModel", "TFFlaubertModel",
    "TFFunnelBaseModel", "TFFunnelModel", "TFGPT2Model", "TFGPTJModel", "TFGroupViTModel", "TFHubertModel",
    "TFLEDModel", "TFLayoutLMModel", "TFLayoutLMv3Model", "TFLongformerModel", "TFLxmertModel", "TFMBartModel",
    "TFMPNetModel", "TFMT5Model", "TFMarianModel", "TFOpenAIGPTModel", "TFPegasusModel", "TFRemBertModel",
    "TFRoFormerModel", "TFRobertaModel", "TFRobertaPreLayerNormModel", "TFSamModel", "TFSamVisionModel",
    "TFSegformerModel", "TFSwiftFormerModel", "TFSwinModel", "TFTapasModel", "TFViTMAEModel", "TFViTModel",
    "TFVisionTextDualEncoderModel", "TFWav2Vec2Model", "TFWhisperModel", "TFXGLMModel", "TFXLMModel",
    "TFXLMRobertaModel", "TFXLNetModel",
}
# {family: {stage: the one-line refusal it meets now}}: none since the sweep above.
NOT_YET = {}

STAGES = ("builtin", "int8")

# Families whose stages take 15 s or more, where the rest take 3-13 s (the sweep above, its conversions through the
# sandbox, on 2 cores): `KG_HF_FAMILIES=all`, names and the sweep take them, the daily share does not, so that the
# day that would draw one keeps `make test` within its budget.
SLOW = {"TFLxmertModel": 38, "TFFunnelModel": 29, "TFLEDModel": 23, "TFFunnelBaseModel": 23, "TFSwinModel": 20,
        "TFSegformerModel": 18, "TFSamModel": 16, "TFLongformerModel": 16, "TFGroupViTModel": 15}


def test_every_tf_model_transformers_lists_is_recorded():
    classes = set(hugging_face_families.model_classes())
    assert len(classes) >= 69  # transformers 4.57's count: a smaller one means the enumeration lost some
    recorded = WITHOUT_GELU | PASSING | set(NOT_YET) | set(hugging_face_families.CANNOT_BUILD)
    assert classes == recorded, f"sweep them (benchmarks/sweep_hugging_face.py): {sorted(classes ^ recorded)}"
    assert not (PASSING & set(NOT_YET)) and not (WITHOUT_GELU & (PASSING | set(NOT_YET)))


@pytest.mark.slow
@pytest.mark.parametrize("family", family_outcomes.families_today(set(NOT_YET) | PASSING, SLOW, "KG_HF_FAMILIES"))
def test_a_hugging_face_family_found_by_enumeration_converts_as_a_user_would(family, tmp_path):
    built = hugging_face_families.traced(family)
    assert built.forms, f"{family} no longer computes a GELU"
    path, samples = hugging_face_families.save(built, tmp_path)
    outcomes = family_outcomes.Outcomes()

    def converted_with_its_gelus(**options):
        _, report = converters.convert(path, inputs=samples, **options)
        # the rewrite found what the graph computes as a GELU: a tanh or sigmoid form it missed would convert op
        # by op, unseen
        assert report.verified and sum(gelu["count"] for gelu in report.gelus) >= 1, report.gelus

    outcomes.attempt("builtin", converted_with_its_gelus)
    # min_cosine 0: a tiny random model's int8 cosine to the float model is a figure (the sweep prints it), not
    # this stage's bar
    outcomes.attempt("int8", lambda: converted_with_its_gelus(int8=True, calibration=samples, min_cosine=0.0))
    family_outcomes.assert_as_recorded(family, outcomes, NOT_YET)
