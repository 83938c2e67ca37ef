"""Run the source model, the rewritten graph and the .tflite on the same inputs.

Two comparisons, reported per output:

* fidelity: .tflite vs the *rewritten* graph run in TensorFlow. Same math, so
  only float32 rounding separates them; this is what must pass.
* drift: .tflite vs the *original* model. The approximation the user chose
  (x*sigmoid(1.702x) is up to 0.02 from exact GELU per activation) shows here;
  it fails only above --max-drift.

The default tolerances, and why, are in options.py.
"""

import contextlib
import dataclasses
import math
import warnings

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context

from .. import errors
from ..options import DEFAULT_DYNAMIC_SIZE
from . import progress


@dataclasses.dataclass
class Comparison:
    output: str
    max_abs: float
    max_rel: float
    cosine: float
    passed: bool
    # NaN or Inf where the other side has a number, or not the same infinity: max_abs measures the rest only
    non_finite_differ: bool = False


class RandomInputs(dict):
    """Seeded random inputs, {name: array}: what the original model fails on is then worth real samples, or
    another size of the dynamic dimensions, where a dimension other than the batch took one (`dynamic_size`)."""
    dynamic_size = None


def make_inputs(inputs, seed=0, dynamic_size=DEFAULT_DYNAMIC_SIZE, npz_path=None, option="--inputs"):
    """Inputs for every signature input: seeded random (`RandomInputs`), or read from an .npz file.

    Random integers are drawn from the values the graph shows the input takes
    (TensorInfo.values: an embedding table's rows, a mask's 0/1); where it
    shows none, we refuse rather than guess, naming `option` for real samples.
    """
    if npz_path is not None:
        return load_npz(npz_path, inputs, option)
    rng = np.random.default_rng(seed)
    arrays = RandomInputs()
    for info in inputs:
        shape = [dynamic_size if size is None else size for size in (info.shape or (dynamic_size,))]
        if info.shape is None or None in info.shape[1:]:
            arrays.dynamic_size = dynamic_size
        if info.dtype.is_floating:
            arrays[info.name] = (rng.normal(0.0, 2.0, size=shape)).astype(info.dtype.as_numpy_dtype)
        elif info.dtype.is_integer:
            if info.values is None:
                raise errors.BadInputs(f"cannot make random values for integer input {info.name!r}: it indexes no "
                                       f"embedding table and is no mask, so its valid values are unknown; pass "
                                       f"real samples with {option} file.npz")
            arrays[info.name] = info.values.sample(rng, shape, info.dtype.as_numpy_dtype)
        elif info.dtype == tf.bool:
            arrays[info.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise errors.BadInputs(f"cannot make random values for input {info.name!r} of dtype {info.dtype.name}; "
                                   f"pass {option} file.npz")
    return arrays


def load_npz(path, inputs, option="--inputs", batched=False):
    """One array per signature input from an .npz, checked against the signature.

    batched: the first axis counts samples (calibration data), so only the
    other axes must match the signature's shape.
    """
    try:
        with np.load(path) as archive:
            provided = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        raise errors.BadInputs(f"{path}: cannot read as .npz for {option} ({error})") from error
    provided = _by_name_or_position(path, provided, inputs)
    for info in inputs:
        array = provided[info.name]
        if array.dtype != info.dtype.as_numpy_dtype:
            raise errors.BadInputs(f"{path}: input {info.name!r} has dtype {array.dtype}, the model expects "
                                   f"{info.dtype.name}")
        wanted, got = info.shape, array.shape
        if info.shape is not None and batched:
            wanted, got = info.shape[1:], array.shape[1:]
        if wanted is not None and (len(got) != len(wanted) or any(
                want is not None and want != size for want, size in zip(wanted, got))):
            shape = "(" + ", ".join("?" if size is None else str(size) for size in info.shape) + ")"
            per = "per sample, the model expects " if batched else "the model expects "
            raise errors.BadInputs(f"{path}: input {info.name!r} has shape {array.shape}, {per}{shape}")
    return {info.name: provided[info.name] for info in inputs}


def _by_name_or_position(path, provided, inputs):
    """The arrays keyed by input name: by name, or, unnamed (np.savez(f, a, b)), by position.

    np.savez names positional arrays arr_0, arr_1, ...; they feed the inputs
    in signature order, as the report and `keras-gelu-convert -v` list them.
    """
    names = [info.name for info in inputs]
    if all(name in provided for name in names):
        return provided
    positional = [f"arr_{index}" for index in range(len(inputs))]
    if sorted(provided) == sorted(positional):
        return {name: provided[key] for name, key in zip(names, positional)}
    missing = [name for name in names if name not in provided]
    raise errors.BadInputs(f"{path}: missing input(s) {', '.join(missing)}; expected keys: {', '.join(names)}, or "
                           f"{len(names)} unnamed array(s) (np.savez(path, a, ...)) in that order")


def run_source(source, arrays):
    """The original model's outputs, each op computed as written (see _ops_as_written)."""
    progress.entered("verify: the original model")
    if source.kind != "Keras model":  # a model file, loaded in the worker; never a live model's caller's functions
        _registered_without_xla(source.function)
    try:
        with _ops_as_written():
            outputs = source.function(**{name: tf.constant(value) for name, value in arrays.items()})
    except tf.errors.OpError as error:  # the model's own ops failing on the parity inputs: the model's fault
        message = " ".join(error.message.split("[[")[0].split())
        # random values within what the graph shows may still break what it does not (LayoutLM's boxes, corners
        # in order, whose differences index a table)
        hint = "; on seeded random inputs: pass real samples with --inputs file.npz" \
            if isinstance(arrays, RandomInputs) else ""
        if getattr(arrays, "dynamic_size", None) is not None:  # SigLIP's sequence: its position table's length
            hint += f", or the length its dynamic dimensions need with --dynamic-size (they took {arrays.dynamic_size})"
        raise errors.CorruptModel(f"{source.path}: the original model fails when run ({type(error).__name__}: "
                                  f"{message[:250]}){hint}") from error
    return {info.name: np.asarray(outputs[info.name]) for info in source.outputs}


# The mark tf.function(jit_compile=True) leaves on a function and on each call of it, which a saved model keeps
_XLA_MUST_COMPILE = "_XlaMustCompile"


def _registered_without_xla(function):
    """The functions `function` calls registered again without XLA's mark, where a model saved from jit-compiled
    code carries it (keras_gelu's kernels do: xla_kernels): the original model runs its ops as written, as the
    .tflite does, where XLA would first compile each marked function for each shape it meets, fused its own way
    (a small Keras 3 SavedModel's first run took 0.10-0.12 s with them compiled, 0.065 s without)."""
    eager = context.context()
    for definition in function.graph.as_graph_def().library.function:
        name = definition.signature.name
        if not eager.has_function(name):
            continue
        registered = eager.get_function_def(name)
        marks = [attributes for attributes in (registered.attr, *(node.attr for node in registered.node_def))
                 if _XLA_MUST_COMPILE in attributes]
        if not marks:
            continue
        for attributes in marks:
            del attributes[_XLA_MUST_COMPILE]
        try:
            while eager.has_function(name):  # each registration of it counted: all of them go
                eager.remove_function(name)
        except tf.errors.OpError:  # one the context holds for another's sake: it stays marked, and compiles
            continue
        eager.add_function_def(registered)


@contextlib.contextmanager
def _ops_as_written():
    """TensorFlow's graph optimizer off while the original model runs, as it is for the reference graph.

    Grappler optimizes every function it instantiates, nested control flow again at each level: 80 nested
    tf.cond took 6.6 s to run once with it and 3.6 s without (the reference graph, 7.7 s and 0.1 s). What
    TFLite computes is the ops as written, which is what parity compares against.
    """
    previous = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options(
            {**previous, "disable_meta_optimizer": previous.get("disable_meta_optimizer", False)})


def _session_config_computing_each_op():
    """A Session config under which every op of the graph runs its own kernel, none optimized away or fused.

    The reference is a frozen graph: its weights are Const nodes. With oneDNN
    on (the default on AVX-512 CPUs, or TF_ENABLE_ONEDNN_OPTS=1 on any x86),
    grappler's remapper then replaces the Mean/SquaredDifference/Rsqrt ops of
    a layer normalization with constant gamma/beta by one _MklLayerNorm
    kernel, which moved a tiny BERT's outputs by 2e-3; with variables (the
    SavedModel itself) the pattern does not match and nothing moves. Fused
    kernels compute something other than the ops in the graph, which are
    what the .tflite computes, so the reference turns the remapper off, and
    with it grappler's other passes, which also cost time quadratic in the
    depth of nested control flow (80 nested tf.cond: 7.7 s, 0.1 s without).
    """
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def graph_runner(graph_def, source):
    """run({input name: array}) -> {output name: array}: a GraphDef with the source's input and output tensor
    names, computing each op as written; imported once, however many batches it runs (a static-shape target's
    parity runs one sample at a time)."""
    progress.entered("verify: the rewritten graph")
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(graph_def, name="")
    placeholders = {info.name: scratch.get_tensor_by_name(info.tensor) for info in source.inputs}
    fetches = [scratch.get_tensor_by_name(info.tensor) for info in source.outputs]
    session = tf.compat.v1.Session(graph=scratch, config=_session_config_computing_each_op())

    def run(arrays):
        feeds = {placeholder: arrays[name].astype(placeholder.dtype.as_numpy_dtype)
                 for name, placeholder in placeholders.items()}
        return {info.name: value for info, value in zip(source.outputs, session.run(fetches, feeds))}

    return run


def saved_model_runner(directory, source):
    """run({input name: array}) -> {output name: array}: a SavedModel's signature, loaded once, computing each
    op as written; the weights it loaded are let go with `run`."""
    progress.entered("verify: the rewritten graph")
    function = signature_as_written(directory, source.signature)

    def run(arrays):
        with _ops_as_written():
            outputs = function(**{name: tf.constant(value) for name, value in arrays.items()})
        return {info.name: np.asarray(outputs[info.name]) for info in source.outputs}

    return run


def signature_as_written(directory, signature):
    """A SavedModel's signature function, loaded, the functions it calls registered without XLA's mark as the
    original model's are (run_source): a rewritten Keras SavedModel keeps keras_gelu's jit-compiled kernels,
    and XLA's first compile started its thread pools and took 0.04-0.08 s of a small model's 0.35 s conversion."""
    function = tf.saved_model.load(directory).signatures[signature]
    _registered_without_xla(function)
    return function


def reference_runner(reference, source):
    """The runner of what the .tflite must compute: a rewritten GraphDef, or a rewritten SavedModel's folder."""
    return saved_model_runner(reference, source) if isinstance(reference, str) else graph_runner(reference, source)


def run_graph(graph_def, source, arrays):
    """Run a GraphDef once with the source's input and output tensor names, computing each op as written."""
    return graph_runner(graph_def, source)(arrays)


def interpreter_class():
    """ai-edge-litert's interpreter when installed, else TensorFlow's."""
    try:
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter, "ai-edge-litert"
    except ImportError:
        return _tensorflow_interpreter, f"tf.lite.Interpreter (TF {tf.__version__})"


def interpreter_keeping_every_tensor(tflite_model):
    """`interpreter_class`'s interpreter for `tflite_model` with every intermediate tensor kept after a run
    (`experimental_preserve_all_tensors`: none is computed in place, none shares another's buffer)."""
    interpreter_type, _ = interpreter_class()
    with warnings.catch_warnings():  # its notice that keeping every tensor is for debugging: it is
        warnings.simplefilter("ignore")
        return interpreter_type(model_content=tflite_model, experimental_preserve_all_tensors=True)


def _tensorflow_interpreter(*args, **kwargs):
    """tf.lite.Interpreter without its notice to move to ai-edge-litert: the report names the runtime used."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"\s*Warning: Please use the LiteRT interpreter")
        return tf.lite.Interpreter(*args, **kwargs)


def _quantization(detail):
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return (scale, zero_point) if scale else None


def input_value(detail, array):
    """`array` as the interpreter input `detail` takes it: quantized with its scale if it is integer."""
    quantization = _quantization(detail)
    if quantization is not None and np.issubdtype(detail["dtype"], np.integer) and array.dtype.kind == "f":
        scale, zero_point = quantization
        limits = np.iinfo(detail["dtype"])
        array = np.clip(np.round(array / scale) + zero_point, limits.min, limits.max)
    return array.astype(detail["dtype"])


def output_value(detail, value):
    """An interpreter output as float: dequantized with its scale if it is integer."""
    quantization = _quantization(detail)
    if quantization is not None and np.issubdtype(detail["dtype"], np.integer):
        scale, zero_point = quantization
        return (value.astype(np.float32) - zero_point) * np.float32(scale)
    return value


def invoke(tflite_model, arrays):
    """Run a .tflite on float arrays given in its input order; float outputs in its output order.

    Integer inputs and outputs of an --int8-io model are quantized and
    dequantized with the model's own scales. Raises RuntimeError/ValueError
    where the runtime cannot run the model (Flex ops on TF >= 2.19).
    """
    interpreter_type, _ = interpreter_class()
    interpreter = interpreter_type(model_content=tflite_model)
    details = interpreter.get_input_details()
    for detail, array in zip(details, arrays):
        interpreter.resize_tensor_input(detail["index"], array.shape)
    interpreter.allocate_tensors()
    for detail, array in zip(details, arrays):
        interpreter.set_tensor(detail["index"], input_value(detail, array))
    interpreter.invoke()
    return [output_value(detail, interpreter.get_tensor(detail["index"]))
            for detail in interpreter.get_output_details()]


def run_signature(tflite_model, signature_key, arrays):
    """Run a .tflite through its SignatureDef: {output name: float array} for {input name: array}.

    As `invoke`, but by the names the signature gives, the way LiteRT's
    `get_signature_runner()` and `runSignature` call a model.
    """
    return signature_runner(tflite_model, signature_key)(arrays)


def signature_runner(tflite_model, signature_key):
    """run({input name: array}) -> {output name: float array}, as `run_signature`, with one interpreter for every
    batch it runs."""
    progress.entered("verify: LiteRT")
    interpreter_type, _ = interpreter_class()
    runner = interpreter_type(model_content=tflite_model).get_signature_runner(signature_key)
    input_details, output_details = runner.get_input_details(), runner.get_output_details()

    def run(arrays):
        outputs = runner(**{name: input_value(input_details[name], array) for name, array in arrays.items()})
        return {name: output_value(output_details[name], value) for name, value in outputs.items()}

    return run


def compare(name, actual, expected, atol, rtol):
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    if actual.shape != expected.shape:
        return Comparison(name, float("inf"), float("inf"), float("nan"), False)
    finite = np.isfinite(expected) & np.isfinite(actual)
    # Non-finite values must agree exactly: the same positions, the same infinities.
    same_non_finite = np.array_equal(np.isfinite(actual), np.isfinite(expected)) and np.array_equal(
        actual[~finite], expected[~finite], equal_nan=True)
    difference = np.abs(actual - expected)[finite]
    max_abs = float(difference.max()) if difference.size else 0.0
    scale = np.abs(expected[finite])
    max_rel = float((difference / np.maximum(scale, 1e-12)).max()) if difference.size else 0.0
    a, e = actual[finite].ravel(), expected[finite].ravel()
    norms = np.linalg.norm(a) * np.linalg.norm(e)
    cosine = float(a @ e / norms) if norms > 0 else (1.0 if np.array_equal(a, e) else 0.0)
    passed = bool(same_non_finite and np.all(difference <= atol + rtol * scale))
    return Comparison(name, max_abs, max_rel, cosine, passed, not same_non_finite)


def non_finite_where_finite(actual, expected):
    """Whether `actual` holds NaN or Inf anywhere `expected` is finite."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    return actual.shape == expected.shape and bool(np.any(~np.isfinite(actual) & np.isfinite(expected)))


def with_steps(comparison, scale):
    """A comparison as a dict, with its max abs error in integer output steps (None for float outputs)."""
    entry = dataclasses.asdict(comparison)
    entry["steps"] = None if scale is None else comparison.max_abs / scale
    return entry


def fail_unless_passed(comparisons, path, report, what, limit):
    """ParityFailure naming the outputs that failed, what was measured and, in int8, the limit accepting it."""
    failures = [c for c in comparisons if not c["passed"]]
    if not failures:
        return
    worst = max(comparisons, key=lambda c: c["max_abs"])
    measured = f"max abs {worst['max_abs']:.3g}"
    if any(c["non_finite_differ"] for c in failures):
        measured = "NaN or Inf where the other has a number"
    elif worst.get("steps") is not None:
        # A deep int8 model's roundings add up (measured: 19 steps at cosine 0.999 on an untrained DeiT): the
        # user decides, knowing the cosine
        steps = math.ceil(round(worst["steps"], 3))  # float32 rounding of a whole number of steps
        measured = f"{steps} {report.step_type} steps at cosine {min(c['cosine'] for c in failures):.4f}"
        limit = f"{limit}; pass --max-steps {steps} to accept it"
    raise errors.ParityFailure(report, f"{path}: {what} on output(s) "
                               f"{', '.join(c['output'] for c in failures)} ({measured} > {limit}); nothing written")
