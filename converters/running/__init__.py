"""Running and verifying: the conversion pipelines (`pipeline` for a TensorFlow model, `tflite_input` for a
.tflite), the parity runs (`verify`) and the targets' own runtimes (`runtimes`, `target_checks`). Runs inside
the sandbox: this is where the model executes."""
