"""Find GELU spellings and bare erf in a frozen GraphDef and rewrite them.

The matcher works like tf2onnx's GELU rewriter in three steps, but with
algebra instead of a fixed op tree:

1. Start at every gate op (Erf, Erfc, Tanh, Sigmoid). Its argument must be a
   polynomial a1*x + a3*x^3 in one tensor x, with scalar constant coefficients.
2. Walk up through the arithmetic consumers, evaluating each as a polynomial in
   x and the gate's value; keep the highest node whose polynomial is
   x*(offset + scale*gate). Any operand order, nesting, Sub/Neg/Div/Pow works.
3. Look the coefficients up in patterns.PATTERNS (float32 tolerance).

Only then is the replacement (keras_gelu.replacements' table, by the GELU's
function, the mode and exact_as) spliced in and the GELU's consumers
rewired; the old ops become dead and are pruned. Int8 graph passes and
ranges are the pipeline's (int8.py); this module only matches and splices.
"""

import collections
import dataclasses
import math

import tensorflow as tf

from keras_gelu import replacements

from . import graph
from . import patterns
from . import saved_model

# Name scope of the ops the rewrite adds; their erf is ours, not a leftover.
REWRITE_SCOPE = "/keras_gelu_rewrite/"
# Within it, the ops of replacements the TFLite converter fuses into one op.
FUSED_SCOPE = REWRITE_SCOPE + "fused/"


class NotPolynomial(Exception):
    """An operand is not a polynomial in x and the gate."""


def _multiply(a, b):
    product = collections.defaultdict(float)
    for (i1, j1), c1 in a.items():
        for (i2, j2), c2 in b.items():
            product[(i1 + i2, j1 + j2)] += c1 * c2
    return dict(product)


def _add(a, b, sign=1.0):
    total = collections.defaultdict(float, a)
    for key, value in b.items():
        total[key] += sign * value
    return dict(total)


# Ops whose scalar constant operands are folded while matching, so that
# coefficients written as tf.sqrt(2.0), 1 / tf.sqrt(2 / pi) or 2.0 ** 0.5 count
# as the numbers they compute. The graph itself is left as it is: the whole
# GELU, constants included, is replaced.
_FOLDED = {
    "Sqrt": lambda a: math.sqrt(a) if a >= 0 else None,
    "Rsqrt": lambda a: 1.0 / math.sqrt(a) if a > 0 else None,
    "Reciprocal": lambda a: 1.0 / a if a else None,
    "Neg": lambda a: -a,
    "Square": lambda a: a * a,
    "Cast": lambda a: a,
    "Mul": lambda a, b: a * b,
    "RealDiv": lambda a, b: a / b if b else None,
    "Div": lambda a, b: a / b if b else None,
    "AddV2": lambda a, b: a + b,
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Pow": lambda a, b: a ** b if a > 0 else None,
}


def _scalar_constant(name, nodes):
    """The value of a scalar constant, or of a scalar expression of constants (_FOLDED), else None."""
    value = graph.constant_value(name, nodes)
    if value is not None:
        return float(value.reshape(())) if value.size == 1 and value.dtype.kind in "fiu" else None
    node = graph.producer(name, nodes)
    if node is None or node.op not in _FOLDED or graph.split_tensor_name(graph.resolve(name, nodes))[1] != 0:
        return None
    if node.op == "Cast" and not tf.as_dtype(node.attr["DstT"].type).is_floating:
        return None
    operands = [_scalar_constant(operand, nodes) for operand in graph.data_inputs(node)]
    if None in operands:
        return None
    try:
        return _FOLDED[node.op](*operands)
    except (ArithmeticError, TypeError):
        return None


class _Polynomials:
    """Evaluates tensors as polynomials {(power of x, power of gate): coefficient}."""

    def __init__(self, nodes, x, gate=None):
        self.nodes = nodes
        self.x = x
        self.gate = gate
        self.memo = {}

    def of(self, name):
        name = graph.resolve(name, self.nodes)
        if name not in self.memo:
            self.memo[name] = self._evaluate(name)
        return self.memo[name]

    def _evaluate(self, name):
        if name == self.x:
            return {(1, 0): 1.0}
        if name == self.gate:
            return {(0, 1): 1.0}
        constant = _scalar_constant(name, self.nodes)
        if constant is not None:
            return {(0, 0): constant}
        node_name, index = graph.split_tensor_name(name)
        node = self.nodes.get(node_name)
        if node is None or index != 0 or node.op not in patterns.ARITHMETIC_OPS:
            raise NotPolynomial(name)
        operands = graph.data_inputs(node)
        if node.op == "Neg":
            return {k: -v for k, v in self.of(operands[0]).items()}
        if node.op == "Square":
            value = self.of(operands[0])
            return _multiply(value, value)
        if node.op in ("RealDiv", "Div", "Pow"):
            exponent_or_divisor = _scalar_constant(operands[1], self.nodes)
            if exponent_or_divisor is None:
                raise NotPolynomial(name)
            base = self.of(operands[0])
            if node.op == "Pow":
                if exponent_or_divisor not in (1.0, 2.0, 3.0):
                    raise NotPolynomial(name)
                result = {(0, 0): 1.0}
                for _ in range(int(exponent_or_divisor)):
                    result = _multiply(result, base)
                return result
            return {k: v / exponent_or_divisor for k, v in base.items()}
        left, right = self.of(operands[0]), self.of(operands[1])
        if node.op == "Mul":
            return _multiply(left, right)
        return _add(left, right, -1.0 if node.op == "Sub" else 1.0)


def _subexpressions(name, nodes):
    """The non-constant tensors an expression is computed from through arithmetic (itself included), those
    farthest from it first."""
    depths, frontier = {}, [(graph.resolve(name, nodes), 0)]
    while frontier:
        tensor, depth = frontier.pop()
        if _scalar_constant(tensor, nodes) is not None or depths.get(tensor, -1) >= depth:
            continue
        depths[tensor] = depth
        node_name, index = graph.split_tensor_name(tensor)
        node = nodes.get(node_name)
        if node is not None and index == 0 and node.op in patterns.ARITHMETIC_OPS:
            frontier.extend((graph.resolve(operand, nodes), depth + 1) for operand in graph.data_inputs(node))
    return sorted(depths, key=lambda tensor: -depths[tensor])


def _gate_arguments(gate_node, nodes):
    """Each (x, a1, a3) for which the gate's argument is a1 x + a3 x^3 in one tensor x: x the argument's one
    leaf, else any tensor it is computed from (a GELU of `h + b` or of `g * h`, whose x is no leaf), the
    farthest first."""
    argument = gate_node.input[0]
    for x in _subexpressions(argument, nodes):
        try:
            terms = _Polynomials(nodes, x).of(argument)
        except NotPolynomial:
            continue
        terms = {k: v for k, v in terms.items() if v != 0.0}
        if not set(terms) - {(1, 0), (3, 0)} and (1, 0) in terms:
            yield x, terms[(1, 0)], terms.get((3, 0), 0.0)


def _effective_consumers(name, nodes, consumer_map):
    """Consumers of a tensor, looking through Identity-like nodes."""
    result = []
    for node, _ in consumer_map.get(graph.canonical(name), []):
        if node.op == "IdentityN":
            for position, source in enumerate(graph.canonical(i) for i in graph.data_inputs(node)):
                if source == graph.canonical(name):
                    result.extend(_effective_consumers(f"{node.name}:{position}", nodes, consumer_map))
        elif node.op in graph.PASS_THROUGH_OPS:
            result.extend(_effective_consumers(node.name + ":0", nodes, consumer_map))
        else:
            result.append(node)
    return result


@dataclasses.dataclass
class Finding:
    pattern: str
    alpha: float
    became: str
    root: str  # output tensor of the GELU in the source graph
    x: str
    gate: str  # the gate op's node name


def find_gelus(graph_def):
    """All GELUs in the graph: a list of (Finding-without-'became', Pattern)."""
    nodes = graph.nodes_by_name(graph_def)
    consumer_map = graph.consumers(graph_def)
    found = {}
    for gate_node in graph_def.node:
        if gate_node.op not in patterns.GATE_OPS:
            continue
        for x, linear, cubic in _gate_arguments(gate_node, nodes):
            best = _gelu_above(gate_node, x, linear, cubic, nodes, consumer_map)
            if best is not None:
                root, (pattern, alpha) = best
                found[root] = (Finding(pattern.name, alpha, "", root, x, gate_node.name), pattern)
                break
    return list(found.values())


def _gelu_above(gate_node, x, linear, cubic, nodes, consumer_map):
    """(the highest tensor above the gate that is a GELU of x, (pattern, alpha)), or None."""
    polynomials = _Polynomials(nodes, x, gate=gate_node.name + ":0")
    current, best = gate_node.name + ":0", None
    while True:
        users = _effective_consumers(current, nodes, consumer_map)
        if len(users) != 1 or users[0].op not in patterns.ARITHMETIC_OPS:
            return best
        current = users[0].name + ":0"
        try:
            terms = {k: v for k, v in polynomials.of(current).items() if v != 0.0}
        except NotPolynomial:
            return best
        if set(terms) <= {(1, 0), (1, 1)} and (1, 1) in terms:
            matched = patterns.match(gate_node.op, terms.get((1, 0), 0.0), terms[(1, 1)], linear, cubic)
            if matched is not None:
                best = (current, matched)


@dataclasses.dataclass
class RewriteResult:
    graph_def: object
    findings: list
    leftover_erf: dict  # op type -> count of bare Erf/Erfc rewritten (or kept, in select mode)


def _dtype_of(name, nodes):
    node = nodes[graph.split_tensor_name(name)[0]]
    for key in ("T", "dtype", "DstT"):
        if key in node.attr and node.attr[key].type:
            return tf.as_dtype(node.attr[key].type)
    return tf.float32


def rewrite(graph_def, keep_tensors, mode, exact_as, int8=False, marker=None):
    """Rewrite every GELU and bare erf as `mode` (a vocabulary.Mode) wants; returns a RewriteResult.

    The main graph is rewritten in place (its RewriteResult.graph_def is `graph_def` itself, unless
    control flow made a new one): pass a copy to keep the original.

    `keep_tensors` are the graph's inputs and outputs: everything else that no
    longer feeds them is pruned. `int8` picks the table's int8 replacements.
    `marker(build, alpha, x, nodes)`, where given, gives each replacement its
    `mark` and a note for the report (int8.marker: exact int8 ranges); a
    replacement given a mark does without the -inf clamp. The branches and
    bodies of If/While ops are rewritten the same way.
    """
    findings, leftover = [], collections.Counter()

    def rewrite_one(body, outputs):
        rewritten, found, bare = _rewrite_graph(body, outputs, mode, exact_as, int8, marker)
        findings.extend(found)
        leftover.update(bare)
        return rewritten

    rewritten = graph.transform_control_flow_functions(rewrite_one(graph_def, keep_tensors), rewrite_one)
    return RewriteResult(rewritten, findings, dict(leftover))


def rewrite_saved_model(saved_model_proto, signature_key, mode, exact_as, passes=()):
    """rewrite() on a SavedModel where it keeps its graph (saved_model.rewrite_functions): every function the
    signature runs, after the in-place graph `passes`; a RewriteResult without a graph_def (the protocol
    buffer itself is rewritten). A function with nothing to rewrite is left as it was written."""
    findings, leftover = [], collections.Counter()

    def rewrite_one(body, outputs, calls):
        passed = sum(graph_pass(body) for graph_pass in passes)
        rewritten, found, bare = _rewrite_graph(body, outputs, mode, exact_as, False, None)
        findings.extend(found * calls)  # each call's GELU, as the frozen route finds it inlined at each call
        leftover.update({op: count * calls for op, count in bare.items()})
        changed = passed or (bare and mode.rewrites) or any(not f.became.startswith("unchanged") for f in found)
        return rewritten if changed else None

    saved_model.rewrite_functions(saved_model_proto, signature_key, rewrite_one)
    return RewriteResult(None, findings, dict(leftover))


def _splice_replacement(graph_def, finding, replacement, nodes, marker):
    """Splice `replacement` in for the GELU of `finding`; what it became, for the report."""
    description = replacement.description
    if marker is None:
        mark = None
    else:
        mark, note = marker(replacement.build, finding.alpha, finding.x, nodes)
        description += note
    scope = FUSED_SCOPE if replacement.fused else REWRITE_SCOPE
    new = graph.splice(graph_def, lambda x: replacement.build(x, finding.alpha, mark=mark), finding.x,
                       _dtype_of(finding.x, nodes), graph.split_tensor_name(finding.root)[0] + scope, nodes)
    graph.redirect(graph_def, finding.root, new)
    return description


def _rewrite_graph(graph_def, keep_tensors, mode, exact_as, int8, marker):
    """rewrite() for one graph (the main graph or a function body): (graph_def, findings, leftover erf)."""
    rewritten = graph_def  # in place: a copy would hold every weight twice
    findings = []
    nodes = graph.nodes_by_name(rewritten)  # splice keeps it up to date
    for finding, pattern in find_gelus(rewritten):
        replacement = None
        if mode.rewrites:
            replacement = replacements.replacement_for(pattern.function, mode, exact_as, int8)
        if replacement is None:
            finding.became = "unchanged" + (" (already builtin ops)" if mode.rewrites else "")
        else:
            finding.became = _splice_replacement(rewritten, finding, replacement, nodes, marker)
        findings.append(finding)
    rewritten = graph.prune(rewritten, keep_tensors)

    leftover = collections.Counter()
    gelu_gates = {finding.gate for finding in findings}
    nodes = graph.nodes_by_name(rewritten)
    for node in list(rewritten.node):
        if node.op not in replacements.BARE_ERF or node.name in gelu_gates or REWRITE_SCOPE in node.name:
            continue
        leftover[node.op] += 1
        if mode.rewrites:
            replacement = (replacements.BARE_ERF_INT8 if int8 else replacements.BARE_ERF)[node.op]
            new = graph.splice(rewritten, replacement, node.input[0], _dtype_of(node.name, nodes),
                               node.name + REWRITE_SCOPE, nodes)
            graph.redirect(rewritten, node.name + ":0", new)
    if leftover and mode.rewrites:
        rewritten = graph.prune(rewritten, keep_tensors)
    return rewritten, findings, leftover
