"""Quantization-aware training of keras_gelu models, to an integer .tflite: the one front door to two engines.

    from keras_gelu import qat
    qat_model = qat.quantize_model(model, mode="builtin", calibration_data=x_train[:256])
    ...train qat_model, save it, then: keras-gelu-convert <saved model> --int8 --mode builtin

The engine follows the Keras flavour (`keras_gelu.flavour`):

* Keras 3: `keras3`, our own, on Keras 3's fake-quant ops (no tfmot). Layers
  have rules (`QuantizeRule`, `register_rule`); a saved QAT model loads after
  `import keras_gelu`.
* tf-keras: `tfmot`, on tensorflow-model-optimization (the `qat` extra),
  with our QuantizeConfigs (`GELUQuantizeConfig`, `LearnableGELUQuantizeConfig`);
  load a saved QAT model inside `quantize_scope()`.

Both fake-quantize what the int8 model will hold as int8, on the grid it will
have there, and both compute a GELU as the very ops the converter turns it
into for the conversion's `mode` and `exact_as` (`keras_gelu.replacements`,
the table the converter reads), so the .tflite is integer throughout and a
step or so from the QAT model.
"""

import warnings

from keras_gelu import swapping
from keras_gelu import vocabulary
from keras_gelu.flavour import USE_LEGACY_KERAS
from keras_gelu.flavour import keras

if USE_LEGACY_KERAS:
    from keras_gelu.qat import tfmot as _engine
else:  # imported with keras_gelu, so that its layers are registered before a saved QAT model loads
    from keras_gelu.qat import keras3 as _engine

# What each engine has of its own, by name: the other flavour's names explain where to look.
_TFMOT_NAMES = ("GELUQuantizeConfig", "LearnableGELUQuantizeConfig", "custom_objects", "quantize_config_for",
                "quantize_scope", "split_activations", "require_tfmot")
_KERAS3_NAMES = ("QuantizeRule", "register_rule", "QuantizeWrapper", "QuantizeInput", "NonFiniteTraining")


def __getattr__(name):
    if name in _TFMOT_NAMES:
        if not USE_LEGACY_KERAS:
            raise AttributeError(f"keras_gelu.qat.{name} belongs to the tfmot engine, which runs under tf-keras "
                                 "(TF_USE_LEGACY_KERAS=1); under Keras 3 a saved QAT model loads without a scope")
        if name in ("GELUQuantizeConfig", "LearnableGELUQuantizeConfig"):  # they subclass tfmot's: tfmot loads
            from keras_gelu.qat.tfmot import configs

            return getattr(configs, name)
        return getattr(_engine, name)
    if name in _KERAS3_NAMES:
        if USE_LEGACY_KERAS:
            raise AttributeError(f"keras_gelu.qat.{name} belongs to the Keras 3 engine; under tf-keras give a layer "
                                 "of yours a tfmot QuantizeConfig with "
                                 "tfmot.quantization.keras.quantize_annotate_layer")
        return getattr(_engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def quantize_model(model, mode="builtin", exact_as=None, calibration_data=None, keep_float=()):
    """A quantization-aware copy of a Sequential or functional model, for `keras-gelu-convert --int8`.

    Every layer is quantized as its int8 op will compute it, GELUs as the
    conversion's `mode` and `exact_as` turn them into int8 ops; the float
    weights are kept. Train the result, save it, then convert it with
    `keras-gelu-convert --int8 --mode <mode> [--form <exact_as>]`.

    Args:
        model: A built Sequential or functional model of the active Keras.
        mode: The conversion mode the model is meant for, "builtin" (no GELU
            op; the default, as the converter's) or "native". QAT then
            trains against exactly the int8 ops that mode produces; the
            model converts in the other mode too, a few int8 steps apart.
        exact_as: how builtin mode computes exact GELU, the converter's
            --form: "sigmoid" (the default), "tanh" or "erf" (which int8
            computes as tanh). Native mode has the GELU op and takes none.
        calibration_data: Optional representative inputs (one batch). When
            given, every int8 range starts at its range over them (see
            `initialize_ranges`), rather than where the engine would start
            it, which short QAT runs barely move away from.
        keep_float: Names of layers to leave in float (the int8 model then
            has float ops there). A layer with no quantization rule is an
            error, not silently float, unless keep_float is "auto": then
            exactly the layers the engine refuses (and a composite layer
            holding one, whole) stay float, each named with its refusal in
            a warning and in the QAT model's `kept_float` ({name: reason}).

    Returns:
        The QAT model.
    """
    if not isinstance(model, keras.Model) or not swapping.is_rebuildable(model):
        raise ValueError(
            "quantize_model takes a built Sequential or functional model (a subclassed model's call is code it "
            f"cannot rewrite). Received: model={type(model).__name__}")
    if not model.built:
        raise ValueError(f"quantize_model needs a built model; call it on data or build it first. "
                         f"Received: model={model.name} (not built)")
    vocabulary.check_mode(mode, vocabulary.INT8_MODE_NAMES)
    exact_as = vocabulary.resolve_exact_as(mode, exact_as)
    if keep_float != "auto":
        keep_float = set(keep_float)
        unknown = keep_float - {layer.name for layer in model.layers}
        if unknown:
            raise ValueError(f"Argument `keep_float` names layers the model does not have, or is not \"auto\". "
                             f"Received: keep_float={sorted(unknown)}")
        return _engine.quantize(model, mode, exact_as, calibration_data, keep_float)
    qat_model = _engine.quantize(model, mode, exact_as, calibration_data, keep_float)
    if qat_model.kept_float:
        warnings.warn(f"quantize_model kept {len(qat_model.kept_float)} layer(s) float (keep_float=\"auto\"): "
                      + "; ".join(f"{name}: {reason.splitlines()[0]}" for name, reason in qat_model.kept_float.items()),
                      stacklevel=2)
    return qat_model


def initialize_ranges(qat_model, samples):
    """Set every moving-average int8 range of a QAT model to its range over `samples` (one batch).

    What post-training calibration does: one forward pass in training mode,
    each range taken from that batch instead of moving a little towards it;
    every other variable (batch-norm statistics, weights) is restored. Dropout
    is active in that pass, which can widen a range a little.
    """
    return _engine.initialize_ranges(qat_model, samples)


__all__ = ["initialize_ranges", "quantize_model", *(_TFMOT_NAMES if USE_LEGACY_KERAS else _KERAS3_NAMES)]
