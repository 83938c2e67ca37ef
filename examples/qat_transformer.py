"""A tiny Transformer encoder (attention + GELU feed-forward) to int8, for each GELU function.

The task is generated from the seed (examples/tasks.py): sequences of 24 tokens out of 12,
and the class is which of the tokens 0-5 occurs most often (ties go to the
smaller token). Counting across the sequence is what attention is for.

For each GELU function (exact, tanh, sigmoid, learnable) the script trains the float
encoder, quantizes it after training (PTQ, calibrated on training
sequences), then runs quantization-aware training with
keras_gelu.qat.quantize_model (its int8 ranges started from the
same calibration samples) and converts that with keras-gelu-convert --int8.
It prints a table of the four accuracies, and writes one int8 .tflite per
function.

tfmot quantizes Dense, Add and pooling layers itself but has no config for
attention, so the encoder's attention is a small layer defined here with a
QuantizeConfig of its own: its template for your own layers. There is no
LayerNormalization either (tfmot cannot quantize it); the block is
residual-only, which a model this small trains well without.

    python examples/qat_transformer.py [--functions exact,learnable] [--epochs 12] [--output-dir qat_transformer_output]

QAT runs on tf-keras with tfmot unless TF_USE_LEGACY_KERAS=0 is set, which
runs it on Keras 3 with keras_gelu's own engine (no tfmot); the attention
layer then has a QuantizeRule instead of a QuantizeConfig. Keras 3's engine
also has rules for Keras's own layers: `--attention multi_head` builds the
usual post-LayerNormalization block on keras.layers.MultiHeadAttention
(Keras 3 only).
"""

import sys

import int8_recipe
from int8_recipe import keras
from int8_recipe import tf

import keras_gelu
import numpy as np

from keras_gelu import replacements
import keras_gelu.qat
from tasks import CLASSES
from tasks import SEQUENCE_LENGTH
from tasks import VOCABULARY
from tasks import make_sequence_task


class DotProductAttention(keras.layers.Layer):
    """softmax(q k^T) v over a sequence, for [q, k, v] of shape (batch, length, width).

    The 1/sqrt(width) scale is left to the query projection to learn, which
    saves an op in the int8 model.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.quantized_call = None  # set by AttentionQuantizeConfig for QAT

    def call(self, inputs):
        if self.quantized_call is not None:
            return self.quantized_call(inputs)
        query, key, value = inputs
        return tf.matmul(tf.nn.softmax(tf.matmul(query, key, transpose_b=True)), value)

    def compute_output_shape(self, input_shapes):
        return input_shapes[2]


def attention_quantize_config():
    """A QuantizeConfig for DotProductAttention, mirroring its int8 ops.

    BATCH_MATMUL (scores: a moving-average range), SOFTMAX (TFLite's fixed
    grid of k/256, the same as LOGISTIC's), BATCH_MATMUL (the output range).
    """
    from keras_gelu.qat.tfmot.configs import IntermediateQuantizer
    from keras_gelu.qat.tfmot.configs import activation_quantizer

    tfmot_keras = keras_gelu.qat.require_tfmot()

    class AttentionQuantizeConfig(tfmot_keras.QuantizeConfig):
        def get_weights_and_quantizers(self, layer):
            return []

        def get_activations_and_quantizers(self, layer):
            return [(keras.activations.linear, IntermediateQuantizer(0))]

        def set_quantize_weights(self, layer, quantize_weights):
            pass

        def set_quantize_activations(self, layer, quantize_activations):
            (quantized_scores,) = quantize_activations

            def quantized_call(inputs):
                query, key, value = inputs
                scores = quantized_scores(tf.matmul(query, key, transpose_b=True))
                return tf.matmul(replacements.on_logistic_int8_grid(tf.nn.softmax(scores)), value)

            layer.quantized_call = quantized_call

        def get_output_quantizers(self, layer):
            return [activation_quantizer()]

        def get_config(self):
            return {}

    return AttentionQuantizeConfig()


def attention_rule():
    """The same for Keras 3's QAT engine: a QuantizeRule (keras_gelu.qat.register_rule)."""
    from keras_gelu.qat import QuantizeRule

    class AttentionRule(QuantizeRule):
        def build(self, wrapper, layer):
            wrapper.add_activation_range("scores")
            wrapper.add_activation_range("output")

        def call(self, wrapper, layer, inputs, training, **kwargs):
            query, key, value = inputs
            scores = wrapper.ranges["scores"](tf.matmul(query, key, transpose_b=True), training)
            probabilities = replacements.on_logistic_int8_grid(tf.nn.softmax(scores))
            return wrapper.ranges["output"](tf.matmul(probabilities, value), training)

    return AttentionRule()


def build_encoder(function, width, attention="dot_product"):
    inputs = keras.Input((SEQUENCE_LENGTH, VOCABULARY + SEQUENCE_LENGTH), name="tokens")
    hidden = keras.layers.Dense(width, name="embed")(inputs)
    if attention == "multi_head":
        attended = keras.layers.MultiHeadAttention(2, width // 2, name="attention")(hidden, hidden)
    else:
        attended = keras.layers.Dense(width, name="attention_out")(DotProductAttention(name="attention")(
            [keras.layers.Dense(width, name=name)(hidden) for name in ("query", "key", "value")]))
    hidden = keras.layers.Add(name="residual_1")([hidden, attended])
    if attention == "multi_head":
        hidden = keras.layers.LayerNormalization(name="norm_1")(hidden)
    expanded = keras.layers.Dense(4 * width, activation=keras_gelu.gelu_layer(function), name="ffn_in")(hidden)
    hidden = keras.layers.Add(name="residual_2")([hidden, keras.layers.Dense(width, name="ffn_out")(expanded)])
    if attention == "multi_head":
        hidden = keras.layers.LayerNormalization(name="norm_2")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(hidden)
    return keras.Model(inputs, keras.layers.Dense(CLASSES, name="logits")(pooled), name=f"encoder_{function}")


def quantize_encoder(model, mode, exact_as, calibration_data=None):
    """quantize_model with the attention layer quantized by its own config (tfmot) or rule (Keras 3)."""
    if keras_gelu.KERAS_FLAVOUR == "keras3":
        keras_gelu.qat.register_rule(DotProductAttention, attention_rule())
        return keras_gelu.qat.quantize_model(model, mode=mode, exact_as=exact_as, calibration_data=calibration_data)
    tfmot_keras = keras_gelu.qat.require_tfmot()
    config = attention_quantize_config()

    def annotate(layer):
        if isinstance(layer, DotProductAttention):
            return tfmot_keras.quantize_annotate_layer(layer, config)
        return layer

    annotated = keras.models.clone_model(model, clone_function=annotate)
    with tfmot_keras.quantize_scope({"AttentionQuantizeConfig": type(config),
                                     "DotProductAttention": DotProductAttention}):
        return keras_gelu.qat.quantize_model(annotated, mode=mode, exact_as=exact_as, calibration_data=calibration_data)


def _check_attention(parser, args):
    if args.attention == "multi_head" and keras_gelu.KERAS_FLAVOUR != "keras3":
        parser.error("--attention multi_head needs Keras 3's QAT engine (TF_USE_LEGACY_KERAS=0): tfmot has no "
                     "config for MultiHeadAttention or LayerNormalization")
    if args.attention == "multi_head" and args.width % 2:
        parser.error(f"--attention multi_head splits --width over 2 heads; got --width {args.width}")


def main(argv=None):
    parser = int8_recipe.argument_parser(__doc__, "qat_transformer_output", epochs=12, qat_epochs=3,
                                         qat_learning_rate=3e-5, width=32)
    parser.add_argument("--train-size", type=int, default=4000, help="training sequences (default 4000)")
    parser.add_argument("--test-size", type=int, default=1000, help="test sequences (default 1000)")
    parser.add_argument("--attention", choices=("dot_product", "multi_head"), default="dot_product",
                        help="dot_product: the attention layer defined here, in a residual-only block (default); "
                             "multi_head: keras.layers.MultiHeadAttention, 2 heads, with LayerNormalization "
                             "(Keras 3 only: tfmot has no config for either)")
    args = int8_recipe.parse_arguments(parser, argv, "encoder", positive=("train_size", "test_size"),
                                       check=_check_attention)
    x_train, y_train = make_sequence_task(args.train_size, args.seed)
    x_test, y_test = make_sequence_task(args.test_size, args.seed + 1)
    print(f"task: most frequent of tokens 0-{CLASSES - 1} in {SEQUENCE_LENGTH} tokens out of {VOCABULARY}; "
          f"{args.train_size} train / {args.test_size} test sequences; majority class "
          f"{np.bincount(y_test).max() / len(y_test):.3f}; attention {args.attention}; {int8_recipe.describe(args)}")
    results = [int8_recipe.compare_float_ptq_qat(function, lambda f: build_encoder(f, args.width, args.attention),
                                                 (x_train, y_train, x_test, y_test), args, "tokens",
                                                 learning_rate=3e-3, batch_size=64, quantize=quantize_encoder)
               for function in args.functions]
    int8_recipe.print_results(results, args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
