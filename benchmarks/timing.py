"""Interleaved TFLite timing shared by the benchmarks: ratios measured in one run, on a noisy machine."""

import statistics
import time

from keras_gelu.converters import verify


def interpreter(tflite_model, inputs, threads=1):
    """A ready interpreter (inputs set, one warm-up run) for float `inputs`, quantized if it takes int8."""
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


def interleaved_medians(interpreters, rounds):
    """{key: median seconds per invoke}, timing every interpreter once per round, in turn."""
    samples = {key: [] for key in interpreters}
    for _ in range(rounds):
        for key, runner in interpreters.items():
            started = time.perf_counter()
            runner.invoke()
            samples[key].append(time.perf_counter() - started)
    return {key: statistics.median(values) for key, values in samples.items()}


def runtime_name():
    return verify.interpreter_class()[1]


def fit_epoch_seconds(models, x, y, batch_size, rounds):
    """{name: seconds of each timed epoch}: one warm-up epoch each (tracing), then `rounds` epochs each in turn,
    so every model trains under the same load."""
    for model in models.values():
        model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
    seconds = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            started = time.perf_counter()
            model.fit(x, y, batch_size=batch_size, epochs=1, verbose=0)
            seconds[name].append(time.perf_counter() - started)
    return seconds
