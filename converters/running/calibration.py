"""Calibrated ranges as the samples give them: each tensor's values recorded with nothing computed in place.

TensorFlow's calibrator (the converter's post-training quantization, `_experimental_calibrate_only` too) reads
an op's input tensors after the op ran, on an interpreter that computes elementwise ops in place: a tensor
whose reader wrote into its buffer gets the reader's values in its range. Measured on TF 2.21, x * 0.5 for x
in [-1, 1], minus 1e4 * a mask: the product's recorded range is [-10000.5, 0.47]. Hugging Face's GPT-2 adds
its -1e4 causal mask to the scaled attention scores that way, and the scores, on an int8 grid of 39 a step,
round to 0 (the stock converter's int8 model too).

Run once more on LiteRT with every intermediate kept (`verify.interpreter_keeping_every_tensor`: no tensor
shares a buffer), each float tensor's smallest and largest value over the samples is its range
(`quantizer.repaired` writes them over the calibrator's).
"""

import numpy as np

from ..tflite import quantizer
from . import verify


def recorded_ranges(calibrated_model, samples):
    """{tensor index: (smallest, largest)} of each tensor the calibrator recorded a range for, over `samples`
    (each a list of one array per model input, in the model's input order, as the converter's calibration
    takes them)."""
    tensors = quantizer.recorded_tensors(calibrated_model)
    interpreter = verify.interpreter_keeping_every_tensor(calibrated_model)
    inputs = interpreter.get_input_details()
    shapes = None
    lowest, highest = {}, {}
    for sample in samples:
        if shapes != [array.shape for array in sample]:
            shapes = [array.shape for array in sample]
            for detail, shape in zip(inputs, shapes):
                interpreter.resize_tensor_input(detail["index"], shape, strict=False)
            interpreter.allocate_tensors()
        for detail, array in zip(inputs, sample):
            interpreter.set_tensor(detail["index"], verify.input_value(detail, array))
        interpreter.invoke()
        for index in tensors:
            values = interpreter.get_tensor(index)
            if values.dtype.kind != "f" or not values.size:
                continue
            low, high = np.min(values), np.max(values)  # NaN stays NaN: `quantizer.repaired` keeps its ops float
            lowest[index] = np.minimum(low, lowest.get(index, low))
            highest[index] = np.maximum(high, highest.get(index, high))
    return {index: (float(lowest[index]), float(highest[index])) for index in lowest}
