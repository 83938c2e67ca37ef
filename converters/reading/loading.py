"""Load a SavedModel, .keras or .h5 file, or a live Keras model, into a Source: its signature, and its graph
inlined and frozen (or, for a SavedModel whose graph is rewritten where it keeps it, its structure alone)."""

import contextlib
import dataclasses
import importlib
import os
import re
import shutil
import sys
import tempfile
import types

import tensorflow as tf
from tensorflow.python.framework import convert_to_constants
from tensorflow.python.saved_model import signature_serialization

from .. import errors
from .. import paths
from ..rewriting import graph
from . import integer_inputs
from . import trust


@dataclasses.dataclass
class TensorInfo:
    name: str  # the signature's key
    tensor: str  # the tensor's name in the graph
    dtype: tf.DType
    shape: tuple  # None for dynamic dimensions
    values: object = None  # integer_inputs.IntegerValues of an integer input, where the graph tells them


@dataclasses.dataclass
class Source:
    path: str
    kind: str  # "SavedModel", ".keras", ".h5" or "Keras model" (a live model object)
    signature: str
    function: object  # the original signature, callable with the inputs as keywords
    inputs: list
    outputs: list
    graph_def: object  # inlined, float16/bfloat16/float64 retyped as float32; frozen unless load(freeze=False)
    retyped_to_float32: tuple  # the float types it computed in, now in float32 (vocabulary.RETYPED_TO_FLOAT32)
    directory: str = None  # a SavedModel's folder, where its graph is rewritten (rewriting.saved_model)
    owner: object = None  # what owns the function's variables (the loaded SavedModel): let go with the function


def first_line(error):
    """The first line of an exception's message (at most 200 characters) that says something: autograph's "in
    user code:" heading left out; or the exception type's name."""
    lines = [line.strip() for line in str(error).strip().splitlines()
             if line.strip() and line.strip() != "in user code:"]
    return (lines or [type(error).__name__])[0][:200]


def choose_signature(path, available, requested):
    """The signature to convert: `requested`, else serving_default, else the only one."""
    available = sorted(available)
    if not available:
        raise errors.UnknownSignature(f"{path}: the SavedModel has no signatures")
    if requested is None:
        requested = "serving_default" if "serving_default" in available else (
            available[0] if len(available) == 1 else None)
        if requested is None:
            raise errors.UnknownSignature(
                f"{path}: several signatures and none is serving_default; pick one with "
                f"--signature ({', '.join(available)})")
    if requested not in available:
        raise errors.UnknownSignature(
            f"{path}: no signature {requested!r}; available: {', '.join(available)}")
    return requested


def _saved_model_signature(path, directory, signature, trust_model):
    """(the loaded SavedModel, the chosen signature's key); an untrusted model is inspected whole before loading."""
    if not trust_model:
        trust.check_saved_model(path, directory)
    try:
        loaded = tf.saved_model.load(directory)
    except Exception as error:  # TF raises many types for a bad file
        raise errors.CorruptModel(f"{path}: cannot read the SavedModel ({first_line(error)})") from error
    return loaded, choose_signature(path, loaded.signatures.keys(), signature)


# Keras's words, deep in its error, for a class or function a config names and nothing registered defines
# (Keras 3: "Could not locate class 'X'", tf-keras: "Unknown layer: 'X'").
_UNKNOWN_CLASS = re.compile(r"(?:Could not locate|Unknown) (class|function|layer|object):? '([^']+)'")


def _made_by_tfmot(config):
    """Whether a Keras file's config holds a tfmot QAT model (its QuantizeWrapperV2), not one of keras_gelu's own
    Keras 3 engine, whose wrapper has the same class name and is registered as keras_gelu>QuantizeWrapper."""
    return "QuantizeWrapper" in config and "keras_gelu>QuantizeWrapper" not in config


def _quantize_scope_if_needed(path, config):
    """keras_gelu's quantize scope for a tf-keras file holding a QAT (tfmot) model, else a no-op."""
    from keras_gelu.flavour import USE_LEGACY_KERAS

    if USE_LEGACY_KERAS and _made_by_tfmot(config):
        try:
            from keras_gelu.qat import quantize_scope

            return quantize_scope()
        except ImportError as error:
            raise errors.CorruptModel(f"{path}: a quantization-aware model: {error}") from None
    return contextlib.nullcontext()


def _load_keras_file(path, description, trust_model, config_limit, member_limit):
    """The model of a .keras or .h5 file, loaded as Keras loads it (safe mode unless trusted)."""
    from keras_gelu.flavour import KERAS_FLAVOUR
    from keras_gelu.flavour import keras

    if not trust_model:  # before Keras rebuilds anything; tf-keras's .h5 loader has no safe mode
        trust.check_keras_file(description, path, config_limit, member_limit)
    config = trust.keras_file_config(description, path, config_limit) or ""
    scope = _quantize_scope_if_needed(description, config)  # its own error (tfmot missing) is already one line
    try:
        with scope:
            return keras.models.load_model(path, compile=False, safe_mode=not trust_model)
    except Exception as error:
        if trust.is_safe_mode_refusal(error):
            raise trust.refuse_safe_mode(description, error) from None
        unknown = _UNKNOWN_CLASS.search(str(error))
        a_tfmot_model_here = KERAS_FLAVOUR == "keras3" and _made_by_tfmot(config)
        if unknown is not None and not a_tfmot_model_here:
            raise errors.CorruptModel(
                f"{description}: cannot load the Keras model: it names {unknown.group(1)} {unknown.group(2)!r}, which "
                "no installed package defines (a class your program registers as it runs is unknown to the "
                "conversion's own process: convert the live model, or define the class in an importable module)") \
                from error
        hint = ""
        if path.endswith(".keras") and KERAS_FLAVOUR != "keras3":
            hint = " (a .keras file from Keras 3 needs TF_USE_LEGACY_KERAS unset)"
        elif a_tfmot_model_here:
            hint = " (a tf-keras quantization-aware model: set TF_USE_LEGACY_KERAS=1, or convert its SavedModel)"
        raise errors.CorruptModel(f"{description}: cannot load the Keras model{hint} ({first_line(error)})") \
            from error


def _keras_model_flavour(model):
    """"keras3" or "tf_keras" for a Keras model object of either Keras, else None."""
    for flavour, module_name in (("keras3", "keras"), ("tf_keras", "tf_keras")):
        module = sys.modules.get(module_name)  # a model object means its Keras is imported
        if module is not None and isinstance(model, module.Model):
            return flavour
    return None


# Keras's own helpers that trace a model as its export would, by flavour: (module, function). They are internal
# (model.export and tf-keras's saving call them), so a Keras release may move them: then the model is exported
# and read back instead (`_exported_signatures`).
_KERAS_EXPORT_HELPERS = {
    "keras3": ("keras.src.export.export_utils", "get_input_signature"),
    "tf_keras": ("tf_keras.src.saving.legacy.saved_model.save_impl", "default_save_signature"),
}


def _keras_export_helper(flavour):
    """The flavour's export helper, or None where this Keras no longer has it where we look."""
    module_name, function_name = _KERAS_EXPORT_HELPERS[flavour]
    try:
        return getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError):
        return None


def _traced_signatures(model, flavour, helper):
    """{signature key: function} of the model, traced in memory as its Keras's export traces it."""
    if flavour == "keras3":
        from keras.export import ExportArchive

        archive = ExportArchive()
        archive.track(model)
        # in inference, as the .tflite runs: called with `training` unset, keras-hub's SegFormer updated its
        # BatchNormalization's statistics in the traced graph (Keras's own export writes them too)
        serve = archive.add_endpoint("serve", lambda *inputs: _flat_outputs(model(*inputs, training=False)),
                                     helper(model))
        keys = ("serve", "serving_default")  # as model.export writes them
    else:
        serve, keys = helper(model), ("serving_default",)
    if serve is None:
        raise ValueError("tf-keras cannot tell the model's inputs; call it on a batch of inputs first")
    functions, _, _ = signature_serialization.canonicalize_signatures({"serving_default": serve})
    return dict.fromkeys(keys, functions["serving_default"])


def autograph_ahead():
    """Convert with autograph, ahead, the functions that tracing a Keras model converts, so that a process forked
    afterwards (the sandbox's workers, from the zygote, which may run nothing of TensorFlow's) finds them in
    autograph's cache, kept by code object: parsing and rewriting each one's source took 0.02-0.1 s of every
    worker's conversion of a Keras file (a tf-keras .h5 of two GELUs converted in 0.56 s, in 0.44 s with them
    converted ahead). Autograph's conversion is Python alone: it starts no thread, as TensorFlow's first run
    would. Its internals may move in a TensorFlow release: then nothing is converted ahead.

    Autograph writes each module it makes to a file of the temporary folder and imports it from there: here in
    a folder of this process's own (the shared /tmp would let another user plant the bytecode Python reads
    first, in /tmp/__pycache__), removed once they are imported, and the modules are taken out of sys.modules
    (they live on in the functions that use them), whose files the sandbox's workers are given to read."""
    try:
        from tensorflow.python.autograph.core import converter
        from tensorflow.python.autograph.impl import api
    except ImportError:
        return
    folder, modules = tempfile.mkdtemp(prefix="keras_gelu_autograph_"), set(sys.modules)
    tempfile.tempdir, previous = folder, tempfile.tempdir
    try:
        for function, top_level in _converted_when_traced():
            if function is None:
                continue
            options = converter.ConversionOptions(recursive=True, optional_features=None, user_requested=top_level)
            try:
                api._convert_actual(function, converter.ProgramContext(options=options))  # noqa: SLF001
            except Exception:  # noqa: BLE001 - a function autograph will not convert ahead, the worker converts
                pass
    finally:
        tempfile.tempdir = previous
        for name in set(sys.modules) - modules:
            if name.startswith("__autograph_generated_file"):
                del sys.modules[name]
        shutil.rmtree(folder, ignore_errors=True)


def _converted_when_traced():
    """(function, whether a tf.function converts it itself (else a function it calls does)) for what tracing a
    Keras model converts: the signature wrapper `_traced_signatures` makes (both Keras), tf-keras's traced model
    call, and the call of each of keras_gelu's layers and activations, which tf-keras's layers convert."""
    from keras_gelu.flavour import USE_LEGACY_KERAS
    from keras_gelu.flavour import keras

    yield _nested_function(signature_serialization.canonicalize_signatures, "signature_wrapper"), True
    if not USE_LEGACY_KERAS:
        return
    saving_utils = sys.modules.get("tf_keras.src.saving.legacy.saving_utils")
    if saving_utils is not None and hasattr(saving_utils, "trace_model_call"):
        yield _nested_function(saving_utils.trace_model_call, "_wrapped_model"), True
    for name, registered in keras.saving.get_custom_objects().items():
        if name.startswith("keras_gelu>") and isinstance(registered, type):
            method = vars(registered).get("call") or vars(registered).get("__call__")
            if method is not None:
                yield method, False


def _nested_function(outer, name):
    """A function of the code object `name` defined (at any depth) in `outer`, with empty cells for its free
    variables: autograph keeps what it converts by code object; or None."""
    pending = [outer.__code__]
    while pending:
        for constant in pending.pop().co_consts:
            if isinstance(constant, types.CodeType):
                if constant.co_name == name:
                    return types.FunctionType(constant, outer.__globals__, name, None,
                                              tuple(types.CellType() for _ in constant.co_freevars))
                pending.append(constant)
    return None


def _flat_outputs(outputs):
    """A model's outputs as a signature takes them: as they are where they are a tensor, or a list or dict of
    tensors; nested deeper (keras-hub's D-FINE: a tuple of tensors under one key), one tensor per name, the
    path's keys and positions joined by "_"."""
    if not isinstance(outputs, (dict, list, tuple)) or all(
            not isinstance(value, (dict, list, tuple)) for value in (outputs.values() if isinstance(outputs, dict)
                                                                      else outputs)):
        return outputs
    return {"_".join(str(part) for part in path): value for path, value in _leaves(outputs)}


def _leaves(value, path=()):
    """(path, leaf) of a nest of dicts, lists and tuples, in order."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, path + (key,))
    elif isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            yield from _leaves(item, path + (position,))
    else:
        yield path, value


def _exported_signatures(model, flavour):
    """{signature key: function} of the model's SavedModel export, written to a temporary folder and read back:
    the public route (measured on a small QAT model: 1.9 s, against 0.4 s traced in memory)."""
    with tempfile.TemporaryDirectory() as folder:
        if flavour == "keras3":
            model.export(folder, verbose=False)
        else:
            tf.saved_model.save(model, folder)
        loaded = tf.saved_model.load(folder)
    signatures = dict(loaded.signatures)
    for function in signatures.values():
        function.restored_from = loaded  # its variables live as long as the object read back does
    return signatures


def _keras_signatures(model, description):
    """{signature key: function} of a Keras model (either Keras, whichever is active).

    The function is the one its Keras's own export would save (Keras 3's
    `ExportArchive` endpoint, as `model.export` makes it, under "serve" and
    "serving_default"; tf-keras's default save signature), made a signature
    as saving makes it (keyword inputs, a dict of outputs), traced in memory:
    the signature a SavedModel export would give back, without writing and
    reloading one, which was most of a Keras model's load (1.9 s of a small
    QAT model's 2.4 s conversion). Where Keras has moved the helpers that
    trace it, the model is exported and read back.
    """
    flavour = _keras_model_flavour(model)
    if flavour is None:
        raise errors.NotAModel(f"{description}: not a Keras model, SavedModel directory, .keras or .h5 file")
    if not model.built:
        raise errors.NotAModel(f"{description}: the model is not built; call it on a batch of inputs (or build "
                               "it) before converting")
    helper = _keras_export_helper(flavour)
    try:
        if helper is None:
            return _exported_signatures(model, flavour)
        return _traced_signatures(model, flavour, helper)
    except Exception as error:  # Keras raises many types for a model it cannot trace
        raise errors.NotAModel(f"{description}: cannot export the Keras model for conversion ({first_line(error)})") \
            from error


def describe(model):
    """How the report names the model: its path, or a live Keras model's class and name."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    return f"<{type(model).__name__} {getattr(model, 'name', '?')!r}>"


def load(model, signature=None, trust_model=False, kind=None, name=None, config_limit=None, member_limit=None,
         freeze=True):
    """Load a path or a live Keras model and freeze its signature; raises errors.ConversionError subclasses.

    A path is a model of `kind` ("SavedModel", ".keras" or ".h5", as paths.model_kind decided it; found here
    where not given), named `name` in messages. Unless `trust_model`, the model is first inspected whole (see
    trust/) and refused if it carries code or reaches outside the process; a Keras file's config is read up
    to `config_limit` bytes, a .keras archive's members up to `member_limit`. A SavedModel loaded with
    `freeze=False` keeps its weights in its variables: its Source's graph_def has the structure only (see
    `freeze_graph` for the rest).
    """
    description = name or describe(model)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        kind = kind or paths.model_kind(path)
        if kind == "SavedModel":
            loaded, key = _saved_model_signature(description, path, signature, trust_model)
            source = _source(description, kind, key, loaded.signatures[key], freeze)
            source.directory, source.owner = path, loaded
            return source
        model = _load_keras_file(path, description, trust_model, config_limit, member_limit)
    else:
        kind = "Keras model"
    signatures = _keras_signatures(model, description)
    key = choose_signature(description, signatures, signature)
    if not trust_model:  # what the model's layers traced, before any of it runs
        trust.check_graph(description, signatures[key].graph.as_graph_def())
    return _source(description, kind, key, signatures[key])


class _FreezingData(convert_to_constants._FunctionConverterDataInEager):
    """The freezer's view of a function: its graph with the calls inlined by graph.inline_function_calls, where
    the freezer's own constructor runs grappler's function inlining. That pass took time quadratic in the depth
    of nested control flow (80 nested tf.cond: 4.7 s of a 5 s load; 150: 27 s); ours is linear in the graph."""

    def __init__(self, function):  # noqa: super().__init__ is the constructor this one replaces
        self._func = function
        graph_def = graph.inline_function_calls(function.graph.as_graph_def())
        graph_def = convert_to_constants.disable_lower_using_switch_merge(graph_def)
        for library_function in graph_def.library.function:
            library_function.attr.pop("api_implements", None)  # as the inlining pass does: one implementation
        convert_to_constants._ConverterData.__init__(self, graph_def)
        self._build_tensor_data()


_VARIABLE_WRITES = {"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"}


def _refuse_variable_writes(path, graph_def):
    """ConverterFailed for a frozen graph that still writes a variable: Keras's JAX export writes a layer's state
    back (keras-hub's DINOv2 its interpolated position embeddings), and the variable it writes is now a constant,
    which takes no write (TensorFlow failed on the graph later: 'passed float ... expected resource')."""
    for node in graph.every_node(graph_def):
        if node.op in _VARIABLE_WRITES or node.op.startswith(("ResourceScatter", "ResourceApply")):
            raise errors.ConverterFailed(
                f"{path}: the model writes a variable while it runs ({node.op}, node {node.name!r}), and a frozen "
                "graph (what --int8, --input-shape and a static-shape --target convert) holds variables as "
                "constants, which take no write: convert without those options, and the .tflite keeps the "
                "variable, as the stock converter's does")


def _frozen_graph_def(function, path):
    """The signature's graph with its variables turned into constants.

    Control flow stays functional (If/While with library functions), as the
    TFLite converter itself freezes it: lowered to Switch/Merge frames, a
    while loop cannot be converted and a rewrite inside it breaks the frames.

    The public convert_variables_to_constants_v2 also rebuilds a
    ConcreteFunction from the result, which took 8x longer than the freezing
    itself on a BERT-base encoder (6 s of 6.7 s for 4 layers); we only need the
    GraphDef, so we call the step it is built on (the same in TF 2.18-2.21) and
    fall back to the public API if that ever moves.
    """
    try:
        data = _FreezingData(function)
        graph_def, _ = convert_to_constants._replace_variables_by_constants(converter_data=data)
        for node in graph_def.node:
            # Names of the functions the node was inlined from: the TFLite
            # converter would look them up for error locations, and complain
            # on stderr that they are gone.
            node.ClearField("experimental_debug_info")
    except (AttributeError, TypeError):
        frozen = convert_to_constants.convert_variables_to_constants_v2(function, aggressive_inlining=True)
        graph_def = frozen.graph.as_graph_def()
    _refuse_variable_writes(path, graph_def)
    return graph_def


def _refuse_non_finite_weights(path, function):
    """NonFiniteWeights for a model whose floating-point variables hold NaN or Inf: the .tflite would compute
    garbage (and its int8 scales would be NaN), whatever the conversion did."""
    variables = [variable for variable in function.graph.variables if variable.dtype.is_floating]
    spoilt = []
    for variable in variables:
        count = int(tf.math.count_nonzero(tf.logical_not(tf.math.is_finite(variable))))
        if count:
            spoilt.append((variable.name, count, int(tf.size(variable))))
    if spoilt:
        name, count, size = spoilt[0]
        raise errors.NonFiniteWeights(f"{path}: {len(spoilt)} of {len(variables)} weight variables hold NaN or Inf "
                                      f"(the first, {name}: {count:,} of {size:,} values), as a training that "
                                      "diverged leaves them; nothing written")


def freeze_graph(source):
    """Freeze, in place, the graph of a Source loaded with freeze=False (its function still held)."""
    source.graph_def, source.retyped_to_float32 = _inlined_in_float32(_frozen_graph_def(source.function,
                                                                                        source.path))


def _variable_shapes(function):
    """{the name of the placeholder through which the function's graph reads a variable: its shape}."""
    variables = {id(variable.handle): variable for variable in function.graph.variables}
    return {internal.op.name: tuple(variables[id(external)].shape.as_list())
            for external, internal in function.graph.captures if id(external) in variables}


def _source(path, kind, signature, function, freeze=True):
    """The Source of a signature function: its inputs and outputs, and its graph, frozen or structure only."""
    _refuse_non_finite_weights(path, function)
    input_specs = tf.nest.flatten(function.structured_input_signature)
    input_keys = sorted(function.structured_input_signature[1]) if function.structured_input_signature[1] else [
        spec.name for spec in input_specs]
    # Freezing keeps tensor names: the signature's placeholders and outputs.
    placeholders = [t for t in function.inputs if t.dtype != tf.resource][: len(input_specs)]
    inputs = [
        TensorInfo(key, placeholder.name, spec.dtype,
                   tuple(spec.shape.as_list()) if spec.shape.rank is not None else None)
        for key, spec, placeholder in zip(input_keys, input_specs, placeholders)
    ]
    # The signature's outputs come in the order of its sorted keys.
    output_keys = sorted(function.structured_outputs)
    outputs = [
        TensorInfo(key, tensor.name, tensor.dtype,
                   tuple(tensor.shape.as_list()) if tensor.shape.rank is not None else None)
        for key, tensor in zip(output_keys, function.outputs)
    ]
    if freeze:
        graph_def, variable_shapes = _frozen_graph_def(function, path), {}
    else:
        graph_def = graph.inline_function_calls(function.graph.as_graph_def())
        variable_shapes = _variable_shapes(function)
    graph_def, retyped = _inlined_in_float32(graph_def)
    for info in inputs:
        if info.dtype.is_integer:
            info.values = integer_inputs.integer_values(graph_def, info.tensor, info.name, variable_shapes)
    return Source(path, kind, signature, function, inputs, outputs, graph_def, retyped)


def _inlined_in_float32(graph_def):
    """(graph_def, the names of the types retyped): calls inlined and half/double retyped, in the graph and its
    control flow."""
    retyped = set()

    def prepare(body, outputs=None):
        body, types = graph.retype_floats_to_float32(graph.inline_function_calls(body))
        retyped.update(types)
        return body

    graph_def = prepare(graph_def)
    graph.constant_arguments_inlined(graph_def)  # captured constants, visible in the bodies they reach
    graph_def = graph.transform_control_flow_functions(graph_def, prepare)
    return graph_def, tuple(sorted(retyped))
