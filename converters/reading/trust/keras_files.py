"""Keras files (.h5, .keras) checked from their bytes, before Keras rebuilds anything of them.

Rebuilding a Keras model calls code its config names, and reading its
weights follows its HDF5 storage wherever it points, so the check reads
both without deserializing anything, with the reader the loader uses (a
.keras file as a zip archive, an .h5 file with HDF5; paths.model_kind has
made sure the bytes are that format and no other):

* the model config (an .h5's `model_config` attribute, a .keras file's
  config.json), no larger than the config limit, every object in it at any
  depth: no layer that carries Python code (Lambda), no tf-keras op layer
  calling a TensorFlow function outside `tf_symbols`, and no constructor
  argument, in any class, that names a file or a URL (a lookup layer's
  vocabulary file, a TFSMLayer's SavedModel, a tokenizer's vocabulary),
  unless it is one of the .keras archive's own members; a config that is
  not a model config is malformed (CorruptModel);
* the HDF5 storage (the .h5 itself, every .h5 inside a .keras archive): no
  external link, no dataset stored in an external file or as a virtual
  dataset, all of which open files outside the model; HDF5 that cannot be
  walked is malformed (CorruptModel);
* a .keras archive's members: no name absolute or climbing out with "..",
  none inflating past the memory limit.
"""

import json
import os
import re
import zipfile

from ... import errors
from . import tf_symbols

CODE_CARRYING_LAYERS = ("Lambda",)
_OP_LAYERS = ("TFOpLambda", "SlicingOpLambda")
_INSTANCE_LAYERS = ("InstanceMethod", "InstanceProperty")
# Keys whose values name Keras objects, never files: a class, its module, its registered or layer name.
_NAMING_KEYS = ("class_name", "module", "registered_name", "name")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_WINDOWS_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
# What h5py raises for HDF5 it cannot read or walk ("Link visitation failed", truncated objects; a SystemError
# from its lock when the HDF5 library failed inside it, which the file fuzzer met).
_HDF5_FAILURES = (OSError, RuntimeError, KeyError, ValueError, TypeError, SystemError)


def is_archive(path):
    """Whether Keras reads the file as a .keras zip archive (by its name, which paths.model_kind checked)."""
    return path.endswith(".keras")


def config_text(description, path, limit):
    """The model config of an .h5 (its model_config attribute) or .keras (config.json) file as text, or None
    where the file has none; SizeLimitExceeded past `limit` bytes, before it is read; CorruptModel if it is
    there but not text."""
    try:
        if is_archive(path):
            with zipfile.ZipFile(path) as archive:
                size = archive.getinfo("config.json").file_size
                _within(description, "config.json", size, limit, "--config-limit")
                config = archive.read("config.json")  # zipfile inflates no more than the size checked
        else:
            import h5py  # a dependency of tf-keras and Keras

            with h5py.File(path, "r") as stream:
                # HDF5 compresses no attribute: the config is no larger than the file, and is read to be measured
                config = stream.attrs.get("model_config")
            _within(description, "its model_config", len(config) if isinstance(config, (str, bytes)) else 0, limit,
                    "--config-limit")
    except (KeyError, zipfile.BadZipFile):
        return None
    except _HDF5_FAILURES as error:
        raise errors.CorruptModel(f"{description}: cannot read the HDF5 file ({type(error).__name__}: "
                                  f"{' '.join(str(error).split())[:150]})") from None
    if config is None or isinstance(config, str):
        return config
    if isinstance(config, bytes):  # numpy's bytes_ too
        return config.decode(errors="replace")
    raise errors.CorruptModel(f"{description}: the model config is a {type(config).__name__}, not JSON text")


def _within(description, what, size, limit, flag):
    if limit is not None and size > limit:
        raise errors.SizeLimitExceeded(f"{description}: {what} inflates to {size:,} bytes, past the limit of "
                                       f"{limit:,} ({flag}); nothing read")


def model_config(description, path, limit):
    """The parsed model config, or None where the file has none; CorruptModel if it is malformed."""
    text = config_text(description, path, limit)
    if text is None:
        return None
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise errors.CorruptModel(f"{description}: the model config is not valid JSON ({type(error).__name__})") \
            from None
    if not (isinstance(config, dict) and isinstance(config.get("class_name"), str)
            and isinstance(config.get("config"), (dict, type(None)))):
        raise errors.CorruptModel(f"{description}: the model config is not a Keras object (a class_name and its "
                                  "config)")
    return config


def _objects(config):
    """(class name, object config, where) of every Keras object inside `config`, iteratively (no depth limit)."""
    pending = [(config, "")]
    while pending:
        value, where = pending.pop()
        if isinstance(value, dict):
            inner = value.get("config")
            if isinstance(value.get("class_name"), str) and isinstance(inner, dict):
                name = inner.get("name", "?")
                yield value["class_name"], inner, where
                where = f"{where} > {name}" if where else str(name)
            pending.extend((item, where) for item in value.values())
        elif isinstance(value, list):
            pending.extend((item, where) for item in value)


def _layer_refusal(class_name, config, own_files):
    if class_name in CODE_CARRYING_LAYERS:
        return "carries Python code, which loading the model would run"
    if class_name in _OP_LAYERS:
        what = tf_symbols.refusal(config.get("function"))
        return None if what is None else f"calls tf.{config.get('function')}, which {what}"
    if class_name == "ClassMethod":
        return tf_symbols.class_method_refusal(config.get("cls_symbol"), config.get("method_name"))
    if class_name in _INSTANCE_LAYERS:
        return tf_symbols.instance_attribute_refusal(config.get("attr_name"))
    for key, value in _arguments(config):
        if value not in own_files and names_a_file(value):
            return f"has an argument {key!r} naming a file or URL ({value[:100]!r}), which building it would open"
    return None


def _arguments(config):
    """(key, string) of every string among an object's constructor arguments, nested lists and dicts included,
    but not inside the Keras objects it holds (each is checked as an object of its own)."""
    pending = [(key, value) for key, value in config.items() if key not in _NAMING_KEYS]
    while pending:
        key, value = pending.pop()
        if isinstance(value, str):
            yield key, value
        elif isinstance(value, list):
            pending.extend((key, item) for item in value)
        elif isinstance(value, dict) and not isinstance(value.get("class_name"), str):
            pending.extend((key, item) for name, item in value.items() if name not in _NAMING_KEYS)


def names_a_file(value):
    """Whether a string would lead a constructor to a file or the network: a URL, a path (absolute, from the home
    folder, or with a folder in it), or the name of something in the working directory."""
    if _URL.match(value) or value.startswith(("/", "\\", "~")) or _WINDOWS_DRIVE.match(value):
        return True
    if "/" in value or "\\" in value:
        return True
    try:
        return bool(value) and len(value) < 4096 and os.path.lexists(value)
    except (OSError, ValueError):  # a string no file system takes (a NUL byte)
        return False


def _check_config(path, config, own_files=frozenset()):
    for class_name, object_config, where in _objects(config):
        what = _layer_refusal(class_name, object_config, own_files)
        if what is not None:
            name = object_config.get("name", "?")
            raise errors.UntrustedModel.refused(path, f"layer {name!r} ({class_name}, in {where or 'the model'}) "
                                                      f"{what}")


def _check_hdf5_storage(path, stream, where):
    """No link, dataset or virtual dataset in an open HDF5 file that reads another file."""
    import h5py

    def problem(name, link):  # a value other than None ends the visit and is returned
        if isinstance(link, h5py.ExternalLink):
            return name, f"is a link into another file ({link.filename})"
        item = stream.get(name) if isinstance(link, h5py.HardLink) else None
        if isinstance(item, h5py.Dataset) and item.external:
            return name, f"stores its data in another file ({item.external[0][0]})"
        if isinstance(item, h5py.Dataset) and item.is_virtual:
            return name, "is a virtual dataset, made of other files' data"
        return None

    try:
        found = stream.visititems_links(problem)
    except _HDF5_FAILURES as error:
        raise errors.CorruptModel(f"{path}: cannot read the HDF5 {'file' if not where else where} "
                                  f"({type(error).__name__}: {' '.join(str(error).split())[:150]})") from None
    if found is not None:
        name, what = found
        raise errors.UntrustedModel.refused(path, f"HDF5 entry {where}{name} {what}, which loading would open")


def _check_archive(description, path, member_limit):
    """The archive's member names (each inside it), their sizes, and every HDF5 member's storage; the names."""
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                parts = member.filename.replace("\\", "/").split("/")
                if member.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
                    raise errors.UntrustedModel.refused(
                        description, f"archive member {member.filename!r} names a path outside the archive")
                _within(description, f"archive member {member.filename}", member.file_size, member_limit,
                        "--memory-limit")
                if member.filename.endswith(".h5"):
                    import h5py

                    try:
                        with archive.open(member) as data, h5py.File(data, "r") as stream:
                            _check_hdf5_storage(description, stream, f"{member.filename}:")
                    except _HDF5_FAILURES as error:
                        raise errors.CorruptModel(f"{description}: cannot read {member.filename} in the archive "
                                                  f"({type(error).__name__})") from None
            return frozenset(archive.namelist())
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise errors.CorruptModel(f"{description}: cannot read the .keras archive ({error})") from None


def check(description, path, config_limit, member_limit=None):
    """Refuse (errors.UntrustedModel) a Keras file whose config or storage could act outside the process; a
    config past `config_limit` bytes or an archive member past `member_limit` (errors.SizeLimitExceeded)."""
    own_files = frozenset()
    if is_archive(path):
        own_files = _check_archive(description, path, member_limit)
    else:
        import h5py

        try:
            stream = h5py.File(path, "r")
        except _HDF5_FAILURES as error:
            raise errors.CorruptModel(f"{description}: cannot read the HDF5 file ({type(error).__name__})") from None
        with stream:
            _check_hdf5_storage(description, stream, "")
    config = model_config(description, path, config_limit)
    if config is not None:
        _check_config(description, config, own_files)
