"""GraphDef surgery: inlining, tensor naming, splicing, float32 promotion.

Everything here is generic TensorFlow graph plumbing; nothing knows about GELU.
"""

import contextlib
import itertools

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import function_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import function_def_to_graph
from tensorflow.python.framework import graph_to_function_def
from tensorflow.python.framework import op_def_registry

from keras_gelu import vocabulary

CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")
# Attributes through which If/While/Case ops (and their Stateless twins) name
# the library functions they run: branches, loop conditions and bodies.
CONTROL_FLOW_FUNCTION_ATTRS = ("then_branch", "else_branch", "cond", "body", "branches")
PASS_THROUGH_OPS = ("Identity", "IdentityN", "StopGradient", "Snapshot")
# Ops that read a tensor's shape alone, none of its values.
SHAPE_READERS = ("Shape", "ShapeN", "Size", "Rank")
# TFLite computes floats in float32: half types (Keras mixed precision) and
# float64 (keras_gelu computes bfloat16 GELUs in float64) are retyped.
RETYPED_TO_FLOAT32 = tuple(tf.as_dtype(name).as_datatype_enum for name in vocabulary.RETYPED_TO_FLOAT32)


def split_tensor_name(name):
    """'node:1' -> ('node', 1); 'node' -> ('node', 0); '^node' -> ('node', None)."""
    if name.startswith("^"):
        return name[1:], None
    node, _, index = name.partition(":")
    return node, int(index) if index else 0


def tensor_name(node, index):
    return node if index == 0 else f"{node}:{index}"


def canonical(name):
    node, index = split_tensor_name(name)
    return name if index is None else f"{node}:{index}"


def nodes_by_name(graph_def):
    return {node.name: node for node in graph_def.node}


def attribute(node, name, default):
    """The value of a node's attribute, or `default` where the node omits it, as a graph saved with its default
    attributes stripped does: reading `node.attr[name]` would add an empty AttrValue, which the converter then
    refuses ("AttrValue missing value")."""
    if name not in node.attr:
        return default
    value = node.attr[name]
    return getattr(value, value.WhichOneof("value"))


def data_inputs(node):
    """A node's data inputs, without its control inputs ('^name')."""
    return [name for name in node.input if not name.startswith("^")]


def producer(name, nodes):
    """The node that produces tensor `name`'s value (through Identity-like nodes), or None."""
    return nodes.get(split_tensor_name(resolve(name, nodes))[0])


def consumers(graph_def):
    """tensor 'node:i' -> list of (consumer node, input position), data edges only."""
    result = {}
    for node in graph_def.node:
        for position, name in enumerate(node.input):
            if not name.startswith("^"):
                result.setdefault(canonical(name), []).append((node, position))
    return result


def _copy_under_prefix(target, nodes, prefix, outer_tensors, control_inputs=(), device=None):
    """Copy `nodes` into `target` under `prefix`, wired to the outer graph.

    `outer_tensors` maps the names of the nodes that stand for outside values
    (a function's arguments, a traced placeholder) to the outer tensors they
    stand for; those nodes are not copied. `control_inputs` go to copied nodes
    that have no inputs of their own. Returns the copies and the function that
    maps an inner tensor name to its name in `target`.
    """

    def outer(name):
        node_name, index = split_tensor_name(name)
        if node_name in outer_tensors:
            source = outer_tensors[node_name]
            return source if index is not None else "^" + split_tensor_name(source)[0]
        return "^" + prefix + node_name if index is None else prefix + tensor_name(node_name, index)

    copies = []
    for node in nodes:
        if node.name in outer_tensors:
            continue
        copy = target.node.add()
        copy.CopyFrom(node)
        copy.name = prefix + node.name
        del copy.input[:]
        copy.input.extend(outer(name) for name in node.input)
        if not node.input:
            copy.input.extend(control_inputs)
        if device is not None:
            copy.device = device
        copies.append(copy)
    return copies, outer


def called_directly(nodes, library):
    """A FunctionDefLibrary of the functions `nodes` call (by op name, or a call op's `f`) and those they call so,
    transitively: what turning a body into a graph and inlining its calls need of `library` ({name: FunctionDef}).
    Not the control flow they name, which transform_control_flow_functions takes function by function: a body
    that carried the whole library made a deep nest of tf.cond quadratic."""
    needed, pending = {}, list(nodes)
    while pending:
        node = pending.pop()
        names = [node.op] + ([node.attr["f"].func.name] if node.op in CALL_OPS else [])
        for name in names:
            if name in library and name not in needed:
                needed[name] = library[name]
                pending.extend(library[name].node_def)
    result = function_pb2.FunctionDefLibrary()
    result.function.extend(needed.values())
    return result


@contextlib.contextmanager
def functions_known(library):
    """A default graph that holds `library`: function_def_to_graph looks up there the functions a body calls by
    name, and the freezer's renamed copies (..._frozen_...) are known nowhere else."""
    library_only = graph_pb2.GraphDef()
    library_only.library.CopyFrom(library)
    with tf.Graph().as_default():
        tf.compat.v1.import_graph_def(library_only, name="")
        yield


def inline_function_calls(graph_def):
    """Inline, in place, every call to a function of the graph's own library; returns graph_def.

    TensorFlow's freezer leaves calls to XLA-compiled functions (keras_gelu's
    kernels among them) as PartitionedCall nodes; the rewrite has to see their
    bodies. Functions nothing names any more are dropped from the library: a
    control-flow branch an inlined function also called would otherwise seem
    called with other arguments there. In place: a copy would hold every
    weight twice.
    """
    library = {function.signature.name: function for function in graph_def.library.function}
    for _ in range(16):  # nested calls: one level per pass
        calls = [index for index, n in enumerate(graph_def.node)
                 if n.op in CALL_OPS and n.attr["f"].func.name in library]
        if not calls:
            _drop_unnamed_functions(graph_def)
            return graph_def
        rename = {}  # canonical 'call:i' -> the inlined tensor
        call_names = set()
        with functions_known(graph_def.library):
            for index in calls:
                node = graph_def.node[index]
                call_names.add(node.name)
                function = library[node.attr["f"].func.name]
                body, flat_names = function_def_to_graph.function_def_to_graph_def(function)
                operands = data_inputs(node)
                arguments = {arg.name: operands[i] for i, arg in enumerate(function.signature.input_arg)}
                _, outer = _copy_under_prefix(
                    graph_def, body.node, node.name + "/inlined/", arguments,
                    control_inputs=[name for name in node.input if name.startswith("^")],  # the call's own
                    device=node.device)
                for position, output in enumerate(function.signature.output_arg):
                    rename[f"{node.name}:{position}"] = outer(flat_names[function.ret[output.name]])
        for index in reversed(calls):
            del graph_def.node[index]
        for node in graph_def.node:
            for position, name in enumerate(node.input):
                if name.startswith("^") and name[1:] in call_names:
                    # A control edge on a call: depend on the inlined outputs instead.
                    node.input[position] = "^" + split_tensor_name(rename[f"{name[1:]}:0"])[0]
                elif canonical(name) in rename:
                    node.input[position] = rename[canonical(name)]
    raise ValueError("function calls nested more than 16 deep")


def _functions_called_by_control_flow(nodes):
    for node in nodes:
        for key in CONTROL_FLOW_FUNCTION_ATTRS:
            if key in node.attr:
                value = node.attr[key]
                yield from ([value.func.name] if value.HasField("func") else [f.name for f in value.list.func])


def control_flow_functions(graph_def):
    """Library functions that control flow runs, in the graph or inside those functions; callees first."""
    library = {function.signature.name: function for function in graph_def.library.function}
    ordered, visited = [], set()

    def visit(name):  # depth first, a function after all it calls
        if name in visited or name not in library:
            return
        visited.add(name)
        for callee in _functions_called_by_control_flow(library[name].node_def):
            visit(callee)
        ordered.append(name)

    for name in _functions_called_by_control_flow(graph_def.node):
        visit(name)
    return ordered


def function_as_graph(function, library):
    """(GraphDef of the body with the functions it calls, its output tensors, its control outputs' node names);
    `library` is {name: FunctionDef}. Within functions_known of the whole library."""
    body, flat_names = function_def_to_graph.function_def_to_graph_def(function)
    del body.library.function[:]  # function_def_to_graph's copies of what the body calls by name, as it was
    body.library.CopyFrom(called_directly(function.node_def, library))
    outputs = []
    taken = {node.name for node in body.node}
    for arg in function.signature.output_arg:
        # An Identity per output, so that a rewrite redirecting the consumers
        # of a tensor also reaches a tensor that is returned as it is.
        name = next(f"{arg.name}/keras_gelu_output_{n}" for n in itertools.count()
                    if f"{arg.name}/keras_gelu_output_{n}" not in taken)
        output = body.node.add(name=name, op="Identity", input=[flat_names[function.ret[arg.name]]])
        output.attr["T"].type = arg.type
        outputs.append(output.name + ":0")
    return body, outputs, dict(function.control_ret)


def graph_as_function(body, function, outputs, control_outputs):
    """A FunctionDef with `function`'s name, argument and output names, attributes, computing `body`."""
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(body, name="")
    arguments = [scratch.get_tensor_by_name(arg.name + ":0") for arg in function.signature.input_arg]
    rebuilt = graph_to_function_def.graph_to_function_def(
        scratch, scratch.get_operations(), arguments, [scratch.get_tensor_by_name(name) for name in outputs],
        out_names=[arg.name for arg in function.signature.output_arg])
    rebuilt.signature.name = function.signature.name
    rebuilt.signature.is_stateful = function.signature.is_stateful
    for key, value in function.attr.items():
        rebuilt.attr[key].CopyFrom(value)
    for key, value in function.arg_attr.items():
        rebuilt.arg_attr[key].CopyFrom(value)
    kept = {node.name for node in body.node}
    for output in function.signature.control_output:
        if control_outputs.get(output) in kept:
            rebuilt.signature.control_output.append(output)
            rebuilt.control_ret[output] = control_outputs[output]
    return rebuilt


# The ops that run library functions on their inputs: (function attributes, how many leading inputs are not
# the functions' arguments). A While's loop variables are its body's and condition's arguments.
_CONTROL_FLOW_CALLS = {
    "If": (("then_branch", "else_branch"), 1), "StatelessIf": (("then_branch", "else_branch"), 1),
    "Case": (("branches",), 1), "StatelessCase": (("branches",), 1),
    "While": (("cond", "body"), 0), "StatelessWhile": (("cond", "body"), 0),
}


def branches(node):
    """The functions an If or Case node runs one of, in order; none for any other node."""
    if node.op not in _CONTROL_FLOW_CALLS or node.op.endswith("While"):
        return []
    return [function.name for key in _CONTROL_FLOW_CALLS[node.op][0] for value in [node.attr[key]]
            for function in (value.list.func if value.HasField("list") else [value.func])]


def _function_tensor_source(name, body_nodes):
    """In a FunctionDef body: through Identity nodes, the argument or node output a tensor name comes from."""
    while True:
        node_name = name.split(":")[0]
        node = body_nodes.get(node_name)
        if node is None or node.op != "Identity":
            return name if node is not None else node_name
        name = node.input[0]


def every_node(graph_def):
    """The graph's nodes, then those of every function in its library."""
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def constant_bytes(graph_def):
    """The bytes of every Const's value in the graph and its function library: what freezing made of the
    weights, which a serialized GraphDef must hold."""
    return sum(node.attr["value"].tensor.ByteSize() for node in every_node(graph_def) if node.op == "Const")


def constant_arguments_inlined(graph_def):
    """Make each control-flow function argument that is the same constant at every call a Const in the body.

    tf.cond and tf.while_loop pass the tensors a branch or body captures as
    arguments: a GELU whose constants are captured (or computed outside the
    loop) reaches the body with arguments where its constants should be, and
    neither our matcher nor the TFLite converter's GELU fusion can read them.
    Where every call of the function passes the same Const for an argument,
    and, for a loop, the body hands the argument on unchanged, the body now
    reads a Const node of that value instead (the argument stays, unused).
    Functions are settled callers first, so a constant reaches nested control
    flow in one pass: linear in the graph, however deep the nest.
    In place; returns how many arguments were inlined.
    """
    library = {function.signature.name: function for function in graph_def.library.function}
    calls = {name: [] for name in library}  # function -> [(holder or None, node)], every call of it
    for holder, _, nodes in _scopes(graph_def, library):
        for node in nodes:
            for name in functions_named(node):
                if name in library:
                    calls[name].append((holder, node))
    # Whether each loop body hands each argument on, read before any body changes.
    bodies = {node.attr["body"].func.name for _, _, nodes in _scopes(graph_def, library) for node in nodes
              if node.op in ("While", "StatelessWhile")}
    passes_on = {(name, position): handed_on for name in bodies if name in library
                 for position, handed_on in enumerate(_handed_on(library[name]))}
    indexes = {}  # holder name -> {node name: node}, made once the holder itself is settled

    def scope_nodes(holder):
        key = None if holder is None else holder.signature.name
        if key not in indexes:
            indexes[key] = {node.name: node for node in (graph_def.node if holder is None else holder.node_def)}
        return indexes[key]

    inlined = 0
    for name in _callers_first(graph_def, library):
        function = library[name]
        for position in range(len(function.signature.input_arg)):
            values = {_call_operand_constant(name, position, holder, node, scope_nodes(holder), passes_on)
                      for holder, node in calls[name]}
            value = values.pop() if len(values) == 1 else None
            if value is not None:
                inlined += _inline_argument(function, position, value)
    return inlined


def _drop_unnamed_functions(graph_def):
    """Remove, in place, the library functions that neither the graph nor a function it names names (gradient
    registrations keep theirs)."""
    library = {function.signature.name: function for function in graph_def.library.function}
    pending = [name for node in graph_def.node for name in functions_named(node)]
    pending += [name for gradient in graph_def.library.gradient
                for name in (gradient.function_name, gradient.gradient_func)]
    named = set()
    while pending:
        name = pending.pop()
        if name in library and name not in named:
            named.add(name)
            pending.extend(functions_named_in(library[name]))
    if len(named) < len(library):
        kept = [function for function in graph_def.library.function if function.signature.name in named]
        del graph_def.library.function[:]
        graph_def.library.function.extend(kept)


def functions_named(node):
    """The functions a node names: as its op, or in function attributes."""
    yield node.op
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            yield from (function.name for function in value.list.func)


def _callers_first(graph_def, library):
    """Library functions in an order where every caller comes before the functions it names (a reversed
    depth-first post-order from the graph)."""
    ordered, visited = [], set()

    def visit(name):
        stack = [(name, iter(functions_named_in(library[name])))]
        visited.add(name)
        while stack:
            current, callees = stack[-1]
            callee = next((callee for callee in callees if callee in library and callee not in visited), None)
            if callee is None:
                ordered.append(current)
                stack.pop()
            else:
                visited.add(callee)
                stack.append((callee, iter(functions_named_in(library[callee]))))

    for node in graph_def.node:
        for name in functions_named(node):
            if name in library and name not in visited:
                visit(name)
    for name in library:
        if name not in visited:
            visit(name)
    return ordered[::-1]


def functions_named_in(function):
    return (name for node in function.node_def for name in functions_named(node))


# The calls whose arguments constant_arguments_inlined follows: control flow, and the calls of functions a
# SavedModel keeps (its signature wrappers receive the constants a function captured).
_ARGUMENT_PASSING_CALLS = {**_CONTROL_FLOW_CALLS, "PartitionedCall": (("f",), 0),
                           "StatefulPartitionedCall": (("f",), 0)}


def _call_operand_constant(name, position, holder, node, scope_nodes, passes_on):
    """The serialized constant a call passes the function as argument `position`, or None: a call that passes
    no arguments on, a computed operand, or a loop whose body changes the argument."""
    attributes, skipped = _ARGUMENT_PASSING_CALLS.get(node.op, ((), 0))
    analysable = {node.attr[key].func.name for key in attributes if node.attr[key].HasField("func")}
    analysable |= {function.name for key in attributes for function in node.attr[key].list.func}
    operands = data_inputs(node)[skipped:]
    if name not in analysable or position >= len(operands):
        return None
    if node.op in ("While", "StatelessWhile") and not passes_on.get((node.attr["body"].func.name, position)):
        return None
    return _constant_operand(operands[position], holder, scope_nodes)


def _scopes(graph_def, library):
    """(the function holding them or None for the graph, {name: node}, the nodes) of the graph and each function."""
    yield None, {node.name: node for node in graph_def.node}, graph_def.node
    for function in library.values():
        yield function, {node.name: node for node in function.node_def}, function.node_def


def _constant_operand(operand, holder, scope_nodes):
    """The serialized TensorProto of a Const operand (through Identity nodes), else None."""
    if holder is None:
        node = scope_nodes.get(split_tensor_name(resolve(operand, scope_nodes))[0])
    else:
        source = _function_tensor_source(operand, scope_nodes)
        node = scope_nodes.get(source.split(":")[0])
    if node is None or node.op != "Const":
        return None
    return node.attr["value"].SerializeToString()


def _handed_on(body):
    """For each of a loop body's arguments, whether it returns it unchanged as the output in its position."""
    nodes = {node.name: node for node in body.node_def}
    return [_function_tensor_source(body.ret[output.name], nodes) == argument.name
            for argument, output in zip(body.signature.input_arg, body.signature.output_arg)]


def _inline_argument(function, position, serialized_value):
    """Point every reader of the function's argument `position` at a new Const of the value; 1 if any did."""
    argument = function.signature.input_arg[position]
    name = f"{argument.name}/keras_gelu_constant"
    if any(node.name == name for node in function.node_def):
        return 0
    readers = [node for node in function.node_def for operand in node.input if operand == argument.name]
    if not readers:
        return 0
    constant = function.node_def.add(name=name, op="Const")
    constant.attr["value"].ParseFromString(serialized_value)
    constant.attr["dtype"].type = argument.type
    replacement = f"{name}:output:0"
    for node in readers:
        for index, operand in enumerate(node.input):
            if operand == argument.name:
                node.input[index] = replacement
    return 1


# The types Maximum takes. A TensorList handle (a variant: tf.map_fn's elements, read one per pass) is not among
# them: a Maximum of one failed the converter's import ("Value for attr 'T' of variant is not in the list"). Left
# as they are, the converter lowers them to plain tensors, and its calibrator ran through such loops (D-FINE's
# three maps, tests/test_converter_control_flow.py).
_MAXIMUM_TYPES = frozenset({types_pb2.DT_BFLOAT16, types_pb2.DT_HALF, types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE,
                            types_pb2.DT_INT8, types_pb2.DT_UINT8, types_pb2.DT_INT16, types_pb2.DT_UINT16,
                            types_pb2.DT_INT32, types_pb2.DT_UINT32, types_pb2.DT_INT64, types_pb2.DT_UINT64})


def loop_invariants_recomputed(graph_def):
    """Make each While body compute its computed loop invariants as max(v, v) rather than hand them on unchanged.

    TFLite's WHILE frees an output its body hands on unchanged, and the int8
    calibrator then reads the freed tensor and crashes the process
    (tensorflow#75140, TF 2.14 and later): every tf.while_loop that captures a
    computed tensor does that. max(v, v) is v, costs one elementwise op per
    iteration, and the converter keeps it (it folds v * 1, v + 0 and a Reshape
    to v). Constant invariants need nothing: the converter hoists them out.
    In place; returns how many were rewritten.
    """
    library = {function.signature.name: function for function in graph_def.library.function}
    rewritten = 0
    for holder, scope_nodes, nodes in _scopes(graph_def, library):
        for node in nodes:
            body = library.get(node.attr["body"].func.name) if node.op in ("While", "StatelessWhile") else None
            if body is None:
                continue
            handed_on = _handed_on(body)
            for position, operand in enumerate(data_inputs(node)):
                if position < len(handed_on) and handed_on[position] \
                        and body.signature.input_arg[position].type in _MAXIMUM_TYPES \
                        and _constant_operand(operand, holder, scope_nodes) is None:
                    rewritten += _recomputed(body, position)
    return rewritten


def _recomputed(body, position):
    argument = body.signature.input_arg[position]
    output = body.signature.output_arg[position].name
    name = f"{argument.name}/keras_gelu_recomputed"
    if any(node.name == name for node in body.node_def):
        return 0
    maximum = body.node_def.add(name=name, op="Maximum", input=[argument.name, argument.name])
    maximum.attr["T"].type = argument.type
    body.ret[output] = f"{name}:z:0"
    return 1


def transform_control_flow_functions(graph_def, transform):
    """Apply `transform(body GraphDef, its input and output tensors) -> GraphDef` to every control-flow function.

    If/While/Case ops keep their branches and bodies as library functions,
    which the TFLite converter turns into subgraphs; whatever is done to the
    main graph must be done to them too. Each body is taken out as a GraphDef
    (its arguments become Placeholders named after them), transformed and put
    back under its own name and interface; callees go first, so a caller's
    body is rebuilt against its callees' new signatures. Returns a new
    GraphDef, or `graph_def` itself where there is no control flow.
    """
    names = control_flow_functions(graph_def)
    if not names:
        return graph_def
    result = graph_pb2.GraphDef()
    result.CopyFrom(graph_def)
    positions = {function.signature.name: index for index, function in enumerate(result.library.function)}
    library = {function.signature.name: function for function in result.library.function}  # updated in place
    # Every function's signature known once (function_def_to_graph checks the functions a body names): each
    # body converted within its own import of the library made a deep nest quadratic.
    with functions_known(graph_def.library):
        for name in names:
            function = library[name]
            body, outputs, control_outputs = function_as_graph(function, library)
            arguments = [arg.name + ":0" for arg in function.signature.input_arg]
            new_body = transform(body, arguments + outputs + list(control_outputs.values()))
            result.library.function[positions[name]].CopyFrom(
                graph_as_function(new_body, function, outputs, control_outputs))
    return result


def resolve(name, nodes):
    """Follow Identity-like nodes back to the tensor that produces the value."""
    name = canonical(name)
    while True:
        node_name, index = split_tensor_name(name)
        node = nodes.get(node_name)
        if node is None or node.op not in PASS_THROUGH_OPS:
            return name
        name = canonical(data_inputs(node)[index if node.op == "IdentityN" else 0])


def constant_value(name, nodes):
    """The numpy value of a Const tensor (through Identity-like nodes, Reshape and Cast), or None.

    Keras 3's fake_quant reshapes and casts its frozen range constants before the FakeQuant reads them.
    """
    node = producer(name, nodes)
    if node is None:
        return None
    if node.op == "Const":
        return tf.make_ndarray(node.attr["value"].tensor)
    if node.op not in ("Reshape", "Cast"):
        return None
    value = constant_value(node.input[0], nodes)
    if value is None:
        return None
    if node.op == "Cast":
        return value.astype(tf.dtypes.as_dtype(node.attr["DstT"].type).as_numpy_dtype)
    shape = constant_value(node.input[1], nodes)
    return None if shape is None else value.reshape(shape)


class _StatelessOps:
    """The ops a tensor computed from constants alone may be computed by (for constant_subgraph_value): any
    TensorFlow op that reads no state and takes no input."""

    def __contains__(self, op):
        definition = op_def_registry.get(op)
        return definition is not None and not definition.is_stateful and op not in (
            "Placeholder", "PlaceholderWithDefault")


STATELESS_OPS = _StatelessOps()


def constant_subgraph_value(name, graph_def, nodes, ops):
    """The value of tensor `name` where it is computed from constants alone, by `ops` (stateless op names), else
    None. Run in a graph of its own, control inputs left out with the rest of the graph, with the library functions
    it runs (Hugging Face Swin's attention mask comes out of a cond on constants)."""
    pending, seen = [split_tensor_name(name)[0]], set()
    while pending:
        node = nodes.get(pending.pop())
        if node is None or node.op not in ops:
            return None
        if node.name not in seen:
            seen.add(node.name)
            pending.extend(split_tensor_name(operand)[0] for operand in data_inputs(node))
    subgraph = type(graph_def)()
    subgraph.node.extend(node for node in graph_def.node if node.name in seen)
    for node in subgraph.node:
        del node.input[:]  # control inputs dropped with the rest of the graph; data inputs restored below
        node.input.extend(data_inputs(nodes[node.name]))
    drop_dangling_colocations(subgraph)
    functions = _functions_reached(subgraph.node, {function.signature.name: function
                                                   for function in graph_def.library.function})
    if functions is None:
        return None
    subgraph.library.function.extend(functions)
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(subgraph, name="")
        with tf.compat.v1.Session(graph=scratch) as session:
            return session.run(canonical(name))


def _functions_reached(nodes, library):
    """The library functions `nodes` name (as their op or in function attributes: a cond's branches) and those
    name in turn; None where a function attribute names one `library` lacks (a control-flow body's nested
    branches, which the main graph's library keeps)."""
    reached, pending = {}, list(nodes)
    while pending:
        node = pending.pop()
        for position, name in enumerate(functions_named(node)):
            if name in library:
                if name not in reached:
                    reached[name] = library[name]
                    pending.extend(library[name].node_def)
            elif position:  # position 0 is the node's op: a registered op, where no function has its name
                return None
    return list(reached.values())


def _to_float32_saturating(values):
    """float32 values; finite values beyond float32's range become its largest finite values.

    keras_gelu clamps -inf to float64's lowest value, which must stay a finite
    clamp (float32's lowest), not turn into -inf, when the graph is retyped.
    """
    values = np.asarray(values)
    largest = np.finfo(np.float32).max
    return np.where(np.isfinite(values), np.clip(values, -largest, largest), values).astype(np.float32)


def _retyped_types(value):
    """The types of RETYPED_TO_FLOAT32 an attribute's value names."""
    types = [value.type] if value.HasField("type") else value.list.type if value.HasField("list") else \
        [value.tensor.dtype] if value.HasField("tensor") else []
    return {dtype for dtype in types if dtype in RETYPED_TO_FLOAT32}


def retype_floats_to_float32(graph_def):
    """Recompute float16/bfloat16/float64 parts of a graph in float32; returns (graph_def, the names of the types
    retyped, sorted: none where the graph has none).

    Keras mixed-precision models compute in half precision between casts; the
    TFLite converter cannot convert those graphs at all, nor float64 math. We
    retype every such tensor as float32: constants are converted, and casts
    that become float32-to-float32 turn into Identity.
    """
    found = set().union(*(_retyped_types(value) for node in graph_def.node for value in node.attr.values()))
    if not found:
        return graph_def, ()  # nothing to do: spare the copy of every weight
    promoted = graph_pb2.GraphDef()
    promoted.CopyFrom(graph_def)
    for node in promoted.node:
        for key, value in node.attr.items():
            if value.HasField("type") and value.type in RETYPED_TO_FLOAT32:
                value.type = types_pb2.DT_FLOAT
            elif value.HasField("list") and any(t in RETYPED_TO_FLOAT32 for t in value.list.type):
                types = [types_pb2.DT_FLOAT if t in RETYPED_TO_FLOAT32 else t for t in value.list.type]
                del value.list.type[:]
                value.list.type.extend(types)
            elif value.HasField("tensor") and value.tensor.dtype in RETYPED_TO_FLOAT32:
                value.tensor.CopyFrom(tf.make_tensor_proto(_to_float32_saturating(tf.make_ndarray(value.tensor))))
        if node.op == "Cast" and node.attr["SrcT"].type == node.attr["DstT"].type:
            node.op = "Identity"
            dtype = node.attr["SrcT"].type
            for key in list(node.attr):
                del node.attr[key]
            node.attr["T"].CopyFrom(attr_value_pb2.AttrValue(type=dtype))
    return promoted, tuple(sorted(tf.as_dtype(dtype).name for dtype in found))


# Constants larger than this are weights, never the shapes and axes that importing a graph infers from.
_WEIGHT_BYTES = 1024


def without_weights(graph_def):
    """graph_def with each weight replaced by a Placeholder of its dtype and shape: what importing it infers
    (shapes, the tensors a converter reads) is the same, without a copy of the weights.

    Importing the weights too held all of them once more: a third of the
    TFLite converter's extra peak memory, and the time of a copy of every
    weight wherever an int8 pass asked a shape (every LayerNormalization).
    """
    skeleton = tf.compat.v1.GraphDef()
    skeleton.versions.CopyFrom(graph_def.versions)
    skeleton.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        tensor = node.attr["value"].tensor if node.op == "Const" else None
        if tensor is None or len(tensor.tensor_content) <= _WEIGHT_BYTES:
            skeleton.node.add().CopyFrom(node)
            continue
        placeholder = skeleton.node.add(name=node.name, op="Placeholder", device=node.device)
        placeholder.attr["dtype"].type = tensor.dtype
        placeholder.attr["shape"].shape.CopyFrom(tensor.tensor_shape)
    return skeleton


def static_shapes(graph_def, tensors):
    """{tensor name: tf.TensorShape} from TensorFlow's own shape inference over the graph."""
    drop_dangling_colocations(graph_def)  # an inlined graph's, which import refuses (one CPU needs none)
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(without_weights(graph_def), name="")
    return {name: scratch.get_tensor_by_name(canonical(name)).shape for name in tensors}


def splice(graph_def, replacement_fn, x_name, dtype, prefix, nodes):
    """Add the ops of `replacement_fn(x)` to graph_def, fed by tensor x_name; `nodes` (name -> node) is kept up
    to date. Returns the name of the tensor that holds the result."""
    return splice_many(graph_def, lambda x: [replacement_fn(x)], [(x_name, dtype, None)], prefix, nodes)[0]


def splice_many(graph_def, build, inputs, prefix, nodes=None, control_inputs=()):
    """Add the ops of `build(*placeholders)` (a list of tensors) to graph_def, each placeholder standing for one
    of `inputs`, (tensor name, dtype, shape or None).

    The ops are traced once as a tiny graph of their own and copied in under `prefix`, the placeholders
    replaced by the tensors they stand for, `control_inputs` on the copies that have no inputs; `nodes`
    (name -> node), if given, is kept up to date. Returns the names of the tensors `build` returned.
    """
    with tf.Graph().as_default() as scratch:
        placeholders = [tf.compat.v1.placeholder(dtype, shape, name=f"input_{index}")
                        for index, (_, dtype, shape) in enumerate(inputs)]
        results = build(*placeholders)
    outer_tensors = {placeholder.op.name: name for placeholder, (name, _, _) in zip(placeholders, inputs)}
    copies, outer = _copy_under_prefix(graph_def, scratch.as_graph_def().node, prefix, outer_tensors,
                                       control_inputs)
    if nodes is not None:
        nodes.update((copy.name, copy) for copy in copies)
    return [outer(result.name) for result in results]


def redirect(graph_def, old, new, keep=()):
    """Point every data input that reads tensor `old` at tensor `new`."""
    old = canonical(old)
    for node in graph_def.node:
        if node.name in keep:
            continue
        for position, name in enumerate(node.input):
            if not name.startswith("^") and canonical(name) == old:
                node.input[position] = new


def prune(graph_def, keep_tensors):
    """Delete, in place, the nodes `keep_tensors` do not depend on (data and control edges); returns graph_def."""
    nodes = nodes_by_name(graph_def)
    needed = set()
    pending = [split_tensor_name(name)[0] for name in keep_tensors]
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        pending.extend(split_tensor_name(operand)[0] for operand in nodes[name].input)
    for index in reversed([index for index, node in enumerate(graph_def.node) if node.name not in needed]):
        del graph_def.node[index]
    drop_dangling_colocations(graph_def)
    return graph_def


def drop_dangling_colocations(graph_def):
    """Drop each colocation constraint ('_class': loc:@node) that names a node no longer in the graph.

    TensorFlow's function inliner colocates the identities it makes with one
    another; once one is gone (inlined again, or pruned as dead), importing
    the graph fails on the constraint, which placement on one CPU never needed.
    """
    names = {node.name for node in graph_def.node}
    for node in graph_def.node:
        if "_class" not in node.attr:
            continue
        kept = [entry for entry in node.attr["_class"].list.s if entry.decode().removeprefix("loc:@") in names]
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(kept)
        if not kept:
            del node.attr["_class"]


def with_passes(graph_def, passes):
    """A copy of graph_def with each in-place `pass(graph_def)` run in order, on it and every control-flow function."""
    if not passes:
        return graph_def

    def run(body, outputs=None):
        result = graph_pb2.GraphDef()
        result.CopyFrom(body)
        for graph_pass in passes:
            graph_pass(result)
        return result

    return transform_control_flow_functions(run(graph_def), run)


def round_float_constants_to_float16(graph_def, except_scope=None):
    """A copy whose float32 constants hold float16-rounded values.

    TFLite's float16 weight storage rounds every float constant this way, so
    the TensorFlow reference for a --float16-weights model must too, or the
    fidelity check would measure the weight rounding instead of the conversion.
    Constants under `except_scope` are kept: those of replacements the
    converter fuses into one op (the GELU op), which leaves no constant to round.
    """

    def round_constants(body):
        for node in body.node:
            if except_scope and except_scope in node.name:
                continue
            if node.op == "Const" and node.attr["value"].tensor.dtype == types_pb2.DT_FLOAT:
                value = tf.make_ndarray(node.attr["value"].tensor)
                with np.errstate(over="ignore"):  # float32's extremes become +-inf, as in TFLite
                    rounded_value = value.astype(np.float16).astype(np.float32)
                node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(rounded_value))

    return with_passes(graph_def, [round_constants])
