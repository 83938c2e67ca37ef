"""Ours, the stock TFLite converter and AI Edge Quantizer, head to head on one model and one set of samples.

A `Subject` is a SavedModel exported with fixed input shapes (batch 1), its calibration samples, held-out
samples (each sample {signature input name: array of batch 1}) and the float model's outputs on the held-out
ones. `METHODS` makes each way's .tflite of it, every way calibrated on the same samples:

- ours: `keras-gelu-convert --int8`, `--int16` and `--int8 --mixed-precision`, through the Python API
  (`keras_gelu.converters.convert`), in the command's default mode unless told otherwise. int8 and int16 pass
  --min-cosine 0, so that nothing is refused and what each conversion reaches is measured; mixed precision
  needs a budget to climb to (with 0 it lifts nothing), `MIXED_MIN_COSINE` unless told otherwise;
- the stock converter's post-training int8 (`Optimize.DEFAULT`, a representative dataset, TFLITE_BUILTINS_INT8
  alone) and its 16x8 mode (EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8 alone): integer
  throughout or refused, as ours are;
- AI Edge Quantizer's recipes static_wi8_ai8 and static_wi8_ai16, on the stock converter's float .tflite.

`measure` judges a .tflite against the float model on the held-out samples; `interpreter_inputs` orders a
sample for `timing.interpreter`. Every .tflite keeps the SavedModel's signature, so inputs and outputs are
matched by name, whatever order a converter gave its tensors.
"""

import contextlib
import dataclasses
import io
import json
import os

import numpy as np

SIGNATURE = "serving_default"
# The budget mixed precision climbs to: above the default 0.99, which most models reach in plain int8 (and then
# nothing is lifted), so that the column shows what lifting buys.
MIXED_MIN_COSINE = 0.999


@dataclasses.dataclass
class Subject:
    saved_model: str  # exported with fixed shapes, batch 1
    calibration: list  # [{signature input name: array of batch 1}]
    held_out: list  # the same, none of them among the calibration samples
    reference: dict  # {signature output name: the float model's outputs on `held_out`, stacked on axis 0}
    folder: str  # where its SavedModel, samples and calibration .npz are kept
    logits: tuple = ()  # outputs whose last axis is a class or a token: their argmax is compared too
    _float_model: bytes = None

    def calibration_npz(self):
        """The calibration samples as `--calibration` takes them: one array per input, samples on axis 0."""
        path = os.path.join(self.folder, "calibration.npz")
        if not os.path.exists(path):
            np.savez(path, **stack(self.calibration))
        return path

    def float_model(self):
        """The stock converter's float .tflite, made once: AI Edge Quantizer quantizes it."""
        if self._float_model is None:
            import tensorflow as tf

            self._float_model = tf.lite.TFLiteConverter.from_saved_model(self.saved_model).convert()
        return self._float_model

    def save(self):
        """Keep the samples and the float outputs in `folder` beside the SavedModel, for `Subject.load`."""
        self.calibration_npz()
        np.savez(os.path.join(self.folder, "held_out.npz"), **stack(self.held_out))
        np.savez(os.path.join(self.folder, "reference.npz"), **self.reference)
        with open(os.path.join(self.folder, "subject.json"), "w") as stream:
            json.dump({"saved_model": self.saved_model, "logits": list(self.logits)}, stream)

    @classmethod
    def load(cls, folder):
        with open(os.path.join(folder, "subject.json")) as stream:
            saved = json.load(stream)
        arrays = {}
        for part in ("calibration", "held_out", "reference"):
            with np.load(os.path.join(folder, f"{part}.npz")) as archive:
                arrays[part] = {key: archive[key] for key in archive.files}
        return cls(saved_model=saved["saved_model"], calibration=unstack(arrays["calibration"]),
                   held_out=unstack(arrays["held_out"]), reference=arrays["reference"], folder=folder,
                   logits=tuple(saved["logits"]))


def exported_subject(model, calibration, held_out, folder, logits=False):
    """The Subject of a Keras 3 model and its samples (each a batch-1 input in the model's input structure): the
    model exported to `folder`/saved_model with the samples' shapes, the samples by signature input name, and the
    float model's outputs on the held-out ones, from the exported serving function (the Keras model's own graph,
    run in TensorFlow). `logits`: every output is a classification or token logit."""
    import keras
    import tensorflow as tf

    saved_model = os.path.join(folder, "saved_model")
    input_specs = keras.tree.map_structure(
        lambda array: keras.InputSpec(shape=array.shape, dtype=array.dtype.name), calibration[0])
    model.export(saved_model, verbose=False, input_signature=[input_specs])
    serve = tf.saved_model.load(saved_model).signatures[SIGNATURE]
    signature_specs = serve.structured_input_signature[1]
    first = held_out[0]
    calibration = [_by_signature_name(sample, signature_specs) for sample in calibration]
    held_out = [_by_signature_name(sample, signature_specs) for sample in held_out]
    reference = stack([{output: value.numpy() for output, value in
                        serve(**{name: tf.constant(array) for name, array in sample.items()}).items()}
                       for sample in held_out])
    _check_names(model(first, training=False), reference)
    return Subject(saved_model, calibration, held_out, reference, folder, tuple(reference) if logits else ())


def _check_names(outputs, reference):
    """That the signature, fed by name, computes what the Keras model computes on the first held-out sample: every
    output of the model is one of the signature's (inputs fed to the wrong names compute something else)."""
    import keras

    for output in keras.tree.flatten(outputs):
        output = keras.ops.convert_to_numpy(output)
        if not any(output.shape == values[:1].shape and np.allclose(
                output, values[:1], rtol=1e-3, atol=1e-4 * max(1.0, float(np.abs(values[:1]).max())))
                for values in reference.values()):
            raise ValueError("the exported signature, fed by name, does not compute the model's outputs")


def _by_signature_name(sample, specs):
    """A batch-1 input in the model's structure as {signature input name: array}. Keras's export flattens the
    model's inputs (a dict by its sorted keys) and names them args_0, args_0_1, args_0_2, ... in that order. Shapes
    and dtypes are checked here, and what the names compute by `_check_names`: a change of that naming is an
    error, not a table of wrong figures."""
    import tensorflow as tf

    arrays = tf.nest.flatten(sample)
    names = sorted(specs, key=lambda name: int(name[len("args_0_"):]) if name.startswith("args_0_") else 0)
    if len(arrays) != len(names) or any(
            tuple(specs[name].shape) != array.shape or specs[name].dtype.as_numpy_dtype != array.dtype
            for name, array in zip(names, arrays)):
        raise ValueError(f"the exported signature's inputs {names} do not match the model's inputs")
    return dict(zip(names, arrays))


def stack(samples):
    """[{name: array of batch 1}] -> {name: the arrays stacked on axis 0}."""
    return {name: np.concatenate([sample[name] for sample in samples]) for name in samples[0]}


def unstack(arrays):
    """{name: samples stacked on axis 0} -> [{name: array of batch 1}]."""
    count = len(next(iter(arrays.values())))
    return [{name: values[index:index + 1] for name, values in arrays.items()} for index in range(count)]


# --- the ways to make a .tflite -------------------------------------------------------------------------------

def ours(mode=None, mixed_min_cosine=MIXED_MIN_COSINE, time_limit=None, **options):
    """keras_gelu.converters.convert on the SavedModel with the calibration .npz, as the command runs it;
    `time_limit`: its --time-limit (None: the converter's default, which grows with the model's size)."""
    def make(subject):
        from keras_gelu import converters

        min_cosine = mixed_min_cosine if options.get("mixed_precision") else 0.0
        tflite_model, _ = converters.convert(subject.saved_model, calibration=subject.calibration_npz(), mode=mode,
                                             min_cosine=min_cosine, time_limit=time_limit, **options)
        return tflite_model
    return make


def stock(int16=False):
    """The stock converter's full-integer post-training quantization, calibrated on the subject's samples."""
    def make(subject):
        import tensorflow as tf

        converter = tf.lite.TFLiteConverter.from_saved_model(subject.saved_model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        # {input name: array} per sample: the calibrator feeds it through the signature, by name
        converter.representative_dataset = lambda: iter(subject.calibration)
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8 if int16
            else tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        return converter.convert()
    return make


def ai_edge_quantizer(recipe_name):
    """AI Edge Quantizer's static recipe `recipe_name`, calibrated and applied on the stock float .tflite."""
    def make(subject):
        from ai_edge_quantizer import quantizer
        from ai_edge_quantizer import recipe

        quantizing = quantizer.Quantizer(subject.float_model())
        quantizing.load_quantization_recipe(getattr(recipe, recipe_name)())
        with contextlib.redirect_stderr(io.StringIO()):  # progress bars, some of which no argument turns off
            ranges = quantizing.calibrate({SIGNATURE: subject.calibration}, num_threads=os.cpu_count())
            quantized = quantizing.quantize(ranges, enable_progress_bar=False, enable_progress_report=False)
        return bytes(quantized.quantized_model)  # a bytearray, which LiteRT's interpreter does not take
    return make


def methods(mode=None, mixed_min_cosine=MIXED_MIN_COSINE, time_limit=None):
    """{column name: make(subject) -> .tflite bytes}, in the tables' order; `mode` and `time_limit`: ours'
    --mode and --time-limit."""
    return {
        "float (stock)": lambda subject: subject.float_model(),
        "ours int8": ours(mode, time_limit=time_limit, int8=True),
        "ours int16": ours(mode, time_limit=time_limit, int16=True),
        "ours mixed": ours(mode, mixed_min_cosine, time_limit, int8=True, mixed_precision=True),
        "stock int8": stock(),
        "stock 16x8": stock(int16=True),
        "AEQ int8": ai_edge_quantizer("static_wi8_ai8"),
        "AEQ 16x8": ai_edge_quantizer("static_wi8_ai16"),
    }


METHODS = tuple(methods())


def failure_line(error, subject=None, limit=160):
    """An exception as the one line a table cell holds: the converter's own line (less the model's path, which
    it starts with), or for the stock converter's multi-line MLIR dumps the first line that says `error:`."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = next((line[line.index("error:") + len("error:"):].strip() for line in lines if "error:" in line),
                lines[0] if lines else "")
    if subject is not None:
        said = said.replace(subject.saved_model + ": ", "")
    line = f"{type(error).__name__}: {said}".replace("|", "/")  # a Markdown cell
    return line if len(line) <= limit else line[:limit - 3] + "..."


# --- judging a .tflite ----------------------------------------------------------------------------------------

def _cosine(actual, expected):
    actual, expected = actual.astype(np.float64).ravel(), expected.astype(np.float64).ravel()
    norms = np.linalg.norm(actual) * np.linalg.norm(expected)
    if norms == 0.0:
        return 1.0 if not actual.any() and not expected.any() else 0.0
    return float(actual @ expected / norms)


def outputs(tflite_model, samples):
    """{output name: the .tflite's float outputs on `samples`, stacked}, through its signature."""
    from keras_gelu.converters.running import verify

    run = verify.signature_runner(tflite_model, SIGNATURE)
    results = [run(sample) for sample in samples]
    return {name: np.concatenate([result[name] for result in results]) for name in results[0]}


def measure(tflite_model, subject):
    """`judged` on the .tflite's outputs on the subject's held-out samples."""
    return judged(tflite_model, outputs(tflite_model, subject.held_out), subject)


def judged(tflite_model, got, subject):
    """{"cosine": the worst output's cosine against the float model, "output": its name, "top1": the share of
    argmaxes that agree over the logit outputs (None without any), "bytes", "float_ops": what still computes in
    float ({op: count}, as the converter's report counts it)}, for `got`, the .tflite's outputs on the held-out
    samples ({output name: stacked})."""
    from keras_gelu.converters.tflite import operators

    cosines = {name: _cosine(got[name], expected) for name, expected in subject.reference.items()}
    worst = min(cosines, key=cosines.get)
    agreements = [np.argmax(got[name], axis=-1) == np.argmax(subject.reference[name], axis=-1)
                  for name in subject.logits]
    top1 = float(np.mean(np.concatenate([agreed.ravel() for agreed in agreements]))) if agreements else None
    return {"cosine": cosines[worst], "output": worst, "top1": top1, "bytes": len(tflite_model),
            "float_ops": operators.float_islands(tflite_model)}


def interpreter_inputs(tflite_model, sample):
    """`sample` ({input name: array}) as a list in the interpreter's input order, for `timing.interpreter`."""
    from keras_gelu.converters.running import verify

    interpreter_type, _ = verify.interpreter_class()
    interpreter = interpreter_type(model_content=tflite_model)
    names = {detail["index"]: name
             for name, detail in interpreter.get_signature_runner(SIGNATURE).get_input_details().items()}
    return [sample[names[detail["index"]]] for detail in interpreter.get_input_details()]
