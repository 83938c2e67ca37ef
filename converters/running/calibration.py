"""Calibrated ranges as the samples give them: each tensor's values recorded with nothing computed in place.

TensorFlow's calibrator (the converter's post-training quantization, `_experimental_calibrate_only` too) reads
an op's input tensors after the op ran, on an interpreter that computes elementwise ops in place: a tensor
whose reader wrote into its buffer gets the reader's values in its range. Measured on TF 2.21, x * 0.5 for x
in [-1, 1], minus 1e4 * a mask: the product's recorded range is [-10000.5, 0.47]. Hugging Face's GPT-2 adds
its -1e4 causal mask to the scaled attention scores that way, and the scores, on an int8 grid of 39 a step,
round to 0 (the stock converter's int8 model too).

Run once more on LiteRT with every intermediate kept (`verify.interpreter_keeping_every_tensor`: no tensor
shares a buffer), each float tensor's smallest and largest value over the samples is its range
(`quantizer.repaired` writes them over the calibrator's). A softmax's input also gets the smallest and the
largest of its rows' largest values, from which `quantizer.softmax_floors` finds how far down its range needs to
reach.
"""

import collections

import numpy as np

from ..tflite import quantizer
from . import multiplied_by_zero
from . import verify


# {tensor index: (smallest, largest)} of each tensor the calibrator recorded a range for, and {tensor index: (the
# smallest, the largest) of the largest values of its rows} of each softmax input, over the samples; and each
# softmax input's beta (`quantizer.softmax_inputs`); and the tensors whose ranges hold only the values some output
# reads, where others only ever met a multiplication by zero (`multiplied_by_zero`)
Recorded = collections.namedtuple("Recorded", "ranges row_maxima softmax_betas read_alone")


def recorded_ranges(calibrated_model, samples):
    """The `Recorded` ranges of `samples` (each a list of one array per model input, in the model's input order,
    as the converter's calibration takes them)."""
    tensors = quantizer.recorded_tensors(calibrated_model)
    softmax_inputs = quantizer.softmax_inputs(calibrated_model)
    row_maxima = {}
    interpreter = verify.interpreter_keeping_every_tensor(calibrated_model)
    discarded = multiplied_by_zero.DiscardedValues(calibrated_model)
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
        discarded.record(interpreter)
        for index in tensors:
            values = interpreter.get_tensor(index)
            if values.dtype.kind != "f" or not values.size:
                continue
            low, high = np.min(values), np.max(values)  # NaN stays NaN: `quantizer.repaired` keeps its ops float
            lowest[index] = np.minimum(low, lowest.get(index, low))
            highest[index] = np.maximum(high, highest.get(index, high))
        for index in softmax_inputs:
            rows = interpreter.get_tensor(index)
            rows = rows.reshape(-1, rows.shape[-1]) if rows.ndim and rows.size and rows.dtype.kind == "f" else None
            # a row of one value (every score masked) is uniform on any grid: it asks for no floor
            varying = None if rows is None else rows.max(axis=-1)[rows.max(axis=-1) > rows.min(axis=-1)]
            if varying is not None and varying.size and np.all(np.isfinite(varying)):
                smallest, largest = row_maxima.get(index, (np.inf, -np.inf))
                row_maxima[index] = (min(float(varying.min()), smallest), max(float(varying.max()), largest))
    ranges = {index: (float(lowest[index]), float(highest[index])) for index in lowest}
    read_alone = {index: read for index, read in discarded.ranges().items() if index in ranges}
    return Recorded({**ranges, **read_alone}, row_maxima, softmax_inputs, sorted(read_alone))
