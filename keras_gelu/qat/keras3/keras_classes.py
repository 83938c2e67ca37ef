"""What Keras defines and exports under no public name, imported from where Keras defines them, in this one
place (Keras 3 only, as this engine).

* `LayerScale`: keras.applications' ConvNeXt's per-channel x * gamma.
* `VALUE_KEEPING_OPERATIONS`: the operations a functional model may call on
  its tensors (`x[:, 0]`, `ops.reshape(x, ...)`) whose outputs are values of
  their input's int8 grid: moved or dropped, never computed.
* `training_of_the_call_under_way`: the `training` of the layer call Keras
  is in, from its call context.
"""

from keras.src.applications.convnext import LayerScale  # noqa: F401
from keras.src.backend.common import global_state
from keras.src.ops import numpy as numpy_operations

VALUE_KEEPING_OPERATIONS = (numpy_operations.Reshape, numpy_operations.Transpose, numpy_operations.ExpandDims,
                            numpy_operations.Squeeze, numpy_operations.GetItem)


def training_of_the_call_under_way():
    """The `training` Keras hands the sublayers of the layer call under way (False outside any call)."""
    context = global_state.get_global_attribute("current_call_ctx")
    return bool(context is not None and context.training)
