"""Interleaved timing shared by the benchmarks: ratios measured in one run, on a noisy machine.

The converter is imported where a TFLite interpreter is needed, not here: the JAX and PyTorch benchmarks use this
module in environments without TensorFlow.
"""

import statistics
import time


def interpreter(tflite_model, inputs, threads=1):
    """A ready interpreter (inputs set, one warm-up run) for float `inputs`, quantized if it takes int8."""
    from keras_gelu.converters.running import verify

    interpreter_type, _ = verify.interpreter_class()
    runner = interpreter_type(model_content=tflite_model, num_threads=threads)
    details = runner.get_input_details()
    for detail, array in zip(details, inputs):
        runner.resize_tensor_input(detail["index"], array.shape)
    runner.allocate_tensors()
    for detail, array in zip(details, inputs):
        runner.set_tensor(detail["index"], verify.input_value(detail, array))
    runner.invoke()
    return runner


def in_turn(keys, round_index):
    """`keys` in the order of round `round_index`: each goes first in turn, so that what recurs at one place in a
    round (a cache another variant warmed, a disturbance on a period) does not fall on one variant every round."""
    keys = list(keys)
    shift = round_index % len(keys)
    return keys[shift:] + keys[:shift]


def call_medians(calls, rounds):
    """{key: median seconds of calls[key]()}, calling each once per round, each first in turn."""
    samples = {key: [] for key in calls}
    for round_index in range(rounds):
        for key in in_turn(calls, round_index):
            started = time.perf_counter()
            calls[key]()
            samples[key].append(time.perf_counter() - started)
    return {key: statistics.median(values) for key, values in samples.items()}


def interleaved_medians(interpreters, rounds):
    """{key: median seconds per invoke}, timing every interpreter once per round, in turn."""
    return call_medians({key: runner.invoke for key, runner in interpreters.items()}, rounds)


def runtime_name():
    from keras_gelu.converters.running import verify

    return verify.interpreter_class()[1]


def _steps_timer():
    """A Keras callback that times an epoch's steps: from the first step's start to the last step's end."""
    from keras_gelu.flavour import keras

    class StepsTimer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                self.started = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds = time.perf_counter() - self.started

    return StepsTimer()


def fit_epoch_seconds(models, x, y, batch_size, rounds):
    """{name: seconds of each timed epoch}: one warm-up epoch each (tracing), then `rounds` epochs each in turn,
    so every model trains under the same load.

    An epoch is `model.fit(epochs=1)`, timed from its first step's start to its last step's end, as Keras's
    progress bar times steps: the call's own set-up and tear-down around them (its data iterator) added 0.6 s
    to one epoch in two at random, whatever the model (measured: 8-step epochs of 0.65 s took 0.65 or 1.31 s), and
    made the medians a coin toss."""
    timer = _steps_timer()
    for model in models.values():
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    seconds = {name: [] for name in models}
    for round_index in range(rounds):
        for name in in_turn(models, round_index):
            models[name].fit(x, y, batch_size=batch_size, epochs=1, verbose=0, callbacks=[timer])
            seconds[name].append(timer.seconds)
    return seconds
