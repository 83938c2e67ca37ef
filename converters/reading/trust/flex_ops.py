"""The TensorFlow ops a select-mode .tflite ships as Flex ops, checked like the source graph's ops.

A Flex op is a TensorFlow op carried whole into the .tflite: its custom
options hold the op's NodeDef, which the Flex delegate runs on the device.
An op that would be refused in the source is refused here too, so that a
file-writing op cannot reach a device by way of select mode.
"""

from flatbuffers import flexbuffers
from tensorflow.core.framework import node_def_pb2

from ... import errors
from ...tflite import flatbuffer_model
from . import ops

_FLEX_PREFIX = "Flex"


def flex_nodes(tflite_model):
    """The NodeDef of every Flex op in every subgraph of a .tflite."""
    model = flatbuffer_model.read(tflite_model)
    for subgraph in model.subgraphs or ():
        for operator in subgraph.operators or ():
            code = flatbuffer_model.custom_code(model.operatorCodes[operator.opcodeIndex])
            if code and code.startswith(_FLEX_PREFIX):
                node = node_def_pb2.NodeDef()
                try:
                    _, serialized = flexbuffers.Loads(bytes(operator.customOptions))
                    node.ParseFromString(serialized if isinstance(serialized, bytes) else serialized.encode("latin-1"))
                except Exception:  # a Flex op we cannot read is as unknown as an unregistered op
                    node.op = code[len(_FLEX_PREFIX):]
                    node.name = "?"
                yield node


def check(path, tflite_model):
    """Refuse a .tflite that would ship a Flex op able to act outside the process."""
    for node in flex_nodes(tflite_model):
        what = ops.refusal(node.op, node.attr)
        if what is not None:
            raise errors.UntrustedModel.refused(path, f"the .tflite would ship Flex op {node.op} (node "
                                                      f"{node.name!r}), which {what}")
