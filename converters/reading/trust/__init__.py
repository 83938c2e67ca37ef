"""What a model may do on the converting machine: checked before anything of it is loaded or run.

Converting runs the model: loading a Keras file rebuilds its layers, loading
a SavedModel runs its initializers, the parity check and int8 calibration
execute it in TensorFlow, and verification runs the .tflite. A model someone
else made could carry Python code (a Lambda's bytecode), call TensorFlow
functions that write files (a tf-keras op layer), or hold ops that read
files, write them or open connections, wherever loading or running reaches.
Unless the user trusts the model (--trust-model), we refuse all of it, by
reading everything the model file holds, not one path through it, and by
deciding from what each op or layer can do, not from its name:

* `ops`: what a TensorFlow op can do (an allow-list of the stateful ops
  that stay in the process, each with its reason);
* `saved_model`: every node, function, collection, the saver and the object
  graph of a SavedModel, and its folder; the same node and function checks
  for a Keras model's traced graph;
* `keras_files`: an .h5 or .keras file's model config and HDF5 storage;
  Keras 3's own safe mode then still guards the .keras load;
* `flex_ops`: the TensorFlow ops a select-mode .tflite would ship.

A Keras model (a loaded file's, or a live one, the user's own object) is
traced in memory, and the traced graph is checked like a SavedModel's
before any of it runs.
"""

from ... import errors
from . import flex_ops
from . import keras_files
from . import saved_model

check_saved_model = saved_model.check
check_graph = saved_model.check_graph
check_keras_file = keras_files.check
check_flex_ops = flex_ops.check
keras_file_config = keras_files.config_text


def is_safe_mode_refusal(error):
    """Whether a Keras load error is its safe mode refusing to deserialize code."""
    return "safe_mode" in str(error)


def refuse_safe_mode(path, error):
    reason = " ".join(str(error).split())
    return errors.UntrustedModel.refused(path, f"Keras's safe mode refused to load it: {reason}")
