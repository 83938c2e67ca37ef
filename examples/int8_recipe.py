"""What the int8 recipes share: their flags, the float -> PTQ -> QAT -> int8 flow, the summary table.

Not a recipe itself: `qat_digits.py` and `qat_transformer.py` import it.
"""

import argparse
import os
import sys
import tempfile
import time

# QAT runs on tf-keras (tfmot) by default, as it always has here; TF_USE_LEGACY_KERAS=0 runs it on Keras 3
# (keras_gelu's own engine). The choice must be made before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

import keras_gelu  # noqa: E402
from keras_gelu import converters  # noqa: E402
import keras_gelu.qat  # noqa: E402
from keras_gelu import vocabulary  # noqa: E402
from keras_gelu.converters.paths import write_atomically  # noqa: E402
from keras_gelu.converters.running import verify  # noqa: E402
from keras_gelu.flavour import keras  # noqa: E402
from tables import print_table  # noqa: E402

FUNCTIONS = keras_gelu.GELU_LAYER_FUNCTIONS


class EpochProgress(keras.callbacks.Callback):
    """One line per epoch, rewritten in place on a terminal."""

    def __init__(self, label, epochs, epoch_seconds=None):
        super().__init__()
        self.label, self.epochs = label, epochs
        self.started = self.epoch_started = None
        self.epoch_seconds = [] if epoch_seconds is None else epoch_seconds
        self.interactive = sys.stdout.isatty()

    def on_train_begin(self, logs=None):
        self.started = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_seconds.append(time.perf_counter() - self.epoch_started)
        logs = logs or {}
        figures = "  ".join(f"{key} {value:.4f}" for key, value in logs.items())
        elapsed = time.perf_counter() - self.started
        line = f"  {self.label}: epoch {epoch + 1}/{self.epochs}  {figures}  ({elapsed:.0f} s)"
        last = epoch + 1 == self.epochs
        if self.interactive:
            print("\r" + line.ljust(110), end="\n" if last else "", flush=True)
        elif last or (epoch + 1) % max(1, self.epochs // 4) == 0:
            print(line, flush=True)


def set_seed(seed):
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()


def train(model, x, y, epochs, learning_rate, label, batch_size=32, epoch_seconds=None):
    """Train `model` on (x, y); each epoch's wall time is appended to `epoch_seconds`, where given."""
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=True,
              callbacks=[EpochProgress(label, epochs, epoch_seconds)])
    return model


def accuracy(logits, labels):
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def to_int8(model, mode, exact_as=None, calibration=None, check_inputs=None):
    """Convert `model`, as it is in memory, to int8 with keras-gelu-convert's pipeline.

    A QAT model uses its trained ranges; a float model is calibrated on
    `calibration`, {input name: samples}. The converter checks the int8
    model on `check_inputs` ({input name: a batch}; real data, since random
    values would sit outside the trained ranges). Returns (tflite bytes, report).
    """
    with tempfile.TemporaryDirectory(prefix="keras_gelu_recipe_") as directory:
        options = {"mode": mode, "exact_as": exact_as, "int8": True}
        if calibration is not None:
            options["calibration"] = os.path.join(directory, "calibration.npz")
            np.savez(options["calibration"], *calibration.values())  # in input order: Keras 3 names them "inputs"
        if check_inputs is not None:
            options["inputs"] = os.path.join(directory, "check_inputs.npz")
            np.savez(options["inputs"], *check_inputs.values())
        return converters.convert(model, **options)


def tflite_outputs(tflite_model, x):
    return verify.invoke(tflite_model, [x])[0]


def save(tflite_model, path, force):
    write_atomically(tflite_model, path, force)


def argument_parser(description, output_dir, epochs, qat_epochs, qat_learning_rate, width=None, functions=FUNCTIONS):
    """The flags every recipe has, with its own defaults (`epochs=None`: each model's own; `width=None`: no
    --width flag)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--functions", default=",".join(functions),
                        help=f"GELU functions, comma-separated, of {', '.join(FUNCTIONS)}")
    parser.add_argument("--mode", choices=vocabulary.INT8_MODE_NAMES, default="builtin",
                        help="keras-gelu-convert mode of the int8 models (default builtin: no GELU op)")
    parser.add_argument("--form", choices=vocabulary.EXACT_AS, dest="exact_as",
                        help="how builtin mode computes exact GELU (default sigmoid; int8 computes erf as tanh)")
    parser.add_argument("--epochs", type=int, default=epochs,
                        help=f"float training epochs (default {epochs or 'per model'})")
    parser.add_argument("--qat-epochs", type=int, default=qat_epochs,
                        help=f"quantization-aware epochs (default {qat_epochs})")
    parser.add_argument("--qat-learning-rate", type=float, default=qat_learning_rate,
                        help=f"quantization-aware learning rate (default {qat_learning_rate:g}: a fine-tune, "
                             "not a retrain)")
    if width is not None:
        parser.add_argument("--width", type=int, default=width, help=f"model width (default {width})")
    parser.add_argument("--calibration-samples", type=int, default=256,
                        help="samples that calibrate PTQ and start QAT's ranges (default 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=output_dir, help=f"where the .tflite files go (default {output_dir})")
    parser.add_argument("--force", action="store_true", help="overwrite existing .tflite files")
    return parser


def parse_arguments(parser, argv, file_prefix, positive=(), check=None, outputs=None):
    """Parsed flags, with `functions` as a list; exits with a one-line error on bad flags (`check(parser, args)`
    checks a recipe's own) or existing outputs, before anything is written. The outputs are
    `<file_prefix>_<function>_int8.tflite`, or the file names `outputs(args)` gives."""
    args = parser.parse_args(argv)
    if check is not None:
        check(parser, args)
    args.functions = args.functions.split(",")
    unknown = [function for function in args.functions if function not in FUNCTIONS]
    if unknown:
        parser.error(f"unknown GELU function(s) {', '.join(unknown)}; choose from {', '.join(FUNCTIONS)}")
    for name in ("epochs", "qat_epochs", "width", "calibration_samples", *positive):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.exact_as is not None and not vocabulary.MODES[args.mode].exact_as:
        parser.error(f"--form applies to --mode builtin only (got --mode {args.mode})")
    if not args.qat_learning_rate > 0:
        parser.error("--qat-learning-rate must be > 0")
    args.file_prefix = file_prefix
    names = outputs(args) if outputs is not None else [_output_name(args, function) for function in args.functions]
    existing = [name for name in names if os.path.exists(os.path.join(args.output_dir, name))]
    if existing and not args.force:
        parser.exit(7, f"{parser.prog}: error: {args.output_dir} already holds {', '.join(existing)}; pass --force "
                       "to overwrite them\n")
    os.makedirs(args.output_dir, exist_ok=True)
    return args


def _output_name(args, function):
    return f"{args.file_prefix}_{function}_int8.tflite"


def compare_float_ptq_qat(function, build_model, data, args, input_name, learning_rate, batch_size=32,
                          quantize=keras_gelu.qat.quantize_model):
    """Train the float model of one GELU function; PTQ it; QAT it; convert; evaluate all four on the test split.

    `data` is (x_train, y_train, x_test, y_test); `quantize(model, mode=, exact_as=, calibration_data=)`
    makes the QAT model. Writes the QAT int8 .tflite; returns a row of figures.
    """
    x_train, y_train, x_test, y_test = data
    calibration = x_train[: args.calibration_samples]
    check_inputs = {input_name: x_test[:256]}  # the converter's parity check, on real data
    set_seed(args.seed)
    model = train(build_model(function), x_train, y_train, args.epochs, learning_rate, f"{function} float", batch_size)
    float_accuracy = accuracy(model.predict(x_test, verbose=0), y_test)

    ptq_model, _ = to_int8(model, args.mode, args.exact_as, calibration={input_name: calibration},
                           check_inputs=check_inputs)
    qat_model = quantize(model, mode=args.mode, exact_as=args.exact_as, calibration_data=calibration)
    train(qat_model, x_train, y_train, args.qat_epochs, args.qat_learning_rate, f"{function} QAT", batch_size)
    qat_logits = qat_model.predict(x_test, verbose=0)
    int8_model, report = to_int8(qat_model, args.mode, args.exact_as, check_inputs=check_inputs)
    int8_logits = tflite_outputs(int8_model, x_test)
    save(int8_model, os.path.join(args.output_dir, _output_name(args, function)), args.force)
    return {
        "function": function,
        "float": float_accuracy,
        "ptq_int8": accuracy(tflite_outputs(ptq_model, x_test), y_test),
        "qat": accuracy(qat_logits, y_test),
        "qat_int8": accuracy(int8_logits, y_test),
        "agreement": float(np.mean(np.argmax(int8_logits, -1) == np.argmax(qat_logits, -1))),
        "integer": "yes" if not report.float_ops else "NO: " + ", ".join(report.float_ops),
        "size": len(int8_model),
    }


def print_results(results, output_dir):
    print()
    print_table(["function", "float", "PTQ int8", "QAT", "QAT int8", "int8 = QAT argmax", "integer", "int8 bytes"],
                [[r["function"], f"{r['float']:.4f}", f"{r['ptq_int8']:.4f}", f"{r['qat']:.4f}", f"{r['qat_int8']:.4f}",
                  f"{r['agreement']:.4f}", r["integer"], f"{r['size']:,}"] for r in results])
    print(f"\nint8 models in {output_dir}/")


def describe(args):
    exact_as = vocabulary.resolve_exact_as(args.mode, args.exact_as)
    engine = "tfmot on tf-keras" if keras_gelu.KERAS_FLAVOUR == "tf_keras" else "keras_gelu.qat on Keras 3"
    return (f"QAT: {engine}; mode {args.mode}" + (f", exact GELU as {exact_as}" if exact_as else "")
            + f", seed {args.seed}")

