"""Running a .tflite in tests with whichever interpreter the converter would use."""

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from keras_gelu.converters.tflite import flatbuffer_model
from keras_gelu.converters.tflite import operators
from keras_gelu.converters.running import verify


def run(tflite_model, *arrays):
    """Outputs (in the model's order) for inputs given in the model's order."""
    return verify.invoke(tflite_model, arrays)


def with_weight_matrices_scaled(tflite_model, factor):
    """The .tflite with every float32 weight matrix (a 2-D tensor with data) multiplied by `factor`: a converter
    that is wrong on purpose, whatever route it took."""
    model = flatbuffer_model.as_object(tflite_model)
    for tensor in model.subgraphs[0].tensors:
        data = model.buffers[tensor.buffer].data
        if tensor.type == schema.TensorType.FLOAT32 and len(tensor.shape) == 2 and data is not None and len(data):
            values = np.frombuffer(bytes(data), np.float32) * np.float32(factor)
            model.buffers[tensor.buffer].data = np.frombuffer(values.tobytes(), np.uint8)
    return flatbuffer_model.as_bytes(model, len(tflite_model))


def ops(tflite_model):
    return operators.op_histogram(tflite_model)


def with_int8_weight_scales_scaled(tflite_model, factor):
    """The .tflite with the scale of every int8 weight tensor (a tensor with data, of 2 dimensions or more)
    multiplied by `factor`: an int8 converter that is wrong on purpose."""
    model = flatbuffer_model.as_object(tflite_model)
    for tensor in model.subgraphs[0].tensors:
        data = model.buffers[tensor.buffer].data
        if tensor.type == schema.TensorType.INT8 and len(tensor.shape) >= 2 and data is not None and len(data):
            tensor.quantization.scale = np.asarray(tensor.quantization.scale, np.float32) * np.float32(factor)
    return flatbuffer_model.as_bytes(model, len(tflite_model))


def run_matched_by_shape(tflite_model, arrays):
    """Outputs for `arrays` given in any order, each fed to the input of its (distinct) shape."""
    interpreter_type, _ = verify.interpreter_class()
    shapes = [tuple(detail["shape"][1:]) for detail in interpreter_type(model_content=tflite_model).get_input_details()]
    by_shape = {array.shape[1:]: array for array in arrays}
    assert len(by_shape) == len(arrays) == len(shapes), "inputs of distinct shapes"
    return verify.invoke(tflite_model, [by_shape[shape] for shape in shapes])


_EXACT_OPS = {  # the float function of each int8 op the rounding check knows, on dequantized inputs
    "ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "SQUARED_DIFFERENCE": lambda a, b: (a - b) ** 2,
    "RSQRT": lambda a: 1 / np.sqrt(a),
    "MEAN": lambda a, axes: np.mean(a, axis=tuple(np.atleast_1d(axes).astype(int)), keepdims=True),
}


def invoked_keeping_every_tensor(tflite_model, array, resolver="BUILTIN_REF"):
    """An interpreter of `tflite_model` (ai-edge-litert's, else TensorFlow's) that ran once on `array`, every
    tensor kept, with the op resolver named `resolver` (the reference kernels by default)."""
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        import tensorflow as tf

        Interpreter, OpResolverType = tf.lite.Interpreter, tf.lite.experimental.OpResolverType
    interpreter = Interpreter(model_content=tflite_model, experimental_preserve_all_tensors=True,
                              experimental_op_resolver_type=getattr(OpResolverType, resolver))
    (detail,) = interpreter.get_input_details()
    interpreter.resize_tensor_input(detail["index"], array.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], verify.input_value(detail, array))
    interpreter.invoke()
    return interpreter


def stock_int8(converter, samples):
    """The stock converter's post-training int8 .tflite from `converter` (a tf.lite.TFLiteConverter), calibrated
    on each of `samples` (a batch each)."""
    import tensorflow as tf

    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = lambda: ([sample] for sample in samples)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter.convert()


def op_rounding_steps(tflite_model, array, op_names):
    """For each int8 op named in `op_names` (of _EXACT_OPS), in graph order: (name, the largest difference in
    output steps between its output and its exact function on its own int8 inputs, rounded to its output
    grid). 0-1 for every op means the graph is the ops it should be, each rounding once. Reference kernels."""
    interpreter = invoked_keeping_every_tensor(tflite_model, array)
    tensors = {tensor["index"]: tensor for tensor in interpreter.get_tensor_details()}

    def dequantized(index):
        value = interpreter.get_tensor(index)
        scale, zero_point = tensors[index]["quantization"]
        return (value.astype(np.float64) - zero_point) * scale if scale else value

    found = []
    for op in interpreter._get_ops_details():
        if op["op_name"] not in op_names:
            continue
        (output,) = op["outputs"]
        scale, zero_point = tensors[output]["quantization"]
        exact = _EXACT_OPS[op["op_name"]](*(dequantized(index) for index in op["inputs"] if index >= 0))
        expected = np.clip(np.round(exact / scale + zero_point), -128, 127)
        found.append((op["op_name"], float(np.max(np.abs(interpreter.get_tensor(output) - expected)))))
    return found


def analyzer_op_counts(tflite_model):
    """{op name: count} over every subgraph, as TFLite's own model analyzer (C++) lists them: a second reading
    of the flatbuffer, independent of the converter's report."""
    import collections
    import contextlib
    import io
    import re

    import tensorflow as tf

    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        tf.lite.experimental.Analyzer.analyze(model_content=tflite_model)
    return dict(collections.Counter(re.findall(r"^\s+Op#\d+ (\w+)\(", listing.getvalue(), re.MULTILINE)))


def ops_behind_outputs(tflite_model, signature="serving_default"):
    """{signature output name: {op name: count} of the ops its value is computed by}, in the main subgraph."""
    import collections

    interpreter_type, _ = verify.interpreter_class()
    interpreter = interpreter_type(model_content=tflite_model)
    runner = interpreter.get_signature_runner(signature)
    ops = interpreter._get_ops_details()
    writer = {output: op for op in ops for output in op["outputs"]}
    cones = {}
    for name, detail in runner.get_output_details().items():
        seen, pending, counts = set(), [detail["index"]], collections.Counter()
        while pending:
            op = writer.get(pending.pop())
            if op is not None and op["index"] not in seen:
                seen.add(op["index"])
                counts[op["op_name"]] += 1
                pending.extend(index for index in op["inputs"] if index >= 0)
        cones[name] = dict(counts)
    return cones


def integer_outputs(report):
    """{op: {integer type: how many}} of a conversion report's ops whose outputs are integers (mixed ones too)."""
    return {op: {kind: count for kind, count in types.items() if kind in ("int32", "bool")}
            for op, types in report.op_types.items() if {"int32", "bool"} & set(types)}
