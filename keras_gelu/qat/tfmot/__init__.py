"""The tfmot engine: quantization-aware training under tf-keras, which `keras_gelu.qat.quantize_model` picks there.

What is fake-quantized mirrors the int8 TFLite graph, so the converted model
is integer from end to end:

* `GELU`: what depends on the conversion, so `quantize_model` takes the
  converter's `mode` and `exact_as` (its --form). In native mode an exact or
  tanh GELU is one int8 GELU op, a lookup table of its 256 input values: only
  the output is fake-quantized. Otherwise (builtin mode, and the sigmoid GELU
  always) it is LOGISTIC/MUL/ADD ops: QAT computes those very ops
  (`keras_gelu.replacements`, the table the converter reads), with a
  moving-average range on each intermediate, the sigmoid output on TFLite's
  fixed LOGISTIC grid (k/256) and the output quantized.
* `LearnableGELU`, x * sigmoid(alpha x + beta): alpha and beta (8-bit
  asymmetric per tensor, what TFLite does with a MUL/ADD constant), alpha x,
  alpha x + beta, the gate (on the LOGISTIC grid) and the output.

tfmot builds on tf-keras (TF_USE_LEGACY_KERAS=1 before keras_gelu is
imported) and is an extra (`pip install keras-gelu[qat]`); it is imported
only when first needed (`support.require_tfmot`), and its QuantizeConfigs
live in `configs`, which imports it.
"""

import contextlib

from keras_gelu import activations
from keras_gelu.flavour import keras
from keras_gelu.layers import GELU
from keras_gelu.layers import GELU_ACTIVATIONS
from keras_gelu.layers import LearnableGELU
from keras_gelu.layers import layer_computing
from keras_gelu.qat.tfmot.support import require_tfmot

# Activations that quantize_model moves out of their layer into a layer of
# their own, because tfmot accepts only Keras's named activations there.
SPLIT_ACTIVATIONS = GELU_ACTIVATIONS


def _configs():
    from keras_gelu.qat.tfmot import configs

    return configs


def quantize_config_for(layer, mode="builtin", exact_as=None):
    """Our QuantizeConfig for a keras_gelu layer, or None for any other layer (exact class, as tfmot).

    mode and exact_as: those the model will be converted with (see GELUQuantizeConfig).
    """
    if type(layer) is GELU:
        return _configs().GELUQuantizeConfig(mode=mode, exact_as=exact_as)
    if type(layer) is LearnableGELU:
        return _configs().LearnableGELUQuantizeConfig()
    return None


def custom_objects():
    """Every class a saved QAT model of ours refers to, by the names it is saved under."""
    configs = _configs()
    return {
        "GELUQuantizeConfig": configs.GELUQuantizeConfig,
        "LearnableGELUQuantizeConfig": configs.LearnableGELUQuantizeConfig,
        "GELU": GELU,
        "LearnableGELU": LearnableGELU,
        "GELUActivation": activations.GELUActivation,
        "AllValuesQuantizerAcrossReplicas": configs.AllValuesQuantizerAcrossReplicas,
    }


@contextlib.contextmanager
def quantize_scope():
    """tfmot's quantize_scope with our layers and configs: use it to load QAT models."""
    with require_tfmot().quantize_scope(custom_objects()):
        yield


def _unique_name(base, taken):
    name, suffix = base, 1
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    taken.add(name)
    return name


def split_activations(model):
    """A copy of `model` where each layer with one of our GELUs as `activation=` is
    split into the same layer with a linear activation plus the GELU as a layer.

    Weights are copied, so the copy computes the same function. Other layers
    are rebuilt from their configs with their weights. Returns `model` itself
    when there is nothing to split.
    """
    splits = [layer for layer in model.layers if isinstance(getattr(layer, "activation", None), SPLIT_ACTIVATIONS)]
    if not splits:
        return model
    taken = {layer.name for layer in model.layers}
    activation_layers = {layer.name: layer_computing(layer.activation, _unique_name(f"{layer.name}_gelu", taken))
                         for layer in splits}
    config = model.get_config()
    for layer_config in config["layers"]:
        if layer_config["config"]["name"] in activation_layers:
            layer_config["config"]["activation"] = "linear"
    if isinstance(model, keras.Sequential):
        layer_configs = []
        for layer_config in config["layers"]:
            layer_configs.append(layer_config)
            activation_layer = activation_layers.get(layer_config["config"]["name"])
            if activation_layer is not None:
                layer_configs.append(keras.layers.serialize(activation_layer))
        config["layers"] = layer_configs
        rebuilt = keras.Sequential.from_config(config, custom_objects=custom_objects())
    else:
        _rewire_functional_config(config, activation_layers)
        rebuilt = keras.Model.from_config(config, custom_objects=custom_objects())
    _copy_weights(model, rebuilt, activation_layers)
    return rebuilt


def _rewire_functional_config(config, activation_layers):
    """Insert each activation layer after its linear layer, once per call (node) of it."""
    def renamed(reference):
        layer_name, node_index, tensor_index = reference[:3]
        if layer_name in activation_layers:
            return [activation_layers[layer_name].name, node_index, tensor_index, *reference[3:]]
        return reference

    new_layers = []
    for layer_config in config["layers"]:
        layer_config["inbound_nodes"] = [[renamed(reference) for reference in node]
                                         for node in layer_config["inbound_nodes"]]
        new_layers.append(layer_config)
        activation_layer = activation_layers.get(layer_config["name"])
        if activation_layer is not None:
            serialized = keras.layers.serialize(activation_layer)
            serialized["name"] = activation_layer.name
            serialized["inbound_nodes"] = [[[layer_config["name"], node_index, 0, {}]]
                                           for node_index in range(len(layer_config["inbound_nodes"]))]
            new_layers.append(serialized)
    config["layers"] = new_layers
    config["output_layers"] = [renamed(reference) for reference in config["output_layers"]]


def _copy_weights(source, target, activation_layers):
    for layer in source.layers:
        activation = getattr(layer, "activation", None)
        moved = activation.weights if isinstance(activation, keras.layers.Layer) else []
        moved_ids = {id(weight) for weight in moved}
        own = [weight for weight in layer.weights if id(weight) not in moved_ids]
        target.get_layer(layer.name).set_weights([weight.numpy() for weight in own])
        if moved:
            target.get_layer(activation_layers[layer.name].name).set_weights([weight.numpy() for weight in moved])


def _annotator(mode, exact_as, keep_float=(), kept=None):
    """tfmot's annotation of each layer: ours, the user's, tfmot's default, or none (float) for `keep_float`; with
    `kept` (a dict: keep_float="auto"), none for a layer tfmot's default scheme does not support either, each
    recorded there with the reason."""
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import \
        default_8bit_quantize_registry
    from tensorflow_model_optimization.python.core.quantization.keras.quantize_annotate import QuantizeAnnotate

    registry = default_8bit_quantize_registry.Default8BitQuantizeRegistry()

    def annotate(layer):
        if isinstance(layer, QuantizeAnnotate):
            return layer  # annotated by the user, with a config of their own
        if layer.name in keep_float:
            return layer  # tfmot leaves what is not annotated float
        config = quantize_config_for(layer, mode, exact_as)
        if config is not None:
            return require_tfmot().quantize_annotate_layer(layer, config)
        if isinstance(layer, keras.layers.InputLayer):
            return layer
        if kept is not None and not registry.supports(layer):
            kept[layer.name] = f"tfmot's default 8-bit scheme has no QuantizeConfig for {type(layer).__name__}"
            return layer
        return require_tfmot().quantize_annotate_layer(layer)

    return annotate


@contextlib.contextmanager
def _moving_averages_without_memory():
    """tfmot's moving-average ranges set to the current batch's range (EMA decay 0), for a while."""
    from tensorflow_model_optimization.python.core.quantization.keras import quant_ops

    moving_average = quant_ops.MovingAvgQuantize

    def without_memory(*args, **kwargs):
        kwargs["ema_decay"] = 0.0
        return moving_average(*args, **kwargs)

    quant_ops.MovingAvgQuantize = without_memory
    try:
        yield
    finally:
        quant_ops.MovingAvgQuantize = moving_average


def initialize_ranges(qat_model, samples):
    """Set every moving-average int8 range of a QAT model to its range over `samples`.

    tfmot starts each range at [-6, 6] and moves it with an exponential
    moving average of decay 0.999, so a few hundred training steps leave it
    mostly where it started, and QAT trains against needlessly coarse grids.
    This does what post-training calibration does instead: one forward pass
    in training mode over `samples` (a batch: an array, or a list of arrays
    for several inputs), with each range taken from that batch. Every other
    variable (batch-norm statistics, weights) is restored afterwards. Dropout
    is active in that pass, which can widen a range a little.

    Args:
        qat_model: A model from `quantize_model`.
        samples: Representative inputs, as one batch.
    """
    require_tfmot()
    snapshot = [(variable, variable.numpy()) for variable in qat_model.variables]
    with _moving_averages_without_memory():
        qat_model(samples, training=True)
    ranges = {id(variable) for layer in qat_model.layers for variable in layer.non_trainable_variables
              if variable.name.split("/")[-1].split(":")[0].endswith(("_min", "_max"))}
    for variable, value in snapshot:
        if id(variable) not in ranges:
            variable.assign(value)


def quantize(model, mode, exact_as, calibration_data, keep_float):
    """The tfmot engine of `keras_gelu.qat.quantize_model`, which checks the arguments first.

    It splits `Dense/Conv(..., activation=<keras_gelu GELU or activation>)`
    into the layer plus a GELU layer (tfmot accepts only Keras's named
    activations there), annotates our layers with their QuantizeConfigs and
    leaves every other layer to tfmot's default 8-bit scheme. Layers you
    annotated yourself (`tfmot.quantization.keras.quantize_annotate_layer`
    with a config of yours, for a layer tfmot does not know) keep that
    config; call it under a `quantize_scope` that knows your classes.
    """
    tfmot = require_tfmot()
    split = split_activations(model)
    kept = {} if keep_float == "auto" else None
    annotator = _annotator(mode, exact_as, () if kept is not None else keep_float, kept)
    annotated = keras.models.clone_model(split, clone_function=annotator)
    with quantize_scope():
        qat_model = tfmot.quantize_apply(annotated)
    qat_model.kept_float = kept
    _configs().agree_across_replicas(qat_model)
    if calibration_data is not None:
        initialize_ranges(qat_model, calibration_data)
    return qat_model
