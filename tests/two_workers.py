"""One worker of a two-worker MultiWorkerMirroredStrategy run on the loopback interface (see test_distribute).

    python two_workers.py INDEX PORT0,PORT1 OUTPUT.npz

Each worker trains the same tfmot QAT model for a few steps on its shard of
every batch and saves every variable's value, by name, to OUTPUT.npz, with
the extremes of all the inputs it was shown under "inputs_seen".
"""

import json
import os
import sys

index, ports, output = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
    "task": {"type": "worker", "index": index},
})
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tfmot's flavour; Keras 3 on TensorFlow does not train multi-worker

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()

import keras_gelu  # noqa: E402
import keras_gelu.qat  # noqa: E402
from keras_gelu.flavour import keras  # noqa: E402

rng = np.random.default_rng(7)
x = rng.normal(scale=2.0, size=(64, 6)).astype(np.float32)
y = np.tanh(x[:, :2] * x[:, 2:4]).astype(np.float32)
# Each worker takes its own half of every global batch of 32 (auto-sharding by data), as two machines would.
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).with_options(options)

keras.utils.set_random_seed(3)
with strategy.scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras_gelu.GELU("exact"),
                              keras_gelu.LearnableGELU(), keras.layers.Dense(2)])
    model = keras_gelu.qat.quantize_model(model)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
model.fit(dataset, epochs=1, verbose=0)
np.savez(output, inputs_seen=np.array([x.min(), x.max()]),
         **{variable.name: variable.numpy() for variable in model.variables})
