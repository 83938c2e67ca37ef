"""Every keras-hub Backbone family and keras.applications module, built tiny and offline, and whether it computes
a GELU.

`TINY_CONFIGS` holds, for every `keras_hub.models.*Backbone` class (found by
introspection, aliases included under their own attribute name), the smallest
constructor arguments that build: one or two layers, widths of 16-32, two
heads, a vocabulary of 50, 32x32 images, short sequences. Arguments that pick
an activation keep the family's default, or the value its presets use where
the argument has no default, so that the GELU question is answered for the
family and not for a choice made here. Optional towers (a multimodal LLM's
vision or audio encoder) are left out: they make a larger model and need
structured inputs, and the text tower is what every preset carries. This
matters for one answer: Qwen 3.5's optional vision encoder computes GELUs, but
its call reads image grid sizes as Python ints, which no graph trace allows.

A constructor argument that is itself a model or a layer (a composite's image
encoder, a CLIP's two towers) is written as a nested spec,
`{"component": NAME, "config": {...}}`, where NAME is either a class of
`keras_hub.models` or a dotted path under `keras_hub.src.models`; `build`
instantiates specs depth first, so that nothing is built at import.

`CANNOT_BUILD` names the classes that cannot be built from a config at all,
each with the reason.

keras.applications' builders (`application_builders`) are grouped by the
module that holds them, one entry a module in `TINY_CONFIGS` (ConvNeXt's at
depth 1 through its module's own constructor); `family_names` lists both kinds.

`computes_gelu` decides by what the model computes, never by names: it traces
the backbone's call with tf.function on TensorSpecs of the example inputs and
reads the graph and its function library (`gelu_evidence`) for an Erf (the exact
GELU), a Tanh whose argument carries the 0.044715 cubic (the tanh approximation)
or a Sigmoid of 1.702 x (the sigmoid form, CLIP's "quick GELU"); `gelu_forms`
says which.

    backbone, inputs = build("BertBackbone")
    computes_gelu(backbone)  # True

Nothing here downloads anything; keras-hub and TensorFlow are imported on
first use, so importing this module is cheap and has no side effects.
"""

import numpy as np

import gelu_evidence

SEED = 1234
BATCH = 2
SEQUENCE_LENGTH = 8  # every token sequence whose length the backbone leaves open
OPEN_DIMENSION = 32  # any other dimension the backbone leaves open (an image side, a frame count)

# Constructor arguments, by the attribute name under keras_hub.models.
# BASNet and RetinaNet take the same ResNet (four stages) for their image encoder.
_TINY_RESNET = {
    "component": "ResNetBackbone",
    "config": {
        "input_conv_filters": [64],
        "input_conv_kernel_sizes": [7],
        "stackwise_num_filters": [64, 16, 16, 16],  # ResNetBackbone insists on 64 first
        "stackwise_num_blocks": [1, 1, 1, 1],
        "stackwise_num_strides": [1, 2, 2, 2],
        "block_type": "basic_block",
    },
}

# SmolLM and SmolLM3 take the same constructor arguments.
_SMOLLM = {
    "vocabulary_size": 50,
    "hidden_dim": 16,
    "intermediate_dim": 32,
    "num_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_layer_enabled_list": [True],
    "layer_types": ["attention"],
    "mlp_bias": False,
    "layer_norm_epsilon": 1e-05,
    "max_position_embeddings": 16,
    "rope_theta": 10000.0,
    "partial_rotary_factor": 1.0,
}

# T5Gemma and T5Gemma 2 take the same constructor arguments.
_T5GEMMA_ENCODER_DECODER = {
    "vocabulary_size": 50,
    "encoder_hidden_dim": 16,
    "encoder_intermediate_dim": 32,
    "encoder_num_layers": 1,
    "encoder_num_attention_heads": 2,
    "encoder_num_key_value_heads": 1,
    "encoder_head_dim": 8,
    "encoder_layer_types": ["full_attention"],
    "decoder_hidden_dim": 16,
    "decoder_intermediate_dim": 32,
    "decoder_num_layers": 1,
    "decoder_num_attention_heads": 2,
    "decoder_num_key_value_heads": 1,
    "decoder_head_dim": 8,
    "decoder_layer_types": ["full_attention"],
    "cross_attention_hidden_size": 16,
}

# keras.applications: every builder (a function of keras.applications that takes `weights`) belongs to the module
# that holds it. A module's builders share its code and differ in widths and depths, not in activations, so one
# entry per module, under its path here, answers for them (`application_builders` finds them all). Built with
# no weights (nothing downloaded) and a head of 4 classes.
APPLICATIONS = "keras.src.applications."
_APPLICATION = {"weights": None, "input_shape": (32, 32, 3), "classes": 4}

TINY_CONFIGS = {
    "AlbertBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "embedding_dim": 16,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "BASNetBackbone": {
        # At least ~49M parameters: the bridge and decoder are 8 x projection_filters wide, and
        # projection_filters keeps its 64, as BASNet's stem feeds the ResNet's first stage (64 channels).
        "image_encoder": _TINY_RESNET,
        "num_classes": 1,
        "image_shape": (32, 32, 3),
    },
    "BLIP2Backbone": {
        "vision_encoder": {
            "component": "blip2.blip2_vision_encoder.BLIP2VisionEncoder",
            "config": {
                "image_size": 32,
                "patch_size": 8,
                "num_layers": 1,
                "num_heads": 2,
                "hidden_dim": 16,
                "intermediate_dim": 32,
                "use_patch_bias": True,
                "use_class_token": True,
                "use_mha_bias": True,
                "use_mlp_bias": True,
                "dropout_rate": 0.0,
                "layer_norm_epsilon": 1e-06,
                "initializer_range": 0.02,
            },
        },
        "qformer": {
            "component": "blip2.blip2_qformer.BLIP2QFormer",
            "config": {
                "num_query_tokens": 2,
                "num_layers": 1,
                "num_heads": 2,
                "hidden_dim": 16,
                "intermediate_dim": 32,
                "vision_dim": 16,  # the vision encoder's hidden_dim
                "cross_attention_frequency": 1,
                "dropout": 0.0,
                "layer_norm_epsilon": 1e-06,
            },
        },
        "language_model": {
            "component": "blip2.blip2_custom_opt.BLIP2CustomOPT",
            "config": {
                "vocabulary_size": 50,
                "num_layers": 1,
                "num_heads": 2,
                "hidden_dim": 16,
                "intermediate_dim": 32,
                "num_query_tokens": 2,
                "qformer_hidden_dim": 16,
                "max_sequence_length": 16,  # the query tokens and the text together
                "dropout": 0.0,
            },
        },
    },
    "BartBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "BertBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "BloomBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "CLIPBackbone": {
        "vision_encoder": {
            "component": "CLIPVisionEncoder",
            "config": {
                "patch_size": 8,
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_dim": 32,
                "image_shape": (32, 32, 3),
            },
        },
        "text_encoder": {
            "component": "CLIPTextEncoder",
            "config": {
                "vocabulary_size": 50,
                "embedding_dim": 16,
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_dim": 32,
                "max_sequence_length": SEQUENCE_LENGTH,
            },
        },
        "projection_dim": 16,
    },
    "CLIPTextEncoder": {
        "vocabulary_size": 50,
        "embedding_dim": 16,
        "hidden_dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_dim": 32,
        "max_sequence_length": SEQUENCE_LENGTH,
    },
    "CLIPVisionEncoder": {
        "patch_size": 8,
        "hidden_dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_dim": 32,
        "image_shape": (32, 32, 3),
    },
    "CSPNetBackbone": {
        "stem_filters": 8,
        "stem_kernel_size": 3,
        "stem_strides": 1,
        "stackwise_depth": [1, 1],
        "stackwise_strides": 2,
        "stackwise_num_filters": [16, 32],
        "block_type": "dark_block",
        "stage_type": "csp",
        # Cross-stage partial stages split their channels: these ratios keep the two halves' widths equal.
        "bottle_ratio": [0.5, 1.0],
        "block_ratio": [1.0, 0.5],
        "expand_ratio": [2.0, 1.0],
        "down_growth": True,
        "stem_padding": "same",
        "image_shape": (32, 32, 3),
    },
    "DFineBackbone": {
        "backbone": {
            "component": "HGNetV2Backbone",
            "config": {
                "depths": [1, 1],
                "embedding_size": 8,
                "hidden_sizes": [16, 32],
                "stem_channels": [3, 8, 8],
                "hidden_act": "relu",  # what the D-FINE presets' HGNetV2 uses
                "use_learnable_affine_block": True,
                "stackwise_stage_filters": [[8, 8, 16, 1, 1, 3], [16, 8, 32, 1, 1, 3]],
                "apply_downsample": [False, True],
                "use_lightweight_conv_block": [False, False],
                "image_shape": (None, None, 3),
                "out_features": ["stage1", "stage2"],
            },
        },
        "decoder_in_channels": [16, 16],
        "encoder_hidden_dim": 16,
        "num_labels": 4,
        "num_denoising": 0,  # denoising queries need ground-truth labels; inference has none
        "learn_initial_query": False,
        "num_queries": 8,
        "anchor_image_size": (32, 32),
        "feat_strides": [4, 8],
        "num_feature_levels": 2,
        "hidden_dim": 16,
        "encoder_in_channels": [16, 32],
        "encode_proj_layers": [1],
        "num_attention_heads": 2,
        "encoder_ffn_dim": 32,
        "num_encoder_layers": 1,
        "hidden_expansion": 0.5,
        "depth_multiplier": 0.5,
        "eval_idx": -1,
        "num_decoder_layers": 1,
        "decoder_attention_heads": 2,
        "decoder_ffn_dim": 32,
        "decoder_n_points": [2, 2],
        "lqe_hidden_dim": 16,
        "num_lqe_layers": 2,
        "seed": SEED,
        "image_shape": (32, 32, 3),
        "out_features": ["stage1", "stage2"],
    },
    "DINOV2Backbone": {
        "patch_size": 14,
        "num_layers": 1,
        "hidden_dim": 16,
        "num_heads": 2,
        "intermediate_dim": 32,
        "image_shape": (28, 28, 3),
        "position_embedding_shape": (28, 28, 3),  # the default 518x518 is a 37x37 table for 2x2 patches
    },
    "DINOV3Backbone": {
        "patch_size": 16,
        "num_layers": 1,
        "hidden_dim": 16,
        "num_heads": 2,
        "intermediate_dim": 32,
        "image_shape": (32, 32, 3),
    },
    "DebertaV3Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
        "bucket_size": 8,  # relative-position buckets: at most the length
    },
    "DeepLabV3Backbone": {
        "image_encoder": {
            "component": "ResNetBackbone",
            "config": {
                "input_conv_filters": [64],
                "input_conv_kernel_sizes": [7],
                "stackwise_num_filters": [64, 16, 16],  # ResNetBackbone insists on 64 first
                "stackwise_num_blocks": [1, 1, 1],
                "stackwise_num_strides": [1, 2, 2],
                "block_type": "basic_block",
            },
        },
        "spatial_pyramid_pooling_key": "P4",
        "upsampling_size": 4,  # P4 is 1/16 of the image, P2 1/4: x4 brings them together
        "dilation_rates": [2, 4],
        "low_level_feature_key": "P2",
        "projection_filters": 8,
        "image_shape": (64, 64, 3),  # its spatial pyramid pooling has a fixed 256 filters
    },
    "DeiTBackbone": {
        "image_shape": (32, 32, 3),
        "patch_size": 8,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "DenseNetBackbone": {"stackwise_num_repeats": [1, 1, 1, 1], "growth_rate": 4, "image_shape": (32, 32, 3)},
    "DepthAnythingBackbone": {
        # DPT's neck reads four layers of the image encoder: stage1..stage4 are DINOv2's four layers.
        "image_encoder": {
            "component": "DINOV2Backbone",
            "config": {
                "patch_size": 14,
                "num_layers": 4,
                "hidden_dim": 16,
                "num_heads": 2,
                "intermediate_dim": 32,
                "image_shape": (112, 112, 3),  # 8x8 patches: the 0.5 reassembly, then a 3x3 conv
                "position_embedding_shape": (112, 112, 3),
                "apply_layernorm": True,
            },
        },
        "reassemble_factors": [4, 2, 1, 0.5],
        "neck_hidden_dims": [8, 8, 8, 8],
        "fusion_hidden_dim": 8,
        "head_hidden_dim": 8,
        "head_in_index": -1,
        "feature_keys": ["stage1", "stage2", "stage3", "stage4"],
    },
    "DistilBertBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "ESM2Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "ESMBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "EdRecBackbone": {
        "vocab_size": 50,
        "num_layers_enc": 1,
        "num_layers_dec": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "num_heads": 2,
    },
    "EfficientNetBackbone": {
        # One stage of each block type: fused (MBConv without the depthwise conv) and unfused.
        "stackwise_kernel_sizes": [3, 3],
        "stackwise_num_repeats": [1, 1],
        "stackwise_input_filters": [8, 8],
        "stackwise_output_filters": [8, 16],
        "stackwise_expansion_ratios": [1, 2],
        "stackwise_squeeze_and_excite_ratios": [0.0, 0.25],
        "stackwise_strides": [1, 2],
        "stackwise_block_types": ["fused", "unfused"],
        "stackwise_force_input_filters": [0, 0],
        "stackwise_nores_option": [False, False],
        "width_coefficient": 1.0,
        "depth_coefficient": 1.0,
        "num_features": 32,
        "input_shape": (32, 32, 3),
    },
    "ElectraBackbone": {
        "vocab_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "embedding_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "FNetBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "FalconBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_attention_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "FluxBackbone": {
        "input_channels": 8,
        "hidden_size": 32,
        "mlp_ratio": 2.0,
        "num_heads": 2,
        "depth": 1,
        "depth_single_blocks": 1,
        "axes_dim": [4, 6, 6],  # the three RoPE axes share the head dim, 32 / 2 = 16
        "theta": 10000,
        "use_bias": True,
        "image_shape": (8, 8),  # (tokens, channels): the packed latent image
        "text_shape": (8, 16),
        "image_ids_shape": (8, 3),
        "text_ids_shape": (8, 3),
        "y_shape": (16,),  # the pooled text vector
    },
    "GPT2Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "GPTNeoXBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "Gemma3Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "image_size": 16,
        "head_dim": 8,
    },
    "Gemma3nBackbone": {
        "text_vocab_size": 50,
        "text_hidden_size": 16,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "intermediate_size": [32],
        "hidden_activation": "gelu_approximate",  # what every Gemma 3n preset uses (no default)
        "layer_types": ["full_attention"],
        "sliding_window": 4,
        "rope_theta": 10000.0,
        "max_position_embeddings": 16,
        "vocab_size_per_layer_input": 50,
        "hidden_size_per_layer_input": 4,
        "altup_num_inputs": 2,
        "laurel_rank": 2,
    },
    "Gemma4Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "image_size": 16,
        "head_dim": 8,
        "sliding_window_size": 4,
    },
    "GemmaBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "head_dim": 8,
    },
    "GptOssBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "num_experts": 2,
        "top_k": 2,
        "sliding_window": 4,
        "head_dim": 8,
    },
    "HGNetV2Backbone": {
        "depths": [1, 1],
        "embedding_size": 8,
        "hidden_sizes": [16, 32],
        "stem_channels": [3, 8, 8],
        "hidden_act": "relu",  # what the HGNetV2 presets use (no default)
        "use_learnable_affine_block": False,
        "stackwise_stage_filters": [[8, 8, 16, 1, 1, 3], [16, 8, 32, 1, 1, 3]],
        "apply_downsample": [False, True],
        "use_lightweight_conv_block": [False, False],
        "image_shape": (32, 32, 3),
    },
    "Llama3Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "LlamaBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "MetaCLIP2Backbone": {
        "vision_encoder": {
            "component": "MetaCLIP2VisionEncoder",
            "config": {
                "patch_size": 8,
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_dim": 32,
                "image_shape": (32, 32, 3),
            },
        },
        "text_encoder": {
            "component": "MetaCLIP2TextEncoder",
            "config": {
                "vocabulary_size": 50,
                "embedding_dim": 16,
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_dim": 32,
                "max_sequence_length": SEQUENCE_LENGTH,
            },
        },
        "projection_dim": 16,
    },
    "MetaCLIP2TextEncoder": {
        "vocabulary_size": 50,
        "embedding_dim": 16,
        "hidden_dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_dim": 32,
        "max_sequence_length": SEQUENCE_LENGTH,
    },
    "MetaCLIP2VisionEncoder": {
        "patch_size": 8,
        "hidden_dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_dim": 32,
        "image_shape": (32, 32, 3),
    },
    "MiTBackbone": {
        "layerwise_depths": [1, 1],
        "num_layers": 2,
        "layerwise_num_heads": [1, 2],
        "layerwise_sr_ratios": [4, 2],
        "max_drop_path_rate": 0.0,
        "layerwise_patch_sizes": [7, 3],
        "layerwise_strides": [4, 2],
        "image_shape": (32, 32, 3),
        "hidden_dims": [8, 16],
    },
    "MistralBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "sliding_window": 4,
    },
    "MixtralBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "num_experts": 2,
        "top_k": 2,
        "sliding_window": 4,
    },
    "MobileNetBackbone": {
        # One inverted-residual stack; stackwise_activation has one more entry, for the last layer.
        "stackwise_expansion": [[16]],
        "stackwise_num_blocks": [1],
        "stackwise_num_filters": [[8]],
        "stackwise_kernel_size": [[3]],
        "stackwise_num_strides": [[2]],
        "stackwise_se_ratio": [[0.25]],
        "stackwise_activation": [["hard_swish"], ["hard_swish"]],
        "stackwise_padding": [[1]],
        "output_num_filters": 32,
        "depthwise_filters": 8,
        "depthwise_stride": 2,
        "depthwise_residual": False,
        "last_layer_filter": 16,
        "squeeze_and_excite": 0.5,
        "input_num_filters": 8,
        "image_shape": (32, 32, 3),
    },
    "MobileNetV5Backbone": {
        # An edge-residual block then a universal-inverted-residual one, as Gemma 3n's encoder starts.
        "stackwise_block_types": [["er"], ["uir"]],
        "stackwise_num_blocks": [1, 1],
        "stackwise_num_filters": [[16], [16]],
        "stackwise_strides": [[2], [2]],
        "stackwise_act_layers": [["gelu"], ["gelu"]],  # the builder's default for preset blocks
        "stackwise_exp_ratios": [[4.0], [2.0]],
        "stackwise_se_ratios": [[0.0], [0.0]],
        "stackwise_dw_kernel_sizes": [[0], [3]],
        "stackwise_dw_start_kernel_sizes": [[0], [0]],
        "stackwise_dw_end_kernel_sizes": [[0], [0]],
        "stackwise_exp_kernel_sizes": [[3], [0]],
        "stackwise_pw_kernel_sizes": [[1], [0]],
        "stackwise_num_heads": [[0], [0]],
        "stackwise_key_dims": [[0], [0]],
        "stackwise_value_dims": [[0], [0]],
        "stackwise_kv_strides": [[0], [0]],
        "stackwise_use_cpe": [[False], [False]],
        "stem_size": 8,
        "num_features": 32,
        "use_msfa": False,  # the fusion adapter wants a 16x16 output
        "image_shape": (32, 32, 3),
    },
    "MoonshineBackbone": {
        "vocabulary_size": 50,
        "filter_dim": 16,
        "encoder_num_layers": 1,
        "decoder_num_layers": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "encoder_num_heads": 2,
        "decoder_num_heads": 2,
        "max_position_embeddings": 64,
    },
    "OPTBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "PARSeqBackbone": {
        "image_encoder": {
            "component": "ViTBackbone",
            "config": {
                "image_shape": (32, 64, 3),  # text lines are wide
                "patch_size": (8, 8),
                "num_layers": 1,
                "num_heads": 2,
                "hidden_dim": 16,
                "mlp_dim": 32,
                "use_class_token": False,
            },
        },
        "vocabulary_size": 50,
        "max_label_length": SEQUENCE_LENGTH - 1,  # the label plus its start token
        "decoder_hidden_dim": 16,
        "num_decoder_layers": 1,
        "num_decoder_heads": 2,
        "decoder_mlp_dim": 32,
        "dropout_rate": 0.0,
        "attention_dropout": 0.0,
    },
    "PaliGemmaBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "image_size": 16,
        "head_dim": 8,
        "vit_patch_size": 8,
        "vit_num_heads": 2,
        "vit_hidden_dim": 16,
        "vit_num_layers": 1,
        "vit_intermediate_dim": 32,
    },
    "Phi3Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "max_sequence_length": 16,
        "pretraining_sequence_length": 16,
    },
    "Qwen2Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "Qwen3Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "head_dim": 8,
    },
    "Qwen3MoeBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "head_dim": 8,
        "moe_intermediate_dim": 16,
        "num_experts": 2,
        "top_k": 2,
    },
    "Qwen3_5Backbone": {
        # Qwen 3.5 interleaves linear-attention (gated delta net) layers with full attention: one of each.
        "vocabulary_size": 50,
        "num_layers": 2,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "head_dim": 8,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 4,
        "linear_value_head_dim": 4,
    },
    "Qwen3_5MoeBackbone": {
        # Qwen 3.5 interleaves linear-attention (gated delta net) layers with full attention: one of each.
        "vocabulary_size": 50,
        "num_layers": 2,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "hidden_dim": 16,
        "moe_intermediate_dim": 16,
        "shared_expert_intermediate_size": 16,
        "num_experts": 2,
        "top_k": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 4,
        "linear_value_head_dim": 4,
    },
    "QwenBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "QwenMoeBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_query_heads": 2,
        "num_key_value_heads": 1,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "moe_intermediate_dim": 16,
        "shared_expert_intermediate_dim": 16,
        "num_experts": 2,
        "top_k": 2,
    },
    "RWKV7Backbone": {
        "hidden_size": 16,
        "head_size": 4,
        "num_layers": 1,
        "vocabulary_size": 50,
        "intermediate_dim": 32,
        "gate_lora": 8,
        "mv_lora": 8,
        "aaa_lora": 8,
        "decay_lora": 8,
    },
    "ResNetBackbone": {
        "input_conv_filters": [64],
        "input_conv_kernel_sizes": [7],
        "stackwise_num_filters": [64, 16],  # ResNetBackbone insists on 64 first
        "stackwise_num_blocks": [1, 1],
        "stackwise_num_strides": [1, 2],
        "block_type": "basic_block",
        "image_shape": (32, 32, 3),
    },
    "RetinaNetBackbone": {
        "image_encoder": _TINY_RESNET,
        # The feature pyramid's 256 filters are fixed: the levels are what can be cut, to P3-P5.
        "min_level": 3,
        "max_level": 5,
        "use_p5": True,
        "image_shape": (32, 32, 3),
    },
    "RobertaBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "RoformerV2Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "head_size": 8,
    },
    "SAM3PromptableConceptBackbone": {
        "vision_encoder": {
            "component": "sam3.sam3_vision_encoder.SAM3VisionEncoder",
            "config": {
                "image_shape": (28, 28, 3),
                "patch_size": 14,
                "num_layers": 1,
                "hidden_dim": 16,
                "intermediate_dim": 32,
                "num_heads": 2,
                "fpn_hidden_dim": 16,
                "fpn_scale_factors": [4.0, 2.0, 1.0, 0.5],
                "pretrain_image_shape": (28, 28, 3),
                "window_size": 2,
                "global_attn_indexes": [0],  # the one layer attends globally
            },
        },
        "text_encoder": {
            "component": "sam3.sam3_text_encoder.SAM3TextEncoder",
            "config": {
                "vocabulary_size": 50,
                "embedding_dim": 16,
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_dim": 32,
            },
        },
        "geometry_encoder": {
            "component": "sam3.sam3_geometry_encoder.SAM3GeometryEncoder",
            "config": {
                "num_layers": 1,
                "hidden_dim": 16,
                "intermediate_dim": 32,
                "num_heads": 2,
                "roi_size": 7,
            },
        },
        "detr_encoder": {
            "component": "sam3.sam3_detr_encoder.SAM3DetrEncoder",
            "config": {"num_layers": 1, "hidden_dim": 16, "intermediate_dim": 32, "num_heads": 2},
        },
        "detr_decoder": {
            "component": "sam3.sam3_detr_decoder.SAM3DetrDecoder",
            "config": {
                "image_shape": (28, 28, 3),
                "patch_size": 14,
                "num_layers": 1,
                "hidden_dim": 16,
                "intermediate_dim": 32,
                "num_heads": 2,
                "num_queries": 4,
            },
        },
        "mask_decoder": {
            "component": "sam3.sam3_mask_decoder.SAM3MaskDecoder",
            "config": {"num_upsampling_stages": 3, "hidden_dim": 16, "num_heads": 2},
        },
    },
    "SAMBackbone": {
        "image_encoder": {
            "component": "ViTDetBackbone",
            "config": {
                "hidden_size": 16,
                "num_layers": 1,
                "intermediate_dim": 32,
                "num_heads": 2,
                "global_attention_layer_indices": [0],
                "patch_size": 4,
                "num_output_channels": 8,
                "window_size": 2,
                "image_shape": (32, 32, 3),
            },
        },
        "prompt_encoder": {
            "component": "sam.sam_prompt_encoder.SAMPromptEncoder",
            "config": {
                "hidden_size": 8,  # the image encoder's num_output_channels
                "image_embedding_size": (8, 8),  # 32 / patch 4
                "input_image_size": (32, 32),
                "mask_in_channels": 4,
            },
        },
        "mask_decoder": {
            "component": "sam.sam_mask_decoder.SAMMaskDecoder",
            "config": {
                "num_layers": 1,
                "hidden_size": 8,
                "intermediate_dim": 16,
                "num_heads": 2,
                "embedding_dim": 8,
                "num_multimask_outputs": 3,
                "iou_head_depth": 2,
                "iou_head_hidden_dim": 8,
            },
        },
    },
    "SegFormerBackbone": {
        "image_encoder": {
            "component": "MiTBackbone",
            "config": {
                "layerwise_depths": [1, 1],
                "num_layers": 2,
                "layerwise_num_heads": [1, 2],
                "layerwise_sr_ratios": [4, 2],
                "max_drop_path_rate": 0.0,
                "layerwise_patch_sizes": [7, 3],
                "layerwise_strides": [4, 2],
                "image_shape": (32, 32, 3),
                "hidden_dims": [8, 16],
            },
        },
        "projection_filters": 16,
    },
    "SigLIPBackbone": {
        "vision_encoder": {
            "component": "SigLIPVisionEncoder",
            "config": {
                "patch_size": 8,
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_dim": 32,
                "image_shape": (32, 32, 3),
            },
        },
        "text_encoder": {
            "component": "SigLIPTextEncoder",
            "config": {
                "vocabulary_size": 50,
                "embedding_dim": 16,
                "hidden_dim": 16,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_dim": 32,
                "max_sequence_length": SEQUENCE_LENGTH,
            },
        },
    },
    "SigLIPTextEncoder": {
        "vocabulary_size": 50,
        "embedding_dim": 16,
        "hidden_dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_dim": 32,
        "max_sequence_length": SEQUENCE_LENGTH,
    },
    "SigLIPVisionEncoder": {
        "patch_size": 8,
        "hidden_dim": 16,
        "num_layers": 1,
        "num_heads": 2,
        "intermediate_dim": 32,
        "image_shape": (32, 32, 3),
    },
    "SmolLM3Backbone": _SMOLLM,
    "SmolLMBackbone": _SMOLLM,
    "StableDiffusion3Backbone": {
        "mmdit_patch_size": 2,
        "mmdit_hidden_dim": 32,
        "mmdit_num_layers": 1,
        "mmdit_num_heads": 2,
        "mmdit_position_size": 8,
        "mmdit_qk_norm": None,
        "mmdit_dual_attention_indices": None,
        "vae": {
            "component": "vae.vae_backbone.VAEBackbone",
            "config": {
                # Group normalization has 32 groups, so no VAE layer may have fewer than 32 channels.
                "encoder_num_filters": [32, 32, 32, 32],
                "encoder_num_blocks": [1, 1, 1, 1],
                "decoder_num_filters": [32, 32, 32, 32],
                "decoder_num_blocks": [1, 1, 1, 1],
                "sampler_method": "mode",  # deterministic: the mode, not a sample
            },
        },
        "clip_l": {
            "component": "CLIPTextEncoder",
            "config": {
                "vocabulary_size": 50,
                "embedding_dim": 16,
                "hidden_dim": 16,
                "num_layers": 2,
                "num_heads": 2,
                "intermediate_dim": 32,
                "intermediate_activation": "quick_gelu",
                "intermediate_output_index": -2,
                "max_sequence_length": SEQUENCE_LENGTH,
            },
        },
        # clip_l is OpenAI's CLIP (quick GELU), clip_g OpenCLIP bigG (GELU), as SD3's presets.
        "clip_g": {
            "component": "CLIPTextEncoder",
            "config": {
                "vocabulary_size": 50,
                "embedding_dim": 16,
                "hidden_dim": 16,
                "num_layers": 2,
                "num_heads": 2,
                "intermediate_dim": 32,
                "intermediate_activation": "gelu",
                "intermediate_output_index": -2,
                "max_sequence_length": SEQUENCE_LENGTH,
            },
        },
        "latent_channels": 16,
        "image_shape": (32, 32, 3),
    },
    "SwinTransformerBackbone": {
        "image_shape": (32, 32, 3),
        "embed_dim": 16,
        "depths": (2,),  # one window block, one shifted-window block
        "num_heads": (2,),
        "window_size": 4,
        "patch_size": 4,
    },
    "T5Backbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "T5Gemma2Backbone": _T5GEMMA_ENCODER_DECODER,
    "T5GemmaBackbone": _T5GEMMA_ENCODER_DECODER,
    "VGGBackbone": {"stackwise_num_repeats": [1, 1], "stackwise_num_filters": [8, 16], "image_shape": (32, 32, 3)},
    "ViTBackbone": {
        "image_shape": (32, 32, 3),
        "patch_size": 8,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "mlp_dim": 32,
    },
    "ViTDetBackbone": {
        "hidden_size": 16,
        "num_layers": 1,
        "intermediate_dim": 32,
        "num_heads": 2,
        "global_attention_layer_indices": [0],
        "image_shape": (32, 32, 3),
        "patch_size": 4,
        "num_output_channels": 8,
        "window_size": 2,
    },
    "VideoPrismBackbone": {
        "num_frames": 2,
        "patch_size": 8,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "num_heads": 2,
        "num_spatial_layers": 1,
        "num_temporal_layers": 1,
        "num_auxiliary_layers": 1,
        "image_shape": (32, 32, 3),
    },
    "WhisperBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "num_mels": 8,
        "max_encoder_sequence_length": 16,  # in log-mel frames, halved by the encoder
        "max_decoder_sequence_length": 16,
    },
    "XLMRobertaBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
        "max_sequence_length": 16,
    },
    "XLNetBackbone": {
        "vocabulary_size": 50,
        "num_layers": 1,
        "num_heads": 2,
        "hidden_dim": 16,
        "intermediate_dim": 32,
    },
    "XceptionBackbone": {
        "stackwise_conv_filters": [[8, 16], [32, 32]],
        "stackwise_pooling": [False, True],
        "image_shape": (32, 32, 3),
    },
    # keras.applications, one entry per module (see APPLICATIONS): ConvNeXt through its module's own constructor
    # at depth 1 and small widths, the others as their smallest builder at the smallest image side it takes
    APPLICATIONS + "convnext.ConvNeXt": {"depths": [1, 1, 1, 1], "projection_dims": [8, 16, 24, 32],
                                         "name": "convnext", **_APPLICATION},
    APPLICATIONS + "densenet.DenseNet121": _APPLICATION,
    APPLICATIONS + "efficientnet.EfficientNetB0": _APPLICATION,
    APPLICATIONS + "efficientnet_v2.EfficientNetV2B0": _APPLICATION,
    APPLICATIONS + "inception_resnet_v2.InceptionResNetV2": {**_APPLICATION, "input_shape": (75, 75, 3)},
    APPLICATIONS + "inception_v3.InceptionV3": {**_APPLICATION, "input_shape": (75, 75, 3)},
    APPLICATIONS + "mobilenet.MobileNet": {**_APPLICATION, "alpha": 0.25},
    APPLICATIONS + "mobilenet_v2.MobileNetV2": {**_APPLICATION, "alpha": 0.35},
    APPLICATIONS + "mobilenet_v3.MobileNetV3Small": _APPLICATION,
    APPLICATIONS + "nasnet.NASNetMobile": _APPLICATION,
    APPLICATIONS + "resnet.ResNet50": _APPLICATION,
    APPLICATIONS + "resnet_v2.ResNet50V2": _APPLICATION,
    APPLICATIONS + "vgg16.VGG16": _APPLICATION,
    APPLICATIONS + "vgg19.VGG19": _APPLICATION,
    APPLICATIONS + "xception.Xception": {**_APPLICATION, "input_shape": (71, 71, 3)},
}


CANNOT_BUILD = {
    "FeaturePyramidBackbone": "abstract base of the pyramid image encoders: no layers or config of its own",
}

# Inputs whose size the backbone leaves open but which need a particular one, by class and input name.
_INPUT_SHAPES = {
    # Moonshine reads raw 16 kHz audio; its convolutions (strides 64, 3, 2) need a few hundred samples.
    "MoonshineBackbone": {"encoder_input_values": (BATCH, 1600, 1), "encoder_padding_mask": (BATCH, 1600)},
    # Whisper reads log-mel frames (num_mels each), at most max_encoder_sequence_length of them.
    "WhisperBackbone": {"encoder_features": (BATCH, 16, 8)},
    # One box prompt per image: SAM 3's geometry encoder broadcasts its box mask wrongly for more (keras-hub 0.32).
    "SAM3PromptableConceptBackbone": {"boxes": (BATCH, 1, 5), "box_labels": (BATCH, 1)},
}
_VOCABULARY_ARGUMENTS = ("vocabulary_size", "vocab_size", "text_vocab_size", "vocab_size_per_layer_input")


def _keras_hub():
    import keras_hub  # imported on first use: importing this module must stay cheap

    return keras_hub


def _resolve_class(name):
    """A class of keras_hub.models, one named by its dotted path under keras_hub.src.models, or a keras.applications
    builder by its path under APPLICATIONS."""
    import importlib

    if "." not in name:
        return getattr(_keras_hub().models, name)
    module_path, class_name = name.rsplit(".", 1)
    if not name.startswith(APPLICATIONS):
        module_path = f"keras_hub.src.models.{module_path}"
    return getattr(importlib.import_module(module_path), class_name)


def _instantiate(value):
    """A config value with every nested {"component", "config"} spec built into its object."""
    if isinstance(value, dict) and set(value) == {"component", "config"}:
        return _resolve_class(value["component"])(**_instantiate(value["config"]))
    if isinstance(value, dict):
        return {key: _instantiate(item) for key, item in value.items()}
    return value


def _smallest_vocabulary(config):
    """The smallest vocabulary anywhere in a (nested) config, so that every token id fits every embedding."""
    sizes = []
    for key, value in config.items():
        if key in _VOCABULARY_ARGUMENTS and isinstance(value, int) and value > 0:
            sizes.append(value)
        elif isinstance(value, dict):
            nested = _smallest_vocabulary(value)
            if nested is not None:
                sizes.append(nested)
    return min(sizes) if sizes else None


def _example_input(name, shape, dtype, vocabulary, rng):
    """One random input, made from the input's name, as a preprocessor would make it."""
    lowered = name.lower()
    if dtype == "bool":
        return np.ones(shape, dtype=bool)
    if "int" in dtype:
        if "mask" in lowered:
            return np.ones(shape, dtype=dtype)  # every position is real: nothing is padding
        if "segment" in lowered:
            return np.zeros(shape, dtype=dtype)
        if "token" in lowered and vocabulary:
            return rng.integers(1, vocabulary, size=shape).astype(dtype)
        if "position" in lowered and len(shape) >= 2:
            return np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
        return np.ones(shape, dtype=dtype)  # labels, step counts: a valid small value
    if "mask" in lowered:
        return np.ones(shape, dtype=dtype)
    return rng.uniform(0.0, 1.0, size=shape).astype(dtype)  # images in [0, 1], features, coordinates


def _concrete_shape(name, shape):
    """The input's shape with batch BATCH and every other open dimension filled in."""
    filled = [BATCH]
    is_sequence = any(word in name.lower() for word in ("token", "mask", "segment", "ids", "position"))
    for size in shape[1:]:
        filled.append(size if size is not None else SEQUENCE_LENGTH if is_sequence else OPEN_DIMENSION)
    return tuple(filled)


def example_inputs(backbone, seed=SEED):
    """Random numpy inputs of batch BATCH with the structure of `backbone.input` (a dict or one array).

    Token ids are drawn below the smallest vocabulary in the backbone's own config (nested
    towers included), so they fit whichever config the backbone was built from.
    """
    import keras

    rng = np.random.default_rng(seed)
    vocabulary = _smallest_vocabulary(backbone.get_config())
    overrides = _INPUT_SHAPES.get(type(backbone).__name__, {})

    def make(name, tensor):
        shape = overrides.get(name) or _concrete_shape(name, tuple(tensor.shape))
        return _example_input(name, shape, keras.backend.standardize_dtype(tensor.dtype), vocabulary, rng)

    structure = backbone.input
    if isinstance(structure, dict):
        return {name: make(name, tensor) for name, tensor in structure.items()}
    if isinstance(structure, (list, tuple)):
        return [make(tensor.name, tensor) for tensor in structure]
    return make(structure.name, structure)


def build(class_name):
    """(backbone, inputs): the class built from its tiny config, and random inputs of batch 2 that it accepts."""
    if class_name in CANNOT_BUILD:
        raise ValueError(f"{class_name} cannot be built: {CANNOT_BUILD[class_name]}")
    import keras

    keras.utils.set_random_seed(SEED)  # the same weights on every run
    config = TINY_CONFIGS[class_name]
    backbone = _resolve_class(class_name)(**_instantiate(config))
    return backbone, example_inputs(backbone)


def backbone_class_names():
    """Every attribute of keras_hub.models that subclasses keras_hub.models.Backbone, the base excluded."""
    import inspect

    models = _keras_hub().models
    return sorted(
        name for name in dir(models)
        if inspect.isclass(getattr(models, name))
        and issubclass(getattr(models, name), models.Backbone)
        and getattr(models, name) is not models.Backbone
    )


def application_builders():
    """{name: the module that holds it} for every function of keras.applications that takes `weights`."""
    import inspect

    import keras

    builders = {name: getattr(keras.applications, name) for name in dir(keras.applications)}
    return {name: inspect.getmodule(builder).__name__ for name, builder in builders.items()
            if inspect.isfunction(builder) and "weights" in inspect.signature(builder).parameters}


def application_entries():
    """{module: its entry's name in TINY_CONFIGS} for the keras.applications modules."""
    return {name.rsplit(".", 1)[0]: name for name in TINY_CONFIGS if name.startswith(APPLICATIONS)}


def family_names():
    """Every family to sweep: the keras-hub Backbone classes, then one entry per keras.applications module."""
    return backbone_class_names() + sorted(application_entries().values())


def gelu_forms(backbone, inputs=None):
    """The set of GELU forms ("erf", "tanh", "sigmoid", "fused") that the backbone's call computes
    (`gelu_evidence`): the call traced with tf.function on TensorSpecs of the inputs' concrete shapes (made by
    `example_inputs` when not given), its graph read with its function library.

    The backbone is called eagerly once before the trace: a few layers make state from the
    values of their first inputs (Stable Diffusion 3's scheduler its sigma table, from
    num_steps), which a graph trace cannot do.
    """
    import tensorflow as tf

    if inputs is None:
        inputs = example_inputs(backbone)
    backbone(inputs, training=False)
    specs = tf.nest.map_structure(lambda array: tf.TensorSpec(np.shape(array), tf.as_dtype(array.dtype)), inputs)
    concrete = tf.function(lambda x: backbone(x, training=False)).get_concrete_function(specs)
    return gelu_evidence.forms_in_graph(concrete.graph.as_graph_def())


def computes_gelu(backbone, inputs=None):
    """Whether the backbone computes a GELU in any form, read from its traced graph (see `gelu_forms`)."""
    return bool(gelu_forms(backbone, inputs))
