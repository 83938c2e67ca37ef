"""Which GELU forms a traced TensorFlow graph computes, read from its ops and constants, never from names: the
test models' families (`keras_hub_families`, `hugging_face_families`) are found to compute a GELU by it.

* "erf": an Erf or Erfc op, the exact GELU x Phi(x) = 0.5 x (1 + erf(x / sqrt 2));
* "tanh": a Tanh fed, within a few ops, by the constant 0.044715 of the cubic in
  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
* "sigmoid": a Sigmoid fed by the constant 1.702, x sigmoid(1.702 x) (quick GELU), which this package counts as
  a GELU form;
* "fused": an op whose type names a GELU.

A layer called "gelu" that computes a ReLU is not counted, and a GELU written by hand inside a composite layer is.
"""

_TANH_CUBIC_COEFFICIENT = 0.044715  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
_SIGMOID_SLOPE = 1.702  # x sigmoid(1.702 x), "quick GELU"
_UPSTREAM_DEPTH = {"Tanh": 5, "Sigmoid": 3}  # how far above the op its constant may sit
# The walk up from a Tanh or Sigmoid goes through elementwise arithmetic only: a GELU's coefficient is
# in the argument's own formula, not beyond the matmul or convolution that made the argument.
_ELEMENTWISE_OPS = frozenset({"Mul", "AddV2", "Add", "Sub", "RealDiv", "Pow", "Square", "Neg", "Cast", "Identity"})


def _scalar_constants(node):
    """The values of a Const node (only small ones: a GELU's coefficient is a scalar)."""
    import tensorflow as tf

    if node.op != "Const" or "value" not in node.attr:
        return ()
    try:
        values = tf.make_ndarray(node.attr["value"].tensor)
    except (TypeError, ValueError):
        return ()
    if values.dtype.kind != "f" or values.size > 4:
        return ()
    return tuple(float(v) for v in values.ravel())


def _has_constant_upstream(node, nodes_by_name, target, depth):
    """Whether a Const close to `target` feeds `node` within `depth` steps of elementwise arithmetic."""
    frontier, seen = [node], set()
    for _ in range(depth):
        next_frontier = []
        for current in frontier:
            for input_name in current.input:
                producer = nodes_by_name.get(input_name.lstrip("^").split(":")[0])
                if producer is None or producer.name in seen:
                    continue
                seen.add(producer.name)
                if any(abs(value - target) < 1e-5 * max(1.0, abs(target)) for value in _scalar_constants(producer)):
                    return True
                if producer.op in _ELEMENTWISE_OPS:
                    next_frontier.append(producer)
        frontier = next_frontier
    return False


def _gelu_forms_in(nodes):
    """The GELU forms that one graph's (or one library function's) nodes compute."""
    nodes = list(nodes)
    nodes_by_name = {node.name: node for node in nodes}
    forms = set()
    for node in nodes:
        if node.op in ("Erf", "Erfc"):
            forms.add("erf")
        elif "gelu" in node.op.lower():  # a fused kernel, should a graph ever carry one
            forms.add("fused")
        elif node.op == "Tanh" and _has_constant_upstream(
                node, nodes_by_name, _TANH_CUBIC_COEFFICIENT, _UPSTREAM_DEPTH["Tanh"]):
            forms.add("tanh")
        elif node.op == "Sigmoid" and _has_constant_upstream(
                node, nodes_by_name, _SIGMOID_SLOPE, _UPSTREAM_DEPTH["Sigmoid"]):
            forms.add("sigmoid")
    return forms


def forms_in_graph(graph_def):
    """The set of GELU forms a GraphDef computes, its function library (loops, conditionals and nested
    tf.functions) included."""
    forms = _gelu_forms_in(graph_def.node)
    for function in graph_def.library.function:
        forms |= _gelu_forms_in(function.node_def)
    return forms
