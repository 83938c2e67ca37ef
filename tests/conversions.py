"""The conversions the tests ask for, read from keras_gelu.vocabulary: a new mode or exact_as is tested everywhere.

A conversion is (mode, exact_as), exact_as None where the mode takes none. `convert_here` is the suite's route for
a model file where the sandbox is not the test's subject (conftest: the conversions' route); `saved_function` writes
a TensorFlow function as the SavedModel a test converts.
"""

import collections
import contextlib
import os

import tensorflow as tf
from tensorflow.python.eager import context

from keras_gelu import converters
from keras_gelu import replacements
from keras_gelu import vocabulary
from keras_gelu.converters import explanation
from keras_gelu.converters import paths
from keras_gelu.converters.convert import _explained  # the explanation's files, as `convert` writes them
from keras_gelu.converters.options import Options
from keras_gelu.converters.report import Report


def saved_function(folder, name, function, *signature):
    """The path of the SavedModel of `function` on the TensorSpecs `signature`, as its serving_default, at
    folder/name."""
    module = tf.Module()
    module.f = tf.function(function, input_signature=list(signature))
    path = str(folder / name)
    tf.saved_model.save(module, path, signatures={"serving_default": module.f})
    return path


# The product's own route, whatever a test's route puts in its place (conftest: the conversions' route).
CONVERT = converters.convert


def _each_exact_as(modes):
    return [(mode, exact_as) for mode in modes for exact_as in vocabulary.MODES[mode].exact_as or (None,)]


EVERY = _each_exact_as(vocabulary.MODE_NAMES)
REWRITING = _each_exact_as(name for name, mode in vocabulary.MODES.items() if mode.rewrites)

# The QAT model against its int8 .tflite, in steps of the output's int8 scale,
# when QAT trained for the conversion's mode: both compute the same ops on the
# same grids, but TFLite's fixed-point rescaling rounds a value on a rounding
# boundary the other way (1 step), which can carry into the next layer.
# Measured: at most 1 step on test_quantization's models, 2 on digits' three
# layers. (The 1e-3: step counts are ratios of float32 values.)
QAT_INT8_STEPS = 2.0 + 1e-3

# TF 2.18's tf.lite.Interpreter (the TF 2.18 leg's runtime) runs int8 depthwise convolutions on an XNNPACK
# that rounds differently from the reference kernel and from TF 2.21's: measured up to 4 steps on a strided
# separable convolution, where TF 2.21, and TF 2.18's reference kernels, give 1.
DEPTHWISE_INT8_STEPS = 4.0 + 1e-3 if tf.__version__.startswith("2.18") else QAT_INT8_STEPS


def made_already(function, mode, exact_as, int8=False):
    """Whether a conversion gives a GELU(function) the ops an earlier builtin --form gave it already: --form only
    says how an exact GELU is spelled, and int8 spells the erf form as the tanh form (replacements.RULES).
    function None: a GELU whose ops no form changes (LearnableGELU). Other modes are never made already."""
    if mode != "builtin":
        return False
    forms = vocabulary.MODES["builtin"].exact_as

    def ops(form):
        return None if function is None else replacements.replacement_for(
            function, vocabulary.conversion_mode("builtin", int8), form, int8).build

    return any(ops(earlier) is ops(exact_as) for earlier in forms[:forms.index(exact_as)])


def ids(conversions):
    return [mode if exact_as is None else f"{mode}-{exact_as}" for mode, exact_as in conversions]


def keeps_exact_gelu(mode, exact_as):
    """Whether the conversion keeps exact GELU's function: the GELU op, no rewrite, or the erf polynomial."""
    return exact_as in (None, "erf")


def convert_here(model, **options):
    """(tflite bytes, Report) of `converters.convert(model, **options)` with the pipeline run in this process, outside
    the sandbox, for a model file: what the suite's own models are converted by, where the sandbox is not the test's
    subject (conftest: the conversions' route), and the tests that change the pipeline's own parts (monkeypatch),
    which the sandbox's process, forked from a zygote that imported them before, would not see. What comes back is
    what the sandbox's supervisor gives: the report read from the worker's form of it (Report.from_untrusted, the
    fields the supervisor states set as it sets them), the explanation's files written as `convert` writes them. A
    live model or a .tflite's bytes takes `convert`'s own route."""
    from keras_gelu.converters.running import pipeline

    if not isinstance(model, (str, os.PathLike)):
        return CONVERT(model, **options)
    path, options = os.fspath(model), Options(**options)
    if options.explain:
        explanation.check_folder(options.explain, force=False)
    kind = paths.model_kind(path)
    try:
        with _eager_functions_kept():
            tflite_model, report = pipeline.convert(path, options, kind=kind, name=path)
    except converters.ConversionError as error:
        if getattr(error, "report", None) is not None:
            error.report = _as_the_supervisor_reads_it(error.report, path, kind, options)
            _explained(options, error.report, False)
        raise
    report = _as_the_supervisor_reads_it(report, path, kind, options)
    _explained(options, report, False)
    return tflite_model, report


def _as_the_supervisor_reads_it(report, name, kind, options):
    report = Report.from_untrusted(report.to_dict())
    report.input, report.kind, report.trusted = name, kind, bool(options.trust_model)
    return report


@contextlib.contextmanager
def _eager_functions_kept():
    """TensorFlow's eager context as it was, after a conversion in this process: a model file this process saved
    names its functions as the live ones it was saved from (keras_gelu's kernels among them), and the reference
    run registers those again without XLA's mark (verify._registered_without_xla), as it may in a worker, whose
    context holds nothing else. Here the live functions would compute without XLA from then on."""
    eager = context.context()
    replaced = collections.Counter()
    originals = {}
    remove = eager.remove_function

    def remove_remembering(name):
        originals.setdefault(name, eager.get_function_def(name))
        replaced[name] += 1
        remove(name)

    eager.remove_function = remove_remembering
    try:
        yield
    finally:
        del eager.remove_function
        for name, definition in originals.items():
            while eager.has_function(name):
                eager.remove_function(name)
            for _ in range(replaced[name]):
                eager.add_function_def(definition)
