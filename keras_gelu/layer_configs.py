"""Copies of layers made from their configs, and the configs saved files hold (QAT models, swapped layers).

Some layers' `get_config` gives keys their constructor does not take
(keras-hub's `ViTPatchingAndEmbedding` and `DeiTEmbeddings` add the derived
`num_patches` and `num_positions`), leaves out some it does (keras-hub's
MiT encoder block: `sr_ratio`), gives a weight for one (keras-hub's D-FINE
decoder: `upsampling_factor`), or fails (keras-hub's `DeiTEncoder`
reads a `key_dim` it never sets; its ViT `MLP` has none, which Keras's
default refuses). keras-hub never rebuilds such a layer from its own config
(a backbone is rebuilt from the backbone's arguments), but the QAT model and
`swap_activations` copy layers one by one, and save them so: with the config
without those keys, and with the arguments it left out or gave as weights
as Keras recorded them at construction; where `get_config` fails, with the
constructor's arguments as the layer holds them, under the same names.
"""

import inspect

from keras_gelu import flavour
from keras_gelu.flavour import keras

# What keras.layers.Layer's constructor takes besides its named parameters.
_LAYER_KEYWORDS = {"input_dim", "input_shape", "batch_input_shape", "batch_size", "weights"}


def _constructor_arguments(layer_class):
    """The keyword arguments the constructor of `layer_class` takes: its own, and its bases' as far as each hands
    its other keywords on (keras-hub's Flux `MLPEmbedder(hidden_dim)` takes no `name`)."""
    names = set()
    for cls in inspect.getmro(layer_class):
        if "__init__" in vars(cls) and cls is not object:
            parameters = inspect.signature(cls.__init__).parameters.values()
            names |= {parameter.name for parameter in parameters
                      if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)}
            if not any(parameter.kind == parameter.VAR_KEYWORD for parameter in parameters):
                return names
    return names | _LAYER_KEYWORDS


def _is_graph(layer):
    """Whether `layer` is a Sequential or functional model (a functional subclass too), whose config is its graph;
    a subclassed model's is its constructor's arguments, as a layer's."""
    return isinstance(layer, keras.Sequential) or any(cls.__name__ == "Functional" for cls in type(layer).__mro__)


def _reads_its_own_config(layer_class):
    """Whether the class overrides Keras's from_config, Layer's or a subclassed Model's (tf-keras's
    MultiHeadAttention pops the shapes it saved)."""
    keras_class = keras.Model if issubclass(layer_class, keras.Model) else keras.layers.Layer
    return getattr(layer_class.from_config, "__func__", None) is not getattr(keras_class.from_config, "__func__",
                                                                             None)


def _base_config(layer):
    """What keras.layers.Layer's constructor takes, as `layer` holds it."""
    try:
        return keras.layers.Layer.get_config(layer)
    except NotImplementedError:  # Keras 3's, for a constructor taking arguments it did not record
        return {"name": layer.name, "trainable": layer.trainable, "dtype": layer.dtype_policy.name}


def config(layer, **overrides):
    """`layer`'s config (with `overrides`) as its class's constructor takes it."""
    accepted = _constructor_arguments(type(layer))
    try:
        settings = type(layer).get_config(layer)  # the class's (swap_activations sets an instance's to this)
    except (AttributeError, NotImplementedError, TypeError) as error:  # reads an attribute never set; Keras's
        # default refuses; Keras cannot serialize a layer class it holds (keras-hub's Swin patch embedding's
        # `norm_layer=LayerNormalization`, which Keras then calls get_config on, unbound)
        settings = {**_base_config(layer), **_recorded_arguments(layer),
                    **{name: _class_serialized(getattr(layer, name)) for name in accepted if name in vars(layer)}}
        _check_required_arguments(layer, settings, error)
    if _is_graph(layer) or _reads_its_own_config(type(layer)):
        return {**settings, **overrides}  # a model's config is its graph; a class with its own from_config reads
        # what it wrote
    recorded = _recorded_arguments(layer)
    # A weight in place of an argument: keras-hub's D-FINE decoder makes its `upsampling_factor` argument a
    # weight of that name in build(), and its get_config then gives that weight, which a copy would track as
    # its own (one weight too many). The argument as recorded, or else the weight's value, as the constructor's.
    settings = {key: (recorded[key] if key in recorded else keras.ops.convert_to_numpy(value).tolist())
                if flavour.is_variable(value) else value for key, value in settings.items()}
    return {key: value for key, value in {**recorded, **settings, **overrides}.items() if key in accepted}


def _class_serialized(value):
    """A layer class as Keras serializes a function, by module and name, which keras.saving.deserialize_keras_object
    reads back as the class itself; any other value as it is."""
    if not (isinstance(value, type) and issubclass(value, keras.layers.Layer)):
        return value
    return {"module": value.__module__, "class_name": "function", "config": value.__name__, "registered_name": None}


def _check_required_arguments(layer, settings, error):
    """Refuse, naming them, a layer whose constructor requires arguments that neither its get_config (which
    failed with `error`), nor Keras's record, nor its attributes give: keras-hub's Flux blocks, subclassed
    models without a get_config, whose arguments Keras does not record either (Model.__new__ hands it none)."""
    missing = [parameter.name for parameter in list(inspect.signature(type(layer).__init__).parameters.values())[1:]
               if parameter.default is parameter.empty and parameter.name not in settings
               and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)]
    if missing:
        raise ValueError(f"Layer {layer.name} ({type(layer).__name__}) cannot be copied or saved from a config: its "
                         f"get_config fails ({type(error).__name__}) and its constructor's {', '.join(missing)} are "
                         f"neither recorded by Keras nor held as attributes. Received: layer={layer.name}")


def _recorded_arguments(layer):
    """The arguments `layer`'s constructor was called with, where Keras 3 recorded them (`_auto_config`: every
    one a str, number, bool or None), for those its get_config leaves out: keras-hub's MiT encoder block gives
    no `sr_ratio`, and a copy without it has no sequence-reducing Conv2D, nor its weights."""
    recorded = getattr(layer, "_auto_config", None)
    return dict(recorded.config) if recorded is not None else {}


def copy(layer, **overrides):
    """A new layer of `layer`'s class, from its config (with `overrides`), unbuilt; named as `layer` is, where
    its constructor takes no name."""
    settings = config(layer, **overrides)
    new = type(layer).from_config(settings)
    if "name" not in settings:
        new.name = overrides.get("name", layer.name)
    return new


def serialized(layer):
    """`keras.saving.serialize_keras_object(layer)`, holding `config(layer)` (which never calls a failing
    get_config twice)."""
    return {"module": type(layer).__module__, "class_name": type(layer).__name__, "config": config(layer),
            "registered_name": keras.saving.get_registered_name(type(layer))}
