"""QAT of GELU model families as they come, to a fully integer .tflite: float, PTQ int8, QAT int8, per GELU function.

Three families, each built by its library and quantized without flattening anything by hand:

* `convnext`: keras.applications' ConvNeXt builder (depth 1 per stage, widths 16-64; nested Sequential
  blocks, LayerScale, StochasticDepth, grouped 7x7 convolutions, ImageNet Normalization) on scikit-learn's
  digits, each 8x8 image upsampled to 32x32x3 (ConvNeXt's stem is a 4x4, stride-4 patchify);
* `vit`: keras-hub's ViTBackbone (2 blocks, width 32, 2x2 patches of the 8x8 digits) with a Dense head on its
  class token;
* `bert`: keras-hub's BertBackbone (2 layers, width 32) with a Dense head on its tanh pooler, on the counting
  task of examples/tasks.py as token ids.

Each family's GELUs (ConvNeXt's and ViT's exact "gelu", BERT's tanh `gelu_approximate`; ViT's built in its MLP's
own code) are swapped for each GELU function with `keras_gelu.swap_activations`. For each the script trains
the float model, quantizes it after training (PTQ: keras-gelu-convert --int8, calibrated on training samples),
runs quantization-aware training (`keras_gelu.qat.quantize_model`, ranges started from the same samples),
saves the QAT model as .keras and converts that file with --int8, then converts it again for TFLite Micro
(run there: its tensor arena) and Ethos-U55 (Vela: operators on the NPU and on the CPU). It prints one table
and writes `<family>_<function>_qat.keras` and `<family>_<function>_int8.tflite`.

    python examples/qat_real_models.py [--families vit,bert] [--functions exact,learnable] [--output-dir DIR]

Keras 3 only: keras-hub's models are Keras 3 models, and the QAT engine is keras_gelu's own (no tfmot).
"""

import dataclasses
import os
import statistics
import sys
import tempfile
import warnings

os.environ.setdefault("TF_USE_LEGACY_KERAS", "0")  # before TensorFlow is imported (int8_recipe imports it)

import int8_recipe  # noqa: E402
from int8_recipe import keras  # noqa: E402
from int8_recipe import np  # noqa: E402

import keras_gelu  # noqa: E402
from keras_gelu import converters  # noqa: E402
from keras_gelu.converters.tflite import operators  # noqa: E402
from keras_gelu.converters import errors  # noqa: E402
from keras_gelu.converters.running import verify  # noqa: E402
from keras_gelu.swapping import computed_function  # noqa: E402
from tables import print_table  # noqa: E402
from tasks import CLASSES  # noqa: E402
from tasks import SEQUENCE_LENGTH  # noqa: E402
from tasks import VOCABULARY  # noqa: E402
from tasks import load_digits_split  # noqa: E402
from tasks import make_token_task  # noqa: E402

FUNCTIONS = ("exact", "sigmoid", "learnable")
QAT_MAX_STEPS = 32


def _digits_images(seed, size, channels, scale):
    """The digits split as (size, size, channels) images: each pixel repeated, values times `scale`."""
    x_train, y_train, x_test, y_test = load_digits_split(seed)
    factor = size // 8

    def images(x):
        x = x.reshape(-1, 8, 8, 1).repeat(factor, axis=1).repeat(factor, axis=2).repeat(channels, axis=3)
        return {"images": (x * scale).astype(np.float32)}

    return images(x_train), y_train, images(x_test), y_test


def _tokens(seed, train_size, test_size):
    def inputs(tokens):
        return {"token_ids": tokens, "segment_ids": np.zeros_like(tokens), "padding_mask": np.ones_like(tokens)}

    (train_tokens, y_train), (test_tokens, y_test) = make_token_task(train_size, seed), make_token_task(
        test_size, seed + 1)
    return inputs(train_tokens), y_train, inputs(test_tokens), y_test


def _convnext():
    from keras.src.applications.convnext import ConvNeXt  # the builder; keras.applications exports fixed sizes

    return ConvNeXt(depths=[1, 1, 1, 1], projection_dims=[16, 32, 48, 64], drop_path_rate=0.1, weights=None,
                    input_tensor=keras.Input((32, 32, 3), name="images"), classes=10, classifier_activation=None,
                    name="convnext_digits")


def _vit():
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(image_shape=(8, 8, 1), patch_size=2, num_layers=2, num_heads=2,
                                            hidden_dim=32, mlp_dim=64)
    images = keras.Input((8, 8, 1), name="images")
    return keras.Model(images, keras.layers.Dense(10, name="head")(backbone(images)[:, 0, :]), name="vit_digits")


def _bert():
    import keras_hub

    backbone = keras_hub.models.BertBackbone(vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=32,
                                             intermediate_dim=64, max_sequence_length=SEQUENCE_LENGTH)
    return keras.Model(backbone.input, keras.layers.Dense(CLASSES, name="head")(backbone.output["pooled_output"]),
                       name="bert_counting")


@dataclasses.dataclass
class Family:
    build: callable
    load: callable  # (args) -> (x_train, y_train, x_test, y_test), inputs as {name: array}
    what: str
    epochs: int
    learning_rate: float
    shared_axes: list  # of a LearnableGELU: the position axes of the GELUs' inputs


FAMILIES = {
    "convnext": Family(_convnext, lambda args: _digits_images(args.seed, 32, 3, 255.0),
                       "keras.applications ConvNeXt on digits at 32x32x3", 20, 2e-3, [1, 2]),
    "vit": Family(_vit, lambda args: _digits_images(args.seed, 8, 1, 1.0),
                  "keras-hub ViT on digits, 2x2 patches", 40, 2e-3, [1]),
    "bert": Family(_bert, lambda args: _tokens(args.seed, args.train_size, args.test_size),
                   "keras-hub BERT on the counting task", 40, 1e-3, [1]),
}


def _is_gelu(layer, activation):
    return computed_function(activation) in ("gelu_exact", "gelu_tanh")


def with_gelu(model, function, shared_axes):
    """`model` with every GELU computing `function`; `model` itself where each already does. A LearnableGELU
    learns one (alpha, beta) per channel: shared over `shared_axes` (positions; BERT's sequence length is
    dynamic)."""
    gelu = keras_gelu.LearnableGELU(shared_axes=shared_axes) if function == "learnable" \
        else keras_gelu.gelu_layer(function)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no activation matched": the family's own GELU is the function
        return keras_gelu.swap_activations(model, {keras_gelu.when(_is_gelu): gelu})


def _for_keras(inputs):
    """A model's inputs as Keras takes them: the array of a one-input model, else {name: array}."""
    return inputs["images"] if list(inputs) == ["images"] else inputs


def _first(inputs, count):
    return {name: values[:count] for name, values in inputs.items()}


def _npz(directory, name, arrays):
    path = os.path.join(directory, f"{name}.npz")
    np.savez(path, **arrays)
    return path


def _logits(tflite_model, inputs):
    if len(inputs) == 1:  # whatever name the signature gives the one input
        return verify.invoke(tflite_model, list(inputs.values()))[0]
    (values,) = verify.run_signature(tflite_model, "serving_default", inputs).values()
    return values


def _target_figures(path, target, check_inputs, modes, shapes):
    """TFLite Micro's arena or Vela's NPU/CPU operator counts for the QAT model, or the one line that stops it.
    `shapes`: {input name: one sample's shape}, as these runtimes need them static."""
    try:
        _, report = converters.convert(path, target=target, allow_cpu_fallback=target != "tflm",
                                       inputs=check_inputs, max_steps=QAT_MAX_STEPS, input_shapes=shapes, **modes)
    except errors.ConversionError as error:
        return f"stopped: {error}"
    figures = report.target["figures"]
    if "arena_bytes" in figures:
        return f"{figures['arena_bytes']:,} B"
    return f"{figures['npu_operators']}/{figures['cpu_operators']}"


def run_family(name, function, data, args, directory):
    family = FAMILIES[name]
    x_train, y_train, x_test, y_test = data
    calibration = _first(x_train, args.calibration_samples)
    check_inputs = _npz(directory, "check", _first(x_test, 256))  # the converter's parity check, on real data
    int8_recipe.set_seed(args.seed)
    float_seconds, qat_seconds = [], []
    model = with_gelu(family.build(), function, family.shared_axes)
    epochs = args.epochs or family.epochs
    int8_recipe.train(model, _for_keras(x_train), y_train, epochs, family.learning_rate, f"{name} {function} float",
                      epoch_seconds=float_seconds)
    float_logits = model.predict(_for_keras(x_test), verbose=0)

    modes = {"mode": args.mode, "exact_as": args.exact_as}
    ptq_model, _ = converters.convert(model, int8=True, calibration=_npz(directory, "calibration", calibration),
                                      inputs=check_inputs, **modes)
    qat_model = keras_gelu.qat.quantize_model(model, calibration_data=_for_keras(calibration), **modes)
    int8_recipe.train(qat_model, _for_keras(x_train), y_train, args.qat_epochs, args.qat_learning_rate,
                      f"{name} {function} QAT", epoch_seconds=qat_seconds)
    qat_logits = qat_model.predict(_for_keras(x_test), verbose=0)
    prefix = os.path.join(args.output_dir, f"{name}_{function}")
    keras_path = f"{prefix}_qat.keras"
    qat_model.save(keras_path)  # what a user ships: the converter reads the saved file
    # QAT does not see every int8 rounding of these models yet (the CONCATENATION of ViT's class token
    # requantizes both its inputs): measured up to 12 output steps where the converter's default stops at 10
    int8_model, report = converters.convert(keras_path, int8=True, inputs=check_inputs, max_steps=QAT_MAX_STEPS,
                                            **modes)
    int8_logits = _logits(int8_model, x_test)
    (scale,) = operators.output_scales(int8_model)
    shapes = {name: (1, *values.shape[1:]) for name, values in x_test.items()}
    int8_recipe.save(int8_model, f"{prefix}_int8.tflite", args.force)
    return {
        "family": name, "function": function,
        "float": int8_recipe.accuracy(float_logits, y_test),
        "ptq_int8": int8_recipe.accuracy(_logits(ptq_model, x_test), y_test),
        "qat_int8": int8_recipe.accuracy(int8_logits, y_test),
        "agreement": float(np.mean(np.argmax(int8_logits, -1) == np.argmax(qat_logits, -1))),
        "steps": float(np.max(np.abs(int8_logits - qat_logits)) / scale),
        "integer": "yes" if not report.float_ops else "NO: " + ", ".join(report.float_ops),
        # the median epoch: the first of each carries tracing
        "epoch_ratio": statistics.median(qat_seconds) / statistics.median(float_seconds),
        "tflm": _target_figures(keras_path, "tflm", check_inputs, modes, shapes),
        "ethos_u55": _target_figures(keras_path, "ethos-u55", check_inputs, modes, shapes),
    }


def _check(parser, args):
    if keras_gelu.KERAS_FLAVOUR != "keras3":
        parser.error("needs Keras 3 (TF_USE_LEGACY_KERAS=0): keras-hub's models are Keras 3 models")
    args.families = args.families.split(",")
    unknown = [family for family in args.families if family not in FAMILIES]
    if unknown:
        parser.error(f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                     f"choose from {', '.join(FAMILIES)}")
    if args.epochs is not None and args.epochs < 1:
        parser.error("--epochs must be >= 1")


def main(argv=None):
    parser = int8_recipe.argument_parser(__doc__, "qat_real_models_output", epochs=None, qat_epochs=3,
                                         qat_learning_rate=1e-4, functions=FUNCTIONS)
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"of {', '.join(FAMILIES)}, comma-separated")
    parser.add_argument("--train-size", type=int, default=2000, help="BERT's training sequences (default 2000)")
    parser.add_argument("--test-size", type=int, default=1000, help="BERT's test sequences (default 1000)")
    args = int8_recipe.parse_arguments(parser, argv, None, positive=("train_size", "test_size"), check=_check,
                                       outputs=lambda args: [f"{family}_{function}_{kind}"
                                                             for family in args.families
                                                             for function in args.functions
                                                             for kind in ("qat.keras", "int8.tflite")])
    print(f"{int8_recipe.describe(args)}; CPU: {_cpu()}")
    results = []
    with tempfile.TemporaryDirectory(prefix="keras_gelu_recipe_") as directory:
        for name in args.families:
            data = FAMILIES[name].load(args)
            print(f"{name}: {FAMILIES[name].what}; {len(data[1])} train / {len(data[3])} test samples")
            for function in args.functions:
                results.append(run_family(name, function, data, args, directory))
                print("  " + " | ".join(_row(results[-1])), flush=True)  # a row as soon as it is measured
    print()
    print_table(["family", "function", "float", "PTQ int8", "QAT int8", "int8 = QAT argmax", "max steps", "integer",
                 "QAT epoch / float", "TFLM arena", "Ethos-U55 NPU/CPU ops"], [_row(result) for result in results])
    print(f"\nQAT models and int8 .tflite files in {args.output_dir}/")
    return 0


def _row(result):
    return [result["family"], result["function"], f"{result['float']:.4f}", f"{result['ptq_int8']:.4f}",
            f"{result['qat_int8']:.4f}", f"{result['agreement']:.4f}", f"{result['steps']:.0f}", result["integer"],
            f"{result['epoch_ratio']:.2f}x", result["tflm"], result["ethos_u55"]]


def _cpu():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
    from machine import cpu_kind

    return cpu_kind()


if __name__ == "__main__":
    sys.exit(main())
