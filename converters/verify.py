"""Run the source model, the rewritten graph and the .tflite on the same inputs.

Two comparisons, reported per output:

* fidelity: .tflite vs the *rewritten* graph run in TensorFlow. Same math, so
  only float32 rounding separates them; this is what must pass.
* drift: .tflite vs the *original* model. The approximation the user chose
  (x*sigmoid(1.702x) is up to 0.02 from exact GELU per activation) shows here;
  it fails only above --max-drift.

Default fidelity tolerance, atol = rtol = 1e-4: TFLite and TensorFlow kernels
round differently (fused multiply-adds, XNNPACK's exp/sigmoid polynomials,
summation order in matmuls). Measured over this package's test models the
worst difference was ~1e-6 relative to the output scale; 1e-4 leaves two
orders of magnitude of headroom while still catching any wrong op
(a wrong GELU spelling moves outputs by >= 1e-3).
"""

import dataclasses

import numpy as np
import tensorflow as tf

from . import errors

DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
DEFAULT_DYNAMIC_SIZE = 2


@dataclasses.dataclass
class Comparison:
    output: str
    max_abs: float
    max_rel: float
    cosine: float
    passed: bool


def make_inputs(inputs, seed=0, dynamic_size=DEFAULT_DYNAMIC_SIZE, npz_path=None):
    """Inputs for every signature input: seeded random, or read from an .npz file."""
    if npz_path is not None:
        return load_npz(npz_path, inputs)
    rng = np.random.default_rng(seed)
    arrays = {}
    for info in inputs:
        shape = [dynamic_size if size is None else size for size in (info.shape or (dynamic_size,))]
        if info.dtype.is_floating:
            arrays[info.name] = (rng.normal(0.0, 2.0, size=shape)).astype(info.dtype.as_numpy_dtype)
        elif info.dtype.is_integer:
            arrays[info.name] = rng.integers(0, 10, size=shape).astype(info.dtype.as_numpy_dtype)
        elif info.dtype == tf.bool:
            arrays[info.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            raise errors.BadInputs(f"cannot make random values for input {info.name!r} of dtype {info.dtype.name}; "
                                   "pass --inputs file.npz")
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
    missing = [info.name for info in inputs if info.name not in provided]
    if missing:
        raise errors.BadInputs(f"{path}: missing input(s) {', '.join(missing)}; expected keys: "
                               f"{', '.join(info.name for info in inputs)}")
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


def run_source(source, arrays):
    outputs = source.function(**{name: tf.constant(value) for name, value in arrays.items()})
    return {info.name: np.asarray(outputs[info.name]) for info in source.outputs}


def run_graph(graph_def, source, arrays):
    """Run a GraphDef with the source's input and output tensor names."""
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(graph_def, name="")
        feeds = {}
        for info in source.inputs:
            placeholder = scratch.get_tensor_by_name(info.tensor)
            feeds[placeholder] = arrays[info.name].astype(placeholder.dtype.as_numpy_dtype)
        fetches = [scratch.get_tensor_by_name(info.tensor) for info in source.outputs]
        with tf.compat.v1.Session(graph=scratch) as session:
            values = session.run(fetches, feeds)
    return {info.name: value for info, value in zip(source.outputs, values)}


def interpreter_class():
    """ai-edge-litert's interpreter when installed, else TensorFlow's."""
    try:
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter, "ai-edge-litert"
    except ImportError:
        return tf.lite.Interpreter, f"tf.lite.Interpreter (TF {tf.__version__})"


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
    outputs = []
    for detail in interpreter.get_output_details():
        value = interpreter.get_tensor(detail["index"])
        quantization = _quantization(detail)
        if quantization is not None and np.issubdtype(detail["dtype"], np.integer):
            scale, zero_point = quantization
            value = (value.astype(np.float32) - zero_point) * np.float32(scale)
        outputs.append(value)
    return outputs


def run_tflite(tflite_model, source, arrays):
    """Run the .tflite on the source's inputs.

    The converter keeps the concrete function's order: inputs as the
    signature's inputs, outputs sorted by name, as `source` lists them.
    """
    outputs = invoke(tflite_model, [arrays[info.name] for info in source.inputs])
    return {info.name: output for info, output in zip(source.outputs, outputs)}


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
    return Comparison(name, max_abs, max_rel, cosine, passed)
