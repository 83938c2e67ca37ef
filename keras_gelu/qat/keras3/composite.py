"""Composite layers, quantized through their sublayers and the keras.ops they compute with: keras-hub's
TransformerEncoder, ViT's patching and embedding, RMS normalizations, LayerScales, and any custom layer of yours
whose computation is made of layers that have rules and of keras.ops (`operations`).

A layer with no rule of its own whose sublayers (attributes, lists of them
too) all have rules, or are composite in turn, is quantized by
`CompositeRule`: in the QAT model's copy of it, each sublayer is replaced by
a `QuantizeSublayer` holding it and its rule, called by the composite's own
`call` exactly as the sublayer was (keywords, masks, `training`). What the
composite computes between its sublayers (a residual `x + y`, a class token
concatenated) is left as it is, and gets its range where it is read: a
sublayer's float input that does not come straight from another sublayer's
range (or from the composite's input) is fake-quantized on a range of its
own, and so is the composite's output. Where the layer's code hands such a
value to another operation as well, the converter points that reader at the
rounded value too (`fake_quants_read_by_every_reader` in
`keras_gelu.converters.rewriting.int8`), as the int8 model holds it. The int8 model
then has a range on every tensor an op computes, save those that only move
values (a reshape, a concatenation, which keep their inputs' grids).

A BatchNormalization among the sublayers folds into the Conv/Dense sublayer
whose output it reads, where nothing else reads that output (`folding`): the
pairs are found at the composite's first call (symbolic, as the QAT model
is built or loaded), from what its sublayers and intercepted operations read
(`_Folds`); one that reads anything else is refused, as a BatchNormalization
of the model's own that does not fold is.

What the layer computes with keras.ops is ranged op by op as it runs
(`operations`). Python operators chained on the backend's tensors with
neither a sublayer nor a keras.ops call between them (an `(x + p) * s`)
leave the first result without a range: the converter's report names the
float ops that remain, and a rule for the layer (`register_rule`) is the way
out.
"""

import contextlib

from keras_gelu.flavour import keras
from keras_gelu.flavour import outside_any_trace
from keras_gelu.inner_activations import set_slot
from keras_gelu.inner_activations import sublayer_slots
from keras_gelu.flavour import register_serializable
from keras_gelu.qat.keras3 import folding
from keras_gelu.qat.keras3 import nesting
from keras_gelu.qat.keras3 import operations
from keras_gelu.qat.keras3 import ranges as ranges_module
from keras_gelu.qat.keras3 import refusals
from keras_gelu.qat.keras3 import splitting
from keras_gelu.qat.keras3.keras_classes import training_of_the_call_under_way
from keras_gelu.qat.keras3.rules import UNCHANGED_VALUES
from keras_gelu.qat.keras3.rules import ConvolutionRule
from keras_gelu.qat.keras3.rules import DenseRule
from keras_gelu.qat.keras3.rules import QuantizeRule
from keras_gelu.qat.keras3.rules import rule_for
from keras_gelu.qat.keras3.wrapper import QuantizeWrapper
from keras_gelu.qat.keras3.wrapper import is_float
from keras_gelu.qat.keras3.wrapper import is_tensor

# The tensors on an int8 grid in the composite calls under way (innermost last): the composite's inputs, and
# those a sublayer's or an operation's range produced. {id: tensor}: kept alive, so that an id is not reused.
_on_grid = []


# What a BatchNormalization may fold into in each composite call under way (innermost last): a _Folds at the
# composite's first call, None at the others.
_folds = []


class _Folds:
    """One composite's first call: the outputs of its Conv/Dense sublayers (`produced`), how often each is read (by
    a sublayer, an intercepted operation, or as the composite's output), and the input of each BatchNormalization
    sublayer called (`scalings`)."""

    def __init__(self):
        self.produced = {}  # id(output) -> [output, its Conv/Dense stand-in, reads]
        self.scalings = []  # (BatchNormalization stand-in, its input)

    def read(self, values):
        for value in values:
            entry = self.produced.get(id(value))
            if entry is not None and entry[0] is value:
                entry[2] += 1

    def settle(self, layer):
        """Fold each BatchNormalization into the Conv/Dense stand-in whose every output here it alone read; refuse
        `layer` where one read anything else."""
        read_by = {id(value): scaling for scaling, value in self.scalings}
        folds = {}  # id(BatchNormalization stand-in) -> (it, its Conv/Dense stand-in)
        for scaling, value in self.scalings:
            entry = self.produced.get(id(value))
            producer = entry[1] if entry is not None and entry[0] is value else None
            alone = producer is not None and all(reads == 1 and read_by.get(id(output)) is scaling
                                                 for output, other, reads in self.produced.values()
                                                 if other is producer)
            if not alone or folds.setdefault(id(scaling), (scaling, producer))[1] is not producer \
                    or not folding.pair_folds(producer.layer, scaling.layer, len(value.shape)):
                raise refusals.no_rule(
                    layer, isinstance(layer, keras.Model),
                    f"Its BatchNormalization {scaling.layer.name} folds only into a Conv/Dense sublayer with a "
                    f"linear activation right before it, whose output nothing else reads, and does not here. ")
        for scaling, producer in folds.values():
            # not tracked as the stand-in's sublayer: its variables are the BatchNormalization's stand-in's
            object.__setattr__(producer, "folded_scaling", scaling.layer)
            scaling.folded = True
            with outside_any_trace():  # the kernel's range is the folded kernel's before any training step
                for quantizer in producer.ranges.values():
                    if hasattr(quantizer, "update"):
                        quantizer.update()


@contextlib.contextmanager
def _composite_call(inputs, first):
    _on_grid.append({id(tensor): tensor for tensor in keras.tree.flatten(inputs)})
    _folds.append(_Folds() if first else None)
    try:
        yield _on_grid[-1], _folds[-1]
    finally:
        _on_grid.pop()
        _folds.pop()


def _is_on_grid(tensor):
    return bool(_on_grid) and id(tensor) in _on_grid[-1]


def _mark_on_grid(outputs):
    if _on_grid:
        _on_grid[-1].update((id(tensor), tensor) for tensor in keras.tree.flatten(outputs))
    return outputs


def _proxy(sublayer, mode, exact_as, apply=False):
    """The QuantizeSublayer that stands for `sublayer` (with `apply`, its fused activation is split out of it
    on the way); None where there is no rule for it. Without `apply`, nothing is made or changed."""
    if isinstance(sublayer, UNCHANGED_VALUES):
        return QuantizeSublayer(sublayer, KeepRule()) if apply else True
    if type(sublayer) is keras.layers.BatchNormalization:  # folds into the Conv/Dense before it, or is refused
        return QuantizeSublayer(sublayer, FoldedAwayRule()) if apply else True
    gelu = splitting.activation_layer_as_gelu(sublayer)
    if gelu is not None:  # Activation("gelu") as our GELU layer, with its rule
        return QuantizeSublayer(gelu, rule_for(gelu, mode, exact_as)) if apply else True
    rule = rule_or_composite(sublayer, mode, exact_as)
    # A composite's `activation` is its sublayers' (keras-hub's SigLIPMLP applies it between its two Dense
    # layers), split out of them in its turn; only a layer with a rule of its own has one fused into its output
    fused = rule is not None and not isinstance(rule, CompositeRule)
    activation = splitting.split_activation(sublayer) if fused else None
    activation_rule = None if activation is None else rule_for(activation, mode, exact_as)
    if rule is None or (activation is not None and activation_rule is None):
        return None
    if not apply:
        return True
    if activation is not None:
        sublayer.activation = keras.activations.linear
        activation = QuantizeWrapper(activation, activation_rule)
    return QuantizeSublayer(sublayer, rule, activation)


@contextlib.contextmanager
def _stand_ins_withdrawn(layer):
    """The sublayers of `layer` as they were, where QuantizeSublayers stand in for them (at any depth: a
    composite's stand-in holds a composite with stand-ins of its own), for the duration."""
    stand_ins = []

    def collect(owner):
        for container, key, sublayer in sublayer_slots(owner):
            if isinstance(sublayer, QuantizeSublayer):
                stand_ins.append((owner, container, key, sublayer))
                collect(sublayer.layer)

    collect(layer)
    for owner, container, key, stand_in in stand_ins:
        set_slot(owner, container, key, stand_in.layer)
    try:
        yield
    finally:
        for owner, container, key, stand_in in stand_ins:
            set_slot(owner, container, key, stand_in)


def rule_or_composite(layer, mode, exact_as):
    """The rule for `layer`: its own, or CompositeRule for a layer made of sublayers that have rules; or None."""
    return rule_for(layer, mode, exact_as) or composite_rule(layer, mode, exact_as)


def composite_rule(layer, mode, exact_as):
    """A CompositeRule for `layer` where it is a composite layer: sublayers, each with a rule (or composite in
    turn, or keeping values), and the keras.ops its call computes with (`operations`). A layer of keras.ops
    alone (an RMS normalization, a LayerScale, a positional embedding) is one with no sublayers; a
    subclassed model and a BatchNormalization that does not fold are refused with reasons of their own. A
    Sequential or functional model it holds is quantized through its layers (`NestedModelRule`)."""
    graph = nesting.graph_of(layer)
    if graph is not None:
        layers = _graph_layers(graph)
        return NestedModelRule(mode, exact_as) if layers is not None and all(
            _proxy(sublayer, mode, exact_as) for sublayer in layers) else None
    slots = sublayer_slots(layer)
    if not slots:
        return None if isinstance(layer, (keras.Model, keras.layers.BatchNormalization)) else \
            CompositeRule(mode, exact_as)
    if all(_proxy(sublayer, mode, exact_as) for _, _, sublayer in slots):
        return CompositeRule(mode, exact_as)
    return None


# What Keras's base Layer (and its bases) define: the machinery Keras probes, the wrapper's own.
_KERAS_LAYER_NAMES = frozenset(name for cls in keras.layers.Layer.__mro__ for name in vars(cls))


def _defined_by_the_layer(layer, name):
    """Whether private `name` is one of `layer`'s weights, or defined by its class and not Keras's base Layer."""
    if isinstance(layer.__dict__.get(name), keras.Variable):
        return True
    return name not in _KERAS_LAYER_NAMES and any(name in vars(cls) for cls in type(layer).__mro__)


@register_serializable
class QuantizeSublayer(QuantizeWrapper):
    """A composite layer's sublayer with its rule, called as the sublayer is; each of its float inputs that
    is not yet on a grid on a range of its own (`input_<n>`), decided at its first call."""

    def __init__(self, layer, rule, activation=None, **kwargs):
        super().__init__(layer, rule, **kwargs)
        self.activation = activation  # a fused activation split out of the sublayer, with its own rule
        self.input_ranges = None
        # decided at the composite's first call (`_Folds`): the BatchNormalization folded into this Conv/Dense,
        # and, for a BatchNormalization's stand-in, whether it is folded away
        self.folded_scaling, self.folded = None, False

    def __getattr__(self, name):
        # The composite's own code reads its sublayers' attributes (keras-hub's Moonshine decoder, its attention's
        # use_causal_mask): the stand-in answers for the layer it holds. Private ones only where the layer's class
        # defines them (Gemma 4's decoder calls `self.attention._mask_sliding_window`) or they are its weights,
        # which the composite reads as they are (SAM3's geometry encoder: `self.cls_embed._embeddings`, a constant
        # to the converter as in the float model): Keras probes its own on the wrapper, which has them as a layer
        layer = self.__dict__.get("layer")
        if layer is None or (name.startswith("_") and not _defined_by_the_layer(layer, name)):
            raise AttributeError(name)
        return getattr(layer, name)

    def __call__(self, *args, **kwargs):
        with operations.suspended():  # its rule's computation is its own
            return self._call(*args, **kwargs)

    def _call(self, *args, **kwargs):
        paths_and_values = keras.tree.flatten_with_path((args, kwargs))
        if self.input_ranges is None:  # first call: symbolic, when the QAT model is built or loaded
            self.input_ranges = {}
            for path, value in paths_and_values:
                if is_tensor(value) and is_float(value) and not _is_on_grid(value):
                    key = _argument_key(path)
                    self.input_ranges[key] = ranges_module.ActivationRange(f"input_{len(self.input_ranges)}")
                    self.input_ranges[key].build(self)
        # called without `training` (keras-hub's DeiT embeddings call their Dropout so): the call's under way, as
        # Keras hands it on, read here because the input ranges come before Keras resolves it
        training = bool(kwargs["training"] if "training" in kwargs else training_of_the_call_under_way())
        values = [self.input_ranges[_argument_key(path)](value, training)
                  if _argument_key(path) in self.input_ranges else value for path, value in paths_and_values]
        folds = _folds[-1] if _folds else None
        if folds is not None:
            folds.read(values)
        args, kwargs = keras.tree.pack_sequence_as((args, kwargs), values)
        inputs, kwargs = self.rule.call_arguments(self.layer, args, kwargs)
        if folds is not None and isinstance(self.rule, FoldedAwayRule):
            folds.scalings.append((self, inputs))
        outputs = super().__call__(inputs, **kwargs)
        if self.activation is not None:
            outputs = self.activation(outputs)
        elif folds is not None and isinstance(self.rule, (ConvolutionRule, DenseRule)) \
                and type(self.layer) in folding.FOLDS_INTO and is_tensor(outputs):
            folds.produced[id(outputs)] = [outputs, self, 0]
        return _mark_on_grid(outputs)

    def get_config(self):
        config = super().get_config()
        if self.activation is not None:
            config["activation"] = keras.layers.serialize(self.activation)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("activation") is not None:
            config["activation"] = keras.layers.deserialize(config["activation"])
        return super().from_config(config)


def _argument_key(path):
    """Where in a call's (args, kwargs) a value is, as a key: (0, 0) for the first positional argument,
    (1, 'attention_mask') for a keyword's."""
    return "/".join(str(step) for step in path)


@register_serializable
class KeepRule(QuantizeRule):
    """A sublayer whose outputs are values of its input's grid (Dropout, Reshape...): called as it is."""

    def build(self, wrapper, layer):
        pass

    def call(self, wrapper, layer, inputs, training, **kwargs):
        return layer(inputs, training=training, **kwargs)  # Keras passes `training` on where call() takes it


@register_serializable
class FoldedAwayRule(QuantizeRule):
    """A composite's BatchNormalization, folded into the Conv/Dense sublayer before it (`_Folds`): its input,
    which that sublayer computed with it, handed on. At the composite's first call, before the fold is decided,
    the layer as it computes at inference."""

    def build(self, wrapper, layer):
        pass

    def call(self, wrapper, layer, inputs, training, **kwargs):
        return inputs if wrapper.folded else layer(inputs, training=False)


@register_serializable
class CompositeRule(QuantizeRule):
    """A composite layer, its sublayers standing in for themselves with their rules (`QuantizeSublayer`), its
    own computation as it is; its output on a range unless a sublayer's range gives it."""

    traces_call = True  # the wrapper's output spec comes from a symbolic call(), which makes the stand-ins' ranges
    builds_by_calling = True  # an unbuilt composite (a QAT model loading) is built by a call: see build_by_calling

    def __init__(self, mode="builtin", exact_as=None):
        self.mode, self.exact_as = mode, exact_as

    def build(self, wrapper, layer):
        for container, key, sublayer in sublayer_slots(layer):
            set_slot(layer, container, key, _proxy(sublayer, self.mode, self.exact_as, apply=True))
        wrapper.add_activation_range("output")

    def layer_config(self, layer):
        """The layer's config as it was before its stand-ins: one held as a constructor argument (keras-hub's
        TransformerEncoder keeps the `activation` layer it hands its Dense; a Wrapper its `layer`) would
        otherwise be saved, and built into the layer when the model loads."""
        with _stand_ins_withdrawn(layer):
            config = super().layer_config(layer)
        # and, for a layer built from several shapes (keras-hub's BART and Moonshine decoders: the encoder's
        # sequence too), those shapes, which its first input's alone cannot build again (the wrapper builds
        # every other layer, after its rule's stand-ins are in place)
        build_config = layer.get_build_config() if layer.built else None
        if build_config is None or len(build_config.get("shapes_dict", ())) < 2:
            return config
        return {**config, "build_config": build_config}

    # A composite called on several positional tensors (keras-hub's DeiTOutput(hidden, residual)) has them
    # packed as {"positional": [...]}; `build` takes the first one's shape, as Keras builds such a layer.
    _POSITIONAL = "positional"

    def call_arguments(self, layer, args, kwargs):
        args, kwargs = self.first_argument_positional(layer, args, kwargs)
        return (args[0] if len(args) == 1 else {self._POSITIONAL: list(args)}), kwargs

    def layer_arguments(self, inputs):
        if isinstance(inputs, dict) and list(inputs) == [self._POSITIONAL]:
            return (inputs[self._POSITIONAL][0],)
        return (inputs,)

    def build_by_calling(self, layer, inputs, **kwargs):
        """Build `layer` by calling it as it is, float, on the wrapper's call's arguments (its result unused)."""
        positional = inputs[self._POSITIONAL] if isinstance(inputs, dict) and list(inputs) == [self._POSITIONAL] \
            else [inputs]
        with operations.suspended():
            layer(*positional, **kwargs)

    def call(self, wrapper, layer, inputs, training, **kwargs):
        positional = inputs[self._POSITIONAL] if isinstance(inputs, dict) and list(inputs) == [self._POSITIONAL] \
            else [inputs]
        with _composite_call(positional, first=wrapper.operation_ranges is None) as (on_grid, folds):
            with operations.intercepting(wrapper, training, on_grid, folds):
                outputs = self.computed(wrapper, layer, positional, training, **kwargs)
            if folds is not None:
                folds.read(keras.tree.flatten(outputs))
                folds.settle(layer)
            outputs = keras.tree.map_structure(
                lambda output: output if not is_tensor(output) or _is_on_grid(output) or not is_float(output)
                else wrapper.ranges["output"](output, training), outputs)
        return outputs

    def computed(self, wrapper, layer, positional, training, **kwargs):
        """The layer's outputs, its stand-ins in place: its own call."""
        return layer(*positional, training=training, **kwargs)

    def get_config(self):
        return {"mode": self.mode, "exact_as": self.exact_as}


def _graph_layers(graph):
    """The layers a functional graph (a model, a Sequential's inner one) calls, in its order; None where it calls
    an operation that is not a layer, which has no rule."""
    operations_called = [operation for operation in graph.operations
                         if not isinstance(operation, keras.layers.InputLayer)]
    return operations_called if all(isinstance(operation, keras.layers.Layer)
                                    for operation in operations_called) else None


@register_serializable
class NestedModelRule(CompositeRule):
    """A Sequential or functional model a composite holds (keras-hub's SAM: its prompt encoder's mask
    downscaler), quantized through its layers: each stands in with its rule (`wrapper.stand_ins`, in the graph's
    order), and the graph runs through them. The model itself is left as it is (its layers are the stand-ins'),
    so that its config is the float one. Run as Functional.call runs it, without the input check its __call__
    makes: a composite may call its model at another shape than the one it was built at (SAM builds the
    downscaler at 4 times the image embedding and calls it at the masks' own size), which the model's layers,
    convolutions and normalizations, take as the float model's do."""

    def build(self, wrapper, layer):
        wrapper.stand_ins = [_proxy(sublayer, self.mode, self.exact_as, apply=True)
                             for sublayer in _graph_layers(nesting.graph_of(layer))]
        wrapper.add_activation_range("output")

    def layer_config(self, layer):
        return QuantizeRule.layer_config(self, layer)

    def build_by_calling(self, layer, inputs, **kwargs):
        with operations.suspended():
            layer(inputs, **kwargs)

    def computed(self, wrapper, layer, positional, training, **kwargs):
        graph = nesting.graph_of(layer)
        stand_ins = {id(sublayer): stand_in
                     for sublayer, stand_in in zip(_graph_layers(graph), wrapper.stand_ins)}
        # a model's call takes one structure of inputs, the composite's first argument; `training` reaches the
        # stand-ins through Keras's call context, as it reaches a functional model's layers
        outputs = graph._run_through_graph(graph._standardize_inputs(positional[0]),
                                           operation_fn=lambda operation: stand_ins[id(operation)])
        return outputs[0] if isinstance(outputs, (list, tuple)) and len(outputs) == 1 else outputs
