"""Activations a layer builds in its own code, replaced so that the replacement saves and loads.

keras-hub's ViT builds its MLP's `Dense(..., activation="gelu")` inside
`ViTEncoderBlock`; no constructor argument reaches it. `swap_activations`
replaces such an activation on the rebuilt layer's sublayer, and wraps the
layer in `InnerActivations`, which holds the replacements by attribute path
(`"mlp.dense_1.activation"`, `"blocks.0.act"`) and puts them back each time
the layer is built: after a `.keras` load too, where the layer's own code
makes its sublayers afresh.
"""

from keras_gelu import layer_configs
from keras_gelu.flavour import keras
from keras_gelu.flavour import register_serializable

# Where each Keras keeps a second list of every sublayer it tracks (not a sublayer of its own).
_TRACKING_LISTS = {"_layers", "_self_tracked_trackables"}


def _named_slots(layer):
    """(attribute path, container, key, sublayer) for each layer `layer` holds as an attribute ("mlp"), or in
    a list attribute ("blocks.0")."""
    slots = []
    for name, value in vars(layer).items():
        if name in _TRACKING_LISTS:
            continue
        if isinstance(value, keras.layers.Layer):
            slots.append((name, layer, name, value))
        elif isinstance(value, list) and value and all(isinstance(item, keras.layers.Layer) for item in value):
            slots.extend((f"{name}.{index}", value, index, item) for index, item in enumerate(value))
    return slots


def sublayer_slots(layer):
    """(container, key, sublayer) for each layer `layer` holds as an attribute, or in a list attribute."""
    return [slot[1:] for slot in _named_slots(layer)]


def sublayers_by_path(layer):
    """{"mlp.dense_1": sublayer} for every sublayer under `layer` at any depth (each once: at its first path),
    nested models excluded: they are rebuilt as models."""
    found, seen = {}, {id(layer)}

    def walk(current, prefix):
        for path, _, _, sublayer in _named_slots(current):
            if id(sublayer) in seen or isinstance(sublayer, keras.Model):
                continue
            seen.add(id(sublayer))
            found[prefix + path] = sublayer
            walk(sublayer, f"{prefix}{path}.")

    walk(layer, "")
    return found


def _slot_at(layer, path):
    """(the layer whose state it is, container, key) of the slot at attribute path `path` under `layer`."""
    *steps, last = path.split(".")
    owner = container = layer
    for step in steps:
        container = container[int(step)] if isinstance(container, list) else getattr(container, step)
        if isinstance(container, keras.layers.Layer):
            owner = container
    return owner, container, (int(last) if isinstance(container, list) else last)


def set_slot(owner, container, key, value):
    """Put `value` in `container` (`owner` itself, or a list it holds) at `key`, as state of `owner`: Keras 3
    locks a built layer's state, which a new sublayer is."""
    tracker = getattr(owner, "_tracker", None)
    locked = tracker is not None and owner.built
    if locked:
        tracker.unlock()
    try:
        if isinstance(container, list):
            container[key] = value
        else:
            setattr(container, key, value)
    finally:
        if locked:
            owner._lock_state()


def replace_at(layer, path, value):
    """Set what `layer` holds at attribute path `path` to `value`, as state of the layer holding it."""
    set_slot(*_slot_at(layer, path), value)


def value_at(layer, path):
    _, container, key = _slot_at(layer, path)
    return container[key] if isinstance(container, list) else getattr(container, key)


@register_serializable
class InnerActivations(keras.layers.Wrapper):
    """`layer`, with the activations at the attribute paths of `activations` replaced ({path: activation}).

    Called exactly as `layer` is. An activation is a name, a function or a
    layer, as a Dense's `activation` is; a layer is used at one path only.
    """

    def __init__(self, layer, activations, **kwargs):
        kwargs.setdefault("name", layer.name)
        super().__init__(layer, **kwargs)
        if not activations:
            raise ValueError(f"InnerActivations needs at least one replacement. Received: activations={activations}")
        self.activations = {path: keras.activations.get(activation) if isinstance(activation, str) else activation
                            for path, activation in activations.items()}
        self.replaced = False
        if self._reachable():
            self._replace()

    def _reachable(self):
        try:
            for path in self.activations:
                _slot_at(self.layer, path)
        except (AttributeError, IndexError):
            return False
        return True

    def _replace(self):
        for path, activation in self.activations.items():
            replace_at(self.layer, path, activation)
        self.replaced = True

    def build(self, input_shape=None):
        if not self._reachable() and input_shape is not None and not self.layer.built:
            # the layer makes its sublayers in build(), as keras-hub's do: built as Keras would, on the shape
            self.layer.build(input_shape)
            self.layer.built = True
        if self._reachable():
            self._replace()  # again: the layer may have made its sublayers afresh
        self.built = True

    def call(self, *args, **kwargs):
        if not self.replaced:
            # Built without a shape (Keras gives none to a call(*args)): the layer makes its sublayers at its
            # first call, then the replacements, then the call that counts
            self.layer(*args, **kwargs)
            self._replace()
        return self.layer(*args, **kwargs)

    def get_config(self):
        # The base Layer's config: Wrapper's would call the layer's get_config, which may fail (`layer_configs`).
        return {**keras.layers.Layer.get_config(self), "layer": layer_configs.serialized(self.layer),
                "activations": {path: keras.saving.serialize_keras_object(activation)
                                for path, activation in self.activations.items()}}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layer"] = keras.layers.deserialize(config["layer"])
        config["activations"] = {path: keras.saving.deserialize_keras_object(activation)
                                 for path, activation in config["activations"].items()}
        return cls(**config)
