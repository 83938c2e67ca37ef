"""Swap the activations of a trained Sequential or functional model, keeping its weights.

    relu_free = keras_gelu.swap_activations(model, {"relu": keras_gelu.gelu_exact})
    deployable, swaps = keras_gelu.swap_activations(model, {"gelu": keras_gelu.GELU("sigmoid")},
                                                    return_swaps=True)

Every layer is rebuilt from its config, as `keras.models.clone_model` does,
with the matched activations replaced, and its weights are copied over, so
the new model is independent of the old one and saves and loads like any
model built with the new activation from the start. The old model is not
modified, even when the swap fails.

An activation is found where Keras keeps one:

* fused into a layer: the `activation` (and `recurrent_activation`) argument
  of `Dense`, `Conv*`, `EinsumDense`, the recurrent layers, and any layer
  that follows Keras's convention of taking it as a constructor argument
  (keras-hub's `TransformerEncoder`, for instance). Keras's own
  `MultiHeadAttention` has no activation to swap: its projections are linear;
* a stand-alone activation layer: `Activation`, `ReLU`, `LeakyReLU`, `PReLU`,
  `ELU`, `Softmax`, our `GELU` and `LearnableGELU`, and instances of any
  layer class used as a mapping key;
* inside nested Sequential and functional models, at any depth;
* inside a layer's own code: a sublayer it makes itself (keras-hub's ViT
  makes its MLP's `Dense(..., activation="gelu")` in `build`), held as an
  attribute or in a list of them. No argument reaches it, so the rebuilt
  layer is wrapped in `InnerActivations`, which holds the new activations
  by attribute path and puts them back whenever the layer is built: the
  swap survives a `.keras` save.

What is still out of reach (an activation called as a function in `call`,
a sublayer in a dict) is named in a warning.
"""

import functools
import json
import logging
import sys
import typing
import warnings

import numpy as np

from keras_gelu import activations
from keras_gelu import layer_configs
from keras_gelu.flavour import KERAS_FLAVOUR
from keras_gelu.flavour import flatten
from keras_gelu.flavour import keras
from keras_gelu.flavour import outside_any_trace
from keras_gelu.inner_activations import InnerActivations
from keras_gelu.inner_activations import sublayers_by_path
from keras_gelu.inner_activations import value_at
from keras_gelu.layers import GELU
from keras_gelu.layers import LearnableGELU

logger = logging.getLogger(__name__)


class SwapError(ValueError):
    """A swap refused for a reason found here, with a message that says why (not Keras's own errors)."""

# The constructor arguments that hold a fused activation, by Keras's convention.
ACTIVATION_CONFIG_KEYS = ("activation", "recurrent_activation")

# Our one-argument activations, by the names `swap_activations` accepts for them.
NAMED_ACTIVATIONS = {
    "gelu_exact": activations.gelu_exact,
    "gelu_tanh": activations.gelu_tanh,
    "gelu_sigmoid": activations.gelu_sigmoid,
}


class Swap(typing.NamedTuple):
    """One activation replaced: in `layer` (a path, "outer/inner/dense"), at `attribute`.

    `attribute` is the constructor argument ("activation",
    "recurrent_activation") of a fused activation, or None for a stand-alone
    activation layer, which the new model has in its place, under the same name.
    `old` and `new` describe the activations ("relu", "gelu_tanh", "LearnableGELU").
    """

    layer: str
    attribute: typing.Optional[str]
    old: str
    new: str

    def __str__(self):
        where = self.layer if self.attribute is None else f"{self.layer}.{self.attribute}"
        return f"{where}: {self.old} -> {self.new}"


class when:  # noqa: N801 - reads as a keyword in a mapping: {when(is_encoder_relu): "gelu"}
    """A mapping key that matches where `predicate(layer, activation)` is true.

    `layer` is the layer holding the activation (the `Dense` of a fused one,
    the activation layer itself otherwise); `activation` is the function or
    layer that computes it (`layer.activation` for an `Activation` layer).
    The predicate is asked about every activation in the model, fused or
    stand-alone, and about nothing else.

    >>> import keras_gelu
    >>> in_encoder = keras_gelu.when(lambda layer, activation: layer.name.startswith("encoder"))
    """

    def __init__(self, predicate, description=None):
        if not callable(predicate):
            raise ValueError(f"Argument `predicate` must be callable. Received: predicate={predicate!r}")
        self.predicate = predicate
        self.description = description or getattr(predicate, "__name__", repr(predicate))

    def __repr__(self):
        return f"when({self.description})"


def _stand_alone_activation_classes():
    names = ("Activation", "ReLU", "LeakyReLU", "PReLU", "ELU", "Softmax", "ThresholdedReLU")
    return tuple(getattr(keras.layers, name) for name in names if hasattr(keras.layers, name)) + (GELU, LearnableGELU)


# Functions of other libraries, by (module, name), that are a GELU of ours: no import needed to know them.
_LIBRARY_SPELLINGS = {
    ("keras_hub.src.utils.keras_utils", "gelu_approximate"): "gelu_tanh",  # keras-hub's BERT and friends
}


@functools.lru_cache(maxsize=None)
def _same_function_names():
    """{id(function): name} for the functions Keras and TensorFlow spell several ways (made once: the
    functions are module-level and live as long as the process, so their ids stay theirs)."""
    # Keras's `gelu` activation and tf.nn.gelu default to exact GELU...
    spellings = [(keras.activations.relu, "relu"), (keras.activations.gelu, "gelu_exact")]
    tf = sys.modules.get("tensorflow")  # None where it is not loaded, or kept out (sys.modules["tensorflow"] = None)
    if tf is not None:  # a model can hold TensorFlow's functions only where TensorFlow is loaded
        spellings += [(tf.nn.relu, "relu"), (tf.nn.relu6, "relu6"), (tf.nn.gelu, "gelu_exact")]
    if hasattr(keras.activations, "relu6"):
        spellings.append((keras.activations.relu6, "relu6"))
    if hasattr(keras, "ops"):  # Keras 3: ...while keras.ops.gelu defaults to the tanh form
        spellings += [(keras.ops.relu, "relu"), (keras.ops.relu6, "relu6"), (keras.ops.gelu, "gelu_tanh")]
    return {id(function): name for function, name in spellings}


def _plain_config(layer):
    """The layer's config without what does not change what it computes, as a hashable string."""
    config = {key: value for key, value in layer.get_config().items() if key not in ("name", "trainable", "dtype")}
    return json.dumps(config, sort_keys=True, default=lambda value: value.tolist() if hasattr(value, "tolist")
                      else repr(value))


def _relu_layer_function(layer):
    config = layer.get_config()
    if float(config["negative_slope"]) != 0 or float(config["threshold"]) != 0:
        return None
    return {None: "relu", 6.0: "relu6"}.get(None if config["max_value"] is None else float(config["max_value"]))


def computed_function(activation):
    """What an activation computes, equal for every spelling of one function.

    "relu" for `keras.activations.relu`, `tf.nn.relu`, `keras.ops.relu`,
    `Activation("relu")` and a default `ReLU()` layer; "gelu_exact" for
    Keras's "gelu" (exact by default), `tf.nn.gelu`, our `gelu_exact` and
    `GELU()`; "gelu_tanh" for `keras.ops.gelu` (tanh by default), keras-hub's
    `gelu_approximate` and ours.
    Other layers are told apart by class and config (not name or dtype),
    other functions by identity.
    """
    if isinstance(activation, str):  # a config's name for one (keras-hub's layers keep "gelu_approximate")
        try:
            return computed_function(keras.activations.get(activation))
        except (ValueError, TypeError):
            return {qualname: name for (_, qualname), name in _LIBRARY_SPELLINGS.items()}.get(activation, activation)
    if isinstance(activation, (activations.GELUActivation, GELU)):
        return f"gelu_{activation.approximate}"
    if isinstance(activation, keras.layers.Activation):
        return computed_function(activation.activation)
    if isinstance(activation, keras.layers.ReLU) and _relu_layer_function(activation):
        return _relu_layer_function(activation)
    if isinstance(activation, keras.layers.Layer):
        return (type(activation), _plain_config(activation))
    library_name = _LIBRARY_SPELLINGS.get((getattr(activation, "__module__", None),
                                           getattr(activation, "__qualname__", None)))
    return library_name or _same_function_names().get(id(activation)) or _gelu_by_values(activation) or activation


# Where no name says what a function computes (a library's own `quick_gelu` or `gelu_new`, a lambda), its values
# do: on this grid, within float32 rounding of one GELU form. The forms differ by far more (tanh from exact by
# up to 4.7e-4, sigmoid by 2e-2), so one matches at most.
_PROBE = np.linspace(-6.0, 6.0, 241, dtype=np.float32)
_PROBE_TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def _as_numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value) if hasattr(keras, "ops") else value, np.float64)


@functools.lru_cache(maxsize=256)
def _gelu_by_values(function):
    """"gelu_<form>" for a plain function whose values are a GELU form's; None for any other, or one that
    cannot run on a vector of float32 values."""
    if not callable(function) or isinstance(function, type):
        return None
    try:
        with outside_any_trace():  # a value read, not a graph tensor (and no None cached for a GELU)
            values = _as_numpy(function(_PROBE))
    except Exception:  # noqa: BLE001 - a function that will not run on the probe is no GELU found here
        return None
    if values.shape != _PROBE.shape:
        return None
    for form, reference in _gelu_forms_on_the_probe().items():
        if np.allclose(values, reference, **_PROBE_TOLERANCE):
            return f"gelu_{form}"
    return None


@functools.lru_cache(maxsize=None)
def _gelu_forms_on_the_probe():
    """{form: our GELU of that form on _PROBE}, computed once rather than for every function probed."""
    with outside_any_trace():
        return {form: _as_numpy(function(_PROBE)) for form, function in (
            ("exact", activations.gelu_exact), ("tanh", activations.gelu_tanh),
            ("sigmoid", activations.gelu_sigmoid))}


def describe(activation):
    """A short name for an activation, for reports: "relu", "gelu_tanh", "LearnableGELU"."""
    function = computed_function(activation)
    if isinstance(function, str):
        return function
    if isinstance(activation, keras.layers.Layer):
        return type(activation).__name__
    return getattr(activation, "__name__", repr(activation))


def _activation_named(name, argument):
    if name in NAMED_ACTIVATIONS:
        return NAMED_ACTIVATIONS[name]
    try:
        return keras.activations.get(name)
    except (ValueError, TypeError):
        raise ValueError(
            f"{argument} {name!r} names no activation Keras knows (nor {', '.join(NAMED_ACTIVATIONS)}). "
            f"Received: {argument}={name!r}") from None


class _Rule:
    """One mapping entry: what it matches, and how to make its replacement for a site."""

    def __init__(self, key, value):
        self.key, self.value = key, value
        self.matches = self._matcher(key)
        self.make, self.new_function, self.new_description = self._maker(value)
        self.matched = 0

    @staticmethod
    def _matcher(key):
        if isinstance(key, when):
            return lambda layer, activation, stand_alone: bool(key.predicate(layer, activation))
        if isinstance(key, type):
            if not issubclass(key, keras.layers.Layer):
                raise ValueError("A mapping key that is a class must be a Keras layer class (an activation layer "
                                 f"such as keras.layers.ReLU). Received: mapping key={key!r}")
            return lambda layer, activation, stand_alone: isinstance(activation, key) or (
                stand_alone and isinstance(layer, key))
        if isinstance(key, str):
            key = _activation_named(key, "mapping key")
        if not callable(key):
            raise ValueError("A mapping key must be an activation (a name, function or layer), an activation "
                             f"layer class or keras_gelu.when(predicate). Received: mapping key={key!r}")
        function = computed_function(key)
        return lambda layer, activation, stand_alone: computed_function(activation) == function

    @staticmethod
    def _maker(value):
        """(make(dtype, name) -> a new activation, what it computes, its description)."""
        if isinstance(value, str):
            value = _activation_named(value, "mapping value")
        if isinstance(value, type) and issubclass(value, keras.layers.Layer):
            layer_class, config = value, {}
        elif isinstance(value, keras.layers.Layer):
            layer_class, config = type(value), value.get_config()
        elif callable(value) and not isinstance(value, type):
            return (lambda dtype, name: value), computed_function(value), describe(value)
        else:
            raise ValueError("A mapping value must be an activation: a name, a function, a layer or a layer "
                             f"class. Received: mapping value={value!r}")

        def make(dtype, name):
            # The host's dtype policy, so that a mixed-precision layer keeps computing in float16.
            settings = {**config, "dtype": dtype, "name": name}
            return layer_class.from_config({key: item for key, item in settings.items() if item is not None})

        try:
            example = make(None, None)
        except Exception as error:
            raise ValueError(f"The mapping value {value!r} cannot be built from its config ({error}). "
                             f"Received: mapping value={value!r}") from None
        return make, computed_function(example), describe(example)


def is_rebuildable(model):
    """Whether clone_model can rebuild `model` layer by layer: Sequential or functional (a functional subclass
    too), not subclassed, in either flavour."""
    return isinstance(model, keras.Sequential) or any(cls.__name__ == "Functional" for cls in type(model).__mro__)


def _check_model(model, path=""):
    if not isinstance(model, keras.Model):
        other = "tf_keras" if KERAS_FLAVOUR == "keras3" else "keras"
        hint = ""
        if type(model).__module__.split(".")[0] == other:
            hint = (f" It is a model of the other Keras: keras_gelu uses {KERAS_FLAVOUR}, chosen by "
                    "TF_USE_LEGACY_KERAS as tf.keras chooses; set it the same way for both.")
        raise SwapError(f"swap_activations takes a Keras model.{hint} Received: model={type(model).__name__}")
    if not is_rebuildable(model):
        raise SwapError(
            f"swap_activations rebuilds Sequential and functional models; {path or 'the model'} is subclassed, "
            "and its call() is Python code that cannot be rebuilt with other layers. Give its constructor "
            "the new activation instead, build it and copy the weights with "
            f"new_model.set_weights(model.get_weights()). Received: model={type(model).__name__} (subclassed)")
    if not model.built:
        raise SwapError("swap_activations copies weights, so the model must be built: call it on data or build "
                        f"it first. Received: model={model.name} (not built)")


def _activation_sites(layer, stand_alone_classes):
    """(attribute, activation, stand_alone) for each activation the layer holds."""
    if isinstance(layer, stand_alone_classes):
        activation = layer.activation if isinstance(layer, keras.layers.Activation) else layer
        return [(None, activation, True)]
    config = layer_configs.config(layer)
    return [(key, getattr(layer, key), False) for key in ACTIVATION_CONFIG_KEYS
            if key in config and callable(getattr(layer, key, None))]


def _activation_layers(layer):
    """{attribute: layer} for the fused activations that are layers, and so may have weights."""
    return {key: getattr(layer, key) for key in ACTIVATION_CONFIG_KEYS
            if isinstance(getattr(layer, key, None), keras.layers.Layer) and getattr(layer, key) is not layer}


def _build_activation_layers(layer):
    """Keras 3 builds a Dense's activation layer only when the Dense first runs on data: run it once on zeros.

    A layer that cannot run on zeros of its input shape (unknown sizes taken as 1) keeps them unbuilt, to be
    built on its first call.
    """
    if all(activation.built for activation in _activation_layers(layer).values()) or not layer._inbound_nodes:
        return
    first_input = flatten(layer._inbound_nodes[0].input_tensors)[0]
    dtype = getattr(first_input.dtype, "as_numpy_dtype", first_input.dtype)  # tf-keras's is a tf.DType
    zeros = np.zeros([1 if size is None else size for size in first_input.shape], dtype)
    try:
        layer(zeros)
    except Exception:  # noqa: BLE001 - e.g. a convolution bigger than the size-1 stand-ins
        logger.debug("could not build the activation of %s on zeros", layer.name)


class _Swapper:
    def __init__(self, rules):
        self.rules = rules
        self.stand_alone_classes = _stand_alone_activation_classes() + tuple(
            rule.key for rule in rules if isinstance(rule.key, type))
        self.swaps = []
        self.created = set()  # ids of the activations we made, which must not be mistaken for leftovers

    def rule_for(self, layer, activation, stand_alone):
        for rule in self.rules:
            if rule.matches(layer, activation, stand_alone):
                return rule
        return None

    def would_change(self, layer, activation, stand_alone):
        rule = self.rule_for(layer, activation, stand_alone)
        return rule is not None and rule.new_function != computed_function(activation)

    def model(self, model, path=""):
        _check_model(model, path)
        rebuilt = []

        def clone_function(layer):
            if isinstance(layer, keras.Model):
                return self.model(layer, f"{path}{layer.name}/")
            if not isinstance(layer, keras.layers.Layer):  # a Keras 3 operation on tensors (x[:, 0]): no weights
                return type(layer).from_config(layer.get_config())
            new_layer, replaced, inner = self.layer(layer, path)
            rebuilt.append((layer, new_layer, replaced, inner))
            return new_layer

        new_model = keras.models.clone_model(model, clone_function=clone_function)
        for old_layer, new_layer, replaced, inner in rebuilt:
            _check_output_shapes(old_layer, new_layer, path)
            if None not in replaced:  # a replaced stand-alone layer starts afresh
                _copy_weights(old_layer, new_layer, replaced, inner)
        return new_model

    def _replacement(self, layer, activation, stand_alone, where, attribute):
        """The new activation for one site, the swap recorded; None where no rule changes it.

        A stand-alone replacement is a layer, named as the one it replaces."""
        rule = self.rule_for(layer, activation, stand_alone)
        if rule is None or rule.new_function == computed_function(activation):
            return None  # no match, or already what was asked for
        dtype = layer_configs.config(layer).get("dtype")  # the host's policy: a float16 layer stays float16
        new = rule.make(dtype, layer.name if stand_alone else None)
        if stand_alone and not isinstance(new, keras.layers.Layer):
            new = keras.layers.Activation(new, name=layer.name, dtype=dtype)
        rule.matched += 1
        self.created.add(id(new))
        swap = Swap(where, attribute, describe(activation), rule.new_description)
        self.swaps.append(swap)
        logger.info("swapped %s", swap)
        return new

    def layer(self, layer, path):
        """(the new layer, the attributes whose activations it replaced: None for the whole layer, and the
        attribute paths of those its own code built)."""
        config = layer_configs.config(layer)  # as its constructor takes it (keras-hub's ViT layers give more)
        replaced = []
        for attribute, activation, stand_alone in _activation_sites(layer, self.stand_alone_classes):
            new = self._replacement(layer, activation, stand_alone, f"{path}{layer.name}", attribute)
            if new is None:
                continue
            if stand_alone:
                return new, [None], []
            config[attribute] = new
            replaced.append(attribute)
        new_layer = type(layer).from_config(config)
        if config != _plain_get_config(layer):
            # Save the config the constructor takes: keras-hub's ViT layers give keys theirs refuses, which
            # keras-hub's backbone never reads back but a .keras file of this model would.
            new_layer.get_config = functools.partial(layer_configs.config, new_layer)
        inner = self._inner_replacements(layer, new_layer, f"{path}{layer.name}.")
        return (InnerActivations(new_layer, inner) if inner else new_layer), replaced, list(inner)

    def _inner_replacements(self, layer, new_layer, where):
        """{attribute path: new activation} for the activations `new_layer`'s own code builds (keras-hub's ViT
        MLP), found once it is built as `layer` was; {} for a layer without sublayers.

        The rules are asked about `layer`'s activations, and a site that `new_layer`'s constructor already
        changed (keras-hub's TransformerEncoder passes its `activation` on) is left as it is."""
        sublayers = sublayers_by_path(layer)
        if not any(self.would_change(sublayer, activation, stand_alone) for sublayer in sublayers.values()
                   for _, activation, stand_alone in _activation_sites(sublayer, self.stand_alone_classes)):
            return {}
        new_sublayers = sublayers_by_path(new_layer)
        if sublayers.keys() - new_sublayers.keys():  # made in build(), as keras-hub's layers make theirs
            build_config = layer.get_build_config() if hasattr(layer, "get_build_config") else None
            if not layer.built or not build_config:
                return {}
            try:
                new_layer.build_from_config(build_config)
            except Exception:  # noqa: BLE001 - a layer that cannot build from its own build config: out of reach
                logger.debug("could not build %s from its build config", layer.name)
                return {}
            new_sublayers = sublayers_by_path(new_layer)
        inner = {}
        for sub_path, sublayer in sublayers.items():
            if sub_path not in new_sublayers:
                continue
            new_sites = _activation_sites(new_sublayers[sub_path], self.stand_alone_classes)
            for (attribute, activation, stand_alone), (_, built, _) in zip(
                    _activation_sites(sublayer, self.stand_alone_classes), new_sites):
                if computed_function(built) != computed_function(activation):
                    continue
                new = self._replacement(sublayer, activation, stand_alone, f"{where}{sub_path}", attribute)
                if new is not None:
                    inner[sub_path if stand_alone else f"{sub_path}.{attribute}"] = new
        return inner

    def leftovers(self, model, path=""):
        """Paths of activations in `model` that match a rule but were out of reach."""
        found = []
        for layer in model.layers:
            if isinstance(layer, keras.Model):
                found += self.leftovers(layer, f"{path}{layer.name}/")
                continue
            for sublayer in layer._flatten_layers(include_self=True, recursive=True):
                if id(sublayer) in self.created:
                    continue
                for attribute, activation, stand_alone in _activation_sites(sublayer, self.stand_alone_classes):
                    if id(activation) not in self.created and self.would_change(sublayer, activation, stand_alone):
                        inner = "" if sublayer is layer else f" (inside {layer.name})"
                        found.append(f"{path}{sublayer.name}{'' if attribute is None else '.' + attribute}{inner}")
        return found


def _plain_get_config(layer):
    try:
        return layer.get_config()
    except (AttributeError, NotImplementedError):
        return None


def _output_shapes(layer):
    return sorted({tuple(tensor.shape) for node in layer._inbound_nodes
                   for tensor in flatten(node.output_tensors) if hasattr(tensor, "shape")}, key=repr)


def _check_output_shapes(old_layer, new_layer, path):
    old, new = _output_shapes(old_layer), _output_shapes(new_layer)
    if not set(new) <= set(old):
        raise SwapError(f"The replacement changes the output shape of layer {path}{old_layer.name} from "
                         f"{old} to {new}; an activation must keep its input's shape. "
                         f"Received: layer={path}{old_layer.name}")


def _copy_weights(old_layer, new_layer, replaced, inner):
    """Copy the layer's own weights in order, then those of the activation layers it kept. The activations
    replaced at the `inner` attribute paths (new_layer is then their InnerActivations) start afresh."""
    old_activations, new_activations = _activation_layers(old_layer), _activation_layers(new_layer)
    _build_activation_layers(new_layer)
    old_inner = [value_at(old_layer, path) for path in inner]
    new_inner = [value_at(new_layer.layer, path) for path in inner]
    pairs = [(_own_weights(old_layer, [*old_activations.values(), *old_inner]),
              _own_weights(new_layer, [*new_activations.values(), *new_inner]))]
    pairs += [(activation.weights, new_activations[attribute].weights)
              for attribute, activation in old_activations.items() if attribute not in replaced]
    for old_weights, new_weights in pairs:
        old_shapes = [tuple(weight.shape) for weight in old_weights]
        new_shapes = [tuple(weight.shape) for weight in new_weights]
        if old_shapes != new_shapes:
            raise SwapError(f"The rebuilt layer {new_layer.name} has weights of shapes {new_shapes}, not the "
                            f"{old_shapes} of the original, so they cannot be copied. Received: layer={old_layer.name}")
        for old_weight, new_weight in zip(old_weights, new_weights):
            new_weight.assign(old_weight.numpy())


def _own_weights(layer, activations):
    """`layer`'s weights but those of `activations` (the layers among them)."""
    theirs = {id(weight) for activation in activations if isinstance(activation, keras.layers.Layer)
              for weight in activation.weights}
    return [weight for weight in layer.weights if id(weight) not in theirs]


def _rules(mapping):
    items = mapping.items() if hasattr(mapping, "items") else mapping
    try:
        items = list(items)
    except TypeError:
        raise ValueError("Argument `mapping` must map what to replace to its replacement (a dict). "
                         f"Received: mapping={mapping!r}") from None
    if not items or not all(isinstance(item, tuple) and len(item) == 2 for item in items):
        raise ValueError("Argument `mapping` must map what to replace to its replacement, with at least one "
                         f"entry. Received: mapping={mapping!r}")
    return [_Rule(key, value) for key, value in items]


def swap_activations(model, mapping, *, return_swaps=False):
    """A copy of `model` with some activations replaced, and the same weights.

    Args:
        model: A built Sequential or functional Keras model (of the Keras
            keras_gelu uses). Nested Sequential and functional models are
            reached too. Subclassed models are refused: their `call` is
            code, which cannot be rebuilt.
        mapping: What to replace, and by what, tried in order, the first
            match winning. Keys: an activation by name ("relu", "gelu",
            "gelu_tanh"), function (`keras.activations.relu`) or layer
            (`keras.layers.ReLU()`, `keras_gelu.GELU("tanh")`), which match
            every spelling of the same function (see `computed_function`:
            "gelu" matches Keras's exact "gelu", `tf.nn.gelu` and
            `keras_gelu.GELU()`); an activation layer class (`keras.layers.ReLU`,
            `keras_gelu.LearnableGELU`); or `keras_gelu.when(predicate)`.
            Values: an activation by name, a function
            (`keras_gelu.gelu_sigmoid`), a layer (used as a template: each
            site gets a fresh copy, with the dtype policy of the layer it
            replaces or sits in) or a layer class (built with its defaults).
        return_swaps: Also return the list of `Swap`s made.

    Returns:
        The new model, or `(model, swaps)` with `return_swaps=True`. Each
        swap is also logged (logger "keras_gelu.swapping", level INFO). When
        a key matched nothing, or an activation matching a key was out of
        reach (built in a layer's own code), a `UserWarning` says so.

    Raises:
        ValueError: for a model that is not a built Sequential or functional
            Keras model, a key or value that is not an activation, or a
            replacement that changes a layer's output shape. `model` is left
            as it was.

    >>> import keras_gelu
    >>> from keras_gelu.flavour import keras
    >>> relu_model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="hidden")])
    >>> gelu_model, swaps = keras_gelu.swap_activations(relu_model, {"relu": "gelu_tanh"}, return_swaps=True)
    >>> [str(swap) for swap in swaps]
    ['hidden.activation: relu -> gelu_tanh']
    """
    _check_model(model)
    swapper = _Swapper(_rules(mapping))
    try:
        new_model = swapper.model(model)
    except SwapError:
        raise
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(f"The model could not be rebuilt with these replacements: {type(error).__name__}: "
                         f"{first_line}. Received: mapping={mapping!r}") from error
    unmatched = [rule.key for rule in swapper.rules if not rule.matched]
    if not swapper.swaps:
        warnings.warn(f"swap_activations: no activation in model {model.name!r} matched {list(mapping)!r} (or each "
                      "already was its replacement); the copy computes what the model does.", stacklevel=2)
    elif unmatched:
        warnings.warn(f"swap_activations: these keys swapped nothing in model {model.name!r}: {unmatched!r}",
                      stacklevel=2)
    leftovers = swapper.leftovers(new_model)
    if leftovers:
        warnings.warn("swap_activations: these activations match the mapping but are built by their layer's own "
                      f"code, which has no argument for them, and were left as they were: {leftovers}", stacklevel=2)
    return (new_model, swapper.swaps) if return_swaps else new_model


__all__ = ["ACTIVATION_CONFIG_KEYS", "NAMED_ACTIVATIONS", "Swap", "computed_function", "describe",
           "swap_activations", "when"]
