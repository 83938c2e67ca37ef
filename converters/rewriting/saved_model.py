"""A SavedModel rewritten where its graph is kept: the function library of its saved_model.pb.

The weights stay in the model's own variables/, which the TFLite converter's SavedModel importer reads from
disk: no frozen graph holds them inline (a protocol buffer cannot pass 2 GB), and no Python copy is made.
Each function the chosen signature runs is taken out as a graph, rewritten, and put back under its own name
and interface (graph.function_as_graph and back), so the SavedModel's object graph, signatures and
checkpoint stay valid. The result is written beside links to the original's variables/ and assets/.
"""

import collections
import os

from tensorflow.core.protobuf import saved_model_pb2

from . import graph

_GRAPH_FILE = "saved_model.pb"


def read(directory):
    """The SavedModel protocol buffer of a SavedModel folder (its graph and functions; no weights)."""
    with open(os.path.join(directory, _GRAPH_FILE), "rb") as stream:
        return saved_model_pb2.SavedModel.FromString(stream.read())


def keeps_its_graph_in_functions(saved_model):
    """Whether a SavedModel is a TensorFlow 2 one whose initialization restores variables and nothing else.

    The stock converter's SavedModel importer converts what the initialization runs too: a TF1 main op or a
    table initializer becomes part of the .tflite (a main op that writes a file, an op TFLite lacks). Those,
    and TF1 SavedModels without an object graph, are converted from the signature's own graph instead.
    """
    if len(saved_model.meta_graphs) != 1 or not saved_model.meta_graphs[0].object_graph_def.nodes:
        return False  # the loaders pick a tagged one of several; a TF1 SavedModel has no object graph
    meta_graph = saved_model.meta_graphs[0]
    if "table_initializer" in meta_graph.collection_def:
        return False
    initializers = [info.name for info in meta_graph.signature_def["__saved_model_init_op"].outputs.values()] \
        if "__saved_model_init_op" in meta_graph.signature_def else []
    for key in ("saved_model_main_op", "legacy_init_op"):  # TF1's, and written beside TF2's signature too
        initializers.extend(meta_graph.collection_def[key].node_list.value if key in meta_graph.collection_def else ())
    nodes = graph.nodes_by_name(meta_graph.graph_def)
    initializing = [nodes.get(graph.split_tensor_name(name)[0]) for name in initializers]
    return all(node is not None and node.op == "NoOp" and not node.input for node in initializing)


def signature_functions(meta_graph, signature_key):
    """{name: how many times the signature calls it} for the library functions `signature_key` runs (those the
    nodes computing its outputs call, and theirs in turn), callers before the functions they call. A function
    two layers share is one function called twice: what is found in it is found at each call."""
    library = {function.signature.name: function for function in meta_graph.graph_def.library.function}
    nodes = graph.nodes_by_name(meta_graph.graph_def)
    pending = [info.name for info in meta_graph.signature_def[signature_key].outputs.values()]
    reached_nodes, direct = set(), collections.Counter()
    while pending:  # the main graph's nodes the outputs depend on (signature wrappers are called from there)
        name = graph.split_tensor_name(pending.pop().lstrip("^"))[0]
        if name in reached_nodes or name not in nodes:
            continue
        reached_nodes.add(name)
        pending.extend(nodes[name].input)
        direct.update(callee for callee in graph.functions_named(nodes[name]) if callee in library)
    callees = {}  # {function: Counter of the functions its nodes call}, over what the signature reaches
    frontier = list(direct)
    while frontier:
        name = frontier.pop()
        if name not in callees:
            callees[name] = collections.Counter(callee for callee in graph.functions_named_in(library[name])
                                                if callee in library)
            frontier.extend(callees[name])
    callers = sum(callees.values(), collections.Counter())  # call sites, not callers: a caller may call twice
    ready = [name for name in callees if not callers[name]]
    calls = collections.Counter(direct)
    ordered = {}
    while ready:  # callers first: a function's count is complete once every caller's is
        name = ready.pop()
        ordered[name] = calls[name]
        for callee, times in callees[name].items():
            calls[callee] += calls[name] * times
            callers[callee] -= times
            if not callers[callee]:
                ready.append(callee)
    return ordered


def rewrite_functions(saved_model, signature_key, transform):
    """Apply `transform(body GraphDef, its input and output tensors, how many times it is called) -> GraphDef
    or None (unchanged)` to every function the signature runs, in place; how many changed."""
    meta_graph = saved_model.meta_graphs[0]
    library = meta_graph.graph_def.library
    functions = {function.signature.name: function for function in library.function}
    positions = {function.signature.name: index for index, function in enumerate(library.function)}
    changed = 0
    with graph.functions_known(library):
        for name, calls in signature_functions(meta_graph, signature_key).items():
            function = functions[name]
            body, outputs, control_outputs = graph.function_as_graph(function, functions)
            arguments = [arg.name + ":0" for arg in function.signature.input_arg]
            new_body = transform(body, arguments + outputs + list(control_outputs.values()), calls)
            if new_body is not None:
                library.function[positions[name]].CopyFrom(
                    graph.graph_as_function(new_body, function, outputs, control_outputs))
                changed += 1
    return changed


def write(saved_model, original, destination):
    """The SavedModel `saved_model` in the new folder `destination`, with links to `original`'s variables/ and
    assets/ (nothing of the weights is copied)."""
    os.makedirs(destination)
    with open(os.path.join(destination, _GRAPH_FILE), "wb") as stream:
        stream.write(saved_model.SerializeToString())
    for part in ("variables", "assets"):
        if os.path.isdir(os.path.join(original, part)):
            os.symlink(os.path.join(os.path.abspath(original), part), os.path.join(destination, part))
    return destination
