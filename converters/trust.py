"""What a model may do on the converting machine: inspected before anything of it is loaded or run.

Converting runs the model: loading a Keras file builds its layers, and the
parity check and int8 calibration execute its signature in TensorFlow and
the .tflite in an interpreter. A model someone else made could carry Python
code (a Lambda layer in an .h5 file is marshalled bytecode, run as the model
is rebuilt) or ops that reach outside the process (write files, read them,
call Python). Unless the user trusts the model (--trust-model), we refuse
both, by reading the model's description only:

* .h5: the model config attribute, as JSON, without deserializing anything;
* .keras: Keras's own safe mode, at load time (it refuses Python lambdas
  before running them), with its reason kept whole;
* SavedModel: saved_model.pb, as a protocol buffer: the chosen signature's
  nodes and every function they call, and what loading itself runs (the
  init op, custom restore functions).

Live Keras models are the user's own objects; their exported graph is still
walked like a SavedModel's.
"""

import json
import os
import re
import zipfile

from . import errors

# Layer kinds whose config carries Python code to run: a Lambda's function
# (marshalled bytecode, or a name looked up among registered functions).
CODE_CARRYING_LAYERS = ("Lambda",)

# Why a deny-list and not an allow-list of pure compute ops: TensorFlow
# registers about 1,500 ops and custom ops add more, so an allow-list would
# refuse every model using an op it did not list, people would pass
# --trust-model by reflex, and the check would protect nothing. The ops that
# reach outside the process are few and TensorFlow names them by family, so
# we deny the families by name (which also catches ops added to a family
# later) and a few single ops.
OUTSIDE_WORLD_OPS = re.compile(
    r"File|Summary|Save|Restore|Checkpoint|Reader|Dataset|Iterator|PyFunc|Rpc|^Debug|^Load|"
    r"^ImmutableConst$|^GenerateVocabRemapping$")
# PrintV2 is harmless to stderr/stdout/the log, but it can append to a file.
_FILE_STREAM = "file://"
# Proto ops read their descriptors from a file unless told "local://".
_PROTO_OPS = ("DecodeProtoV2", "EncodeProto")


def _refusal(path, what):
    return errors.UntrustedModel(f"{path}: refused: {what}; if you made this model or trust its source, pass "
                                 "--trust-model (convert(..., trust_model=True))")


def keras_file_config(path):
    """The model config of an .h5 (its model_config attribute) or .keras (config.json) file, as text, or None."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return archive.read("config.json").decode()
        import h5py  # a dependency of tf-keras and Keras

        with h5py.File(path, "r") as stream:
            config = stream.attrs.get("model_config")
        return config.decode() if isinstance(config, bytes) else config
    except (OSError, KeyError, UnicodeDecodeError):
        return None


def _layers(config, where):
    """(class name, layer name, where) of every layer config inside `config`, nested models and wrappers too."""
    if isinstance(config, dict):
        if "class_name" in config and isinstance(config.get("config"), dict):
            name = config["config"].get("name", "?")
            yield config["class_name"], name, where
            where = f"{where} > {name}" if where else name
        for value in config.values():
            yield from _layers(value, where)
    elif isinstance(config, list):
        for value in config:
            yield from _layers(value, where)


def check_h5(path):
    """Refuse an .h5 file whose model config holds a layer that carries code; nothing is deserialized."""
    text = keras_file_config(path)
    if text is None:
        return  # no model config: the loader says what is wrong
    try:
        config = json.loads(text)
    except ValueError:
        return
    for class_name, name, where in _layers(config, ""):
        if class_name in CODE_CARRYING_LAYERS:
            raise _refusal(path, f"layer {name!r} ({class_name}, in {where or 'the model'}) carries Python code, "
                                 "which loading the model would run")


def is_safe_mode_refusal(error):
    """Whether a Keras load error is its safe mode refusing to deserialize code."""
    return "safe_mode" in str(error)


def refuse_safe_mode(path, error):
    reason = " ".join(str(error).split())
    return _refusal(path, f"Keras's safe mode refused to load it: {reason}")


def _called_functions(node):
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            yield from (function.name for function in value.list.func)


def _outside_world(node):
    if OUTSIDE_WORLD_OPS.search(node.op):
        return "reaches outside the model (files, Python code or other processes)"
    if node.op == "PrintV2" and node.attr["output_stream"].s.decode().startswith(_FILE_STREAM):
        return "prints to a file"
    if node.op in _PROTO_OPS and node.attr["descriptor_source"].s.decode() not in ("", "local://"):
        return "reads a protocol buffer descriptor from a file"
    return None


def check_graph(path, graph_def, outputs, where, functions=()):
    """Refuse a graph that, to compute `outputs` (node names) or run `functions`, runs an op that reaches outside.

    Walks back from the outputs through data and control inputs, and into
    every function those nodes call (If/While branches, nested calls),
    transitively, so what is never run does not count.
    """
    nodes = {node.name: node for node in graph_def.node}
    library = {function.signature.name: function for function in graph_def.library.function}
    pending = [(name, nodes, where) for name in outputs]
    seen_nodes, seen_functions = set(), set()

    def enter(function_name):
        if function_name in library and function_name not in seen_functions:
            seen_functions.add(function_name)
            body = {inner.name: inner for inner in library[function_name].node_def}
            pending.extend((inner, body, f"function {function_name}, reached from {where}") for inner in body)

    for function_name in functions:
        enter(function_name)
    while pending:
        name, scope, location = pending.pop()
        node = scope.get(name.lstrip("^").split(":")[0])
        if node is None or (location, node.name) in seen_nodes:
            continue
        seen_nodes.add((location, node.name))
        what = _outside_world(node)
        if what is not None:
            raise _refusal(path, f"op {node.op} (node {node.name!r} in {location}) {what}")
        pending.extend((operand, scope, location) for operand in node.input)
        for function_name in _called_functions(node):
            enter(function_name)


def saved_model_signatures(directory):
    """{signature key: SignatureDef} and the meta graph of a SavedModel, read from saved_model.pb alone."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    try:
        with open(os.path.join(directory, "saved_model.pb"), "rb") as stream:
            saved_model.ParseFromString(stream.read())
    except Exception as error:  # protobuf raises DecodeError and friends
        raise errors.CorruptModel(f"{directory}: cannot read the SavedModel ({type(error).__name__})") from None
    if not saved_model.meta_graphs:
        raise errors.CorruptModel(f"{directory}: the SavedModel has no meta graph")
    meta_graph = next((graph for graph in saved_model.meta_graphs if "serve" in graph.meta_info_def.tags),
                      saved_model.meta_graphs[0])
    return dict(meta_graph.signature_def), meta_graph


def _restore_functions(meta_graph):
    """Names of the functions that restore custom saveable objects: tf.saved_model.load runs them."""
    objects = meta_graph.object_graph_def.nodes
    names = []
    for saved in objects:
        for saveable in saved.saveable_objects.values():
            restore = objects[saveable.restore_function]
            kind = restore.WhichOneof("kind")
            if kind == "function":
                names.extend(restore.function.concrete_functions)
            elif kind == "bare_concrete_function":
                names.append(restore.bare_concrete_function.concrete_function_name)
    return names


def check_saved_model(path, directory, signature):
    """Refuse a SavedModel whose loading or signature `signature` runs an op that reaches outside the process.

    What loading runs counts too: the init op (table initializers) and the
    restore functions of custom saveable objects.
    """
    signatures, meta_graph = saved_model_signatures(directory)
    init = signatures.get("__saved_model_init_op")
    if init is not None:
        check_graph(path, meta_graph.graph_def, [tensor.name for tensor in init.outputs.values()],
                    where="the init op, which loading runs")
    check_graph(path, meta_graph.graph_def, [], where="a restore function, which loading runs",
                functions=_restore_functions(meta_graph))
    if signature in signatures:  # else the loader names the signatures there are
        outputs = [tensor.name for tensor in signatures[signature].outputs.values()]
        check_graph(path, meta_graph.graph_def, outputs, where=f"signature {signature}")
