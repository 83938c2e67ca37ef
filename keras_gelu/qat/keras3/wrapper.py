"""The layers a Keras 3 QAT model is made of: a layer with its rule and ranges, and the input quantizer."""

from keras_gelu.flavour import keras
from keras_gelu.flavour import register_serializable
from keras_gelu.qat.keras3 import ranges as ranges_module
from keras_gelu.qat.keras3 import refusals


# The keyword arguments Keras itself reads in a layer call.
_CALL_CONTEXT = ("training", "mask")


def is_tensor(value):
    return isinstance(value, keras.KerasTensor) or keras.ops.is_tensor(value)


def _all_none(value):
    return all(item is None for item in keras.tree.flatten(value)) if value is not None else True


def _shapes_as_tuples(shapes):
    """Each shape in a (nested) structure of shapes as a tuple, as Keras gives shapes to `build` when it calls a
    layer; a loaded model's build config gives them as JSON lists, which a layer adding `shape[:-1] + (n,)`
    refuses (keras-hub's BLIP-2 Q-Former)."""
    if isinstance(shapes, dict):
        return {key: _shapes_as_tuples(value) for key, value in shapes.items()}
    if isinstance(shapes, (list, tuple)):
        items = [_shapes_as_tuples(item) for item in shapes]
        return tuple(items) if all(item is None or isinstance(item, int) for item in items) else items
    return shapes


@register_serializable
class QuantizeWrapper(keras.layers.Wrapper):
    """`layer` computed by `rule` (a QuantizeRule), with the rule's int8 ranges as this wrapper's variables."""

    def __init__(self, layer, rule, **kwargs):
        kwargs.setdefault("name", f"quant_{layer.name}")
        super().__init__(layer, **kwargs)
        self.rule = rule
        self.ranges = {}
        self.operation_ranges = None  # {place in the code: range name}, made at a composite's first call

    def build(self, input_shape=None):
        input_shape = _shapes_as_tuples(input_shape)
        with refusals.quantizing(self.layer):
            if not self.layer.built:
                self.layer.build(*self.rule.layer_arguments(input_shape))
            self.layer_input_shape = input_shape
            self.rule.build(self, self.layer)
        self.built = True

    def _add_range(self, name, quantizer, *weight):
        if name in self.ranges:
            raise ValueError(f"{type(self.rule).__name__} adds two ranges named {name!r}. Received: name={name!r}")
        # A composite's operation ranges are made at its first call (`operations`), after build locked the state
        locked = self._tracker.locked
        self._tracker.unlock()
        try:
            quantizer.build(self, *weight)
        finally:
            if locked:
                self._tracker.lock()
        self.ranges[name] = quantizer

    def add_activation_range(self, name):
        self._add_range(name, ranges_module.ActivationRange(name))

    def add_weight_range(self, name, weight, axis=None):
        self._add_range(name, ranges_module.WeightRange(name, axis), weight)

    def add_constant_range(self, name, weight):
        self._add_range(name, ranges_module.WeightRange(name, symmetric=False), weight)

    def __call__(self, inputs, *args, **kwargs):
        if not self.built and not self.layer.built and getattr(self.rule, "builds_by_calling", False):
            # built as Keras builds it, by a call (symbolic, as a QAT model loads) with every argument, before the
            # rule's build: keras-hub's EdRec decoder makes its sublayers in build() and leaves them to build at
            # their first call, its cross-attention from the encoder's shape too, which `inputs` does not hold
            with refusals.quantizing(self.layer):
                self.rule.build_by_calling(self.layer, inputs, *args, **kwargs)
        # Keras takes `**kwargs` for one nested argument, and refuses one mixing tensors and other values (keras-hub's
        # ViTDet attention, `query_size=(8, 8)` beside its queries; PARSeq's decoder, `update_content=False`): the
        # keyword arguments holding tensors are handed over apart, as `keyword_tensors`, and call() merges them back.
        # A functional model runs its node again with the arguments as they were handed over.
        kwargs = dict(kwargs)
        kwargs.update(kwargs.pop("keyword_tensors", None) or {})
        tensors = {key: value for key, value in kwargs.items()
                   if key not in _CALL_CONTEXT and any(is_tensor(item) for item in keras.tree.flatten(value))}
        if tensors:
            kwargs = {key: value for key, value in kwargs.items() if key not in tensors}
            kwargs["keyword_tensors"] = tensors
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, training=False, keyword_tensors=None, **kwargs):
        kwargs.update(keyword_tensors or {})
        # Keras 3 passes the call's other arguments (a mask of None per input, an attention mask) as given.
        kwargs = {key: value for key, value in kwargs.items() if not (key == "mask" and _all_none(value))}
        with refusals.quantizing(self.layer):
            return self.rule.call(self, self.layer, inputs, bool(training), **kwargs)

    def compute_output_spec(self, *args, **kwargs):
        if getattr(self.rule, "traces_call", False):
            # A symbolic run of call(), with the very arguments of this call: a composite layer's stand-in
            # sublayers make their ranges at their first call, when the QAT model is built and when it loads.
            spec = keras.Operation.compute_output_spec(self, *args, **kwargs)
            # An output the layer gives as None (keras-hub's XLNet encoder: the query stream it was not given; its
            # own compute_output_shape gives a shape there) stands as an empty tensor, which nothing reads: Keras
            # takes only tensors for a node's outputs, and a functional model's run passes the None on as it is
            return keras.tree.map_structure(
                lambda output: keras.KerasTensor((0,), self.compute_dtype) if output is None else output, spec) \
                if keras.tree.is_nested(spec) else spec
        return super().compute_output_spec(*args, **kwargs)

    def compute_output_shape(self, input_shape):
        arguments = self.rule.layer_arguments(input_shape)
        try:
            return self.layer.compute_output_shape(*arguments)
        except NotImplementedError:  # a layer that leaves its shape to a trace of its call (ConvNeXt's LayerScale)
            spec = self.layer.compute_output_spec(*(keras.KerasTensor(shape) for shape in arguments))
            return keras.tree.map_structure(lambda tensor: tensor.shape, spec)

    def get_config(self):
        # The base Layer's config (Wrapper's would call the layer's get_config, which may fail: see `layer_configs`)
        config = keras.layers.Layer.get_config(self)
        config["layer"] = self.rule.layer_config(self.layer)  # as the class's constructor takes it
        config["rule"] = keras.saving.serialize_keras_object(self.rule)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layer"] = keras.layers.deserialize(config["layer"])
        config["rule"] = keras.saving.deserialize_keras_object(config["rule"])
        return cls(**config)


@register_serializable
class QuantizeInput(keras.layers.Layer):
    """The model's float input on its int8 range: the QUANTIZE op at the start of the int8 model."""

    def build(self, input_shape=None):
        self.input_range = ranges_module.ActivationRange("input")
        self.input_range.build(self)
        self.built = True

    def call(self, inputs, training=False):
        return self.input_range(inputs, bool(training))

    def compute_output_shape(self, input_shape):
        return input_shape


@register_serializable
class QuantizeOperation(keras.layers.Layer):
    """An operation a functional model calls on its tensors (ConvNeXt's `inputs + x`, `x * 0.5`), computed as
    it is, each float output on a moving-average range: the int8 op it becomes rescales to a range of its own.

    Called on the operation's tensor arguments as one list; `constants` are its other arguments, as
    [position, value] pairs (the 0.5 of `x * 0.5` is [[1, 0.5]])."""

    def __init__(self, operation, constants=(), **kwargs):
        kwargs.setdefault("name", f"quant_{operation.name}")
        super().__init__(**kwargs)
        self.operation = operation
        self.constants = [list(pair) for pair in constants]
        self.output_range = ranges_module.ActivationRange("output")
        self.output_range.build(self)

    def _arguments(self, tensors):
        arguments = list(tensors)
        for position, value in sorted(self.constants):
            arguments.insert(position, value)
        return arguments

    def call(self, tensors, training=False):
        outputs = self.operation(*self._arguments(tensors))
        return keras.tree.map_structure(
            lambda output: self.output_range(output, bool(training)) if is_float(output) else output, outputs)

    def compute_output_spec(self, tensors, training=False):
        spec = self.operation.compute_output_spec(*self._arguments(tensors))
        if any(getattr(tensor, "sparse", False) for tensor in keras.tree.flatten(tensors)):
            return spec
        # Keras's elementwise specs take an argument without a `sparse` attribute for a sparse one (Multiply: a
        # constant, Gemma's `x * sqrt(hidden_dim)`), and so mark a dense tensor's product sparse; a layer reading
        # it is then traced on a SparseTensor, which no fake-quant op takes. Dense tensors give a dense result.
        return keras.tree.map_structure(
            lambda output: keras.KerasTensor(output.shape, output.dtype, name=output.name)
            if getattr(output, "sparse", False) else output, spec)

    def get_config(self):
        return {**super().get_config(), "operation": keras.saving.serialize_keras_object(self.operation),
                "constants": [[position, keras.saving.serialize_keras_object(value)]
                              for position, value in self.constants]}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["operation"] = keras.saving.deserialize_keras_object(config["operation"])
        # a tensor constant (Gemma's `ops.sqrt(hidden_dim)`) is saved as Keras saves a tensor, and read back one
        config["constants"] = [[position, keras.saving.deserialize_keras_object(value)]
                               for position, value in config.get("constants", ())]
        return cls(**config)


def is_float(tensor):
    return "float" in str(tensor.dtype)
