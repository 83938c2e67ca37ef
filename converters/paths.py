"""The converter's file-system side: what kind of model a path is, and safe output writes.

No TensorFlow here: the command line runs these checks before importing it.
"""

import os
import tempfile

from . import errors

KERAS_FILE_SUFFIXES = {".keras": ".keras", ".h5": ".h5", ".hdf5": ".h5"}
TFLITE_FILE_IDENTIFIER = b"TFL3"


def model_kind(path):
    """"SavedModel", ".keras" or ".h5"; raises MissingPath or NotAModel."""
    if not os.path.exists(path):
        raise errors.MissingPath(f"{path}: no such file or directory")
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "saved_model.pb")):
            raise errors.NotAModel(f"{path}: a directory without saved_model.pb is not a SavedModel")
        return "SavedModel"
    for suffix, kind in KERAS_FILE_SUFFIXES.items():
        if path.endswith(suffix):
            return kind
    if is_tflite_path(path):
        return ".tflite"
    raise errors.NotAModel(f"{path}: not a SavedModel directory, .keras, .h5 or .tflite file")


def is_tflite(data):
    """Whether `data` (bytes) is a TFLite flatbuffer, by its file identifier: bytes 4 to 8 are "TFL3"."""
    return len(data) >= 8 and bytes(data[4:8]) == TFLITE_FILE_IDENTIFIER


def is_tflite_path(path):
    """Whether the file at `path` is given as a .tflite: by its name, or by its content."""
    if path.endswith(".tflite"):
        return True
    with open(path, "rb") as file:
        return is_tflite(file.read(8))


def default_output(model_path, mode="builtin"):
    """<model>.tflite beside the input, without a Keras file's suffix; <model>_<mode>.tflite for a .tflite."""
    stripped = os.path.normpath(model_path)
    if os.path.isfile(stripped) and model_kind(stripped) == ".tflite":
        return (stripped[: -len(".tflite")] if stripped.endswith(".tflite") else stripped) + f"_{mode}.tflite"
    for suffix in KERAS_FILE_SUFFIXES:
        if stripped.endswith(suffix):
            stripped = stripped[: -len(suffix)]
    return stripped + ".tflite"


def check_readable_file(path, option):
    """Fail early on an input file (--inputs, --calibration) that is not there."""
    if not os.path.isfile(path):
        raise errors.BadInputs(f"{path}: no such file for {option}")


def check_output_path(output, force):
    """Fail early, before any work, on an output we may not write."""
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise errors.OutputNotWritable(f"{output}: the folder {directory} does not exist")
    if os.path.exists(output) and not force:
        raise errors.OutputExists(f"{output}: exists; pass --force to overwrite it")
    try:  # os.access says yes to root even where a write fails, so try one
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise errors.OutputNotWritable(f"{output}: cannot write in {directory} ({error.strerror})") from None


def _current_umask():
    umask = os.umask(0o022)  # reading the umask means setting it: set it straight back
    os.umask(umask)
    return umask


def write_atomically(data, output, force):
    """Write via a temporary file and rename: readers never see half a file."""
    check_output_path(output, force)
    directory = os.path.dirname(os.path.abspath(output))
    try:
        handle, temporary = tempfile.mkstemp(prefix=".keras_gelu_", suffix=".tmp", dir=directory)
    except OSError as error:
        raise errors.OutputNotWritable(f"{output}: cannot write in {directory} ({error.strerror})") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        # mkstemp makes the file private (0600); give it the mode any new file of the user's gets.
        os.chmod(temporary, 0o666 & ~_current_umask())
        if force:
            os.replace(temporary, output)
        else:
            try:
                os.link(temporary, output)  # fails, atomically, if the output appeared meanwhile
            except FileExistsError:
                raise errors.OutputExists(f"{output}: exists; pass --force to overwrite it") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
