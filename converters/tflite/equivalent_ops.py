"""Ops TFLite has under two names, renamed to the one the --target runs.

The TFLite converter turns TensorFlow's SelectV2 into SELECT where its three
operands have one shape and keeps SELECT_V2 where they broadcast. TFLite Micro
runs only SELECT_V2 and NNAPI only SELECT. With one shape the two compute the
same, so an op the target lacks becomes its twin where the target has that.
"""

from tensorflow.lite.python import schema_py_generated as schema

from ..targets import TWINS
from . import flatbuffer_model
from . import operators

_OPTIONS = {"SELECT": "SelectOptions", "SELECT_V2": "SelectV2Options"}


def for_target(tflite_model, target_ops):
    """(the model with each op the target lacks renamed to a twin it has, {renamed op: count})."""
    model = flatbuffer_model.as_object(tflite_model)
    renamed = {}
    for subgraph in model.subgraphs:
        for operator in subgraph.operators:
            name = operators.op_name(model, operator)
            twin = TWINS.get(name)
            if twin is None or name in target_ops or twin not in target_ops:
                continue
            shapes = {tuple(subgraph.tensors[index].shapeSignature if subgraph.tensors[index].shapeSignature
                            is not None else subgraph.tensors[index].shape) for index in operator.inputs}
            if len(shapes) != 1:
                continue
            operator.opcodeIndex = flatbuffer_model.opcode_index(model, twin)
            operator.builtinOptionsType = getattr(schema.BuiltinOptions, _OPTIONS[twin])
            operator.builtinOptions = getattr(schema, _OPTIONS[twin] + "T")()
            renamed[f"{name} -> {twin}"] = renamed.get(f"{name} -> {twin}", 0) + 1
    if not renamed:
        return tflite_model, renamed
    return flatbuffer_model.as_bytes(model, len(tflite_model)), renamed
