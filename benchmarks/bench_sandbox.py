"""What the sandbox costs a conversion: the command, and convert() called again and again in one program.

Three ways to convert each model, timed in interleaved rounds (each first in turn), medians of wall time:

* contained: `keras-gelu-convert`, as shipped: the conversion in a worker forked from a zygote, in its own
  namespaces, without capabilities, confined by Landlock and the seccomp allow-list, its .tflite copied out and
  checked by a fresh worker;
* unconfined: the same command and processes with KERAS_GELU_SANDBOX=off: what the namespaces, Landlock and
  seccomp alone cost (the copy and the check stay);
* in one process: TensorFlow imported and the pipeline run in the command's own process, as the command ran
  before the sandbox: what the whole sandbox costs (the zygote, the forks, the answer read as hostile input,
  the copy and the check).

For a program that converts many models, `convert()` in one process against the pipeline called directly
(both warm: the zygote started, TensorFlow imported): what each conversion's fork costs, taken apart (the
conversion job's fork, confinement and end; TensorFlow's first calls in a fresh worker; the check job; the
caller's own share), with the CPU seconds of every process of the call.

Models: the suite's small ones (a GELU spelling, a Keras model of keras_gelu layers) and, with --real-width, a
keras-hub GPT-2 at GPT-2 small's width (124 M parameters, random weights, exported at 1 x 128 tokens).
Ratios measured in one run on a shared, noisy machine; not a test.

    python benchmarks/bench_sandbox.py [--rounds 5] [--real-width] [--library-only]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import machine  # noqa: E402
import timing  # noqa: E402

_COMMAND = os.path.join(os.path.dirname(sys.executable), "keras-gelu-convert")
_IN_ONE_PROCESS = """
import sys
from keras_gelu.converters import paths
from keras_gelu.converters.options import Options
from keras_gelu.converters.running import pipeline
tflite_model, _ = pipeline.convert(sys.argv[1], Options(), kind=paths.model_kind(sys.argv[1]))
paths.write_atomically(tflite_model, sys.argv[2], force=True)
"""


def small_models(folder):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    import spelling_models
    import keras_gelu
    from keras_gelu.flavour import keras

    models = {"GELU spelling (SavedModel)": spelling_models.save("tf_nn_gelu", os.path.join(folder, "spelling"))}
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(256, activation=keras_gelu.GELU())(inputs)
    hidden = keras_gelu.LearnableGELU()(keras.layers.Dense(256, activation=keras_gelu.gelu_tanh)(hidden))
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    models["keras_gelu layers (.keras)"] = os.path.join(folder, "layers.keras")
    model.save(models["keras_gelu layers (.keras)"])
    return models


def gpt2_small(folder):
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768,
                                             intermediate_dim=3072, max_sequence_length=1024)
    path = os.path.join(folder, "gpt2_small")
    import keras

    backbone.export(path, verbose=False, input_signature=[{
        "token_ids": keras.InputSpec(shape=(1, 128), dtype="int32"),
        "padding_mask": keras.InputSpec(shape=(1, 128), dtype="int32")}])
    return path


def command_seconds(model, output, how):
    environment = {**os.environ, "KERAS_GELU_SANDBOX": "off"} if how == "unconfined" else dict(os.environ)
    argv = ([sys.executable, "-c", _IN_ONE_PROCESS, model, output] if how == "in one process"
            else [_COMMAND, model, "-o", output, "--force", "-q"])
    started = time.perf_counter()
    subprocess.run(argv, check=True, env=environment, capture_output=True)
    return time.perf_counter() - started


def _zygote_cpu_seconds():
    """The CPU seconds of the zygote and of every process of its jobs that ended (each waited for on its way up); 0
    before it starts."""
    from keras_gelu.converters.sandbox import supervisor

    zygote = next(iter(supervisor._zygotes.values()), None)
    if zygote is None:
        return 0.0
    with open(f"/proc/{zygote.process.pid}/stat") as stream:
        fields = stream.read().rsplit(")", 1)[1].split()
    return sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime, stime, cutime, cstime


def library_seconds(models, rounds):
    """{model: {part: median seconds}}: convert() called again and again in this process, and the pipeline called
    directly, both warm, in interleaved rounds; convert() taken apart as its supervisor sees it: the conversion
    job from the zygote's fork to its reaping ("job"), the pipeline in it by the worker's own clock ("pipeline"),
    the check job ("check"), and the CPU seconds of the call here, in the zygote and in every process of its
    jobs ("cpu")."""
    from keras_gelu import converters
    from keras_gelu.converters import paths
    from keras_gelu.converters.options import Options
    from keras_gelu.converters.running import pipeline
    from keras_gelu.converters.sandbox import supervisor

    jobs = {}
    ran = supervisor._ran

    def timed(job, progress):  # each job's time as the zygote measured it, fork to reaping
        zygote, ended = ran(job, progress)
        jobs["check" if "check" in job else "job"] = ended["seconds"]
        return zygote, ended

    supervisor._ran = timed
    results = {}
    try:
        for name, path in models.items():
            def contained():
                cpu = time.process_time(), _zygote_cpu_seconds()
                started = time.perf_counter()
                _, report = converters.convert(path)
                seconds = time.perf_counter() - started
                return {"convert()": seconds, "pipeline": report.seconds, **jobs,
                        "cpu": time.process_time() - cpu[0] + _zygote_cpu_seconds() - cpu[1]}

            def here():
                started = time.perf_counter()
                pipeline.convert(path, Options(), kind=paths.model_kind(path))
                return {"pipeline here": time.perf_counter() - started}

            calls = {"contained": contained, "here": here}
            for call in calls.values():
                call()  # warm: the zygote started, this process's caches filled
            samples = {}
            for round_index in range(rounds):
                for key in timing.in_turn(calls, round_index):
                    for part, seconds in calls[key]().items():
                        samples.setdefault(part, []).append(seconds)
            results[name] = {part: statistics.median(values) for part, values in samples.items()}
    finally:
        supervisor._ran = ran
    return results


def command_table(models, output, rounds):
    """The command three ways, each model in interleaved rounds: the table's rows as they come."""
    ways = ("contained", "unconfined", "in one process")
    print(f"\nthe command, median of {rounds} interleaved rounds (wall seconds, TensorFlow's import included)")
    print(f"{'model':42s} {'contained':>10s} {'unconfined':>11s} {'one process':>12s} {'vs unconfined':>14s} "
          f"{'vs one process':>15s}")
    for name, path in models.items():
        samples = {how: [] for how in ways}
        for round_index in range(rounds):
            for how in timing.in_turn(ways, round_index):
                samples[how].append(command_seconds(path, output, how))
        medians = {how: statistics.median(values) for how, values in samples.items()}
        print(f"{name:42s} {medians['contained']:10.2f} {medians['unconfined']:11.2f} "
              f"{medians['in one process']:12.2f} {medians['contained'] / medians['unconfined']:14.3f} "
              f"{medians['contained'] / medians['in one process']:15.3f}")


def library_table(models, rounds):
    """convert() called again and again, each model's row, and where its time goes."""
    print(f"\nconvert() called again and again in one program, median of {rounds} interleaved rounds (warm; wall "
          "seconds, and CPU seconds of every process of the call), and where its time goes: the conversion job's "
          "fork, confinement and end (the job less its pipeline), TensorFlow's first calls in a fresh worker (its "
          "pipeline less the pipeline here), the check job, and this process's own share")
    print(f"{'model':42s} {'convert()':>10s} {'CPU':>6s} {'pipeline here':>14s} {'ratio':>6s} "
          f"{'fork/confine/end':>17s} {'first calls':>12s} {'check':>6s} {'here':>6s}")
    for name, parts in library_seconds(models, rounds).items():
        total, here = parts["convert()"], parts["pipeline here"]
        print(f"{name:42s} {total:10.2f} {parts['cpu']:6.2f} {here:14.2f} {total / here:6.2f} "
              f"{parts['job'] - parts['pipeline']:17.3f} {parts['pipeline'] - here:12.3f} {parts['check']:6.3f} "
              f"{total - parts['job'] - parts['check']:6.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--real-width", action="store_true", help="also GPT-2 at GPT-2 small's width")
    parser.add_argument("--library-only", action="store_true", help="only convert() called again and again")
    args = parser.parse_args()
    print(machine.header())
    with tempfile.TemporaryDirectory() as folder:
        models = small_models(folder)
        if args.real_width:
            models["GPT-2 small width (124 M, SavedModel)"] = gpt2_small(folder)
        if not args.library_only:
            command_table(models, os.path.join(folder, "out.tflite"), args.rounds)
        library_table({name: path for name, path in models.items() if "GPT-2" not in name}, args.rounds)


if __name__ == "__main__":
    main()
