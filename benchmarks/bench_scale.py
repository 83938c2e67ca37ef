"""The converter at real widths: wall time and peak memory against the stock converter's, and how both grow.

keras-hub models at the widths people ship, random weights, exported with fixed shapes (Keras 3 on
TensorFlow, `model.export`): GPT-2 small (124 M parameters, 1 x 128 tokens), ViT-B/16 (86 M, one 224 x 224
image), GPT-2 medium (355 M) and GPT-2 large (774 M: 3.1 GB of float32 weights, past protobuf's 2 GB).

Each conversion runs as a process of its own, as a user runs it, TensorFlow's import included; its wall
time and its peak resident memory are what `wait4` says of it and the processes it waited for (GNU time's
figure): the stock converter (`TFLiteConverter.from_saved_model(...).convert()`, float, and int8 on four
random samples), and `keras-gelu-convert` in native, builtin and `--int8 --calibration random:4` modes,
verification included. For ours, the report's seconds and the peak memory the sandbox's zygote sampled in
each step say where the cost is.

Measured on a shared, noisy machine (its speed drifts by tens of percent within an hour): --rounds N
interleaves the ways N times and shows medians; not a test. Needs about 14 GB for GPT-2 large.

    python benchmarks/bench_scale.py [--models gpt2-small vit-b16 gpt2-medium gpt2-large] [--ways ...]
                                     [--rounds N] [--keep FOLDER]
"""

import argparse
import json
import os
import subprocess
import sys
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402

_COMMAND = os.path.join(os.path.dirname(sys.executable), "keras-gelu-convert")

_GPT2_INPUTS = {"token_ids": ((1, 128), "int32"), "padding_mask": ((1, 128), "int32")}
# name: (keras_hub class, its arguments, the export's inputs {name: (shape, dtype)})
MODELS = {
    "gpt2-small": ("GPT2Backbone", dict(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
                                        intermediate_dim=3072), _GPT2_INPUTS),
    "vit-b16": ("ViTBackbone", dict(image_shape=(224, 224, 3), patch_size=16, num_layers=12, num_heads=12,
                                    hidden_dim=768, mlp_dim=3072), {"images": ((1, 224, 224, 3), "float32")}),
    "gpt2-medium": ("GPT2Backbone", dict(vocabulary_size=50257, num_layers=24, num_heads=16, hidden_dim=1024,
                                         intermediate_dim=4096), _GPT2_INPUTS),
    "gpt2-large": ("GPT2Backbone", dict(vocabulary_size=50257, num_layers=36, num_heads=20, hidden_dim=1280,
                                        intermediate_dim=5120), _GPT2_INPUTS),
}

# The stock converter, as a newcomer calls it; int8 with four random samples of the model's inputs.
_STOCK = """
import json, sys, numpy as np, tensorflow as tf
converter = tf.lite.TFLiteConverter.from_saved_model(sys.argv[1])
if sys.argv[3] == "int8":
    rng = np.random.default_rng(0)
    def samples():
        for _ in range(4):
            # in the signature's input order, which its sorted names give (Keras's export names them args_0...)
            yield [(rng.integers(0, 2, shape) if dtype.startswith("int") else rng.normal(size=shape)).astype(dtype)
                   for _, (shape, dtype) in sorted(json.loads(sys.argv[4]).items())]
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = samples
open(sys.argv[2], "wb").write(converter.convert())
"""
WAYS = {
    "stock": lambda model, output, report: [sys.executable, "-c", _STOCK, model, output, "float"],
    "stock int8": lambda model, output, report: [sys.executable, "-c", _STOCK, model, output, "int8",
                                                 json.dumps(MODELS[os.path.basename(model)][2])],
    "native": lambda model, output, report: [_COMMAND, model, "-o", output, "--force", "-q", "--mode", "native",
                                             "--report-json", report],
    "builtin": lambda model, output, report: [_COMMAND, model, "-o", output, "--force", "-q", "--report-json",
                                              report],
    "int8": lambda model, output, report: [_COMMAND, model, "-o", output, "--force", "-q", "--int8",
                                           "--calibration", "random:4", "--report-json", report],
}


def build(name, folder):
    """Export model `name` to `folder` (in a process of its own, so that its memory is gone after)."""
    import keras
    import keras_hub

    class_name, arguments, inputs = MODELS[name]
    keras.utils.set_random_seed(0)
    backbone = getattr(keras_hub.models, class_name)(**arguments)
    backbone.export(folder, verbose=False, input_signature=[
        {input_name: keras.InputSpec(shape=shape, dtype=dtype) for input_name, (shape, dtype) in inputs.items()}])
    print(json.dumps({"weight_bytes": sum(int(weight.numpy().nbytes) for weight in backbone.weights)}))


def measured(argv, log):
    """(wall seconds, peak resident bytes, exit code) of argv and the processes it waited for."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=log, stderr=log, env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - started, usage.ru_maxrss * 1024, process.returncode


def _last_line(path):
    with open(path, errors="replace") as stream:
        lines = [line.strip() for line in stream if line.strip()]
    return lines[-1][:160] if lines else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="convert each way this many times, interleaved, and show the median wall time and "
                             "peak (the range of wall times after it)")
    parser.add_argument("--keep", help="export the models here and keep them (exported once, reused)")
    parser.add_argument("--build", nargs=2, metavar=("MODEL", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        return build(*args.build)
    print(machine.header())
    print("\n| model | weights MB | way | wall s | peak MB | time vs stock | memory vs stock | "
          "steps: s (peak GB) |")
    print("|---|---:|---|---:|---:|---:|---:|---|", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or scratch
        for name in args.models:
            path = os.path.join(folder, name)
            built = subprocess.run([sys.executable, __file__, "--build", name, path], capture_output=True,
                                   text=True, check=True, env={**os.environ, "KERAS_BACKEND": "tensorflow"})
            weight_bytes = json.loads(built.stdout.strip().splitlines()[-1])["weight_bytes"]
            runs = {way: [] for way in args.ways}  # {way: [(seconds, peak, code, figures)] per round}
            for _ in range(args.rounds):  # the ways interleaved, so that a drift of the machine's speed hits all
                for way in args.ways:
                    runs[way].append(_run(way, path, scratch))
            for way in args.ways:
                # each of ours against the stock converter's same kind, round by round: the median of the ratios
                stock = "stock int8" if "int8" in way else "stock"
                failed = [run for run in runs[way] if run[2] != 0]
                seconds, peak = (statistics.median(run[index] for run in runs[way]) for index in (0, 1))
                against = [] if way.startswith("stock") or failed else [
                    (run[0] / base[0], run[1] / base[1]) for run, base in zip(runs[way], runs.get(stock, []))
                    if base[2] == 0]
                ratios = " | "
                if against:
                    ratios = " | ".join(f"{statistics.median(pair[index] for pair in against):.2f}x"
                                        for index in (0, 1))
                steps = f"failed (exit {failed[0][2]}): {failed[0][3]}" if failed else _steps(runs[way][-1][3])
                spread = f" ({min(run[0] for run in runs[way]):.1f}-{max(run[0] for run in runs[way]):.1f})" \
                    if args.rounds > 1 else ""
                print(f"| {name} | {weight_bytes / 1e6:.0f} | {way} | {seconds:.1f}{spread} | {peak / 1e6:.0f} | "
                      f"{ratios} | {steps} |", flush=True)


def _run(way, path, scratch):
    """(wall seconds, peak bytes, exit code, the report's figures or the log's last line) of one conversion."""
    output, report, log = (os.path.join(scratch, f"out.{suffix}") for suffix in ("tflite", "json", "log"))
    for leftover in (output, report):
        if os.path.exists(leftover):
            os.remove(leftover)
    with open(log, "w") as stream:
        seconds, peak, code = measured(WAYS[way](path, output, report), stream)
    if code != 0:
        return seconds, peak, code, _last_line(log)
    if not os.path.exists(report):
        return seconds, peak, code, {}
    with open(report) as stream:
        return seconds, peak, code, json.load(stream)


def _steps(figures):
    """The report's seconds per step and the zygote's peak sample in each, of the last round."""
    if not figures:
        return ""
    steps = ", ".join(f"{step} {seconds:.1f}" for step, seconds in figures["stage_seconds"].items())
    peaks = figures.get("stage_peak_bytes", {})
    return steps + "; peaks " + ", ".join(f"{step} {peak / 1e9:.1f}" for step, peak in peaks.items())


if __name__ == "__main__":
    main()
