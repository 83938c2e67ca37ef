"""The TensorFlow API functions a tf-keras op layer may call while an .h5 model is rebuilt.

tf-keras writes `tf.nn.gelu(x)`, `x + 1` or `x[:, 0]` in a functional model
as a TFOpLambda or SlicingOpLambda layer whose config names the function
("nn.gelu", "__operators__.add"), and calls it, on constants too, as it
rebuilds the model. Any public TensorFlow function can be named so,
`io.write_file` among them. A function is allowed when TensorFlow defines it
in one of the modules below, which only build ops that compute on tensors;
where the module is a generated op wrapper (gen_*), the op it runs must also
pass `ops.refusal`. ClassMethod and InstanceMethod layers may only call the
ragged and sparse tensor methods tf-keras itself delegates to them.
"""

import functools

import tensorflow as tf
from tensorflow.python.util import tf_export

from . import ops

# Modules under tensorflow.python whose functions only build ops computing on tensors, by kind.
COMPUTING_MODULES = (
    ("shapes, indexing, slicing and constants", (
        "ops.array_ops", "ops.array_ops_stack", "ops.gen_array_ops", "ops.manip_ops", "ops.tensor_getitem_override",
        "ops.ragged.ragged_getitem", "framework.constant_op")),
    ("arithmetic and math functions", (
        "ops.math_ops", "ops.gen_math_ops", "ops.special_math_ops", "ops.gen_special_math_ops", "ops.clip_ops",
        "ops.sort_ops", "ops.bincount_ops", "ops.histogram_ops", "ops.gen_bitwise_ops", "ops.check_ops")),
    ("neural-network layers' math", ("ops.nn_ops", "ops.gen_nn_ops", "ops.nn_impl", "ops.embedding_ops")),
    ("linear algebra", ("ops.linalg_ops", "ops.gen_linalg_ops", "ops.linalg.linalg_impl")),
    ("signal processing", (
        "ops.signal.fft_ops", "ops.gen_spectral_ops", "ops.signal.window_ops", "ops.signal.spectral_ops",
        "ops.signal.shape_ops", "ops.signal.mel_ops", "ops.signal.mfcc_ops", "ops.signal.reconstruction_ops",
        "ops.signal.dct_ops")),
    ("image math (decoding bytes already in tensors)", ("ops.image_ops_impl", "ops.gen_image_ops")),
    ("string math on tensors", ("ops.string_ops", "ops.gen_string_ops", "ops.ragged.ragged_string_ops")),
    ("random numbers", ("ops.random_ops", "ops.stateless_random_ops", "ops.gen_random_ops")),
    ("sparse and ragged tensors", (
        "ops.sparse_ops", "ops.ragged.ragged_array_ops", "ops.ragged.ragged_math_ops",
        "ops.ragged.ragged_concat_ops", "ops.ragged.segment_id_ops", "ops.ragged.ragged_tensor",
        "ops.ragged.ragged_factory_ops", "framework.sparse_tensor")),
)
_COMPUTING = {"tensorflow.python." + module for _, modules in COMPUTING_MODULES for module in modules}

# What tf-keras delegates to ClassMethod and InstanceMethod/InstanceProperty layers (its tf_op_layer.py):
# constructors, accessors and conversions of ragged and sparse tensors, all computing.
CLASS_METHODS = {"RaggedTensor": (
    "from_value_rowids", "from_row_splits", "from_row_lengths", "from_row_starts", "from_row_limits",
    "from_uniform_row_length", "from_nested_value_rowids", "from_nested_row_splits", "from_nested_row_lengths",
    "from_tensor", "from_sparse")}
INSTANCE_ATTRIBUTES = (
    "values", "flat_values", "row_splits", "nested_row_splits", "value_rowids", "nested_value_rowids", "nrows",
    "row_starts", "row_limits", "row_lengths", "nested_row_lengths", "bounding_shape", "with_values",
    "with_flat_values", "with_row_splits_dtype", "merge_dims", "to_tensor", "to_sparse", "indices", "dense_shape")


@functools.lru_cache(maxsize=None)
def _generated_ops():
    """{(module, function name): op name} of TensorFlow's generated op wrappers, read off tf.raw_ops."""
    wrappers = {}
    for op in dir(tf.raw_ops):
        function = getattr(tf.raw_ops, op)
        if callable(function):
            wrappers[(function.__module__, function.__name__)] = op
    return wrappers


def refusal(symbol):
    """What calling the public TensorFlow function `symbol` ("nn.gelu") can do beyond computing, or None."""
    function = tf_export.get_symbol_from_name(symbol) if isinstance(symbol, str) else None
    if function is None or not callable(function):
        return "is not a TensorFlow API function"
    module = getattr(function, "__module__", None) or "?"
    if module not in _COMPUTING:
        return f"is defined in {module}, outside the TensorFlow modules that only compute on tensors"
    if module.rpartition(".")[2].startswith("gen_"):
        op = _generated_ops().get((module, function.__name__))
        return ops.refusal(op) if op is not None else "runs an op this check cannot name"
    return None


def class_method_refusal(class_symbol, method):
    if method not in CLASS_METHODS.get(class_symbol, ()):
        return f"calls {class_symbol}.{method}, not a ragged-tensor constructor tf-keras delegates"
    return None


def instance_attribute_refusal(attribute):
    if attribute not in INSTANCE_ATTRIBUTES:
        return f"reads the tensor attribute {attribute!r}, not one tf-keras delegates to ragged or sparse tensors"
    return None
