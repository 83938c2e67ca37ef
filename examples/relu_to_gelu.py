"""ReLU -> GELU in a trained model, measured: what the swap buys, and which GELU-vs-ReLU claims hold here.

Two tasks: scikit-learn's digits (an MLP of three ReLU layers) and the
counting task of the Transformer recipe (an encoder: attention, LayerNorm and
a ReLU feed-forward). For each task and seed, three runs:

  (a) relu     a ReLU model trained --pretrain-epochs, then --epochs more;
  (b) swapped  that same pretrained ReLU model swapped to exact GELU
               (keras_gelu.swap_activations) and fine-tuned for --epochs
               (keras_gelu.fine_tune_swapped: the first epoch trains the
               swapped layers only, at a tenth of the rate);
  (c) gelu     a GELU model from scratch, --pretrain-epochs + --epochs.

Measured on each: test accuracy; training steps until the training loss
first reaches the task's threshold (and, for (b), until it is back at its
pre-swap value); the spread of per-layer gradient norms; the share of
hidden units that are never positive on the test set ("dead": a ReLU unit
that no input turns on learns nothing); how often a prediction flips under
small input noise; and the time of a training step, GELU against ReLU, in
one run. Mean and spread (min-max) over the seeds. Plots go to --plots-dir.

    python examples/relu_to_gelu.py [--seeds 5] [--plots-dir docs] [--force]
    python examples/relu_to_gelu.py --short --plots-dir /tmp/plots   # a quick check that it runs

It uses the Keras that TF_USE_LEGACY_KERAS selects, as keras_gelu does.
"""

import argparse
import io
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_gelu  # noqa: E402
from keras_gelu.converters import errors  # noqa: E402
from keras_gelu.converters import paths  # noqa: E402
from keras_gelu.flavour import keras  # noqa: E402
from tables import print_table  # noqa: E402
import tasks  # noqa: E402

RUNS = ("relu", "swapped", "gelu")
GELU = keras_gelu.gelu_exact
PLOTS = ("relu_to_gelu_curves.png", "relu_to_gelu_gradients.png", "relu_to_gelu_dead_units.png")


class Task:
    """A task: its data, its model (by activation), its training settings and its loss threshold."""

    def __init__(self, name, load, build, hidden_layers, batch_size, learning_rate, loss_threshold, noise,
                 eval_every):
        self.name, self.load, self.build, self.hidden_layers = name, load, build, hidden_layers
        self.batch_size, self.learning_rate = batch_size, learning_rate
        self.loss_threshold, self.noise, self.eval_every = loss_threshold, noise, eval_every


def build_mlp(activation, seed):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((64,), name="pixels")
    hidden = inputs
    for index in range(1, 4):
        hidden = keras.layers.Dense(64, activation=activation, name=f"hidden_{index}")(hidden)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(hidden), name="digits_mlp")


def build_encoder(activation, seed, width=32):
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((tasks.SEQUENCE_LENGTH, tasks.VOCABULARY + tasks.SEQUENCE_LENGTH), name="tokens")
    hidden = keras.layers.Dense(width, name="embed")(inputs)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=width // 2, name="attention")(hidden, hidden)
    hidden = keras.layers.LayerNormalization(name="norm_1")(keras.layers.Add(name="residual_1")([hidden, attended]))
    expanded = keras.layers.Dense(4 * width, activation=activation, name="ffn_in")(hidden)
    hidden = keras.layers.Add(name="residual_2")([hidden, keras.layers.Dense(width, name="ffn_out")(expanded)])
    hidden = keras.layers.LayerNormalization(name="norm_2")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(inputs, keras.layers.Dense(tasks.CLASSES, name="logits")(pooled), name="encoder")


def load_sequences(seed, train_size=4000, test_size=1000):
    x_train, y_train = tasks.make_sequence_task(train_size, seed)
    x_test, y_test = tasks.make_sequence_task(test_size, seed + 10_000)
    return x_train, y_train, x_test, y_test


def _short_data(name, task, train_size=256, test_size=128):
    """The task's data cut down for --short: enough for each run to learn something, not to compare runs."""
    if name == "sequence":
        return load_sequences(0, train_size, test_size)
    x_train, y_train, x_test, y_test = task.load(0)
    return x_train[:train_size], y_train[:train_size], x_test[:test_size], y_test[:test_size]


TASKS = {
    # Thresholds: a training loss every run reaches within the pretraining epochs (sequence: the
    # counting task is learnt to 100% test accuracy, so the threshold sits where its curves still differ).
    "digits": Task("digits", tasks.load_digits_split, build_mlp, ["hidden_1", "hidden_2", "hidden_3"],
                   batch_size=32, learning_rate=1e-3, loss_threshold=0.1, noise=0.1, eval_every=15),
    "sequence": Task("sequence", load_sequences, build_encoder, ["ffn_in"],
                     batch_size=64, learning_rate=3e-3, loss_threshold=0.03, noise=0.1, eval_every=25),
}


def _logits(model, x):
    # A direct call: model.predict would trace a new function for each of the many models here.
    return np.asarray(model(x, training=False))


def _loss(model, x, y):
    return float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, _logits(model, x)))


class LossCurve(keras.callbacks.Callback):
    """The training loss on a fixed sample of the training set every `every` steps, as (step, loss) pairs."""

    def __init__(self, x, y, every, start_step, curve):
        super().__init__()
        self.x, self.y, self.every, self.step, self.curve = x, y, every, start_step, curve

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step % self.every == 0:
            self.curve.append((self.step, _loss(self.model, self.x, self.y)))


def _compile(model, learning_rate):
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


def _fit(model, task, data, epochs, curve, start_step, learning_rate=None):
    x_train, y_train = data[:2]
    if learning_rate is not None:
        _compile(model, learning_rate)
    probe = LossCurve(x_train[:512], y_train[:512], task.eval_every, start_step, curve)
    if epochs:
        model.fit(x_train, y_train, epochs=epochs, batch_size=task.batch_size, verbose=0, callbacks=[probe])
    return probe.step


def _copy(model):
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def dead_unit_share(model, task, x):
    """Share of hidden units whose pre-activation is <= 0 for every test input (every token, for the encoder)."""
    layers = [model.get_layer(name) for name in task.hidden_layers]
    probe = keras.Model(model.inputs[0], [layer.input for layer in layers])
    inputs = probe(x, training=False)
    inputs = [np.asarray(value) for value in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
    never_on = []
    for layer, layer_input in zip(layers, inputs):
        kernel, bias = (weight.numpy() for weight in (layer.kernel, layer.bias))
        pre_activation = layer_input.reshape(-1, kernel.shape[0]) @ kernel + bias
        never_on.append(np.all(pre_activation <= 0, axis=0))
    return np.concatenate(never_on)


def gradient_norms(model, x, y):
    """The norm of the loss gradient of each layer's kernel, on the test set, in layer order."""
    kernels = [weight for weight in model.trainable_weights if weight.name.split("/")[-1].split(":")[0] == "kernel"]
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x, training=False))
    return [float(tf.norm(gradient)) for gradient in tape.gradient(loss, kernels)]


def flip_rate(model, x, noise, seed, draws=5):
    """Share of test predictions that change when Gaussian noise of std `noise` is added to the inputs."""
    rng = np.random.default_rng(seed)
    clean = np.argmax(_logits(model, x), axis=-1)
    flips = [np.mean(np.argmax(_logits(model, x + rng.normal(0, noise, x.shape).astype(np.float32)), axis=-1) != clean)
             for _ in range(draws)]
    return float(np.mean(flips))


def evaluate(model, task, data, seed):
    x_test, y_test = data[2:]
    logits = _logits(model, x_test)
    dead = dead_unit_share(model, task, x_test)
    return {"accuracy": float(np.mean(np.argmax(logits, axis=-1) == y_test)),
            "loss": float(keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y_test, logits)),
            "gradient_norms": gradient_norms(model, x_test, y_test),
            "dead": dead, "dead_share": float(np.mean(dead)),
            "flip_rate": flip_rate(model, x_test, task.noise, seed)}


def steps_to(curve, threshold, after=0):
    """The first step (after `after`) at which the curve is at or below `threshold`; None if never."""
    return next((step - after for step, loss in curve if step > after and loss <= threshold), None)


def one_seed(task, data, seed, pretrain_epochs, epochs):
    """The three runs of one seed: their curves and measurements."""
    results = {}
    relu_model = task.build("relu", seed)
    _compile(relu_model, task.learning_rate)
    relu_curve = [(0, _loss(relu_model, data[0][:512], data[1][:512]))]
    swap_step = _fit(relu_model, task, data, pretrain_epochs, relu_curve, 0)
    at_swap = {"dead": dead_unit_share(relu_model, task, data[2]),
               "loss": _loss(relu_model, data[0][:512], data[1][:512])}

    gelu_model, swaps = keras_gelu.swap_activations(relu_model, {"relu": GELU}, return_swaps=True)
    swapped_curve = [(swap_step, _loss(gelu_model, data[0][:512], data[1][:512]))]

    keras.utils.set_random_seed(seed + 1)
    continued = _copy(relu_model)
    _fit(continued, task, data, epochs, relu_curve, swap_step, learning_rate=task.learning_rate)
    results["relu"] = {**evaluate(continued, task, data, seed), "curve": relu_curve}

    keras.utils.set_random_seed(seed + 1)
    probe = LossCurve(data[0][:512], data[1][:512], task.eval_every, swap_step, swapped_curve)
    keras_gelu.fine_tune_swapped(gelu_model, swaps, data[0], data[1],
                                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                 learning_rate=task.learning_rate, swapped_epochs=min(1, epochs),
                                 epochs=epochs - min(1, epochs), metrics=["accuracy"], batch_size=task.batch_size,
                                 callbacks=[probe], verbose=0)
    results["swapped"] = {**evaluate(gelu_model, task, data, seed), "curve": swapped_curve, "at_swap": at_swap,
                          "swaps": [str(swap) for swap in swaps]}

    scratch = task.build(GELU, seed)
    _compile(scratch, task.learning_rate)
    gelu_curve = [(0, _loss(scratch, data[0][:512], data[1][:512]))]
    _fit(scratch, task, data, pretrain_epochs + epochs, gelu_curve, 0)
    results["gelu"] = {**evaluate(scratch, task, data, seed), "curve": gelu_curve}
    return results


def step_time_ratios(task, data, repeats):
    """Median time of a training epoch of each activation over ReLU's, epochs interleaved (one run, same load)."""
    activations = {"relu": "relu", "gelu (keras_gelu exact)": GELU, "gelu (Keras 'gelu')": "gelu",
                   "gelu (keras_gelu tanh)": keras_gelu.gelu_tanh}
    models = {}
    for name, activation in activations.items():
        models[name] = task.build(activation, 0)
        _compile(models[name], task.learning_rate)
        models[name].fit(data[0], data[1], epochs=2, batch_size=task.batch_size, verbose=0)  # trace, warm up
    seconds = {name: [] for name in activations}
    names = list(models)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:  # each goes first in turn
            started = time.perf_counter()
            models[name].fit(data[0], data[1], epochs=1, batch_size=task.batch_size, verbose=0)
            seconds[name].append(time.perf_counter() - started)
    relu = np.median(seconds["relu"])
    return {name: float(np.median(times) / relu) for name, times in seconds.items() if name != "relu"}


def _spread(values, digits=3, scale=1.0, missing="never"):
    values = [value * scale for value in values if value is not None]
    if not values:
        return missing
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def summarize(task, per_seed, pretrain_steps):
    """The table rows of one task: one per run, mean (min-max) over seeds."""
    rows = []
    for run in RUNS:
        results = [seed_results[run] for seed_results in per_seed]
        if run == "swapped":
            recovery = [steps_to(r["curve"], r["at_swap"]["loss"], after=pretrain_steps) for r in results]
            to_threshold = "-"
            recovered = _spread(recovery, 0)
        else:
            to_threshold = _spread([steps_to(r["curve"], task.loss_threshold) for r in results], 0)
            recovered = "-"
        dead = _spread([r["dead_share"] for r in results], 1, 100)
        spreads = [max(r["gradient_norms"]) / max(min(r["gradient_norms"]), 1e-30) for r in results]
        rows.append([task.name, run, _spread([r["accuracy"] for r in results], 4),
                     _spread([r["loss"] for r in results], 4), to_threshold, recovered,
                     _spread(spreads, 1), dead, _spread([r["flip_rate"] for r in results], 2, 100)])
    return rows


def revival_rows(task, per_seed):
    """What became of the ReLU units dead at the swap: how many there were, and the share GELU turned back on."""
    at_swap = [seed_results["swapped"]["at_swap"]["dead"] for seed_results in per_seed]
    after = [seed_results["swapped"]["dead"] for seed_results in per_seed]
    revived = [float(np.mean(~end[start])) if start.any() else None for start, end in zip(at_swap, after)]
    jumps = [seed_results["swapped"]["curve"][0][1] / seed_results["swapped"]["at_swap"]["loss"]
             for seed_results in per_seed]
    return [[task.name, _spread(jumps, 2), _spread([float(np.mean(start)) for start in at_swap], 1, 100),
             _spread([float(np.mean(end)) for end in after], 1, 100),
             _spread(revived, 0, 100, missing="- (none dead)")]]


def _band(curves):
    """(steps, mean, min, max) over seeds, on the steps all curves share."""
    steps = sorted(set.intersection(*(set(step for step, _ in curve) for curve in curves)))
    values = np.array([[dict(curve)[step] for step in steps] for curve in curves])
    return np.array(steps), values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def plot(results, pretrain_steps, plots_dir, force):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"relu": "tab:blue", "swapped": "tab:orange", "gelu": "tab:green"}
    labels = {"relu": "(a) ReLU, trained on", "swapped": "(b) swapped to GELU, fine-tuned",
              "gelu": "(c) GELU from scratch"}
    figures = {}

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for axis, (task_name, per_seed) in zip(axes[0], results.items()):
        for run in RUNS:
            steps, mean, low, high = _band([seed_results[run]["curve"] for seed_results in per_seed])
            axis.plot(steps, mean, color=colours[run], label=labels[run])
            axis.fill_between(steps, low, high, color=colours[run], alpha=0.2)
        axis.axvline(pretrain_steps[task_name], color="grey", linestyle=":", label="swap")
        axis.axhline(TASKS[task_name].loss_threshold, color="grey", linestyle="--", linewidth=0.8,
                     label="loss threshold")
        axis.set_yscale("log")
        axis.set_title(f"{task_name}: training loss (mean, min-max over {len(per_seed)} seeds)")
        axis.set_xlabel("training step")
        axis.legend(fontsize=8)
    figures[PLOTS[0]] = figure

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for axis, (task_name, per_seed) in zip(axes[0], results.items()):
        data = [np.log10([norm for seed_results in per_seed for norm in seed_results[run]["gradient_norms"]])
                for run in RUNS]
        axis.boxplot(data, showfliers=True)
        axis.set_xticks(range(1, len(RUNS) + 1), [labels[run] for run in RUNS], fontsize=8)
        axis.set_ylabel("log10 gradient norm of a layer's kernel")
        axis.set_title(f"{task_name}: per-layer gradient norms at the end (all seeds)")
    figures[PLOTS[1]] = figure

    figure, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for axis, (task_name, per_seed) in zip(axes[0], results.items()):
        bars = {"ReLU at swap": [100 * np.mean(s["swapped"]["at_swap"]["dead"]) for s in per_seed]}
        bars.update({labels[run]: [100 * s[run]["dead_share"] for s in per_seed] for run in RUNS})
        means = [np.mean(values) for values in bars.values()]
        errors_low = [mean - min(values) for mean, values in zip(means, bars.values())]
        errors_high = [max(values) - mean for mean, values in zip(means, bars.values())]
        axis.bar(range(len(bars)), means, yerr=[errors_low, errors_high], capsize=4,
                 color=["tab:grey"] + [colours[run] for run in RUNS])
        axis.set_xticks(range(len(bars)), list(bars), fontsize=8, rotation=10)
        axis.set_ylabel("% of hidden units never positive on the test set")
        axis.set_title(f"{task_name}: dead units (mean, min-max over seeds)")
    figures[PLOTS[2]] = figure

    for name, figure in figures.items():
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100)
        plt.close(figure)
        paths.write_atomically(buffer.getvalue(), os.path.join(plots_dir, name), force)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per task (default 5)")
    parser.add_argument("--pretrain-epochs", type=int, default=15, help="ReLU epochs before the swap (default 15)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs after the swap (default 10)")
    parser.add_argument("--timing-repeats", type=int, default=8,
                        help="interleaved epochs per activation for the step time (default 8)")
    parser.add_argument("--short", action="store_true",
                        help="a quick check: 1 seed, 1 + 2 epochs, 256 training examples, 1 timing repeat")
    parser.add_argument("--plots-dir", default="docs", help="where the three PNG plots go (default docs)")
    parser.add_argument("--force", action="store_true", help="overwrite existing plots")
    args = parser.parse_args(argv)
    task_names = args.tasks.split(",")
    unknown = [name for name in task_names if name not in TASKS]
    if unknown:
        parser.error(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    if args.short:
        args.seeds, args.pretrain_epochs, args.epochs, args.timing_repeats = 1, 1, 2, 1
    for name in ("seeds", "pretrain_epochs", "epochs", "timing_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    os.makedirs(args.plots_dir, exist_ok=True)
    try:
        for name in PLOTS:
            paths.check_output_path(os.path.join(args.plots_dir, name), args.force)
    except errors.ConversionError as error:
        parser.exit(error.exit_code, f"{parser.prog}: error: {error}\n")

    print(f"keras_gelu {keras_gelu.KERAS_FLAVOUR}, tensorflow {tf.__version__}; {args.seeds} seeds; "
          f"{args.pretrain_epochs} ReLU epochs, then {args.epochs} epochs per run")
    results, pretrain_steps, rows, revival, timing_rows = {}, {}, [], [], []
    for name in task_names:
        task = TASKS[name]
        data = _short_data(name, task) if args.short else task.load(0)
        steps_per_epoch = -(-len(data[0]) // task.batch_size)
        pretrain_steps[name] = args.pretrain_epochs * steps_per_epoch
        started = time.perf_counter()
        results[name] = [one_seed(task, data, seed, args.pretrain_epochs, args.epochs) for seed in range(args.seeds)]
        print(f"  {name}: {len(data[0])} train / {len(data[2])} test; {time.perf_counter() - started:.0f} s",
              flush=True)
        rows += summarize(task, results[name], pretrain_steps[name])
        revival += revival_rows(task, results[name])
        ratios = step_time_ratios(task, data, args.timing_repeats)
        timing_rows += [[name, activation, f"{ratio:.2f}x"] for activation, ratio in ratios.items()]

    print()
    print_table(["task", "run", "test accuracy", "test loss", "steps to loss threshold", "steps back to pre-swap loss",
                 "gradient-norm spread (max/min)", "dead units %", "flips under noise %"], rows)
    print()
    print_table(["task", "training loss just after / before the swap", "dead ReLU units at the swap %",
                 "dead after fine-tuning %",
                 "of those dead at the swap, revived %"], revival)
    print()
    print_table(["task", "activation", "training-step time / ReLU's"], timing_rows)
    swaps = results[task_names[0]][0]["swapped"]["swaps"]
    print(f"\nswapped ({task_names[0]}): {', '.join(swaps)}")
    plot(results, pretrain_steps, args.plots_dir, args.force)
    print(f"plots: {', '.join(os.path.join(args.plots_dir, name) for name in PLOTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
