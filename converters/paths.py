"""The converter's file-system side: what kind of model a path is, and safe output writes.

No TensorFlow here: the command line runs these checks before importing it.
"""

import os
import tempfile
import zipfile

from . import errors

KERAS_FILE_SUFFIXES = {".keras": ".keras", ".h5": ".h5", ".hdf5": ".h5"}
TFLITE_FILE_IDENTIFIER = b"TFL3"
# An HDF5 file starts with this at byte 0, or, after a user block, at byte 512, 1024, 2048, ...
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# The format each kind of model file must be, as its loader reads it: Keras opens a .keras file as a zip
# archive and an .h5 file with HDF5, whatever else the bytes are.
_FORMAT_OF_KIND = {".keras": "a zip archive", ".h5": "an HDF5 file", ".tflite": "a TFLite flatbuffer"}


def model_kind(path):
    """"SavedModel", ".keras", ".h5" or ".tflite", decided once, from the name and the content together;
    raises MissingPath, NotAModel (a name that says one format, bytes another) or CorruptModel (bytes of two
    formats at once: a polyglot, which one reader would see as one model and another as another)."""
    if not os.path.exists(path):
        raise errors.MissingPath(f"{path}: no such file or directory")
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "saved_model.pb")):
            raise errors.NotAModel(f"{path}: a directory without saved_model.pb is not a SavedModel")
        return "SavedModel"
    formats = file_formats(path)
    kind = next((kind for suffix, kind in KERAS_FILE_SUFFIXES.items() if path.endswith(suffix)), None)
    if kind is None and (path.endswith(".tflite") or "a TFLite flatbuffer" in formats):
        kind = ".tflite"
    if kind is None:
        raise errors.NotAModel(f"{path}: not a SavedModel directory, .keras, .h5 or .tflite file")
    if len(formats) > 1:
        raise errors.CorruptModel(f"{path}: both {' and '.join(sorted(formats))}; refused: a file a loader reads as "
                                  "one model and a check as another could hide anything")
    if formats and _FORMAT_OF_KIND[kind] not in formats and kind != ".tflite":
        raise errors.NotAModel(f"{path}: named {kind} but holds {formats.pop()}, not {_FORMAT_OF_KIND[kind]}")
    return kind


def file_formats(path):
    """The formats whose signature the file carries: HDF5 (at byte 0 or after a user block), zip (an archive
    directory at the end, as zipfile finds it, or a member header at the start), TFLite (its identifier)."""
    formats = set()
    with open(path, "rb") as stream:
        head = stream.read(8)
        size = os.fstat(stream.fileno()).st_size
        offset = 0
        while offset + len(HDF5_SIGNATURE) <= size:
            stream.seek(offset)
            if stream.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                formats.add("an HDF5 file")
                break
            offset = 512 if offset == 0 else offset * 2
    if is_tflite(head):
        formats.add("a TFLite flatbuffer")
    if head.startswith(b"PK\x03\x04") or zipfile.is_zipfile(path):
        formats.add("a zip archive")
    return formats


def is_tflite(data):
    """Whether `data` (bytes) is a TFLite flatbuffer, by its file identifier: bytes 4 to 8 are "TFL3"."""
    return len(data) >= 8 and bytes(data[4:8]) == TFLITE_FILE_IDENTIFIER


def default_output(model_path, mode="builtin"):
    """<model>.tflite beside the input, without a Keras file's suffix; <model>_<mode>.tflite for a .tflite."""
    stripped = os.path.normpath(model_path)
    if os.path.isfile(stripped) and (stripped.endswith(".tflite") or "a TFLite flatbuffer" in file_formats(stripped)):
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
    _written_atomically(lambda stream: stream.write(data), output, force)


def move_atomically(source, output, force):
    """Move the file `source`, in `output`'s folder, to `output`: as write_atomically, never over a file without
    `force`; with the mode any new file of the user's gets."""
    os.chmod(source, 0o666 & ~_current_umask())
    if force:
        os.replace(source, output)
        return
    try:
        os.link(source, output)  # fails, atomically, if the output appeared meanwhile
    except FileExistsError:
        raise errors.OutputExists(f"{output}: exists; pass --force to overwrite it") from None
    os.unlink(source)


def _written_atomically(write, output, force):
    check_output_path(output, force)
    directory = os.path.dirname(os.path.abspath(output))
    try:
        handle, temporary = tempfile.mkstemp(prefix=".keras_gelu_", suffix=".tmp", dir=directory)
    except OSError as error:
        raise errors.OutputNotWritable(f"{output}: cannot write in {directory} ({error.strerror})") from None
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
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
