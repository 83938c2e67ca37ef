"""What a TensorFlow op can do outside the process, decided from how TensorFlow registers it.

TensorFlow marks every op whose kernel has effects beyond computing its
outputs as stateful (`OpDef.is_stateful`): file and network I/O, Python
calls, queues, summaries, and also the harmless kinds a serving graph needs,
such as variables and random numbers. So the rule is an allow-list over the
stateful ops, not a deny-list over the dangerous ones:

* a stateful op is refused unless `STAYS_INSIDE` lists it, with the reason it
  keeps to the process's memory;
* a stateless op is allowed, except the few whose kernels still reach out
  (`REACHES_OUTSIDE`: stateless ops that read files or call out) and the
  tf.data ops, recognised by their signature (a dataset argument), since an
  input pipeline reads files and opens connections when it runs;
* a few ops are allowed only with harmless attributes (`print to stderr, not
  to a file`);
* an op that carries a program runs it: a function attribute is allowed only
  on the ops that call it as a plain call or control flow (`CALLS`: the check
  reads the function's body like any other), and an op whose declared
  interface holds a graph, a module or a program (`DatasetFromGraph`'s
  `graph_def`, `MlirPassthroughOp`'s `mlir_module`) is refused, as the check
  does not open it; except XlaCallModule's StableHLO module (JAX's exports),
  which the check opens and reads (`stablehlo`);
* an op TensorFlow does not register here is refused: nobody can say what it
  does.

An op TensorFlow adds next year is therefore refused if stateful, until
someone reads its kernel and lists it, and allowed if pure.
"""

import re

from tensorflow.python.framework import op_def_registry

from . import stablehlo

# Stateful ops a serving graph needs, by group: (why the group stays inside the process, its ops).
STAYS_INSIDE = (
    ("a variable: creates, reads or writes a buffer in the process's memory", (
        "VarHandleOp", "_VarHandlesOp", "ReadVariableOp", "_ReadVariablesOp", "AssignVariableOp",
        "AssignAddVariableOp", "AssignSubVariableOp", "VarIsInitializedOp", "VariableShape", "DestroyResourceOp",
        "DisableCopyOnRead", "ResourceGather", "ResourceGatherNd", "ResourceScatterAdd", "ResourceScatterSub",
        "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMin", "ResourceScatterMax",
        "ResourceScatterUpdate", "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdUpdate",
        "ResourceScatterNdMin", "ResourceScatterNdMax", "ResourceStridedSliceAssign", "Variable", "VariableV2",
        "TemporaryVariable")),
    ("a random number generator: draws from a generator in the process's memory", (
        "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
        "ParameterizedTruncatedNormal", "Multinomial", "RandomShuffle", "RandomGamma", "RandomPoisson",
        "RandomPoissonV2", "RandomCrop", "StatefulUniform", "StatefulUniformInt", "StatefulUniformFullInt",
        "StatefulStandardNormal", "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulRandomBinomial",
        "RngSkip", "RngReadAndSkip", "NonDeterministicInts", "StatelessRandomGetAlg", "SampleDistortedBoundingBox",
        "SampleDistortedBoundingBoxV2")),
    ("a hash table filled from tensors (a table read from a file is not listed): a map in memory", (
        "HashTable", "HashTableV2", "MutableHashTable", "MutableHashTableV2", "MutableHashTableOfTensors",
        "MutableHashTableOfTensorsV2", "MutableDenseHashTable", "MutableDenseHashTableV2", "AnonymousHashTable",
        "AnonymousMutableHashTable", "AnonymousMutableHashTableOfTensors", "AnonymousMutableDenseHashTable",
        "InitializeTableV2", "LookupTableFindV2", "LookupTableImportV2", "LookupTableInsertV2", "LookupTableRemoveV2",
        "LookupTableSizeV2", "LookupTableExportV2")),
    ("a call or control flow: the functions it runs are checked like any other", (
        "StatefulPartitionedCall", "If", "While", "Case")),
    ("a tensor array or stack of a TensorFlow 1 loop: a list of tensors in memory", (
        "TensorArrayV3", "TensorArrayReadV3", "TensorArrayWriteV3", "TensorArrayGatherV3", "TensorArrayScatterV3",
        "TensorArrayConcatV3", "TensorArraySplitV3", "TensorArraySizeV3", "TensorArrayCloseV3", "TensorArrayGradV3",
        "TensorArrayGradWithShape", "StackV2", "StackPushV2", "StackPopV2", "StackCloseV2")),
    ("a check: stops the run with an error message", ("Assert", "CheckNumerics", "CheckNumericsV2")),
    ("a print to the process's standard error or log (PrintV2 to a file is refused)", ("Print", "PrintV2")),
    ("an allocation of uninitialised memory", ("Empty",)),
)
_STAYS_INSIDE = {op: reason for reason, ops in STAYS_INSIDE for op in ops}

# Ops whose program the check opens: XlaCallModule's StableHLO (reading/trust/stablehlo.py).
MODULE_OPS = frozenset({"XlaCallModule"})

# Stateless ops whose kernels reach outside the process all the same, each with what it does.
REACHES_OUTSIDE = {
    "ReadFile": "reads a file",
    "MatchingFiles": "lists the files a pattern matches",
    "ImmutableConst": "maps a file into memory",
    "InitializeTableFromTextFile": "fills a table from a file",
    "GenerateVocabRemapping": "reads vocabulary files",
    "DebugIdentity": "sends tensors to debug URLs (files, gRPC)",
    "DebugNanCount": "sends tensors to debug URLs (files, gRPC)",
    "DebugNumericSummary": "sends tensors to debug URLs (files, gRPC)",
    "PyFuncStateless": "calls Python code",
    "XlaCustomCall": "calls native code by name",
    "XlaCustomCallV2": "calls native code by name",
    # Not outside the process, but its end: a conversion would die with it, or exit as if it had succeeded.
    "Abort": "ends the process",
}

# The ops that run the functions their attributes name as a plain call or as control flow, bodies the check
# reads like any other function. Any other op with a function attribute runs it another way (in a dataset, a
# batch, a remote call, a compiled XLA or TPU program, as a gradient), which the check does not follow.
CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "While", "StatelessWhile",
                   "Case", "StatelessCase"})
# A string argument or attribute that holds a program by its declared name: a graph, a module, a computation.
_PROGRAM_ARGUMENT = re.compile(r"(^|_)(graph_def|graph|module|program|computation|function_def)$")
_STRING = 7  # DataType.DT_STRING

# Ops allowed only when an attribute keeps them inside: (attribute, the test its value must pass, what else).
_ATTRIBUTE_LIMITS = {
    "PrintV2": ("output_stream", lambda value: not value.startswith("file://"), "prints to a file"),
    "DecodeProtoV2": ("descriptor_source", lambda value: value in ("", "local://"),
                      "reads a protocol buffer descriptor from a file"),
    "EncodeProto": ("descriptor_source", lambda value: value in ("", "local://"),
                    "reads a protocol buffer descriptor from a file"),
}


def _is_tf_data(op_def):
    """Whether the op makes, runs or inspects a tf.data dataset: a dataset argument, or element types."""
    arguments = list(op_def.input_arg) + list(op_def.output_arg)
    return (any("dataset" in argument.name for argument in arguments)
            or any(attribute.name in ("output_types", "Toutput_types") for attribute in op_def.attr))


def _carried_program(op, op_def):
    """What program the op carries and runs, by its declared interface, or None."""
    functions = [attribute.name for attribute in op_def.attr if attribute.type in ("func", "list(func)")]
    if functions and op not in CALLS:
        return f"runs the function its attribute {functions[0]!r} names in a way the check does not follow"
    for argument in list(op_def.input_arg) + list(op_def.attr):
        is_string = getattr(argument, "type", None) in (_STRING, "string", "list(string)")
        if is_string and _PROGRAM_ARGUMENT.search(argument.name):
            return f"runs the program its {argument.name!r} holds, which the check does not open"
    return None


def stays_inside_reason(op):
    """Why a stateful op on the allow-list keeps to the process, or None."""
    return _STAYS_INSIDE.get(op)


def refusal(op, attributes=None):
    """What `op` can do outside the process, as a phrase ("reads a file"), or None if it cannot.

    `attributes` is the node's attr map (AttrValue protos), for the ops
    allowed only with some attribute values.
    """
    op_def = op_def_registry.get(op)
    if op_def is None:
        return "is not an op TensorFlow registers here, so what it does is unknown"
    if op in MODULE_OPS:  # its program is opened and read, not refused unread
        return stablehlo.refusal(attributes if attributes is not None else {})
    if op in REACHES_OUTSIDE:
        return REACHES_OUTSIDE[op]
    if _is_tf_data(op_def):
        return "is a tf.data op (input pipelines read files and connect to services when they run)"
    carried = _carried_program(op, op_def)
    if carried is not None:
        return carried
    if op in _ATTRIBUTE_LIMITS:
        name, harmless, effect = _ATTRIBUTE_LIMITS[op]
        value = attributes[name].s.decode(errors="replace") if attributes is not None and name in attributes else ""
        if not harmless(value):
            return effect
    if op_def.is_stateful and op not in _STAYS_INSIDE:
        return "has effects beyond its outputs (a stateful op not known to stay inside the process)"
    return None
