"""keras_gelu end to end on a bundled example: scikit-learn's digits.

Builds a small classifier that uses every GELU spelling this package offers,
trains it for a few epochs, saves it in both formats of the active Keras
flavour, loads each back and checks the outputs are identical. Then the main
job: `keras-gelu-convert <SavedModel> --mode builtin` turns it into a .tflite
without the GELU op, verified, and the .tflite's accuracy is measured; then
the same with `--int8 --calibration`, a fully integer .tflite.

    python examples/demo.py [--output-dir demo_output] [--epochs 5]
    TF_USE_LEGACY_KERAS=1 python examples/demo.py   # the same with tf-keras
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_gelu  # noqa: E402
from keras_gelu.converters import cli as converter_cli  # noqa: E402
from keras_gelu.converters.running import runtimes  # noqa: E402
from keras_gelu.converters.running import verify  # noqa: E402
from keras_gelu.flavour import keras  # noqa: E402


def build_model():
    inputs = keras.Input((64,), name="pixels")
    h = keras.layers.Dense(64, activation=keras_gelu.GELU(approximate="exact"), name="dense_gelu_exact")(inputs)
    h = keras.layers.Dense(64, activation=keras_gelu.gelu_tanh, name="dense_gelu_tanh_fn")(h)
    h = keras.layers.Dense(64, name="dense_linear")(h)
    h = keras_gelu.GELU(approximate="sigmoid", name="gelu_sigmoid")(h)
    h = keras.layers.Dense(64, name="dense_linear_2")(h)
    h = keras_gelu.LearnableGELU(name="learnable_gelu")(h)
    outputs = keras.layers.Dense(10, activation="softmax", name="classes")(h)
    return keras.Model(inputs, outputs, name="digits_gelu")


def describe(gelu):
    approximate = getattr(gelu, "approximate", None)
    return f"{type(gelu).__name__}({'' if approximate is None else repr(approximate)})"


def save_and_reload(model, output_dir):
    """Save in the flavour's two formats; yield (description, path, restored outputs fn)."""
    if keras_gelu.KERAS_FLAVOUR == "keras3":
        path = os.path.join(output_dir, "digits_gelu.keras")
        model.save(path)
        restored = keras.models.load_model(path)
        yield ".keras file", path, lambda x: restored(x).numpy()
        path = os.path.join(output_dir, "digits_gelu_savedmodel")
        model.export(path, verbose=False)
        served = tf.saved_model.load(path)
        yield "exported SavedModel", path, lambda x: served.serve(x).numpy()
    else:
        path = os.path.join(output_dir, "digits_gelu.h5")
        model.save(path)
        restored = keras.models.load_model(path)
        yield ".h5 file", path, lambda x: restored(x).numpy()
        path = os.path.join(output_dir, "digits_gelu_savedmodel")
        model.save(path)
        restored_dir = keras.models.load_model(path)
        yield "SavedModel directory", path, lambda x: restored_dir(x).numpy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", default="demo_output", help="where the saved models go")
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)

    print(f"keras_gelu {keras_gelu.__version__} on {keras_gelu.KERAS_FLAVOUR} "
          f"(keras {keras.__version__}), TensorFlow {tf.__version__}")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=0, stratify=digits.target
    )
    print(f"data: scikit-learn digits, {len(x_train)} train / {len(x_test)} test images of 8x8 pixels")

    keras.utils.set_random_seed(0)
    model = build_model()
    print("layers using GELU:")
    for layer in model.layers:
        if isinstance(layer, (keras_gelu.GELU, keras_gelu.LearnableGELU)):
            print(f"  {layer.name:20s} {describe(layer)}")
        elif isinstance(getattr(layer, "activation", None), (keras_gelu.GELU, keras_gelu.GELUActivation)):
            print(f"  {layer.name:20s} Dense(activation={describe(layer.activation)})")

    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    learnable = model.get_layer("learnable_gelu")
    alpha_before = float(np.mean(learnable.alpha.numpy()))
    started = time.perf_counter()
    history = model.fit(x_train, y_train, epochs=args.epochs, batch_size=64, verbose=0)
    print(f"trained {args.epochs} epochs in {time.perf_counter() - started:.1f} s: "
          f"loss {history.history['loss'][0]:.3f} -> {history.history['loss'][-1]:.3f}")
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"test accuracy: {accuracy:.3f}")
    print(f"LearnableGELU mean alpha {alpha_before:.4f} -> {float(np.mean(learnable.alpha.numpy())):.4f}, "
          f"mean beta 0 -> {float(np.mean(learnable.beta.numpy())):+.4f}")

    reference = model(x_test).numpy()
    ok = True
    for description, path, outputs in save_and_reload(model, args.output_dir):
        difference = float(np.max(np.abs(outputs(x_test) - reference)))
        ok &= difference == 0.0
        print(f"saved and reloaded {description:22s} {path}: max |difference| = {difference:.1e}")
    if not ok:
        print("demo FAILED: a reloaded model differs")
        return 1

    saved_model = os.path.join(args.output_dir, "digits_gelu_savedmodel")
    tflite_path = os.path.join(args.output_dir, "digits_gelu.tflite")
    tflite_accuracy = convert_and_score([saved_model, "--mode", "builtin", "-o", tflite_path, "--force"], x_test,
                                        y_test)
    if tflite_accuracy is None:
        return 1
    print(f"\n.tflite test accuracy: {tflite_accuracy:.3f} (Keras: {accuracy:.3f}); "
          "exact GELU became x*sigmoid(1.702x), built from LOGISTIC and MUL")

    # Post-training int8: calibrated on training images, checked on test images.
    calibration = os.path.join(args.output_dir, "calibration.npz")
    check = os.path.join(args.output_dir, "check_inputs.npz")
    np.savez(calibration, pixels=x_train[:256])
    np.savez(check, pixels=x_test[:256])
    int8_path = os.path.join(args.output_dir, "digits_gelu_int8.tflite")
    int8_accuracy = convert_and_score([saved_model, "--mode", "builtin", "--int8", "--calibration", calibration,
                                       "--inputs", check, "-o", int8_path, "--force"], x_test, y_test)
    if int8_accuracy is None:
        return 1
    print(f"\nint8 .tflite test accuracy: {int8_accuracy:.3f} (float .tflite: {tflite_accuracy:.3f}), "
          f"{os.path.getsize(int8_path) / os.path.getsize(tflite_path):.2f}x its size")

    # For a microcontroller: converted, checked and run in TensorFlow Lite Micro's own interpreter.
    tflm_path = os.path.join(args.output_dir, "digits_gelu_tflm_int8.tflite")
    tflm_argv = [saved_model, "--target", "tflm", "--int8", "--calibration", calibration, "--inputs", check,
                 "-o", tflm_path, "--force"]
    if not run_converter(tflm_argv):
        return 1
    with open(tflm_path, "rb") as stream:
        tflm_model = stream.read()
    tflm_run = runtimes.run_tflm(tflm_model, [[x_test[index:index + 1]] for index in range(len(x_test))])
    if tflm_run is None:
        print("TFLite Micro is not installed (pip install 'keras-gelu[tflm]'): not run")
    else:
        tflm_accuracy = float(np.mean(np.argmax(tflm_run.outputs[0], axis=1) == y_test))
        print(f"\nin TFLite Micro: test accuracy {tflm_accuracy:.3f} over {len(x_test)} images one by one "
              f"(int8 .tflite: {int8_accuracy:.3f}), tensor arena {tflm_run.figures['arena_bytes']:,} bytes, "
              f"model {len(tflm_model):,} bytes")
    print("demo passed")
    return 0


def run_converter(argv):
    """Run keras-gelu-convert, printing the command and its report; whether it succeeded."""
    print("\n$ keras-gelu-convert " + " ".join(argv))
    sys.stderr.flush()
    code = converter_cli.main(argv)
    sys.stderr.flush()
    if code != 0:
        print(f"demo FAILED: keras-gelu-convert exited with {code}")
    return code == 0


def convert_and_score(argv, x_test, y_test):
    """Run keras-gelu-convert; the .tflite's test accuracy in LiteRT, or None if the conversion failed."""
    if not run_converter(argv):
        return None
    with open(argv[argv.index("-o") + 1], "rb") as stream:
        (probabilities,) = verify.invoke(stream.read(), [x_test])
    return float(np.mean(np.argmax(probabilities, axis=1) == y_test))


if __name__ == "__main__":
    sys.exit(main())
