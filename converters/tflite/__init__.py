"""`.tflite` editing: the flatbuffer read and written (`flatbuffer_model`), its operators counted
(`operators`), its SignatureDef, GELU ops, float islands and op names changed in place. Runs inside the
sandbox."""
