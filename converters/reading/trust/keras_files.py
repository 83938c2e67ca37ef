"""Keras files (.h5, .keras) checked from their bytes, before Keras rebuilds anything of them.

Rebuilding a Keras model calls code its config names, and reading its
weights follows its HDF5 storage wherever it points, so the check reads
both without deserializing anything:

* the model config (an .h5's `model_config` attribute, a .keras file's
  config.json), every object in it at any depth: no layer that carries
  Python code (Lambda), no tf-keras op layer calling a TensorFlow function
  outside `tf_symbols`, no layer that opens a file its config names (a
  lookup layer's vocabulary file, a TFSMLayer's SavedModel); a config that is
  not a model config is malformed (CorruptModel);
* the HDF5 storage (the .h5 itself, every .h5 inside a .keras archive): no
  external link, no dataset stored in an external file or as a virtual
  dataset, all of which open files outside the model;
* a .keras archive's member names: none absolute or climbing out with "..".
"""

import json
import zipfile

from ... import errors
from . import tf_symbols

CODE_CARRYING_LAYERS = ("Lambda",)
_OP_LAYERS = ("TFOpLambda", "SlicingOpLambda")
_INSTANCE_LAYERS = ("InstanceMethod", "InstanceProperty")
# Layers that open a file their config names when built: (class name, config key).
_FILE_OPENING_LAYERS = {"StringLookup": "vocabulary", "IntegerLookup": "vocabulary", "TextVectorization": "vocabulary",
                        "TFSMLayer": "filepath"}


def config_text(path):
    """The model config of an .h5 (its model_config attribute) or .keras (config.json) file as text, or None
    where the file has none; CorruptModel if it is there but not text."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                config = archive.read("config.json")
        else:
            import h5py  # a dependency of tf-keras and Keras

            with h5py.File(path, "r") as stream:
                config = stream.attrs.get("model_config")
    except (OSError, KeyError, zipfile.BadZipFile):
        return None
    if config is None or isinstance(config, str):
        return config
    if isinstance(config, bytes):  # numpy's bytes_ too
        return config.decode(errors="replace")
    raise errors.CorruptModel(f"{path}: the model config is a {type(config).__name__}, not JSON text")


def model_config(path):
    """The parsed model config, or None where the file has none; CorruptModel if it is malformed."""
    text = config_text(path)
    if text is None:
        return None
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as error:
        raise errors.CorruptModel(f"{path}: the model config is not valid JSON ({type(error).__name__})") from None
    if not (isinstance(config, dict) and isinstance(config.get("class_name"), str)
            and isinstance(config.get("config"), (dict, type(None)))):
        raise errors.CorruptModel(f"{path}: the model config is not a Keras object (a class_name and its config)")
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


def _layer_refusal(class_name, config):
    if class_name in CODE_CARRYING_LAYERS:
        return "carries Python code, which loading the model would run"
    if class_name in _OP_LAYERS:
        what = tf_symbols.refusal(config.get("function"))
        return None if what is None else f"calls tf.{config.get('function')}, which {what}"
    if class_name == "ClassMethod":
        return tf_symbols.class_method_refusal(config.get("cls_symbol"), config.get("method_name"))
    if class_name in _INSTANCE_LAYERS:
        return tf_symbols.instance_attribute_refusal(config.get("attr_name"))
    key = _FILE_OPENING_LAYERS.get(class_name)
    if key is not None and isinstance(config.get(key), str):
        return f"opens the file its {key} names ({config[key]!r})"
    return None


def _check_config(path, config):
    for class_name, object_config, where in _objects(config):
        what = _layer_refusal(class_name, object_config)
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

    found = stream.visititems_links(problem)
    if found is not None:
        name, what = found
        raise errors.UntrustedModel.refused(path, f"HDF5 entry {where}{name} {what}, which loading would open")


def _check_archive(path):
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                parts = member.filename.replace("\\", "/").split("/")
                if member.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
                    raise errors.UntrustedModel.refused(
                        path, f"archive member {member.filename!r} names a path outside the archive")
                if member.filename.endswith(".h5"):
                    import h5py

                    with archive.open(member) as data, h5py.File(data, "r") as stream:
                        _check_hdf5_storage(path, stream, f"{member.filename}:")
    except (zipfile.BadZipFile, OSError) as error:
        raise errors.CorruptModel(f"{path}: cannot read the .keras archive ({error})") from None


def check(path):
    """Refuse (errors.UntrustedModel) a Keras file whose config or storage could act outside the process.

    A file that is neither a zip archive nor HDF5 is left to the loader, which cannot read it either and says so.
    """
    if zipfile.is_zipfile(path):
        _check_archive(path)
    else:
        import h5py

        try:
            stream = h5py.File(path, "r")
        except OSError:
            return
        with stream:
            _check_hdf5_storage(path, stream, "")
    config = model_config(path)
    if config is not None:
        _check_config(path, config)
