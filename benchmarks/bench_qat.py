"""What quantization-aware training costs: a QAT training epoch against the float model's, per engine.

tfmot under tf-keras, keras_gelu.qat under Keras 3, on the same models:

* MLP: 64 -> 256 -> 256 -> 10, the GELU as each Dense's activation;
* CNN: 8x8x1 -> Conv2D 16 -> MaxPooling -> Conv2D 32 -> GlobalAveragePooling -> Dense 10;
* Encoder (Keras 3 only: tfmot has no config for its layers): 16 tokens of 32, MultiHeadAttention (2 heads),
  Add, LayerNormalization, Dense 128 with the GELU, Dense 32, Add, LayerNormalization, pooled, Dense 10.

For each GELU function the float model and its QAT copy (`quantize_model`,
builtin mode) train one epoch each in turn after a warm-up epoch; the table
shows each one's fastest epoch and QAT's as a ratio to float. Runs the Keras
flavour chosen by TF_USE_LEGACY_KERAS; `--flavours keras3 tf-keras` runs each
in its own process. Ratios measured in one run on a shared, noisy machine;
not a test.

    python benchmarks/bench_qat.py [--rounds 5] [--steps 20] [--flavours keras3 tf-keras]
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import flavours  # noqa: E402

BATCH = 64
FUNCTIONS = ("exact", "sigmoid", "learnable")


def build(kind, function):
    import keras_gelu
    from keras_gelu.flavour import keras

    if kind == "MLP":
        inputs = keras.Input((64,))
        hidden = keras.layers.Dense(256, activation=keras_gelu.gelu_layer(function))(inputs)
        hidden = keras.layers.Dense(256, activation=keras_gelu.gelu_layer(function))(hidden)
    elif kind == "Encoder":
        inputs = keras.Input((16, 32))
        hidden = keras.layers.Add()([inputs, keras.layers.MultiHeadAttention(2, 16)(inputs, inputs)])
        hidden = keras.layers.LayerNormalization()(hidden)
        expanded = keras.layers.Dense(128, activation=keras_gelu.gelu_layer(function))(hidden)
        hidden = keras.layers.LayerNormalization()(keras.layers.Add()([hidden, keras.layers.Dense(32)(expanded)]))
        hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    else:
        inputs = keras.Input((8, 8, 1))
        hidden = keras.layers.Conv2D(16, 3, padding="same", activation=keras_gelu.gelu_layer(function))(inputs)
        hidden = keras.layers.MaxPooling2D()(hidden)
        hidden = keras.layers.Conv2D(32, 3, padding="same", activation=keras_gelu.gelu_layer(function))(hidden)
        hidden = keras.layers.GlobalAveragePooling2D()(hidden)
    return keras.Model(inputs, keras.layers.Dense(10)(hidden))


def table(rounds, steps):
    import numpy as np
    import tensorflow as tf

    import keras_gelu
    import machine
    import timing
    import keras_gelu.qat
    from keras_gelu.flavour import keras

    engine = "tfmot" if keras_gelu.KERAS_FLAVOUR == "tf_keras" else "keras_gelu.qat"
    print(f"\n## QAT epoch time against float ({steps} steps of batch {BATCH}), {keras_gelu.KERAS_FLAVOUR} "
          f"({engine}), TF {tf.__version__}\n")
    print(f"{machine.header()}; {rounds} interleaved epochs\n")
    print("| model | GELU | float s / epoch | QAT s / epoch | QAT / float |")
    print("|---|---|---:|---:|---:|")
    rng = np.random.default_rng(0)
    kinds = [("MLP", (64,)), ("CNN", (8, 8, 1))] + [("Encoder", (16, 32))] * (keras_gelu.KERAS_FLAVOUR == "keras3")
    for kind, shape in kinds:
        x = rng.uniform(0, 1, size=(BATCH * steps, *shape)).astype(np.float32)
        y = rng.integers(0, 10, size=BATCH * steps)
        for function in FUNCTIONS:
            keras.utils.set_random_seed(0)
            float_model = build(kind, function)
            models = {"float": float_model,
                      "QAT": keras_gelu.qat.quantize_model(float_model, mode="builtin", calibration_data=x[:256])}
            for model in models.values():
                model.compile(keras.optimizers.Adam(1e-4),
                              keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            seconds = timing.fit_epoch_seconds(models, x, y, BATCH, rounds)
            # The fastest epoch is the least disturbed: on this shared machine whole epochs run 2x slower at times.
            fastest = {name: min(values) for name, values in seconds.items()}
            print(f"| {kind} | {function} | {fastest['float']:.3f} | {fastest['QAT']:.3f} "
                  f"| {fastest['QAT'] / fastest['float']:.2f}x |", flush=True)


def main():
    flavours.main(__doc__, table, rounds=5, steps=20,
                  round_help="interleaved epochs per model", steps_help="steps per epoch")


if __name__ == "__main__":
    main()
