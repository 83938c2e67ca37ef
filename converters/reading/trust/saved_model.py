"""A SavedModel checked whole, from saved_model.pb and the folder, before TensorFlow loads any of it.

What loading and converting run depends on paths that are easy to miss: the
TensorFlow 1 loader runs the main-op and legacy-init-op collections, the table
initializers and the saver's restore op; the TensorFlow 2 loader runs every
resource's create and initialize functions from the object graph, and takes
its signatures from there, not from signature_def; a node may call a library
function by naming it as its op, and a function attribute may name an op.
Rather than follow each path, the check reads everything the file holds:

* every node of every meta graph and every library function, reachable or
  not, against `ops.refusal` (what the op can do), and every function
  attribute, which names either a library function (itself checked) or an op;
* the checkpoint ops, which every SavedModel holds for its saver, only where
  the saver alone reaches them (see `_SaverRole`);
* the object graph: the functions it names exist, no object asks for a saver
  registered in Python, and its signatures are signature_def's;
* the folder: no symbolic link leads out of it, no asset names a file outside
  its assets folder.
"""

import collections
import os
import re

from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.protobuf import saved_model_pb2

from ... import errors
from . import ops

# The saver's checkpoint ops: it reads the model's variables with the first, and writes a checkpoint with the
# second (which loading and converting never do).
_CHECKPOINT_READS = frozenset({"RestoreV2", "Restore", "RestoreSlice"})
_CHECKPOINT_WRITES = frozenset({"SaveV2", "Save", "SaveSlices", "MergeV2Checkpoints"})
# signature_def keys that are the loader's own, not signatures it exposes.
_LOADER_SIGNATURES = ("__saved_model_init_op", "__saved_model_train_op")
_ASSETS_COLLECTION = "saved_model_assets"


def read(path, directory):
    """The SavedModel proto of saved_model.pb; CorruptModel if it is not one."""
    saved_model = saved_model_pb2.SavedModel()
    try:
        with open(os.path.join(directory, "saved_model.pb"), "rb") as stream:
            saved_model.ParseFromString(stream.read())
    except Exception as error:  # protobuf raises DecodeError and friends
        raise errors.CorruptModel(f"{path}: cannot read the SavedModel ({type(error).__name__})") from None
    if not saved_model.meta_graphs:
        raise errors.CorruptModel(f"{path}: the SavedModel has no meta graph")
    return saved_model


def check(path, directory):
    """Refuse (errors.UntrustedModel) a SavedModel that holds anything able to act outside the process."""
    saved_model = read(path, directory)
    _check_folder(path, directory)
    for meta_graph in saved_model.meta_graphs:
        _check_assets(path, meta_graph)
        _MetaGraphCheck(path, meta_graph).run()


def check_graph(path, graph_def):
    """Refuse (errors.UntrustedModel) a graph, library included, holding an op able to act outside the process.

    For the graph a Keras model's layers traced in memory: a SavedModel's
    node and library checks, on a graph with no saver, object graph or
    assets (so that any checkpoint op is refused).
    """
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph_def)
    _MetaGraphCheck(path, meta_graph).run()


def _check_folder(path, directory):
    root = os.path.realpath(directory)
    for folder, subfolders, files in os.walk(directory):
        for name in subfolders + files:
            entry = os.path.join(folder, name)
            if os.path.islink(entry) and os.path.commonpath([root, os.path.realpath(entry)]) != root:
                raise errors.UntrustedModel.refused(
                    path, f"{os.path.relpath(entry, directory)} is a symbolic link to "
                          f"{os.path.realpath(entry)}, outside the model, which loading would open")


def _asset_file_defs(meta_graph):
    yield from meta_graph.asset_file_def
    for packed in meta_graph.collection_def[_ASSETS_COLLECTION].any_list.value \
            if _ASSETS_COLLECTION in meta_graph.collection_def else ():
        asset = meta_graph_pb2.AssetFileDef()
        if packed.Unpack(asset):
            yield asset


def _check_assets(path, meta_graph):
    for asset in _asset_file_defs(meta_graph):
        inside = os.path.normpath(os.path.join("assets", asset.filename))
        if os.path.isabs(asset.filename) or not inside.startswith("assets" + os.sep):
            raise errors.UntrustedModel.refused(
                path, f"asset {asset.filename!r} names a file outside the model's assets folder")


def _node_name(tensor_name):
    """The node of a tensor or control input name: "^a", "a:0" and "a" are all node "a"."""
    return tensor_name.lstrip("^").split(":")[0]


def _function_attributes(attributes):
    """Every NameAttrList among a node's (or a NameAttrList's) attributes, at any depth."""
    for value in attributes.values():
        functions = [value.func] if value.HasField("func") else list(value.list.func) if value.HasField("list") else []
        for function in functions:
            yield function
            yield from _function_attributes(function.attr)


class _MetaGraphCheck:
    def __init__(self, path, meta_graph):
        self.path = path
        self.meta_graph = meta_graph
        self.library = {function.signature.name: function for function in meta_graph.graph_def.library.function}
        self.nodes = {node.name: node for node in meta_graph.graph_def.node}
        self.saver = _SaverRole(meta_graph, self.library, self.nodes, self._called_functions)

    def run(self):
        self._check_object_graph()
        for node in self.meta_graph.graph_def.node:
            self._check_node(node, "the graph", None)
        for name, function in self.library.items():
            for node in function.node_def:
                self._check_node(node, f"function {name}", function)

    def _called_functions(self, node):
        """Names of the library functions a node runs: as its op, or through function attributes."""
        names = [node.op] if node.op in self.library else []
        return names + [function.name for function in _function_attributes(node.attr) if function.name in self.library]

    def _refuse(self, node, where, what):
        raise errors.UntrustedModel.refused(self.path, f"op {node.op} (node {node.name!r} in {where}) {what}")

    def _check_node(self, node, where, function):
        if node.op in _CHECKPOINT_READS | _CHECKPOINT_WRITES:
            if not self.saver.allows(node, function):
                self._refuse(node, where, "reads or writes checkpoint files, outside the saver's restore of the "
                                          "model's own variables")
        elif node.op not in self.library:  # else a call of a library function, which is checked on its own
            what = ops.refusal(node.op, node.attr)
            if what is not None:
                self._refuse(node, where, what)
        for named in _function_attributes(node.attr):
            if named.name not in self.library:  # TensorFlow runs a registered op named as a function
                what = ops.refusal(named.name, named.attr)
                if what is not None:
                    self._refuse(node, where, f"names {named.name!r} as a function to call, which {what}")

    def _check_object_graph(self):
        graph = self.meta_graph.object_graph_def
        for index, saved in enumerate(graph.nodes):
            if saved.registered_saver:
                raise errors.UntrustedModel.refused(
                    self.path, f"object {index} of the object graph is saved by {saved.registered_saver!r}, "
                               "Python code registered under that name that loading would run")
            for name in _object_functions(saved):
                if name not in self.library:
                    raise errors.CorruptModel(f"{self.path}: the object graph names function {name!r}, which the "
                                              "SavedModel lacks")
        for name in graph.concrete_functions:
            if name not in self.library:
                raise errors.CorruptModel(f"{self.path}: the object graph names function {name!r}, which the "
                                          "SavedModel lacks")
        self._check_signatures_agree(graph)

    def _check_signatures_agree(self, graph):
        """The loader takes a TF2 SavedModel's signatures from the object graph, we read signature_def: the two
        must name the same functions, or the model converted is not the model checked."""
        loaded = _object_graph_signatures(graph)
        if loaded is None:
            return  # a TF1 SavedModel: the loader builds its signatures from signature_def
        declared = {key: _signature_function(signature, self.nodes)
                    for key, signature in self.meta_graph.signature_def.items() if key not in _LOADER_SIGNATURES}
        for key in sorted(set(loaded) | set(declared)):
            if loaded.get(key) != declared.get(key):
                raise errors.UntrustedModel.refused(
                    self.path, f"signature {key!r} runs function {loaded.get(key)!r} when loaded (the object graph) "
                               f"but {declared.get(key)!r} by its description (signature_def); a model whose two "
                               "descriptions disagree is not converted")


def _object_functions(saved):
    kind = saved.WhichOneof("kind")
    if kind == "function":
        return list(saved.function.concrete_functions)
    if kind == "bare_concrete_function":
        return [saved.bare_concrete_function.concrete_function_name]
    return []


def _object_graph_signatures(graph):
    """{key: function name} of the object graph's signature map, or None if it has none."""
    if not graph.nodes:
        return None
    for child in graph.nodes[0].children:
        holder = graph.nodes[child.node_id] if child.node_id < len(graph.nodes) else None
        if child.local_name == "signatures" and holder is not None and \
                holder.user_object.identifier == "signature_map":
            signatures = {}
            for entry in holder.children:
                functions = _object_functions(graph.nodes[entry.node_id]) if entry.node_id < len(graph.nodes) else []
                signatures[entry.local_name] = functions[0] if len(functions) == 1 else None
            return signatures
    return None


def _signature_function(signature, nodes):
    """The one function a signature_def's outputs come from (the call node's `f`), or None."""
    functions = set()
    for tensor in signature.outputs.values():
        node = nodes.get(_node_name(tensor.name))
        functions.add(node.attr["f"].func.name if node is not None and "f" in node.attr else None)
    return functions.pop() if len(functions) == 1 else None


_NAME_CHARACTERS = rb"[\w./>-]"


def _mentions(blob, whole_names, name):
    """Whether serialized protos `blob` mention a node name as a whole name (not as a prefix of another).

    `whole_names`, `blob`'s maximal runs of name characters (`_whole_names`), answers for a name made of those
    characters only, in one lookup where a search reads the whole blob (node by node, that was a third of a
    small ConvNeXt's conversion); any other name is searched for.
    """
    encoded = name.encode()
    if re.fullmatch(_NAME_CHARACTERS + rb"+", encoded):
        return encoded in whole_names
    return re.search(rb"(?<!" + _NAME_CHARACTERS + rb")" + re.escape(encoded) + rb"(?!" + _NAME_CHARACTERS + rb")",
                     blob) is not None


def _whole_names(blob):
    return set(re.findall(_NAME_CHARACTERS + rb"+", blob))


class _SaverRole:
    """Where the saver's checkpoint ops may stand: where nothing but the saver reaches them.

    Every SavedModel holds the saver its exporter made (saver_def): a restore
    op that reads the variables from a file name the loader feeds (the
    variables folder inside the model), and a save tensor that writes a
    checkpoint, which loading and converting never fetch. A checkpoint op is
    allowed only in the part of the graph that leads to nothing but its
    saver entry (the restore op or the save tensor) and that nothing else in
    the file names, and, in library functions, only in functions that only
    that part calls. A restore must also read from the fed file name itself,
    as the loader's argument, not from a name the model chose.
    """

    def __init__(self, meta_graph, library, nodes, called_functions):
        saver = meta_graph.saver_def
        self._nodes = nodes
        self._filename = _node_name(saver.filename_tensor_name) if saver.filename_tensor_name else None
        # Everything outside the graph's node list that can name a node: signatures, collections, assets, the
        # object graph (meta_info_def only describes: its op list names ops, which nodes are often named after).
        elsewhere = meta_graph_pb2.MetaGraphDef()
        elsewhere.CopyFrom(meta_graph)
        for description in ("graph_def", "saver_def", "meta_info_def"):
            elsewhere.ClearField(description)
        self._elsewhere = elsewhere.SerializeToString()
        self._consumers = collections.defaultdict(set)
        self._main_calls = {}  # main-graph node -> the functions it calls
        self._body_calls = collections.defaultdict(set)  # function -> the functions its body calls
        self._callers = collections.defaultdict(list)  # function -> [(function holding the call or None, node)]
        for node in nodes.values():
            for operand in node.input:
                self._consumers[_node_name(operand)].add(node.name)
            self._main_calls[node.name] = called_functions(node)
            for name in self._main_calls[node.name]:
                self._callers[name].append((None, node))
        for holder, function in library.items():
            for node in function.node_def:
                for name in called_functions(node):
                    self._body_calls[holder].add(name)
                    self._callers[name].append((holder, node))
        # Functions the object graph or a gradient registration names could run outside the saver.
        self._named_elsewhere = {gradient.gradient_func for gradient in meta_graph.graph_def.library.gradient}
        self._named_elsewhere.update(gradient.function_name for gradient in meta_graph.graph_def.library.gradient)
        self._named_elsewhere.update(meta_graph.object_graph_def.concrete_functions)
        for saved in meta_graph.object_graph_def.nodes:
            self._named_elsewhere.update(_object_functions(saved))
        self._entries = {"read": _node_name(saver.restore_op_name) if saver.restore_op_name else None,
                         "write": _node_name(saver.save_tensor_name) if saver.save_tensor_name else None}
        self._regions = {}

    def _region(self, kind):
        """(main-graph nodes that lead only to the `kind` entry, functions only they call)."""
        if kind in self._regions:
            return self._regions[kind]
        entry = self._entries[kind]
        if entry is None or entry not in self._nodes:
            self._regions[kind] = (set(), set())
            return self._regions[kind]
        ancestors, pending = set(), [entry]
        while pending:
            name = pending.pop()
            if name in ancestors or name not in self._nodes:
                continue
            ancestors.add(name)
            pending.extend(_node_name(operand) for operand in self._nodes[name].input)
        whole_names = _whole_names(self._elsewhere)
        only_to_entry = {name for name in ancestors if not _mentions(self._elsewhere, whole_names, name)}
        # A node leads only to the entry if every consumer does; iterate to the fixed point.
        changed = True
        while changed:
            changed = False
            for name in list(only_to_entry):
                if name != entry and not self._consumers[name] <= only_to_entry:
                    only_to_entry.discard(name)
                    changed = True
        functions = set()
        pending = [name for node_name in only_to_entry for name in self._main_calls[node_name]]
        while pending:
            name = pending.pop()
            if name not in functions:
                functions.add(name)
                pending.extend(self._body_calls[name])
        changed = True
        while changed:
            changed = False
            for name in list(functions):
                callers_inside = all((holder is None and node.name in only_to_entry) or holder in functions
                                     for holder, node in self._callers[name])
                if not callers_inside or name in self._named_elsewhere:
                    functions.discard(name)
                    changed = True
        self._regions[kind] = (only_to_entry, functions)
        return self._regions[kind]

    def allows(self, node, function):
        kind = "read" if node.op in _CHECKPOINT_READS else "write"
        nodes, functions = self._region(kind)
        if function is None:
            inside = node.name in nodes
            reads_fed_name = self._filename is not None and node.input and _node_name(node.input[0]) == self._filename
        else:
            name = function.signature.name
            inside = name in functions
            reads_fed_name = inside and self._argument_is_fed_name(function, node)
        return inside and (kind == "write" or reads_fed_name)

    def _argument_is_fed_name(self, function, node):
        """Whether the node's first input is an argument of `function` that every caller binds to the fed name."""
        arguments = [argument.name for argument in function.signature.input_arg]
        if not node.input or node.input[0] not in arguments:
            return False
        position = arguments.index(node.input[0])
        callers = self._callers[function.signature.name]
        for holder, caller in callers:
            operands = [operand for operand in caller.input if not operand.startswith("^")]
            if holder is not None or position >= len(operands) or _node_name(operands[position]) != self._filename:
                return False
        return bool(callers)
