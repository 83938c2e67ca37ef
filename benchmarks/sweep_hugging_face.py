"""Build every Hugging Face TensorFlow model family tiny and take each that computes a GELU through the converter.

For each class that `tests/hugging_face_families.py` finds in transformers' TF auto-model table, this builds it
from its tiny configuration, traces its serving function and reads the graph for GELUs (`tests/gelu_evidence.py`);
for each that computes one, saves the SavedModel a user's export would and converts it as the suite's family
test does, through `keras_gelu.converters.convert` (the sandbox): the float model in builtin mode, and `--int8`
calibrated on the family's own inputs (no cosine budget: a tiny random model's int8 cosine is a figure, not a
bar); where int8's cosine misses the converter's default budget (0.99), what its refusal suggests too: `--int16`,
and `--int8 --mixed-precision` (held to that budget). It prints a markdown table (the family, its GELU forms,
each stage as ok with its cosine to the float model or the converter's one-line refusal, and the seconds each
family took) and the sets the suite's
`tests/test_every_hugging_face_family.py` records. Offline: no weights, no tokenizers.

    TF_USE_LEGACY_KERAS=1 python benchmarks/sweep_hugging_face.py [--only TFBertModel TFFunnelModel ...] [--every-stage]

`--every-stage` tries `--int16` and `--int8 --mixed-precision` on every family, not only where int8 misses the
budget: 16x8 is quantized by another quantizer than int8 (`converters/tflite/quantizer.py`), which fails in ways
of its own.

Exits 1 if a class outside CANNOT_BUILD cannot be built or called, so that a transformers upgrade that adds or
breaks a family is noticed.
"""

import argparse
import gc
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # transformers' TF models are tf-keras models
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

import family_outcomes  # noqa: E402
import hugging_face_families as families  # noqa: E402

STAGES = ("builtin", "int8")
RESCUES = ("int16", "mixed")  # tried where int8's cosine misses the converter's default budget
BUDGET = 0.99  # --min-cosine's default


def _cosine(report):
    return min(comparison["cosine"] for comparison in report.fidelity)


def sweep_one(class_name, folder, every_stage=False):
    """A row: {"class", "built", "gelu", stage: outcome..., "seconds"}; the RESCUES where int8 misses BUDGET, or
    on every family (`every_stage`)."""
    import tensorflow as tf

    from keras_gelu import converters

    row = {"class": class_name, "built": "yes", "gelu": ""}
    started = time.perf_counter()
    try:
        family = families.traced(class_name)
        row["gelu"] = ", ".join(sorted(family.forms)) or "no"
    except Exception as error:  # noqa: BLE001 - one family's failure is a row, not the end of the sweep
        row["built"] = family_outcomes.first_line(error)[:150]
        family = None
    if family is not None and family.forms:
        path, samples = families.save(family, folder)
        outcomes = family_outcomes.Outcomes()
        cosines = {}
        conversions = {"builtin": {}, "int8": {"int8": True, "calibration": samples, "min_cosine": 0.0},
                       # what the int8 refusal's line suggests, where int8 misses the default budget
                       "int16": {"int16": True, "calibration": samples, "min_cosine": 0.0},
                       "mixed": {"int8": True, "mixed_precision": True, "calibration": samples}}
        for stage, options in conversions.items():
            if stage in RESCUES and not every_stage and not cosines.get("int8", 1.0) < BUDGET:
                continue
            outcomes.attempt(stage, lambda: cosines.__setitem__(
                stage, _cosine(converters.convert(path, inputs=samples, **options)[1])))
        for stage, refusal in outcomes.items():
            row[stage] = f"ok, cosine {cosines[stage]:.4f}" if refusal is None else refusal[:200]
    row["seconds"] = f"{time.perf_counter() - started:.1f}"
    tf.keras.backend.clear_session()
    gc.collect()
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="CLASS", help="sweep these classes only")
    parser.add_argument("--every-stage", action="store_true",
                        help="try --int16 and --mixed-precision on every family, not only where int8 misses 0.99")
    arguments = parser.parse_args()
    found = families.model_classes()
    unknown = set(arguments.only or ()) - set(found)
    if unknown:
        parser.error(f"not in transformers' TF auto-model table: {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in arguments.only or sorted(found):
            folder = pathlib.Path(scratch, name)
            folder.mkdir()
            rows.append(sweep_one(name, folder, arguments.every_stage))
    print("| Family | Built | GELU | builtin | int8 | int16 | int8 --mixed-precision | s |")
    print("|---|---|---|---|---|---|---|---:|")
    for row in rows:
        stages = " | ".join(row.get(stage, "") for stage in (*STAGES, *RESCUES))
        print(f"| {row['class']} | {row['built']} | {row['gelu']} | {stages} | {row['seconds']} |")
    unbuilt = [row["class"] for row in rows if row["built"] != "yes" and row["class"] not in families.CANNOT_BUILD]
    with_gelu = [row for row in rows if row["gelu"] not in ("", "no")]
    passing = [row["class"] for row in with_gelu if all(row[stage].startswith("ok") for stage in STAGES)]
    print()
    print(f"{len(found)} classes found, {len(rows)} swept, {len(with_gelu)} compute a GELU, {len(passing)} pass "
          f"every stage ({time.perf_counter() - started:.0f} s)")
    print(f"WITHOUT_GELU: {sorted(row['class'] for row in rows if row['gelu'] == 'no')}")
    print(f"PASSING: {sorted(passing)}")
    print(f"NOT_YET: {sorted(row['class'] for row in with_gelu if row['class'] not in passing)}")
    if unbuilt:
        print(f"cannot build, and not in CANNOT_BUILD: {', '.join(unbuilt)}")
    return 1 if unbuilt else 0


if __name__ == "__main__":
    sys.exit(main())
