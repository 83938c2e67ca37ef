"""StableHLO modules as TensorFlow's XlaCallModule ops carry them (JAX's exports: Keras 3's `model.export` on
JAX, jax2tf), read into plain Python records.

The module is serialized StableHLO bytecode; jaxlib ships the MLIR Python bindings that read it (TensorFlow's
own StableHLO API only re-serializes), so reading a module needs jax installed, which exporting one did. The
records below are all the rest of the converter sees: reading runs none of the module.
"""

import collections.abc
import dataclasses
import functools
import itertools

import numpy as np

from .. import errors

XLA_CALL_MODULE = "XlaCallModule"
ENTRY = "main"
# Custom calls that only check what the export promised (shape polymorphism's constraints): no value, and no
# effect a converted model keeps.
CHECKS_ONLY = frozenset({"shape_assertion"})
# MLIR element types, as NumPy dtypes.
_DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i1": np.bool_, "i8": np.int8, "i16": np.int16,
           "i32": np.int32, "i64": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
           "ui64": np.uint64, "bf16": "bfloat16"}


@dataclasses.dataclass(frozen=True)
class TensorType:
    dtype: object  # a NumPy dtype, or "bfloat16"
    shape: tuple  # ints, None where the dimension is dynamic (shape polymorphism)

    @property
    def is_float(self):
        return self.dtype == "bfloat16" or np.issubdtype(self.dtype, np.floating)


@dataclasses.dataclass
class Operation:
    name: str  # "stablehlo.add", "func.call", "chlo.erf", ...
    operands: list  # value ids
    results: list  # value ids
    result_types: list  # TensorType each (None for a token)
    attributes: dict  # name -> the MLIR attribute
    regions: list  # each a list of Blocks


@dataclasses.dataclass
class Block:
    arguments: list  # value ids
    argument_types: list
    operations: list


@dataclasses.dataclass
class Function:
    name: str
    body: Block


@dataclasses.dataclass
class Module:
    functions: dict  # name -> Function
    value_types: dict  # value id -> TensorType

    @property
    def entry(self):
        return self.functions[ENTRY]

    def operations(self):
        """Every operation of every function, nested regions included."""

        def walk(block):
            for operation in block.operations:
                yield operation
                for region in operation.regions:
                    for inner in region:
                        yield from walk(inner)

        for function in self.functions.values():
            yield from walk(function.body)


@functools.lru_cache(maxsize=1)
def _mlir():
    try:
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import stablehlo
    except ImportError as error:
        raise errors.ConverterFailed("the model holds StableHLO (XlaCallModule ops, from JAX), and reading it "
                                     "needs jax: pip install 'keras-gelu[jax]'") from error
    return ir, stablehlo


def tensor_type(mlir_type):
    ir, _ = _mlir()
    if not isinstance(mlir_type, ir.RankedTensorType):
        return None  # a token, or an unranked tensor, which no export of a fixed-rank model writes
    ranked = mlir_type
    shape = tuple(None if ranked.is_dynamic_dim(i) else ranked.get_dim_size(i) for i in range(ranked.rank))
    element = str(ranked.element_type)
    if element not in _DTYPES:
        raise errors.ConverterFailed(f"the StableHLO module computes in {element}, which has no TensorFlow dtype here")
    return TensorType(_DTYPES[element], shape)


# The trust check and the translation each read a module, in the one process that converts it.
@functools.lru_cache(maxsize=4)
def read(serialized):
    """The Module that XlaCallModule's `module` attribute (bytes) holds; errors.ConverterFailed if it cannot be
    read."""
    ir, stablehlo = _mlir()
    context = ir.Context()
    stablehlo.register_dialect(context)
    with context:
        try:
            mlir_module = stablehlo.deserialize_portable_artifact(context, serialized)
        except Exception as error:  # noqa: BLE001 - the bindings raise MLIRError, ValueError, RuntimeError
            try:
                mlir_module = ir.Module.parse(serialized)  # versions before portable artifacts: plain bytecode
            except Exception:  # noqa: BLE001
                reason = " ".join(str(error).split())[:200]
                raise errors.ConverterFailed(f"its StableHLO module cannot be read: {reason}")
        value_ids, value_types = {}, {}

        def value(mlir_value):
            key = mlir_value  # MLIR values hash and compare by the value they name
            if key not in value_ids:
                value_ids[key] = len(value_ids)
                value_types[value_ids[key]] = tensor_type(mlir_value.type)
            return value_ids[key]

        def block(mlir_block):
            arguments = [value(argument) for argument in mlir_block.arguments]
            operations = [operation(op) for op in mlir_block.operations]
            return Block(arguments, [value_types[a] for a in arguments], operations)

        def operation(op):
            op = op.operation
            results = [value(result) for result in op.results]
            return Operation(op.name, [value(operand) for operand in op.operands], results,
                             [value_types[r] for r in results], {name: op.attributes[name] for name in op.attributes},
                             [[block(b) for b in region.blocks] for region in op.regions])

        functions = {}
        for op in mlir_module.body.operations:
            if op.operation.name != "func.func":
                continue
            name = ir.StringAttr(op.attributes["sym_name"]).value
            functions[name] = Function(name, block(op.regions[0].blocks[0]))
        if ENTRY not in functions:
            raise errors.ConverterFailed("its StableHLO module has no main function")
        # The MLIR objects die with the context: keep the attributes the translation reads, as Python values.
        module = Module(functions, value_types)
        for op in module.operations():
            op.attributes = {name: attribute_value(attribute) for name, attribute in op.attributes.items()}
    module.functions[ENTRY] = Function(ENTRY, _calls_inlined(module, module.entry.body))
    return module


def _calls_inlined(module, block):
    """`block` with each func.call replaced by the operations of the function it calls, each inlined copy's
    values numbered afresh: JAX writes jnp.where, clip and the like as private functions, and a GELU's region
    runs across them."""
    fresh = itertools.count(max(module.value_types, default=-1) + 1)

    def inline(operations, substitution, renamed):
        result = []
        for op in operations:
            operands = [substitution.get(value, value) for value in op.operands]
            if op.name == "func.call" and op.attributes.get("callee") in module.functions:
                callee = module.functions[op.attributes["callee"]].body
                inner = dict(zip(callee.arguments, operands))
                body = inline(callee.operations, inner, True)
                returned = body.pop()  # the callee's func.return, its operands renamed
                result.extend(body)
                substitution.update(zip(op.results, returned.operands))
                continue
            results = op.results
            if renamed:
                results = [next(fresh) for _ in op.results]
                for old, new in zip(op.results, results):
                    module.value_types[new] = module.value_types[old]
                    substitution[old] = new
            result.append(dataclasses.replace(op, operands=operands, results=results))
        return result

    return Block(block.arguments, block.argument_types, inline(block.operations, {}, False))


def attribute_value(attribute):
    """An MLIR attribute as a Python value: numbers, strings, lists, NumPy arrays, the dimension-number records
    as dicts of lists, enums (comparison direction, ...) as their names; anything else as its text."""
    ir, stablehlo = _mlir()
    for kind, convert in (
            (ir.BoolAttr, lambda a: a.value),
            (ir.IntegerAttr, lambda a: a.value),
            (ir.FloatAttr, lambda a: a.value),
            (ir.StringAttr, lambda a: a.value),
            (ir.FlatSymbolRefAttr, lambda a: a.value),
            (ir.DenseI64ArrayAttr, list),
            (ir.DenseBoolArrayAttr, list),
            (ir.DenseElementsAttr, _dense_array),
            (ir.ArrayAttr, lambda a: [attribute_value(item) for item in a]),
            (ir.DictAttr, lambda a: {item.name: attribute_value(item.attr) for item in a}),
            (ir.TypeAttr, lambda a: str(a.value)),
    ):
        if isinstance(attribute, kind):
            return convert(attribute)
    # StableHLO's own attributes arrive as plain Attributes: each kind tells its own (`isinstance`).
    for kind in (stablehlo.DotDimensionNumbers, stablehlo.ConvDimensionNumbers, stablehlo.GatherDimensionNumbers,
                 stablehlo.ScatterDimensionNumbers):
        if kind.isinstance(attribute):
            return _record_fields(kind(attribute))
    for kind in (stablehlo.ComparisonDirectionAttr, stablehlo.ComparisonTypeAttr):
        if kind.isinstance(attribute):
            return kind(attribute).value
    return str(attribute)


def _record_fields(record):
    """A dimension-numbers record's fields ({"start_index_map": [0], "index_vector_dim": 1, ...}): every public
    property that is an integer or a sequence of them, whatever the field is called."""
    fields = {}
    for name in dir(record):
        value = None if name.startswith("_") else getattr(record, name)
        if isinstance(value, int) and not isinstance(value, bool):
            fields[name] = value
        elif isinstance(value, collections.abc.Sequence) and not isinstance(value, str) and all(
                isinstance(item, int) for item in value):
            fields[name] = list(value)
    return fields


def _dense_array(attribute):
    ir, _ = _mlir()
    shaped = ir.ShapedType(attribute.type)
    shape = tuple(shaped.shape)
    dtype = _DTYPES.get(str(shaped.element_type))
    if attribute.is_splat:
        scalar = attribute.get_splat_value()
        number = scalar.value
        return np.full(shape, number, dtype=np.float32 if dtype == "bfloat16" else dtype)
    if dtype == np.bool_:
        return np.array([bool(item.value) for item in attribute], dtype=np.bool_).reshape(shape)
    if dtype == "bfloat16" or dtype == np.float16:
        return np.array([item.value for item in attribute], dtype=np.float32).reshape(shape)
    return np.array(attribute, copy=True).astype(dtype).reshape(shape)
