"""Distributed training: MirroredStrategy over the two logical CPUs conftest makes, in both Keras flavours.

A replica sees half the global batch; the cross-replica sum of its gradients
is the single-device gradient of the whole batch, up to the order of float32
additions. QAT is checked to train, to end with one model on every replica
and worker, and to convert. Past one process: tf-keras's two workers under
MultiWorkerMirroredStrategy, and Keras 3's two JAX processes under
keras.distribution.DataParallel, each pair on the loopback interface.
"""

import importlib.util
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_gelu
import tflite_helpers
import two_jax_processes
from conftest import IS_KERAS3
from conftest import keras
from conftest import todays_share
from conversions import QAT_INT8_STEPS
from keras_gelu import converters
from keras_gelu.converters.tflite import operators
import keras_gelu.qat

pytestmark = pytest.mark.legs("keras3", "tf_keras")

LAYERS = {
    "GELU exact": lambda: keras_gelu.GELU("exact"),
    "GELU tanh": lambda: keras_gelu.GELU("tanh"),
    "GELU sigmoid": lambda: keras_gelu.GELU("sigmoid"),
    "LearnableGELU": lambda: keras_gelu.LearnableGELU(),
    "activation function": lambda: keras.layers.Activation(keras_gelu.gelu_exact),
}
HAS_QAT = IS_KERAS3 or importlib.util.find_spec("tensorflow_model_optimization") is not None


@pytest.fixture(scope="module")
def devices():
    names = [device.name for device in tf.config.list_logical_devices("CPU")]
    assert len(names) == 2, "conftest gives TensorFlow two logical CPUs"
    return names


@pytest.fixture(scope="module")
def mirrored(devices):
    """One strategy for the module: strategies made one after another in a process reuse collective instance
    keys, and a later model's all-reduce then meets an earlier model's (TensorFlow aborts on the shapes)."""
    return tf.distribute.MirroredStrategy(devices)


def _batch(n=32, seed=7):
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=2.0, size=(n, 6)).astype(np.float32)
    return x, np.tanh(x[:, :2] * x[:, 2:4]).astype(np.float32)


def _model(layer):
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), layer, keras.layers.Dense(2)])


def _one_step(strategy, layer):
    x, y = _batch()
    with strategy.scope():
        model = _model(LAYERS[layer]())
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [weight.numpy().copy() for weight in model.weights]
    model.train_on_batch(x, y)  # one step on the global batch of 32: 16 per replica
    return before, [weight.numpy() for weight in model.weights]


@pytest.mark.parametrize("layer", todays_share(LAYERS, 2))
def test_one_mirrored_step_equals_the_single_device_step(mirrored, devices, layer):
    before, distributed = _one_step(mirrored, layer)
    _, single = _one_step(tf.distribute.OneDeviceStrategy(devices[0]), layer)
    assert all(not np.array_equal(old, new) for old, new in zip(before, single))  # every weight trained
    for got, want in zip(distributed, single):
        # The same update up to the order of the cross-replica sum: float32 rounding of values below 10.
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.skipif(not HAS_QAT, reason="QAT under tf-keras needs tensorflow-model-optimization")
@pytest.mark.parametrize("layer", todays_share(["GELU exact", "GELU tanh", "LearnableGELU"], 1))
def test_qat_trains_under_mirrored_strategy_and_converts_to_integer(mirrored, layer):
    """Both engines (tfmot under tf-keras, keras_gelu.qat under Keras 3), quantized inside the strategy."""
    x, y = _batch(128)
    with mirrored.scope():
        model = keras_gelu.qat.quantize_model(_model(LAYERS[layer]()), calibration_data=x)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    assert model.evaluate(x, y, verbose=0) < before
    _, report = converters.convert(model, int8=True)  # the live model, its variables mirrored
    assert report.quantization_aware and report.float_ops == {}, report.op_types
    assert report.verified and all(comparison["passed"] for comparison in report.fidelity), report.fidelity


def _replicas_disagreeing(model):
    """The variables whose copies on the replicas differ, with the largest difference."""
    disagreeing = {}
    for variable in model.variables:
        copies = [np.asarray(copy.numpy()) for copy in getattr(variable, "values", [variable])]
        difference = max(float(np.max(np.abs(copy - copies[0]))) for copy in copies)
        if difference:
            disagreeing[variable.name] = difference
    return disagreeing


@pytest.mark.skipif(not HAS_QAT, reason="QAT under tf-keras needs tensorflow-model-optimization")
def test_qat_replicas_agree_on_every_variable_and_the_input_range_is_the_whole_batchs(mirrored):
    """Both engines. tfmot's own input quantizer assigned each replica the range of its own half of the batch;
    the replicas must hold one model, whose input range (tfmot's: every value seen) is that of the whole batch,
    zero included, as TFLite's ranges."""
    x, y = _batch(32)
    with mirrored.scope():
        model = keras_gelu.qat.quantize_model(_model(LAYERS["LearnableGELU"]()))
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    model.train_on_batch(x, y)  # one global batch: each replica quantizes its 16 samples
    assert _replicas_disagreeing(model) == {}
    if IS_KERAS3:
        return  # Keras 3's engine: moving averages, which the replicas average, from the first batch on
    input_range = [variable for variable in model.variables if variable.name.endswith(("_min:0", "_max:0"))][:2]
    np.testing.assert_array_equal([float(variable.numpy()) for variable in input_range],
                                  [min(x.min(), 0.0), max(x.max(), 0.0)])


def _the_variables_both_end_with(folder, scripts, **environment):
    """Run the two processes (Python scripts with their arguments) to their end, each saving its variables to
    folder/INDEX.npz; the chief's, once they are known to be the other's, value for value."""
    workers = [subprocess.Popen([sys.executable, *script], env={**os.environ, **environment}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for script in scripts]
    outputs = [worker.communicate(timeout=300)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], outputs
    chief, other = (np.load(folder / f"{index}.npz") for index in range(2))
    assert sorted(chief.files) == sorted(other.files) and len(chief.files) > 10, chief.files
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name], err_msg=name)
    return chief


@pytest.mark.legs("tf_keras")  # Keras 3 on TensorFlow does not train under MultiWorkerMirroredStrategy
@pytest.mark.skipif(not HAS_QAT, reason="QAT under tf-keras needs tensorflow-model-optimization")
def test_two_workers_on_the_loopback_interface_end_qat_with_the_same_variables(tmp_path):
    ports = []
    for _ in range(2):  # two free ports, held until both are known so that they differ
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        ports.append(listener)
    names = ",".join(str(listener.getsockname()[1]) for listener in ports)
    for listener in ports:
        listener.close()
    script = os.path.join(os.path.dirname(__file__), "two_workers.py")
    chief = _the_variables_both_end_with(
        tmp_path, [[script, str(index), names, str(tmp_path / f"{index}.npz")] for index in range(2)])
    low, high = chief["inputs_seen"]  # both workers' data: the range of every input either worker quantized
    np.testing.assert_array_equal([chief["quantize_layer/quantize_layer_min:0"],
                                   chief["quantize_layer/quantize_layer_max:0"]], [min(low, 0.0), max(high, 0.0)])


def _free_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        return listener.getsockname()[1]


def _moving_range(batches):
    """The Keras 3 engine's activation range over `batches`, by its definition (ranges.ActivationRange): the
    first batch's range, zero included, then a moving average (decay 0.999) of each batch's; in float32."""
    decay = np.float32(0.999)
    low, high = np.float32(min(batches[0].min(), 0.0)), np.float32(max(batches[0].max(), 0.0))
    for batch in batches[1:]:
        low = decay * low + (np.float32(1.0) - decay) * np.float32(min(batch.min(), 0.0))
        high = decay * high + (np.float32(1.0) - decay) * np.float32(max(batch.max(), 0.0))
    return low, high


@pytest.mark.legs("keras3")  # the workers run on JAX, which the main environment has; the conversion on TensorFlow
def test_two_jax_processes_on_the_loopback_interface_train_one_qat_model_that_converts_to_integer(tmp_path):
    """keras.distribution.DataParallel over two processes (jax.distributed, CPU collectives): each process
    feeds its half of every global batch, and both end with every variable equal, the input's range that of
    the whole global batches (not of a process's half), and the chief's .keras converts to a fully integer
    .tflite within QAT's int8 steps of the chief's model."""
    script, port = two_jax_processes.__file__, str(_free_port())
    chief = _the_variables_both_end_with(tmp_path, [[script, str(index), port, str(tmp_path)] for index in range(2)],
                                         KERAS_BACKEND="jax", TF_USE_LEGACY_KERAS="0")
    x = two_jax_processes.data(0)[0]
    batches = np.split(x, len(x) // two_jax_processes.GLOBAL_BATCH)
    (low,) = [name for name in chief.files if name.endswith("/input_min")]  # the model input's range
    np.testing.assert_allclose([chief[low], chief[low[:-len("_min")] + "_max"]], _moving_range(batches), rtol=1e-6)
    tflite_model, report = converters.convert(str(tmp_path / "model.keras"), int8=True)
    assert report.quantization_aware and report.float_ops == {}, report.op_types
    (scale,) = operators.output_scales(tflite_model)
    actual = tflite_helpers.run(tflite_model, x[:16])[0]
    assert np.max(np.abs(actual - np.load(tmp_path / "outputs.npy"))) / scale <= QAT_INT8_STEPS
