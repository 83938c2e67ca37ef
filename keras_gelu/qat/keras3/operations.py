"""What a composite layer computes with `keras.ops` between its sublayers, each float result on an int8 range.

A composite layer's own arithmetic (LayerScale's `x * gamma`, an RMS
normalization's `rsqrt(mean(square(x)))`, DeiT's tokens concatenated before
the encoder) is int8 ops in the converted model, each rescaling to a range
of its own; QAT must round there too. No rule names these layers: while a
composite's `call` runs under `CompositeRule`, every `keras.ops` function
(the public `keras.ops` and Keras's own `keras.src.ops`, the two every
library calls through, and keras.ops.nn, .numpy and .linalg, which hold
the same functions) is intercepted:

* an operation that computes (add, matmul, mean, rsqrt, ...) on a float
  tensor has its float result fake-quantized on a moving-average range of
  its own;
* one that only moves values (reshape, transpose, a slice, a cast) keeps its
  input's grid and takes no range: RESHAPE, TRANSPOSE and STRIDED_SLICE hold
  the same scale on both sides by construction, as TFLite requires;
* one whose result TFLite holds on its operands' scale (concatenate, stack,
  where, maximum, minimum) has its result on a range of its own, and its
  float operands on no grid put there too;
* a float input that is on no grid (a weight, or a value computed where no
  interception runs) is put on a range where an operation reads it, as a
  sublayer's input is;
* one that a backend computes in one call of its own (dot_product_attention,
  moments, fft2) is computed as the int8 ops TFLite runs for it, each on a
  range (`decompositions`).

The Python operators of the backend's own tensors (`x * y`, `q @ k`,
`x[..., :d]` on TensorFlow, JAX or PyTorch tensors, as keras-hub's layers
write them) are intercepted alike, as the keras.ops function each computes.

Ranges are made at the layer's first call (symbolic, when the QAT model is
built or loaded), one per place in the code that calls an operation and per
pass through that place, so a loop or a training-only branch finds its own.
A place first reached later (a branch the first call did not take) is left
unranged. Sublayers (their own rules) and the ranges' own computation run
with the interception suspended; other threads are never affected.

What no interception sees (a backend function called directly, `tf.math.*`)
stays float in the int8 model where its result is read only by other unseen
arithmetic; the converter's report names those ops.
"""

import contextlib
import sys
import threading

from keras_gelu.flavour import keras
from keras_gelu.flavour import tensor_classes
from keras_gelu.qat.keras3 import decompositions
from keras_gelu.qat.keras3.wrapper import is_float

# The modules whose functions libraries call: `from keras import ops` (keras-hub, user code) and `from keras.src
# import ops` (Keras's own layers and activations, keras.activations.gelu included), and the public namespaces
# of keras.ops, which hold the same functions under another path: keras-hub's MiT calls `ops.nn.gelu` (unseen,
# the operators of TensorFlow's own implementation were ranged one by one: a cube in float between a DEQUANTIZE
# and a QUANTIZE), DINOv3 `ops.nn.dot_product_attention` (its scores and softmax stayed float).
_MODULES = ("keras.ops", "keras.src.ops", "keras.ops.nn", "keras.ops.numpy", "keras.ops.linalg")

# Functions that compute nothing on values (control flow, shapes, conversions), called as they are.
_NOT_INTERCEPTED = frozenset({
    "associative_scan", "cond", "convert_to_numpy", "custom_gradient", "dtype", "fori_loop", "is_tensor", "jvp",
    "map", "ndim", "scan", "shape", "size", "switch", "vectorize", "vectorized_map", "while_loop"})

# Functions whose values are constants, whatever the values of the tensor they take the shape of: on no grid,
# as a constant is (Gemma's zeros_like(x) had a range of its own, [0, 0], beside x's in a SELECT_V2).
_SHAPE_ONLY = frozenset({"empty_like", "full_like", "ones_like", "zeros_like"})
# TensorFlow's ops that read a tensor's shape and none of its values
_SHAPE_OPS = frozenset({"Rank", "Shape", "ShapeN", "Size"})

# Functions whose outputs are values of their first tensor input's grid: moved, copied or dropped.
VALUE_MOVING = frozenset({
    "amax", "amin", "array_split", "broadcast_to", "cast", "convert_to_tensor", "copy", "depth_to_space",
    "diagonal", "dsplit", "expand_dims", "flip", "fliplr", "flipud", "get_item", "hsplit", "identity", "max",
    "max_pool", "min", "moveaxis", "pad", "ravel", "rearrange", "repeat", "reshape", "roll", "rot90", "slice",
    "space_to_depth", "split", "squeeze", "stop_gradient", "swapaxes", "take", "take_along_axis", "tile",
    "transpose", "tril", "triu", "unstack", "vsplit"})

# Functions whose result TFLite holds on one scale with their operands' (CONCATENATION, PACK, SELECT_V2, MAXIMUM,
# MINIMUM): the result gets a range, onto which TFLite requantizes the operands on a grid, and those on none are
# put. As value-moving ops, GPT-NeoX's rotated query concatenated with the rest of it, and XLNet's embeddings,
# held two grids in one CONCATENATION, which the converter refused.
ONE_GRID = frozenset({"append", "concatenate", "dstack", "hstack", "maximum", "minimum", "stack", "vstack",
                      "where"})

# Functions infinite at 0 (and their gradients), where the int8 op saturates: rsqrt(0) = inf in QAT gave
# NaN ranges and gradients (0 x inf). Their input is taken no lower than _SMALLEST_INPUT.
_SINGULAR_AT_ZERO = frozenset({"log", "reciprocal", "rsqrt", "sqrt"})
_SMALLEST_INPUT = 1e-12

# The Python operators of the backend's tensors, as the keras.ops function each computes: keras-hub's rotary
# embedding (x * cos + rotated * sin), an RMS normalization's x * rsqrt(...) * scale, attention's q @ k are
# operators on TensorFlow, JAX or PyTorch tensors, which no keras.ops interception sees.
_OPERATORS = {
    "__add__": "add", "__radd__": "add", "__sub__": "subtract", "__rsub__": "subtract", "__mul__": "multiply",
    "__rmul__": "multiply", "__truediv__": "divide", "__rtruediv__": "divide", "__neg__": "negative",
    "__pow__": "power", "__rpow__": "power", "__matmul__": "matmul", "__rmatmul__": "matmul",
    "__getitem__": "get_item"}

_local = threading.local()
_lock = threading.Lock()
# while any thread intercepts: [(module or class, name, function, whether it was its own attribute)]
_installed = {"count": 0, "originals": []}
# (module or class, name) -> (the function, its interception): made once, installed at every composite call
_interceptions = {}


def _states():
    if not hasattr(_local, "states"):
        _local.states = []
    return _local.states


class _Interception:
    """One composite call's interception: its wrapper (which owns the ranges), the tensors on a grid so far
    (id -> tensor), and how often each place in the code has been passed in this call."""

    def __init__(self, wrapper, training, on_grid, reads=None):
        self.wrapper, self.training, self.on_grid = wrapper, training, on_grid
        self.reads = reads  # told of each value an operation reads (`composite._Folds`), or None
        self.passes = {}
        self.constants = {}  # {shapes_too: {graph op name: computed from constants alone}}, see constant()
        self.from_weights = {}  # {id: tensor} computed from a weight, by an intercepted call
        self.rounded_inputs = {}  # {id: (tensor, its rounded self)}, see ranged_input()
        self.zeros = {}  # {id: tensor} made by zeros_like: no data, and 0 on every grid
        self.making = wrapper.operation_ranges is None  # the first call makes the ranges
        if self.making:
            wrapper.operation_ranges = {}

    def constant(self, tensor, shapes_too=False):
        """Whether `tensor` is computed from constants alone (`shapes_too`: and from tensors' shapes: a sequence's
        positions, its causal mask, its rotary table, which hold no data and fold where the shapes are fixed).
        Known where the first call traces a TensorFlow graph: no placeholder (the call's inputs, and the weights
        it captured) and no stateful op (random values) among the ops it comes from; elsewhere (eager tensors,
        JAX, PyTorch) taken as not. Never what an intercepted call computed from a weight: a model loading calls
        its layers before their weights are set, when a weight reads as its initializer's constant, and its
        ranges must be those it was saved with."""
        if id(tensor) in self.from_weights:
            return False
        try:
            root = tensor.op
            root.inputs  # noqa: B018 - an eager tensor has neither
        except AttributeError:
            return False
        known = self.constants.setdefault(shapes_too, {})
        stack = [(root, False)]
        while stack:  # depth first, each op decided after its inputs
            operation, inputs_decided = stack.pop()
            if operation.name in known:
                continue
            if shapes_too and operation.type in _SHAPE_OPS:
                known[operation.name] = True
            elif operation.type.startswith("Placeholder") or operation.op_def.is_stateful:
                known[operation.name] = False
            elif inputs_decided:
                known[operation.name] = all(known[source.op.name] for source in operation.inputs)
            else:
                stack.append((operation, True))
                stack.extend((source.op, False) for source in operation.inputs if source.op.name not in known)
        return known[root.name]

    def range_for(self, key):
        names = self.wrapper.operation_ranges
        if key not in names:
            if not self.making:
                return None
            names[key] = f"operation_{len(names)}"
            with suspended():  # a backend's initializers compute with its tensors' operators too (PyTorch's)
                self.wrapper.add_activation_range(names[key])
        return self.wrapper.ranges[names[key]]

    def ranged_input(self, key, tensor):
        """An operation's float input on no grid, on a range where an operation first reads it; every later
        reader in this call reads that rounded tensor: one int8 tensor in TFLite, with one scale (DINOv3's
        rotary cos, read by its query's and its key's products, had a range at each, and TFLite refused the
        EXPAND_DIMS before them)."""
        if id(tensor) not in self.rounded_inputs:
            self.rounded_inputs[id(tensor)] = (tensor, self.ranged(key, tensor))
        return self.rounded_inputs[id(tensor)][1]

    def ranged(self, key, tensor):
        quantizer = self.range_for(key)
        if quantizer is None:
            return tensor
        with suspended():
            tensor = quantizer(tensor, self.training)
        self.on_grid[id(tensor)] = tensor
        return tensor


@contextlib.contextmanager
def intercepting(wrapper, training, on_grid, reads=None):
    """Within the block, this thread's keras.ops calls are ranged for `wrapper` (a QuantizeWrapper whose
    `operation_ranges` is None before its first call); `on_grid`: {id: tensor} of the values on a grid;
    `reads`, if given, has its `read(values)` told what each operation reads, its shape aside."""
    _states().append(_Interception(wrapper, training, on_grid, reads))
    _install()
    try:
        yield
    finally:
        _states().pop()
        _uninstall()


@contextlib.contextmanager
def suspended():
    """Within the block, this thread's keras.ops calls run as they are (a sublayer's rule, a range's arithmetic)."""
    _states().append(None)
    try:
        yield
    finally:
        _states().pop()


def _is_tensor(value):
    return isinstance(value, keras.KerasTensor) or (keras.ops.is_tensor(value)
                                                     and not isinstance(value, keras.Variable))


def _place(name):
    """Where the intercepted call came from: the function's name, and the caller's file and line."""
    frame = sys._getframe(2)
    return f"{name}@{frame.f_code.co_filename}:{frame.f_lineno}"


def _intercepted(name, function):
    moving = name in VALUE_MOVING

    def operation(*args, **kwargs):
        states = _states()
        state = states[-1] if states else None
        if state is None:
            return function(*args, **kwargs)
        place = _place(name)
        state.passes[place] = count = state.passes.get(place, 0) + 1
        flat = keras.tree.flatten((args, kwargs))
        if state.reads is not None and name not in _SHAPE_ONLY:
            state.reads.read(flat)
        outputs = ranged_call(state, f"{place}#{count}", flat, args, kwargs)
        if any(isinstance(value, keras.Variable) or id(value) in state.from_weights for value in flat):
            state.from_weights.update((id(output), output) for output in keras.tree.flatten(outputs))
        return outputs

    def ranged_call(state, key, flat, args, kwargs):
        tensors = [value for value in flat if _is_tensor(value) and is_float(value)]
        if not tensors or name in _SHAPE_ONLY:  # a constant made (ones, arange), integer arithmetic (positions)
            with suspended():
                outputs = function(*args, **kwargs)
            if name == "zeros_like":
                state.zeros[id(outputs)] = outputs
            return outputs
        if state.making and all(state.constant(tensor, shapes_too=True) for tensor in tensors):
            # computed from constants alone, which the converter folds: the int8 model holds its result as a
            # constant, on a grid of its own, and computes nothing here; rounded at each step instead, YaRN's
            # inverse frequencies (1 / base ** (i / d)) divided by a power rounded to 0 on its range, and the
            # whole model went NaN (keras-hub's GPT-OSS). No range is made for this place, nor for its inputs.
            # So with what is computed from a shape: positions rounded on a range learnt at one length saturate
            # at another, and a causal mask compared them (the first operation reading such a value with data,
            # x * cos, ranges it)
            with suspended():
                return function(*args, **kwargs)
        if name in ONE_GRID:
            return _on_one_grid(state, key, name, function, args, kwargs)
        if moving:
            with suspended():
                outputs = function(*args, **kwargs)
            if id(tensors[0]) in state.on_grid:
                for output in keras.tree.flatten(outputs):
                    state.on_grid[id(output)] = output
            return outputs
        # a float input on no grid, ranged where this operation reads it; not a constant (SAM3's sine positions
        # divide by temperature ** (2i / d), whose 1 a range up to 10000 rounded to 0): the converter holds it
        # as it is, and no range made for it now is found later (the key names its argument's position)
        values = [state.ranged_input(f"{key}/input_{position}", value)
                  if _is_tensor(value) and is_float(value) and id(value) not in state.on_grid
                  and id(value) not in state.zeros and not (state.making and state.constant(value)) else value
                  for position, value in enumerate(flat)]
        args, kwargs = keras.tree.pack_sequence_as((args, kwargs), values)
        if name in decompositions.DECOMPOSED:
            return _decomposed(state, key, name, function, args, kwargs)
        with suspended():
            if name in _SINGULAR_AT_ZERO:
                args = (keras.ops.maximum(args[0], _SMALLEST_INPUT), *args[1:])
            outputs = function(*args, **kwargs)
        flat_outputs = keras.tree.flatten(outputs)
        ranged = [state.ranged(key if len(flat_outputs) == 1 else f"{key}/output_{number}", output)
                  if _is_tensor(output) and is_float(output) else output
                  for number, output in enumerate(flat_outputs)]
        return keras.tree.pack_sequence_as(outputs, ranged)

    operation.__name__ = getattr(function, "__name__", name)
    operation.__doc__ = getattr(function, "__doc__", None)
    operation.__wrapped__ = function
    return operation


def _on_one_grid(state, key, name, function, args, kwargs):
    """function(*args, **kwargs) on the range made for its result (read in float first), and so are its float
    operands on no grid (where's condition, which may be float, is none of them). Those on a grid are kept:
    TFLite requantizes them into the op, but refuses a FakeQuant of a FakeQuant's output there."""
    quantizer = state.range_for(key)
    if quantizer is None:
        with suspended():
            return function(*args, **kwargs)
    condition = (args[0] if args else kwargs.get("condition")) if name == "where" else None
    with suspended():
        if state.training:  # the range follows the float result (at inference it is read as it is)
            quantizer.observe(function(*args, **kwargs), training=True)
        flat = [state.rounded_inputs[id(value)][1] if id(value) in state.rounded_inputs
                else quantizer.quantize(value, state.training)
                if _is_tensor(value) and is_float(value) and value is not condition and id(value) not in
                state.on_grid and not (state.making and state.constant(value)) else value
                for value in keras.tree.flatten((args, kwargs))]
        args, kwargs = keras.tree.pack_sequence_as((args, kwargs), flat)
        outputs = quantizer.quantize(function(*args, **kwargs), state.training)
    state.on_grid[id(outputs)] = outputs
    return outputs


def _decomposed(state, key, name, function, args, kwargs):
    """function(*args, **kwargs) as the int8 ops it is made of (`decompositions`), each on a range of this
    call's (a place first reached after the ranges were made: as it is)."""
    if not state.making and not any(made.startswith(f"{key}/") for made in state.wrapper.operation_ranges):
        with suspended():
            return function(*args, **kwargs)
    context = decompositions.Context(lambda part: state.range_for(f"{key}/{part}"), state.training,
                                     lambda tensor: id(tensor) in state.zeros)
    with suspended():
        outputs = decompositions.DECOMPOSED[name](context, *args, **kwargs)
    for output in keras.tree.flatten(outputs):
        state.on_grid[id(output)] = output
    return outputs


def _install():
    with _lock:
        _installed["count"] += 1
        if _installed["count"] > 1:
            return
        for module_name in _MODULES:
            module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
            for name in dir(module):
                function = getattr(module, name)
                if name.startswith("_") or name in _NOT_INTERCEPTED or not callable(function) \
                        or isinstance(function, type) or type(function).__name__ == "module":
                    continue
                _installed["originals"].append((module, name, function, True))
                setattr(module, name, _interception(module, name, name, function))
        # the backend's tensors, and Keras's variables, whose operators compute with the backend's own functions
        for tensor_class in (*tensor_classes(), keras.Variable):
            for method, name in _OPERATORS.items():
                function = getattr(tensor_class, method, None)
                if function is None:
                    continue
                _installed["originals"].append((tensor_class, method, function, method in vars(tensor_class)))
                setattr(tensor_class, method, _interception(tensor_class, method, name, function))


def _interception(holder, attribute, name, function):
    """`_intercepted(name, function)` for holder.attribute, made at its first install."""
    made = _interceptions.get((holder, attribute))
    if made is None or made[0] is not function:
        made = _interceptions[(holder, attribute)] = (function, _intercepted(name, function))
    return made[1]


def _uninstall():
    with _lock:
        _installed["count"] -= 1
        if _installed["count"]:
            return
        for holder, name, function, own in reversed(_installed["originals"]):
            if own:
                setattr(holder, name, function)
            else:  # inherited (PyTorch's from its C base class): the class's own attribute removed
                delattr(holder, name)
        _installed["originals"] = []
