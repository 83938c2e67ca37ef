"""Precision head to head: ours, the stock TFLite converter and AI Edge Quantizer, against the float model.

Over keras-hub's tiny random families (built offline from `tests/keras_hub_families.py`'s configs, as the
family sweep builds them) and two real-width models with random weights (ViT-B/16 with a 1000-class head,
keras-hub's ViTImageClassifier; GPT-2 small with its language-model head, keras-hub's GPT2CausalLM, on 128
tokens), each exported once as a SavedModel with fixed shapes (batch 1), it makes every .tflite of
`head_to_head.METHODS` from the same calibration samples (ours --int8, --int16 and --int8
--mixed-precision; the stock converter's int8 and 16x8; AI Edge Quantizer's static_wi8_ai8 and
static_wi8_ai16 on the stock float .tflite) and reports, per model and method, on held-out samples (none of
them calibration samples):

- the cosine of the worst output against the float model (the exported SavedModel's serving function, run in
  TensorFlow);
- top-1 agreement, the share of argmaxes along the last axis that match the float model's, where the output
  is a classification or token logit (the two real-width models; a backbone's hidden states have none);
- the .tflite's size, and its latency on LiteRT (`ai_edge_litert`'s interpreter, the same thread count for
  all, median of interleaved rounds, `timing.py`), and what still computes in float.

Every model runs in a process of its own, and a method that fails, crashes the process or overruns its time
is a cell saying so: the process starts again with the methods left. Ratios and figures from one run on a
shared machine; not a test.

    python benchmarks/bench_precision.py        # five tiny families (4 minutes on 2 cores)
    python benchmarks/bench_precision.py --models vit-b16 gpt2-small --held-out 8 --rounds 5   # (40 minutes)
    python benchmarks/bench_precision.py --models all-families   # every keras-hub family with a GELU
"""

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ["TF_USE_LEGACY_KERAS"] = "0"  # keras-hub's models are Keras 3 models
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))

import head_to_head  # noqa: E402
import keras_hub_families as families  # noqa: E402
import machine  # noqa: E402

# A handful of families for the default run, one per way a GELU is written and placed: the tanh form in an encoder
# (keras-hub's BERT) and in a decoder (GPT-2), erf GELU in a vision transformer (ViT) and after depthwise
# convolutions (keras.applications' ConvNeXt), and CLIP's quick GELU, x sigmoid(1.702 x).
DEFAULT_FAMILIES = ("BertBackbone", "ViTBackbone", "GPT2Backbone", "CLIPVisionEncoder",
                    families.APPLICATIONS + "convnext.ConvNeXt")
REAL_WIDTH = ("vit-b16", "gpt2-small")
GPT2_SEQUENCE = 128
# How long one job (a method's conversion and measurement) may take: a real-width conversion takes minutes (ours
# verifies too).
JOB_SECONDS = {"tiny": 600, "real": 1800}
PROGRESS = "progress.jsonl"


def _short(name):
    return name.rsplit(".", 1)[-1] if name.startswith(families.APPLICATIONS) else name


# --- the models, in the model's own process --------------------------------------------------------------------

def _real_width(name):
    """(model, sample(rng) -> one batch-1 input in the model's input structure) of a real-width model."""
    import keras_hub
    import numpy as np

    if name == "vit-b16":
        backbone = keras_hub.models.ViTBackbone(image_shape=(224, 224, 3), patch_size=16, num_layers=12,
                                                num_heads=12, hidden_dim=768, mlp_dim=3072)
        model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=1000, preprocessor=None)
        return model, lambda rng: rng.uniform(0.0, 1.0, (1, 224, 224, 3)).astype(np.float32)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
                                             intermediate_dim=3072, max_sequence_length=1024)
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    return model, lambda rng: {"token_ids": rng.integers(1, 50257, (1, GPT2_SEQUENCE)).astype(np.int32),
                               "padding_mask": np.ones((1, GPT2_SEQUENCE), np.int32)}


def _samples(name, count):
    """(model, [count batch-1 inputs in the model's input structure], whether its output is a logit)."""
    import keras
    import numpy as np

    if name in REAL_WIDTH:
        keras.utils.set_random_seed(families.SEED)
        model, sample = _real_width(name)
        rng = np.random.default_rng(families.SEED)
        return model, [sample(rng) for _ in range(count)], True
    model, _ = families.build(name)
    samples = []
    for seed in range(count):  # the family's own random inputs, as the sweep makes them, split into batch 1
        batch = families.example_inputs(model, seed=families.SEED + 1 + seed)
        samples += [keras.tree.map_structure(lambda array, index=index: array[index:index + 1], batch)
                    for index in range(families.BATCH)]
        if len(samples) >= count:
            break
    return model, samples[:count], False


class ComputesNoGelu(Exception):
    """A family `--models all-families` skips, with a note rather than a failure."""


def prepare(name, folder, calibration_count, held_out_count):
    """Build model `name`, export it with fixed shapes and keep its samples and the float outputs in `folder`;
    {"gelu": the forms it computes, "parameters"}."""
    model, samples, is_logit = _samples(name, calibration_count + held_out_count)
    forms = families.gelu_forms(model, samples[0])
    if not forms:
        raise ComputesNoGelu("computes no GELU")
    head_to_head.exported_subject(model, samples[:calibration_count], samples[calibration_count:], folder,
                                  logits=is_logit).save()
    return {"gelu": ", ".join(sorted(forms)), "parameters": int(model.count_params())}


def _tflite_path(folder, method):
    return os.path.join(folder, method.replace(" ", "_").replace("(", "").replace(")", "") + ".tflite")


def time_methods(folder, methods, threads, rounds):
    """{method: median seconds per invoke} of the methods' .tflite files, interleaved, on one held-out sample."""
    import timing

    sample = head_to_head.Subject.load(folder).held_out[0]
    interpreters = {}
    for method in methods:
        tflite_model = pathlib.Path(_tflite_path(folder, method)).read_bytes()
        interpreters[method] = timing.interpreter(tflite_model, head_to_head.interpreter_inputs(tflite_model, sample),
                                                  threads)
    return timing.interleaved_medians(interpreters, rounds)


def child(folder, jobs, options):
    """The model's own process: each job ("prepare", a method, "time") in turn, its start and its result (or its
    one-line failure) appended to the progress file as it happens, so that the parent knows what a crash cut."""
    made = head_to_head.methods(options["ours_mode"], options["mixed_min_cosine"], options["ours_time_limit"])
    subject = None  # loaded once: AI Edge Quantizer's two recipes share its stock float .tflite

    def note(**entry):
        with open(os.path.join(folder, PROGRESS), "a") as progress:
            progress.write(json.dumps(entry) + "\n")

    for job in jobs:
        note(job=job, began=time.time())
        step = job.split(":", 1)[0]
        try:
            if job.startswith("prepare:"):
                result = prepare(job.split(":", 1)[1], folder, options["calibration_samples"], options["held_out"])
            elif job.startswith("time:"):
                result = time_methods(folder, job.split(":", 1)[1].split(","), options["threads"], options["rounds"])
            else:
                subject = subject or head_to_head.Subject.load(folder)
                step = "conversion"
                tflite_model = made[job](subject)
                pathlib.Path(_tflite_path(folder, job)).write_bytes(tflite_model)
                step = "LiteRT"  # a .tflite written that LiteRT cannot run is the method's failure too
                result = head_to_head.measure(tflite_model, subject)
        except ComputesNoGelu as skipped:
            note(job=job, skipped=str(skipped))
        except Exception as error:  # noqa: BLE001 - a method that fails is a cell of the table
            note(job=job, failed=f"{step}: {head_to_head.failure_line(error, subject)}")
        else:
            note(job=job, result=result)
    return 0


# --- the parent: each model's process, restarted after a crash ---------------------------------------------------

def _ended_how(returncode):
    if returncode < 0:
        return f"crashed ({signal.Signals(-returncode).name})"
    return f"its process exited with {returncode}"


def _new_entries(progress_path, seen):
    """The progress file's entries after its first `seen`, and how many it holds now."""
    lines = pathlib.Path(progress_path).read_text().splitlines() if os.path.exists(progress_path) else []
    return [json.loads(line) for line in lines[seen:]], len(lines)


def run_jobs(folder, jobs, options, job_seconds):
    """{job: {"result"|"failed"|"skipped": ...}} of `jobs` run by the model's processes: one process while none
    crashes; a job that crashes or overruns `job_seconds` is failed and the next process takes the rest."""
    outcomes, pending = {}, list(jobs)
    progress_path = os.path.join(folder, PROGRESS)
    argv = [sys.executable, os.path.abspath(__file__), "--child", folder, json.dumps(options)]
    while pending:
        _, seen = _new_entries(progress_path, 0)
        with open(os.path.join(folder, "log.txt"), "a") as log:
            # a session of its own, so that the time limit ends every process it started (ours's sandbox too)
            process = subprocess.Popen([*argv, *pending], stdout=log, stderr=log, start_new_session=True)
        running, since = None, time.time()
        while True:
            ended = process.poll() is not None  # before reading: what it wrote before it ended is read
            entries, seen = _new_entries(progress_path, seen)
            for entry in entries:
                if "began" in entry:
                    running, since = entry["job"], time.time()
                else:
                    outcomes[entry["job"]] = entry
                    running = None
                    _say(folder, entry)
            if ended:
                break
            if running is not None and time.time() - since > job_seconds:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                outcomes[running] = {"job": running, "failed": f"past the benchmark's {job_seconds} s limit"}
                _say(folder, outcomes[running])
                running = None
                break
            time.sleep(0.5)
        if running is not None:
            outcomes[running] = {"job": running, "failed": _ended_how(process.returncode)}
            _say(folder, outcomes[running])
        left = [job for job in pending if job not in outcomes]
        if left == pending:  # the process ran none of them: say so rather than start it again
            for job in left:
                outcomes[job] = {"job": job, "failed": _ended_how(process.returncode)}
            break
        pending = left
    return outcomes


def _say(folder, entry):
    what = entry.get("failed") or entry.get("skipped") or "done"
    print(f"  {os.path.basename(folder)}: {entry['job']}: {what}", file=sys.stderr, flush=True)


def run_model(name, root, options, methods):
    """{"name", "prepared" (or "failed"), "methods": {method: outcome}, "seconds": {method: latency}}."""
    folder = os.path.join(root, _short(name))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    job_seconds = JOB_SECONDS["real" if name in REAL_WIDTH else "tiny"]
    if options["ours_time_limit"]:  # ours is given longer: so is its job, with time to measure what it made
        job_seconds = max(job_seconds, options["ours_time_limit"] + JOB_SECONDS["tiny"])
    prepared = run_jobs(folder, [f"prepare:{name}"], options, job_seconds)[f"prepare:{name}"]
    row = {"name": _short(name), "methods": {}, "seconds": {}}
    if "result" not in prepared:
        row["skipped" if "skipped" in prepared else "failed"] = prepared.get("skipped") or prepared.get("failed")
        return row
    row["prepared"] = prepared["result"]
    row["methods"] = run_jobs(folder, list(methods), options, job_seconds)
    made = [method for method in methods if "result" in row["methods"].get(method, {})]
    if made:
        timed = next(iter(run_jobs(folder, ["time:" + ",".join(made)], options, job_seconds).values()))
        row["seconds"] = timed.get("result", {})
        row["timing_failed"] = timed.get("failed")
    if not options["keep"]:
        shutil.rmtree(folder, ignore_errors=True)
    return row


# --- the tables ------------------------------------------------------------------------------------------------

def _float_ops(float_ops):
    if not float_ops:
        return "none"
    ranked = sorted(float_ops.items(), key=lambda item: -item[1])
    text = ", ".join(f"{op} {count}" for op, count in ranked[:3])
    return text + (f", +{len(ranked) - 3} kinds" if len(ranked) > 3 else "")


def print_rows(row, methods):
    if "failed" in row:
        print(f"| {row['name']} | | not built: {row['failed']} | | | | | |", flush=True)
        return
    gelu = row["prepared"]["gelu"]
    for method in methods:
        outcome = row["methods"].get(method, {"failed": "not run"})
        if "result" not in outcome:
            print(f"| {row['name']} | {gelu} | {method} | {outcome.get('failed') or outcome.get('skipped')} "
                  "| | | | |", flush=True)
            continue
        result = outcome["result"]
        top1 = "" if result["top1"] is None else f"{result['top1']:.4f}"
        seconds = row["seconds"].get(method)
        latency = f"{seconds * 1e3:.2f}" if seconds is not None else f"timing: {row.get('timing_failed')}"
        still_float = "(the float model)" if method == "float (stock)" else _float_ops(result["float_ops"])
        print(f"| {row['name']} | {gelu} | {method} | {result['cosine']:.6f} | {top1} | {result['bytes']:,} "
              f"| {latency} | {still_float} |", flush=True)


# The methods compared with each other, by the precision of their activations.
CLASSES = {"int8": ("ours int8", "stock int8", "AEQ int8"), "16x8": ("ours int16", "stock 16x8", "AEQ 16x8")}
TIED = 1e-6  # cosines this close are a tie: the held-out samples cannot tell them apart


def most_accurate(row, methods):
    """{class: the names of its most accurate methods (cosine), ties included}."""
    winners = {}
    for precision, members in CLASSES.items():
        cosines = {method: row["methods"][method]["result"]["cosine"] for method in members
                   if method in methods and "result" in row["methods"].get(method, {})}
        if cosines:
            best = max(cosines.values())
            winners[precision] = [method for method, cosine in cosines.items() if cosine >= best - TIED]
    return winners


def print_summary(rows, methods):
    compared = [method for method in methods if method != "float (stock)"]
    print("\n| model | " + " | ".join(compared) + " | most accurate int8 | most accurate 16x8 |")
    print("|---|" + "---:|" * len(compared) + "---|---|")
    for row in rows:
        if "failed" in row:
            continue
        cells = []
        for method in compared:
            outcome = row["methods"].get(method, {})
            cells.append(f"{outcome['result']['cosine']:.6f}" if "result" in outcome else
                         "skipped" if "skipped" in outcome else "failed")
        winners = most_accurate(row, methods)
        made = {precision: sum("result" in row["methods"].get(method, {}) for method in members)
                for precision, members in CLASSES.items()}
        print(f"| {row['name']} | " + " | ".join(cells) + " | " + " | ".join(
            ", ".join(winners.get(precision, ["-"])) + (" (the only one made)" if made[precision] == 1 else "")
            for precision in CLASSES) + " |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_FAMILIES), metavar="MODEL",
                        help="keras-hub families (keras_hub_families.py's names; ConvNeXt: keras.applications'), "
                             "vit-b16, gpt2-small, or all-families (every family; those without a GELU are skipped); "
                             "default: "
                             + ", ".join(_short(name) for name in DEFAULT_FAMILIES))
    parser.add_argument("--methods", nargs="+", default=list(head_to_head.METHODS), choices=head_to_head.METHODS,
                        metavar="METHOD", help="of: " + ", ".join(head_to_head.METHODS))
    parser.add_argument("--calibration-samples", type=int, default=16, help="the same for every method (default 16)")
    parser.add_argument("--held-out", type=int, default=16, help="samples the methods are judged on (default 16)")
    parser.add_argument("--threads", type=int, default=1, help="LiteRT threads, for every method (default 1)")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds (default 20)")
    parser.add_argument("--ours-mode", choices=("builtin", "native", "select"),
                        help="ours' --mode (default: the command's own, builtin)")
    parser.add_argument("--mixed-min-cosine", type=float, default=head_to_head.MIXED_MIN_COSINE,
                        help=f"the budget ours' --mixed-precision climbs to (default {head_to_head.MIXED_MIN_COSINE})")
    parser.add_argument("--ours-time-limit", type=float, metavar="SECONDS",
                        help="ours' --time-limit (default: the converter's, which grows with the model's size)")
    parser.add_argument("--workdir", help="where each model's files go (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep each model's SavedModel, samples and .tflite files")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        folder, options, *jobs = args.child
        return child(folder, jobs, json.loads(options))

    names = []
    for name in args.models:
        full = families.APPLICATIONS + "convnext.ConvNeXt" if name == "ConvNeXt" else name
        if name == "all-families":
            names += [family for family in families.family_names() if family not in families.CANNOT_BUILD]
        elif full in REAL_WIDTH or full in families.TINY_CONFIGS:
            names.append(full)
        else:
            parser.error(f"unknown model {name}: a keras-hub family, vit-b16, gpt2-small or all-families")
    for flag in ("calibration_samples", "held_out", "threads", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    options = {"calibration_samples": args.calibration_samples, "held_out": args.held_out, "threads": args.threads,
               "rounds": args.rounds, "ours_mode": args.ours_mode, "mixed_min_cosine": args.mixed_min_cosine,
               "ours_time_limit": args.ours_time_limit, "keep": args.keep}
    methods = [method for method in head_to_head.METHODS if method in args.methods]

    print(machine.header(threads=args.threads))
    print(f"{args.calibration_samples} calibration samples, {args.held_out} held-out samples; ours in "
          f"{args.ours_mode or 'builtin'} mode, --min-cosine 0 (mixed: {args.mixed_min_cosine}); latency: median of "
          f"{args.rounds} interleaved rounds")
    print("\n| model | GELU | method | cosine (worst output) | top-1 agreement | bytes | ms | still float |")
    print("|---|---|---|---:|---:|---:|---:|---|", flush=True)
    rows = []
    started = time.perf_counter()
    root = args.workdir or tempfile.mkdtemp(prefix="bench_precision_")
    try:
        for name in names:
            print(f"{_short(name)}: building, then {len(methods)} methods", file=sys.stderr, flush=True)
            row = run_model(name, root, options, methods)
            if "skipped" in row:  # computes no GELU
                continue
            rows.append(row)
            print_rows(row, methods)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    print_summary(rows, methods)
    print(f"\n{len(rows)} models in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
