"""Nested models, quantized through: a model whose layers include Sequential or functional models, as one
functional model of their layers.

keras.applications' ConvNeXt holds its stem and downsampling blocks as
Sequential models; a keras-hub task holds its backbone as a functional model.
The int8 model has no such boundaries: the converter sees one graph of ops.
`flattened` makes the QAT engine see the same: every nested model (at any
depth) is replaced by its layers, called in place on the outer tensors, so
that each value gets one range, whichever model it crossed, and a
BatchNormalization folds into the convolution before it across a boundary
too.

The layers are copies (from their configs) carrying the originals' weights:
the user's model is neither changed nor shared. A nested model named in
`keep_float` stays whole, and float.
"""

from keras_gelu.flavour import keras
from keras_gelu import layer_configs
from keras_gelu.swapping import is_rebuildable


def graph_of(layer):
    """The functional graph a nested model runs: itself, a Sequential's inner functional model, or None for
    what is not a model built from layers (a layer, a subclassed model, an unbuilt Sequential)."""
    if isinstance(layer, keras.Sequential):
        return getattr(layer, "_functional", None)
    if isinstance(layer, keras.Model) and is_rebuildable(layer):
        return layer
    return None


def has_nested_models(model, keep_float=()):
    return any(graph_of(layer) is not None for layer in model.layers if layer.name not in keep_float)


def flattened(model, keep_float=()):
    """`model` (functional) with every nested Sequential/functional model not in `keep_float` called layer by layer
    in its place; `model` itself when there is none. Layers keep their names, but for a clash between two
    models' layers, where the inner one is renamed `<its model>_<its name>`."""
    if not has_nested_models(model, keep_float):
        return model
    made = {}  # id(original) -> (original, copy), so that a shared layer stays shared
    names = {operation.name for operation in model.operations}

    def copy_of(operation, within):
        if id(operation) in made:
            return made[id(operation)][1]
        if graph_of(operation) is not None and operation.name not in keep_float:
            copy = operation  # run through in call(), never called itself
        else:
            name = operation.name
            if within is not model and name in names:
                name = f"{within.name}_{name}"
            names.add(name)
            copy = layer_configs.copy(operation, name=name) if isinstance(operation, keras.layers.Layer) \
                else type(operation).from_config({**operation.get_config(), "name": name})
        made[id(operation)] = (operation, copy)
        return copy

    def call(operation, *args, **kwargs):
        graph = graph_of(operation)
        if graph is None or operation.name in keep_float:
            return operation(*args, **kwargs)
        # A model's call takes one structure of inputs; `training` and masks reach its layers through Keras's
        # call context, not this graph, in a functional model too.
        inputs = args[0] if args else kwargs["inputs"]
        return graph._run_through_graph(inputs, operation_fn=lambda inner: copy_of(inner, operation),
                                        call_fn=call)

    flat = keras.models.clone_model(model, clone_function=lambda operation: copy_of(operation, model),
                                    call_function=call)
    for original, copy in made.values():
        if copy is not original and isinstance(original, keras.layers.Layer) and original.weights:
            copy.set_weights(original.get_weights())
    return flat
