"""The QAT model as `quantize_model` returns it: a functional model whose training stops, in one message, at
the first loss that is not a number, naming the layer whose variables went first.

Two Adam steps at 1e-3 once turned a ViT's variables NaN, in silence (`fit` went on, `save` wrote them, the
converter met them later). `QuantizedModel.fit` adds `_StopAtNonFiniteLoss` to the callbacks it is given.
"""

import math

from keras_gelu.flavour import keras
from keras_gelu.flavour import register_serializable


class NonFiniteTraining(FloatingPointError):
    """QAT met a loss that is NaN or infinite."""


class _StopAtNonFiniteLoss(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        self.model.stop_training = True
        raise NonFiniteTraining(f"QAT stopped at epoch {getattr(self, 'epoch', 0) + 1}, batch {batch + 1}: the "
                                f"loss is {float(loss)}; {first_non_finite(self.model)}")


def first_non_finite(model):
    """Where a model's variables went non-finite first, in the order its layers compute, as a phrase."""
    spoilt = [(layer, variable) for layer in model.layers for variable in layer.variables
              if not bool(keras.ops.all(keras.ops.isfinite(variable)))]
    if not spoilt:
        return "every variable is finite: an input or target that is not, or an output that overflowed"
    layer, variable = spoilt[0]
    count = len({id(variable) for _, variable in spoilt})
    return (f"the first layer whose variables went non-finite is {layer.name} ({variable.path}; {count} of "
            f"{len(model.variables)} variables are)")


@register_serializable
class QuantizedModel(keras.Model):
    """A QAT model (functional): `fit` stops at a non-finite loss, naming where it went first."""

    def fit(self, *args, callbacks=None, **kwargs):
        given = list(callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList) else callbacks or ())
        return super().fit(*args, callbacks=[*given, _StopAtNonFiniteLoss()], **kwargs)


# The legacy .h5 loader looks the model's own class up by its bare name, not its registered one
keras.saving.get_custom_objects().setdefault(QuantizedModel.__name__, QuantizedModel)
