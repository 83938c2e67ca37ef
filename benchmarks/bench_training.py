"""The headline: how much faster a model trains with keras_gelu than with Keras's own GELU, per epoch.

Two models, trained with `model.fit` on random data (the time does not
depend on the values):

* FFN stack: 2 blocks of Dense 256 -> 1024 (GELU) -> 256 with residual and
  LayerNormalization, sequences of 128 tokens, batch 32.
* Transformer encoder: 2 layers of 4-head self-attention and that FFN block.

Each activation variant gets its own model; after a warm-up epoch the
variants train one epoch each in turn, for several rounds, and the table shows
each one's fastest and median epoch, and the medians as ratios to
`activation="gelu"` and to ReLU (the fastest epoch of a few says little on a
shared machine: one undisturbed epoch of ReLU's made a 1.24x ratio that the
medians put at 1.00x). An epoch is timed from its first step to its last,
inside `model.fit` (`timing.fit_epoch_seconds`: fit's own set-up around the
steps added 0.6 s to random epochs, whatever the activation). Runs the
Keras flavour chosen by TF_USE_LEGACY_KERAS; `--flavours keras3 tf-keras`
runs each in its own process. Ratios measured in one run on a shared, noisy
machine; not a test.

    python benchmarks/bench_training.py [--rounds 7] [--steps 8] [--flavours keras3 tf-keras]
"""

import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import flavours  # noqa: E402

SEQUENCE, WIDTH, HIDDEN, BATCH, BLOCKS, HEADS = 128, 256, 1024, 32, 2, 4


def variants():
    import keras_gelu

    return {
        'activation="gelu" (Keras, exact)': "gelu",
        "keras_gelu.GELU() (exact)": keras_gelu.GELU(),
        'keras_gelu.GELU("tanh")': keras_gelu.GELU("tanh"),
        "relu": "relu",
    }


def build(kind, activation):
    from keras_gelu.flavour import keras

    tokens = keras.Input((SEQUENCE, WIDTH))
    h = tokens
    for _ in range(BLOCKS):
        if kind == "Transformer encoder":
            h = keras.layers.LayerNormalization()(h + keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(h, h))
        ffn = keras.layers.Dense(WIDTH)(keras.layers.Dense(HIDDEN, activation=activation)(h))
        h = keras.layers.LayerNormalization()(h + ffn)
    model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile(keras.optimizers.Adam(1e-4), "mse")
    return model


def table(rounds, steps):
    import numpy as np
    import tensorflow as tf

    import keras_gelu
    import machine
    import timing

    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * steps, SEQUENCE, WIDTH)).astype(np.float32)
    y = rng.normal(size=(BATCH * steps, 1)).astype(np.float32)
    print(f"\n## Training time per epoch ({steps} steps of batch {BATCH}), {keras_gelu.KERAS_FLAVOUR}, "
          f"TF {tf.__version__}\n")
    jit = build("FFN stack", "relu").jit_compile
    print(f"{machine.header()}; {rounds} interleaved epochs; model.fit compiles the whole step with XLA: {jit}\n")
    print("| model | activation | fastest s / epoch | median s / epoch | vs activation=\"gelu\" (speed-up, medians) "
          "| vs relu (time, medians) |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in ("FFN stack", "Transformer encoder"):
        models = {name: build(kind, activation) for name, activation in variants().items()}
        samples = timing.fit_epoch_seconds(models, x, y, BATCH, rounds)
        medians = {name: statistics.median(values) for name, values in samples.items()}
        keras_gelu_time, relu_time = medians['activation="gelu" (Keras, exact)'], medians["relu"]
        for name, seconds in medians.items():
            print(f"| {kind} | {name} | {min(samples[name]):.2f} | {seconds:.2f} "
                  f"| {keras_gelu_time / seconds:.2f}x | {seconds / relu_time:.2f}x |", flush=True)


def main():
    flavours.main(__doc__, table, rounds=7, steps=8,
                  round_help="interleaved epochs per variant", steps_help="steps per epoch")


if __name__ == "__main__":
    main()
