"""Quantization-aware training on Keras 3, without tfmot: the engine of `keras_gelu.qat.quantize_model`.

A copy of the model where each layer is wrapped with the rule of its kind
(`keras_gelu.qat.keras3.rules`), the inputs pass a `QuantizeInput`, and every value
the int8 .tflite will hold as int8 is fake-quantized on the grid it will have
there. Train it with `fit`, save it as .keras (no custom_objects), then
`model.export(path)` and `keras-gelu-convert path --int8 --mode <mode>`.
"""

import warnings

import numpy as np

from keras_gelu.flavour import keras
from keras_gelu.qat.keras3 import composite
from keras_gelu import layer_configs
from keras_gelu.qat.keras3 import folding
from keras_gelu.qat.keras3 import nesting
from keras_gelu.qat.keras3 import ranges
from keras_gelu.qat.keras3 import refusals
from keras_gelu.qat.keras3.refusals import refusal
from keras_gelu.qat.keras3 import splitting
from keras_gelu.qat.keras3.composite import rule_or_composite
from keras_gelu.qat.keras3.keras_classes import VALUE_KEEPING_OPERATIONS
from keras_gelu.qat.keras3.rules import UNCHANGED_VALUES
from keras_gelu.qat.keras3.rules import QuantizeRule
from keras_gelu.qat.keras3.rules import register_rule
from keras_gelu.qat.keras3.rules import rule_for
from keras_gelu.qat.keras3.training import NonFiniteTraining
from keras_gelu.qat.keras3.training import QuantizedModel
from keras_gelu.qat.keras3.wrapper import QuantizeInput
from keras_gelu.qat.keras3.wrapper import QuantizeOperation
from keras_gelu.qat.keras3.wrapper import QuantizeWrapper
from keras_gelu.qat.keras3.wrapper import is_float


def _identity_at_inference(layer):
    """Whether `layer`, which has no weights, returns its input unchanged at inference (StochasticDepth, DropPath
    and their kin, from any library): the int8 model does not hold it, and QAT trains it as it is. Decided by
    what the layer does, on random values of its input's shape."""
    if layer.weights or len(layer._inbound_nodes) != 1:
        return False
    tensors = keras.tree.flatten(layer._inbound_nodes[0].input_tensors)
    if len(tensors) != 1 or not is_float(tensors[0]):
        return False
    probe = np.random.default_rng(0).normal(size=[2 if size is None else size for size in tensors[0].shape])
    probe = probe.astype(tensors[0].dtype)
    try:
        outputs = layer(probe, training=False)
    except Exception:  # a layer that cannot run alone on random values is not an identity to rely on
        return False
    return not keras.tree.is_nested(outputs) and np.array_equal(keras.ops.convert_to_numpy(outputs), probe)


def _check_rules(model, mode, exact_as, skipped):
    for layer in model.layers:
        if isinstance(layer, UNCHANGED_VALUES) or layer.name in skipped or rule_or_composite(layer, mode, exact_as):
            continue
        if isinstance(layer, keras.Model):
            raise refusals.no_rule(layer, subclassed_model=True)
        if isinstance(layer, keras.layers.BatchNormalization):
            raise refusal(
                layer, f"quantize_model folds a BatchNormalization into the Conv/Dense right before it, with a linear "
                f"activation and no other reader; {layer.name} has none such. Keep it float with "
                f"keep_float=[{layer.name!r}], or register a rule. Received: layer={layer.name}")
        raise refusals.no_rule(layer, subclassed_model=False)


def quantize(model, mode, exact_as, calibration_data, keep_float):
    """The Keras 3 engine of `keras_gelu.qat.quantize_model`, which checks the arguments first.

    The QAT model computes in float32 whatever the model's and the global dtype policies: int8 ranges are
    float32, and float16 would round the values on each int8 grid (11-bit significands) where the int8 model
    does not. A mixed-precision model's weights are float32 already; its layers are rebuilt float32.
    """
    mixed = [layer.name for layer in model.layers
             if layer.dtype_policy.name != "float32" and not isinstance(layer, keras.layers.InputLayer)]
    if mixed:
        warnings.warn(f"quantize_model: the QAT model computes in float32, as the int8 model's ranges are; "
                      f"{len(mixed)} layer(s) of {model.name} had a mixed-precision policy ({mixed[0]}: "
                      f"{model.get_layer(mixed[0]).dtype_policy.name}). The weights are the model's.", stacklevel=3)
    global_policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")  # for the layers made here: wrappers, input quantizers, GELUs
    try:
        if keep_float != "auto":
            return _quantize(model, mode, exact_as, calibration_data, keep_float)
        qat_model, kept = refusals.keeping_refused_layers_float(
            lambda names: _quantize(model, mode, exact_as, calibration_data, names))
        qat_model.kept_float = kept
        return qat_model
    finally:
        keras.config.set_dtype_policy(global_policy)


def _quantize(model, mode, exact_as, calibration_data, keep_float):
    if isinstance(model, keras.Sequential):  # clone_model inserts layers (the split GELUs) in functional models only
        single = lambda tensors: tensors[0] if len(tensors) == 1 else tensors  # noqa: E731
        model = keras.Model(single(model.inputs), single(model.outputs), name=model.name)
    model = nesting.flattened(model, keep_float)
    folds = folding.scales_to_fold(model, keep_float)  # {Conv/Dense name: the BatchNorm or LayerScale after it}
    folded_away = {scaling.name for scaling in folds.values()}
    identities = {layer.name for layer in model.layers
                  if rule_for(layer, mode, exact_as) is None and _identity_at_inference(layer)}
    _check_rules(model, mode, exact_as, set(keep_float) | folded_away | identities)
    pairs = []  # (float layer, its QAT copy, the split-out activation's float and QAT copies or None)
    split_out = {}  # id(QAT copy) -> the QAT activation layer to call after it

    def quantized(layer):
        if layer.name in keep_float:
            return layer
        return QuantizeWrapper(layer, rule_or_composite(layer, mode, exact_as))

    def clone_function(layer):
        if layer.name in folded_away:
            return keras.layers.Identity(name=layer.name)  # a stand-in call_function never calls
        if not isinstance(layer, keras.layers.Layer):  # an operation on the model's tensors; see call_function
            return type(layer).from_config(layer.get_config())
        gelu = splitting.activation_layer_as_gelu(layer)
        if gelu is not None:  # Activation("gelu") as our GELU layer, with its rule
            pairs.append((layer, quantized(gelu), None, None))
            return pairs[-1][1]
        rule = None if layer.name in keep_float or layer.name in identities \
            else rule_or_composite(layer, mode, exact_as)
        if isinstance(rule, composite.CompositeRule):
            # Its weights before its rule puts QuantizeSublayers (and their ranges) in place of its sublayers;
            # built by a symbolic call like the model's (a layer may make its sublayers' state in call()). An
            # `activation` it holds is its sublayers' (keras-hub's TransformerEncoder): split out of them there.
            copy = layer_configs.copy(layer, dtype="float32")
            node = layer._inbound_nodes[0]
            fresh = keras.tree.map_structure(
                lambda value: keras.KerasTensor(value.shape, value.dtype) if isinstance(value, keras.KerasTensor)
                else value, (node.arguments.args, node.arguments.kwargs))
            copy(*fresh[0], **fresh[1])
            copy.set_weights(layer.get_weights())
            return quantized(copy)
        overrides = {"dtype": "float32"}
        if layer.name in folds:
            overrides["use_bias"] = True  # the folded BatchNormalization's shift
        activation = splitting.split_activation(layer)
        if activation is not None:
            overrides["activation"] = "linear"
        copy = layer_configs.copy(layer, **overrides)
        new = copy if isinstance(layer, UNCHANGED_VALUES) or layer.name in identities else quantized(copy)
        new_activation = None if activation is None else quantized(activation)
        if new_activation is not None:
            split_out[id(new)] = new_activation
        pairs.append((layer, new, getattr(layer, "activation", None), new_activation))
        return new

    quantized_inputs = {}  # id(model input) -> it after QuantizeInput, made where a layer first reads it

    def quantized_input(tensor):
        history = getattr(tensor, "_keras_history", None)
        if history is None or not isinstance(history[0], keras.layers.InputLayer) or not is_float(tensor):
            return tensor
        if id(tensor) not in quantized_inputs:
            quantized_inputs[id(tensor)] = QuantizeInput(name=f"quantize_{history[0].name}")(tensor)
        return quantized_inputs[id(tensor)]

    def call_function(layer, *args, **kwargs):
        if layer.name in folded_away:
            return args[0]  # in the weights of the layer before it
        args, kwargs = keras.tree.map_structure(quantized_input, (args, kwargs))
        if isinstance(layer, QuantizeWrapper):
            inputs, kwargs = layer.rule.call_arguments(layer.layer, args, kwargs)
            outputs = layer(inputs, **kwargs)
        elif not isinstance(layer, (keras.layers.Layer, VALUE_KEEPING_OPERATIONS)):
            constants = [[position, value] for position, value in enumerate(args)
                         if not isinstance(value, keras.KerasTensor)]
            tensors = [value for value in args if isinstance(value, keras.KerasTensor)]
            outputs = QuantizeOperation(layer, constants)(tensors, **kwargs)
        else:
            outputs = layer(*args, **kwargs)
        return split_out[id(layer)](outputs) if id(layer) in split_out else outputs

    clone = keras.models.clone_model(model, clone_function=clone_function, call_function=call_function)
    qat_model = QuantizedModel(clone.input, clone.output, name=clone.name)  # the structures (a dict of outputs)
    for layer, new, activation, new_activation in pairs:
        weights = folding.folded_weights(layer, folds[layer.name]) if layer.name in folds else None
        _copy_float_weights(layer, new, activation, new_activation, weights)
    if calibration_data is not None:
        initialize_ranges(qat_model, calibration_data)
    return qat_model


def _inner(layer):
    return layer.layer if isinstance(layer, QuantizeWrapper) else layer


def _copy_float_weights(layer, new, activation, new_activation, weights=None):
    """The float layer's weights (or `weights`) into its QAT copy, and a split-out LearnableGELU's into
    its own; weight ranges follow."""
    moved = list(activation.weights) if new_activation is not None and hasattr(activation, "weights") else []
    moved_ids = {id(weight) for weight in moved}
    if weights is None:
        weights = [weight.numpy() for weight in layer.weights if id(weight) not in moved_ids]
    _inner(new).set_weights(weights)
    if moved:
        _inner(new_activation).set_weights([weight.numpy() for weight in moved])
    for wrapper in (new, new_activation):
        if isinstance(wrapper, QuantizeWrapper):
            for quantizer in wrapper.ranges.values():
                if hasattr(quantizer, "update"):
                    quantizer.update()


def _range_variables(qat_model):
    found = []
    for layer in qat_model._flatten_layers():  # composite layers hold QuantizeSublayers, at any depth
        quantizers = []
        if isinstance(layer, QuantizeWrapper):
            quantizers = list(layer.ranges.values()) + list((getattr(layer, "input_ranges", None) or {}).values())
        elif isinstance(layer, QuantizeInput):
            quantizers = [layer.input_range]
        elif isinstance(layer, QuantizeOperation):
            quantizers = [layer.output_range]
        found += [variable for quantizer in quantizers for variable in (quantizer.low, quantizer.high)]
    return found


def initialize_ranges(qat_model, samples):
    """Set every int8 range of a QAT model to its range over `samples` (one batch); nothing else changes.

    One training-mode pass in which each activation range takes that batch's
    range instead of moving 0.1 % towards it; every other variable (batch-norm
    statistics, weights) is restored afterwards.
    """
    range_ids = {id(variable) for variable in _range_variables(qat_model)}
    snapshot = [(variable, variable.numpy()) for variable in qat_model.variables if id(variable) not in range_ids]
    with ranges.calibrating():
        qat_model(samples, training=True)
    for variable, value in snapshot:
        variable.assign(value)


__all__ = ["NonFiniteTraining", "QuantizeInput", "QuantizeOperation", "QuantizeRule", "QuantizeWrapper",
           "QuantizedModel", "initialize_ranges", "quantize", "register_rule"]
