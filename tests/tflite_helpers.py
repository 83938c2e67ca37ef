"""Running a .tflite in tests with whichever interpreter the converter would use."""

from keras_gelu.converters import report
from keras_gelu.converters import verify


def run(tflite_model, *arrays):
    """Outputs (in the model's order) for inputs given in the model's order."""
    interpreter_type, _ = verify.interpreter_class()
    interpreter = interpreter_type(model_content=tflite_model)
    details = interpreter.get_input_details()
    for detail, array in zip(details, arrays):
        interpreter.resize_tensor_input(detail["index"], array.shape)
    interpreter.allocate_tensors()
    for detail, array in zip(details, arrays):
        interpreter.set_tensor(detail["index"], array)
    interpreter.invoke()
    return [interpreter.get_tensor(detail["index"]) for detail in interpreter.get_output_details()]


def ops(tflite_model):
    return report.op_histogram(tflite_model)
