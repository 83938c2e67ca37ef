"""Every Hugging Face TensorFlow model family, built tiny and offline, and whether it computes a GELU.

`model_classes` enumerates the families as transformers itself lists them: every class its TF auto-model table
(`TF_MODEL_MAPPING_NAMES`, one base model per model type) names, so that a family transformers adds is seen
without anyone naming it. transformers 4.x is the last series with TensorFlow models, and they are tf-keras
models whichever Keras is active.

`tiny_config` makes each family's configuration small by mechanism, not by family: the configuration's own
defaults, with every size its keys name by Hugging Face's conventions (`hidden_size`, `num_hidden_layers`,
`intermediate_size`, `vocab_size`, `image_size`, ...) made small, per-stage lists of a hierarchical vision model
(depths, widths, heads) made shallow and narrow stage by stage, and nested towers' configurations (a CLIP's,
a SAM's) the same way. Activations keep the family's defaults, so the GELU question is answered for the
family. `OVERRIDES` holds what one family needs beyond that (a window that fits the tiny image, a size derived
from others), each with its reason; `CANNOT_BUILD` the families whose tiny model cannot be called, with why.

`build` gives the model and random inputs made from its own `input_signature` (token ids below the
vocabulary, masks of ones, images and audio of the tiny sizes); `traced` builds it seeded and traces the
serving function a user's export would trace (the model's tensor outputs, at those inputs' shapes with an
open batch), with the GELU forms that trace computes (`gelu_evidence`); `save` writes its SavedModel.

    family = traced("TFBertModel")
    family.forms  # {"erf"}
    path, samples = save(family, folder)

Nothing here downloads anything; transformers and TensorFlow are imported on first use.
"""

import collections

import numpy as np

import gelu_evidence

SEED = 1234
BATCH = 2
SEQUENCE_LENGTH = 8
VOCABULARY = 64
IMAGE_SIDE = 32
AUDIO_SAMPLES = 1600  # raw 16 kHz audio: a wav2vec2 feature encoder's strides (320 in all) leave a few frames

# Scalar sizes, by the keys Hugging Face's configurations give them.
_SIZES = {
    "hidden_size": 32, "d_model": 32, "emb_dim": 32, "n_embd": 32, "dim": 32, "embed_dim": 32, "emb_size": 32,
    "embedding_size": 32, "projection_dim": 16, "d_embed": 32, "d_inner": 64, "d_kv": 8, "d_head": 16,
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "num_decoder_layers": 2,
    "num_attention_heads": 2, "n_head": 2, "n_heads": 2, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
    "num_heads": 2, "num_key_value_heads": 2,
    "intermediate_size": 64, "ffn_dim": 64, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "n_inner": 64,
    "hidden_dim": 64, "d_ff": 64, "mlp_dim": 64,
    "vocab_size": VOCABULARY, "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64,
    "max_source_positions": 64, "max_target_positions": 64,
    "image_size": IMAGE_SIDE, "patch_size": 8, "num_channels": 3,
    # sizes a configuration derives from others when it is made, kept in its dictionary at their default
    "pooler_output_size": 32, "output_channels": 32, "num_pos_feats": 16, "iou_head_hidden_dim": 32,
}
# Per-stage lists of a hierarchical model: a block a stage, two heads, widths doubling from 16, and lists of
# one width throughout (a wav2vec2 feature encoder's convolutions) that width.
_STAGE_DEPTHS = {"depths", "num_layers", "layer_depths", "depth", "num_encoder_blocks"}
_STAGE_WIDTHS = {"hidden_sizes", "embed_dims", "dims", "hidden_dims", "embed_dim", "embedding_sizes"}
_EVEN_WIDTHS = {"conv_dim": 32}

# {class: configuration values beyond the shrinking}, each for a reason of its family.
OVERRIDES = {
    # four stages of downsampling by 4, 2, 2, 2 need more than 32 pixels a side
    "TFConvNextModel": {"image_size": 64},
    "TFConvNextV2Model": {"image_size": 64},
    # its windows (7 by default) and four stages of patch merging fit a 16-patch side
    "TFSwinModel": {"patch_size": 2, "window_size": 2},
    # its rotary dimensions (64 by default) within a head's 16
    "TFGPTJModel": {"rotary_dim": 8},
    # ESM's configuration has no default vocabulary: the protein alphabet's 33 tokens
    "TFEsmModel": {"vocab_size": 33, "pad_token_id": 1, "mask_token_id": 32},
    # its last stage's width (dim) is the last of hidden_sizes, its attention's resolution the tiny image's
    "TFEfficientFormerModel": {"dim": 128, "resolution": 1},
    # its four coordinate and two shape embeddings concatenate to hidden_size; its patches cover input_size
    "TFLayoutLMv3Model": {"coordinate_size": 4, "shape_size": 8, "max_2d_position_embeddings": 128, "input_size": 32,
                          "patch_size": 16},
    # its prompt encoder's grid is the image embedding's side: image_size / patch_size
    "TFSamModel": {"prompt_encoder_config": {"image_embedding_size": IMAGE_SIDE // 8}},
    # its adaptive embedding's cutoffs within the tiny vocabulary
    "TFTransfoXLModel": {"cutoffs": [16, 32]},
    # its encoder reads 2 max_source_positions frames of num_mel_bins each
    "TFWhisperModel": {"max_source_positions": SEQUENCE_LENGTH // 2, "num_mel_bins": 8},
    # a dual encoder has no default towers: a ViT and a BERT, each shrunk
    "TFVisionTextDualEncoderModel": {"vision_config": {"model_type": "vit"}, "text_config": {"model_type": "bert"}},
    # its vision configuration names no channels, which the model's input_signature reads
    "TFBlipModel": {"vision_config": {"num_channels": 3}},
    # its stage i reads drop_path_rate's i-th of depth[i] values: stage i needs i + 1 blocks
    "TFCvtModel": {"depth": [1, 2, 3], "image_size": IMAGE_SIDE},
}

CANNOT_BUILD = {
    "TFIdeficsModel": "its call reshapes pixel_values as several images a sample (1088 values against 2176), "
                      "while its own input_signature gives one: the TensorFlow port cannot call itself",
}


# Weights drawn as most families draw them: BLIP's vision tower draws its class embedding and patch projection
# at 1e-10, whose tiny random image embeddings no int8 grid holds (cosine 0, its --explain says where), where
# trained ones are of ordinary size.
_INITIALIZER_RANGE = 0.02


def _shrunk(values):
    """The entries of a configuration dictionary that the tiny model changes, nested towers included."""
    changed = {}
    for key, value in values.items():
        if isinstance(value, bool):
            continue
        if key == "initializer_range" and isinstance(value, float) and value < _INITIALIZER_RANGE:
            changed[key] = _INITIALIZER_RANGE
        if key in _SIZES and isinstance(value, int) and value > 0:  # 0 or None: a part the family leaves out
            changed[key] = _SIZES[key]
        elif isinstance(value, list) and value and all(type(item) is int for item in value):
            if key in _STAGE_DEPTHS:
                changed[key] = [1] * len(value)
            elif "heads" in key:
                changed[key] = [2] * len(value)
            elif key in _STAGE_WIDTHS:
                changed[key] = [16 * 2 ** index for index in range(len(value))]
            elif key in _EVEN_WIDTHS:
                changed[key] = [_EVEN_WIDTHS[key]] * len(value)
        elif isinstance(value, dict) and key.endswith("_config"):
            changed[key] = {**value, **_shrunk(value)}
    return changed


def _with_overrides(values, overrides):
    """`values` with `overrides`; a nested tower's overrides merged into its shrunk configuration, which a
    `model_type` names where the family has no default tower."""
    merged = dict(values)
    for key, value in overrides.items():
        if isinstance(value, dict) and key.endswith("_config"):
            tower = values.get(key)
            if not isinstance(tower, dict):
                from transformers import CONFIG_MAPPING

                tower = CONFIG_MAPPING[value["model_type"]]().to_dict()
                tower = {**tower, **_shrunk(tower)}
            merged[key] = {**tower, **value}
        else:
            merged[key] = value
    return merged


def tiny_config(class_name):
    """The family's configuration, small (see the module's docstring)."""
    import transformers

    config_class = getattr(transformers, class_name).config_class
    try:
        defaults = config_class().to_dict()
    except (ValueError, TypeError):  # a composite without default towers: OVERRIDES gives them
        defaults = {}
    return config_class(**_with_overrides({**defaults, **_shrunk(defaults)}, OVERRIDES.get(class_name, {})))


def model_classes():
    """{class name: model type} for every base TensorFlow model transformers' auto-model table names."""
    from transformers.models.auto import modeling_tf_auto

    classes = {}
    for model_type, names in modeling_tf_auto.TF_MODEL_MAPPING_NAMES.items():
        for name in names if isinstance(names, tuple) else (names,):
            classes.setdefault(name, model_type)  # gpt-sw3 is GPT-2's class
    return classes


def _configured(config, attribute, default):
    """An attribute of the configuration or of its vision or text tower (the first of a per-stage list)."""
    for holder in (config, getattr(config, "vision_config", None), getattr(config, "text_config", None)):
        value = getattr(holder, attribute, None)
        if value:
            return value[0] if isinstance(value, (list, tuple)) else value
    return default


def _example_input(name, shape, dtype, config, rng):
    """One random input, made from its name as a tokenizer, image or audio processor would make it."""
    length = AUDIO_SAMPLES if name == "input_values" else (
        _configured(config, "image_size", IMAGE_SIDE) if "pixel" in name else SEQUENCE_LENGTH)
    shape = [BATCH if axis == 0 else length if size is None else size for axis, size in enumerate(shape)]
    if np.issubdtype(dtype, np.integer):
        if "mask" in name:
            return np.ones(shape, dtype)  # every position is real: nothing is padding
        if "token_type" in name:
            return np.zeros(shape, dtype)
        if name == "bbox":  # boxes as (x0, y0, x1, y1), each below LayoutLM's 2-D position tables
            return np.sort(rng.integers(0, 100, shape), axis=-1).astype(dtype)
        vocabulary = min(_configured(config, "vocab_size", VOCABULARY), VOCABULARY)
        return rng.integers(3, vocabulary, shape).astype(dtype)  # past the special tokens
    return (np.ones(shape) if "mask" in name else rng.normal(size=shape)).astype(dtype)


def build(class_name):
    """(model, inputs): the family's base model from its tiny configuration, and random inputs of batch BATCH
    for every input its `input_signature` names."""
    import transformers

    if class_name in CANNOT_BUILD:
        raise ValueError(f"{class_name} cannot be built: {CANNOT_BUILD[class_name]}")
    config = tiny_config(class_name)
    model = getattr(transformers, class_name)(config)
    rng = np.random.default_rng(SEED)
    inputs = {}
    for name, spec in model.input_signature.items():
        shape = tuple(spec.shape)
        if name == "attention_mask" and inputs:  # along the model's first input (token ids, audio samples)
            shape = next(iter(inputs.values())).shape[:2]
        inputs[name] = _example_input(name, shape, spec.dtype.as_numpy_dtype, config, rng)
    return model, inputs


def _serving_function(model, inputs):
    """The model's call as a user exports it: a tf.function of a dict of its inputs, batch open, returning
    its tensor outputs by name."""
    import tensorflow as tf

    specs = {name: tf.TensorSpec((None, *array.shape[1:]), tf.as_dtype(array.dtype), name=name)
             for name, array in inputs.items()}

    def serve(values):
        outputs = model(values, training=False)
        return {name: value for name, value in outputs.items() if isinstance(value, tf.Tensor)}

    return tf.function(serve, input_signature=[specs])


# A family built and its serving function traced (the trace makes the model's weights), with the GELU forms it
# computes.
Traced = collections.namedtuple("Traced", "model inputs serving forms")


def traced(class_name):
    """The family's `Traced`, built (`build`) with the weights SEED draws."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(SEED)
    model, inputs = build(class_name)
    serving = _serving_function(model, inputs)
    forms = gelu_evidence.forms_in_graph(serving.get_concrete_function().graph.as_graph_def())
    return Traced(model, inputs, serving, forms)


def save(family, folder):
    """The SavedModel of a `Traced` family's serving function at folder/saved_model, and its inputs at
    folder/inputs.npz; their paths. The serving function and the variables it reads alone: a tf-keras model in
    the saved object graph has every layer's call traced again for its own SavedModel metadata."""
    import tensorflow as tf

    holder = tf.Module()
    holder.weights, holder.serve = list(family.model.weights), family.serving
    path, samples = str(folder / "saved_model"), str(folder / "inputs.npz")
    tf.saved_model.save(holder, path, signatures={"serving_default": family.serving})
    np.savez(samples, **family.inputs)
    return path, samples
