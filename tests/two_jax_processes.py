"""One of two JAX processes training a Keras 3 QAT model under keras.distribution.DataParallel (see test_distribute).

    python two_jax_processes.py INDEX PORT FOLDER

The two processes meet on the loopback interface (jax.distributed, CPU collectives over gloo), as two machines
would. Each feeds its own half of every global batch of 32 and trains the same QAT model (keras_gelu's engine,
no calibration data: the ranges start from the first batch) for one epoch. Each saves every variable's value,
by path, to FOLDER/INDEX.npz; the chief (process 0) also saves the model, FOLDER/model.keras, and its outputs on
the first 16 inputs, FOLDER/outputs.npy.
"""

import os
import sys

import numpy as np

GLOBAL_BATCH = 32
INPUTS, OUTPUTS = 6, 2


def data(index):
    """The global data set (every process draws the same), and process `index`'s half of every global batch."""
    rng = np.random.default_rng(7)
    x = rng.normal(scale=2.0, size=(4 * GLOBAL_BATCH, INPUTS)).astype(np.float32)
    y = np.tanh(x[:, :2] * x[:, 2:4]).astype(np.float32)
    half = GLOBAL_BATCH // 2
    rows = np.concatenate([np.arange(start + index * half, start + (index + 1) * half)
                           for start in range(0, len(x), GLOBAL_BATCH)])
    return x, x[rows], y[rows]


def main(index, port, folder):
    os.environ["KERAS_BACKEND"] = "jax"
    # Keras imports TensorFlow where it is installed (for its tf.keras API), which nothing here uses: kept out,
    # as an environment with JAX alone would have it (the import is two thirds of a process's start).
    sys.modules["tensorflow"] = None
    # XLA's CPU code generated without its fusion emitters: what the two processes agree on is the subject here,
    # and XLA's default code generation is the JAX leg's. Compiling the QAT step with them was a third of the
    # pair's CPU time (27 CPU-s, 17.5 s of wall; 20 and 12.7 s without). (LLVM's level 0 would save more, but
    # there the step computed NaN gradients, in jax.jit only: docs/development.md.)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_use_fusion_emitters=false").strip()
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=index)
    import keras_gelu
    import keras_gelu.qat
    from keras_gelu.flavour import keras

    x, local_x, local_y = data(index)
    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
    distribution.auto_shard_dataset = False  # each process feeds its own half
    keras.distribution.set_distribution(distribution)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((INPUTS,)), keras.layers.Dense(8), keras_gelu.GELU("exact"),
                              keras_gelu.LearnableGELU(), keras.layers.Dense(OUTPUTS)])
    model = keras_gelu.qat.quantize_model(model)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    model.fit(local_x, local_y, batch_size=GLOBAL_BATCH // 2, epochs=1, shuffle=False, verbose=0)
    np.savez(os.path.join(folder, f"{index}.npz"),
             **{variable.path: keras.ops.convert_to_numpy(variable.value) for variable in model.variables})
    if index == 0:
        keras.distribution.set_distribution(None)  # the chief's own copy: saved and run as one machine's model
        model.save(os.path.join(folder, "model.keras"))
        np.save(os.path.join(folder, "outputs.npy"), keras.ops.convert_to_numpy(model(x[:16])))


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
