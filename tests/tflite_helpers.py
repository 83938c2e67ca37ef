"""Running a .tflite in tests with whichever interpreter the converter would use."""

from keras_gelu.converters import report
from keras_gelu.converters import verify


def run(tflite_model, *arrays):
    """Outputs (in the model's order) for inputs given in the model's order."""
    return verify.invoke(tflite_model, arrays)


def ops(tflite_model):
    return report.op_histogram(tflite_model)
