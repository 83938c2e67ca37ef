"""Fine-tune a model after `swap_activations`: the swapped layers first, gently, then everything.

    gelu_model, swaps = keras_gelu.swap_activations(relu_model, {"relu": "gelu"}, return_swaps=True)
    keras_gelu.fine_tune_swapped(gelu_model, swaps, x_train, y_train, loss="sparse_categorical_crossentropy",
                                 learning_rate=1e-3, swapped_epochs=2, epochs=3, batch_size=64)

Why in two stages: right after the swap only the layers around the new
activation are off; training all weights at once at full rate lets the
error they make move every other layer too. Training those layers first, at
a tenth of the rate, brings them back before the rest may move.
"""

import contextlib

from keras_gelu.flavour import flatten
from keras_gelu.flavour import keras


def _leaf_layers(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _leaf_layers(layer)
        else:
            yield layer


def _layer_at(model, path):
    layer = model
    for name in path.split("/"):
        layer = layer.get_layer(name)
    return layer


def _producers(layer):
    """The layers whose outputs this layer reads, in its first call."""
    return [tensor._keras_history[0] for tensor in flatten(layer._inbound_nodes[0].input_tensors)]


def swapped_layers(model, swaps):
    """The layers that `swaps` changed, by which fine-tuning starts.

    A layer with a swapped fused activation is one of them. A swapped
    stand-alone activation layer is too, with the layers that feed it, since
    an activation layer usually has no weights of its own to adapt.
    """
    chosen = []
    for swap in swaps:
        layer = _layer_at(model, swap.layer)
        candidates = [layer]
        if swap.attribute is None:
            candidates += [producer for producer in _producers(layer) if producer.weights]
        chosen += [candidate for candidate in candidates if all(candidate is not other for other in chosen)]
    return chosen


@contextlib.contextmanager
def only_trainable(model, layers):
    """Within the block, only `layers` (and what they contain) of `model` train; `trainable` is restored after.

    Compile inside the block: Keras reads which variables train when it compiles.
    """
    leaves = list(_leaf_layers(model))
    saved = [(layer, layer.trainable) for layer in leaves]
    chosen = {id(layer) for layer in layers}
    try:
        for layer in leaves:
            layer.trainable = layer.trainable and id(layer) in chosen
        yield model
    finally:
        for layer, trainable in saved:
            layer.trainable = trainable


def fine_tune_swapped(model, swaps, x, y=None, *, loss, learning_rate=1e-3, swapped_epochs=1, epochs=1,
                      swapped_learning_rate_scale=0.1, metrics=None, **fit_kwargs):
    """Train the swapped layers for `swapped_epochs` at `learning_rate * swapped_learning_rate_scale`,
    then the whole model for `epochs` at `learning_rate`, each with a fresh Adam.

    Args:
        model, swaps: what `swap_activations(..., return_swaps=True)` returned.
        x, y, fit_kwargs: passed to `model.fit` (batch_size, validation_data, callbacks...).
        loss, metrics: passed to `model.compile`.
        learning_rate: Adam's learning rate in the second stage.
        swapped_epochs, epochs: epochs of each stage; 0 skips a stage.
        swapped_learning_rate_scale: the first stage's rate as a share of `learning_rate`.

    Returns:
        (history of the first stage or None, history of the second or None).
        The model is left compiled for the second stage, all its layers as trainable as before.
    """
    for name, value in (("swapped_epochs", swapped_epochs), ("epochs", epochs)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"Argument `{name}` must be a non-negative int. Received: {name}={value!r}")
    if not 0 < swapped_learning_rate_scale <= 1:
        raise ValueError("Argument `swapped_learning_rate_scale` must be in (0, 1]. "
                         f"Received: swapped_learning_rate_scale={swapped_learning_rate_scale!r}")
    histories = [None, None]
    if swapped_epochs:
        with only_trainable(model, swapped_layers(model, swaps)):
            model.compile(optimizer=keras.optimizers.Adam(learning_rate * swapped_learning_rate_scale), loss=loss,
                          metrics=metrics)
            histories[0] = model.fit(x, y, epochs=swapped_epochs, **fit_kwargs)
    if epochs:
        model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss=loss, metrics=metrics)
        histories[1] = model.fit(x, y, epochs=epochs, **fit_kwargs)
    return tuple(histories)


__all__ = ["fine_tune_swapped", "only_trainable", "swapped_layers"]
