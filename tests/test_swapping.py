"""swap_activations: the swapped model is the model built with the new activation, with the same weights.

The reference for every swap is a second model built by hand with the new
activation, given the original's weights with `set_weights`: it shares no code
with the swap. Outputs are compared at float32 rounding (the same ops on the
same weights; 1e-6 allows XLA/oneDNN fusing differently in two graphs).
"""

import math
import warnings

import numpy as np
import pytest
import tensorflow as tf

import keras_gelu
from conftest import IS_KERAS3
from conftest import keras
from conftest import keras3_only
from conftest import tf_keras_only
from conftest import todays_share

pytestmark = pytest.mark.legs("keras3", "tf_keras")

# Same ops, same weights, two graphs: float32 rounding of a few hundred terms.
SAME_FUNCTION_ATOL = 1e-5


def _outputs(model, x):
    return np.asarray(model(x, training=False), dtype=np.float64)


def _snapshot(model):
    return model.to_json(), [weight.copy() for weight in model.get_weights()]


def _assert_untouched(model, snapshot):
    config, weights = snapshot
    assert model.to_json() == config
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)


# Each fused-activation layer kind: (input shape, factory(activation) -> layer).
FUSED_KINDS = {
    "Dense": ((6,), lambda activation: keras.layers.Dense(5, activation=activation)),
    "EinsumDense": ((4, 6), lambda activation: keras.layers.EinsumDense("abc,cd->abd", output_shape=(4, 5),
                                                                       bias_axes="d", activation=activation)),
    "Conv1D": ((8, 3), lambda activation: keras.layers.Conv1D(4, 3, activation=activation)),
    "Conv2D": ((6, 6, 2), lambda activation: keras.layers.Conv2D(4, 3, activation=activation)),
    "DepthwiseConv2D": ((6, 6, 2), lambda activation: keras.layers.DepthwiseConv2D(3, activation=activation)),
    "SeparableConv2D": ((6, 6, 2), lambda activation: keras.layers.SeparableConv2D(4, 3, activation=activation)),
    "Conv2DTranspose": ((4, 4, 2), lambda activation: keras.layers.Conv2DTranspose(3, 2, activation=activation)),
    "SimpleRNN": ((5, 3), lambda activation: keras.layers.SimpleRNN(4, activation=activation)),
    "LSTM": ((5, 3), lambda activation: keras.layers.LSTM(4, activation=activation)),
}

# Replacements, each with a maker of what a hand-built model passes as `activation=` for it.
REPLACEMENTS = {
    "string": ("gelu", lambda: "gelu"),
    "our function": (keras_gelu.gelu_tanh, lambda: keras_gelu.gelu_tanh),
    "our layer": (keras_gelu.GELU("sigmoid"), lambda: keras_gelu.GELU("sigmoid")),
    "learnable layer class": (keras_gelu.LearnableGELU, keras_gelu.LearnableGELU),
}


def _set_weights_except_learnable_gelu(model, weights):
    """Give `model` these weights in order, except LearnableGELU's alpha and beta, left at their initial values."""
    remaining = iter(weights)
    model.set_weights([weight.numpy() if weight.name.split("/")[-1].split(":")[0] in ("alpha", "beta")
                       else next(remaining) for weight in model.weights])
    assert next(remaining, None) is None


def _single_layer_model(shape, layer, name="model"):
    inputs = keras.Input(shape)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(layer(inputs)), name=name)


# Every replacement in every fused-activation layer kind: today's half in each flavour leg, the two legs the
# two halves (conftest.todays_share), each case in each flavour every two days.
FUSED_SWAPS_TODAY = todays_share([(kind, replacement) for kind in FUSED_KINDS for replacement in REPLACEMENTS],
                                 len(FUSED_KINDS) * len(REPLACEMENTS) // 2)


@pytest.mark.parametrize("kind, replacement", FUSED_SWAPS_TODAY, ids=[f"{kind}-{replacement}"
                                                                        for kind, replacement in FUSED_SWAPS_TODAY])
def test_fused_activation_swap_equals_hand_built_model(kind, replacement, rng):
    shape, factory = FUSED_KINDS[kind]
    value, hand_activation = REPLACEMENTS[replacement]
    relu_model = _single_layer_model(shape, factory("relu"))
    hand_built = _single_layer_model(shape, factory(hand_activation()))
    x = rng.normal(size=(4, *shape)).astype(np.float32)
    hand_built(x)  # Keras 3 builds an activation layer fused into Dense/Conv on the first call

    swapped, swaps = keras_gelu.swap_activations(relu_model, {"relu": value}, return_swaps=True)

    assert [(swap.attribute, swap.old) for swap in swaps] == [("activation", "relu")]
    _set_weights_except_learnable_gelu(hand_built, relu_model.get_weights())
    np.testing.assert_allclose(_outputs(swapped, x), _outputs(hand_built, x), atol=SAME_FUNCTION_ATOL)
    assert np.abs(_outputs(swapped, x) - _outputs(relu_model, x)).max() > 1e-3  # something did change


def test_new_learnable_gelu_keeps_the_weights_around_it_and_starts_from_its_initializers(rng):
    relu_model = _single_layer_model((6,), keras.layers.Dense(5, activation="relu", name="hidden"))
    swapped = keras_gelu.swap_activations(relu_model, {"relu": keras_gelu.LearnableGELU(beta_initializer="ones")})
    hidden = swapped.get_layer("hidden")
    np.testing.assert_array_equal(hidden.kernel.numpy(), relu_model.get_layer("hidden").kernel.numpy())
    np.testing.assert_allclose(hidden.activation.alpha.numpy(), 1.702, rtol=1e-7)
    np.testing.assert_array_equal(hidden.activation.beta.numpy(), 1.0)


def test_stand_alone_activation_layers_become_the_replacement_under_their_names(rng):
    inputs = keras.Input((6,))
    hidden = keras.layers.ReLU(name="relu_layer")(keras.layers.Dense(5, name="a")(inputs))
    hidden = keras.layers.Activation("relu", name="activation_layer")(keras.layers.Dense(5, name="b")(hidden))
    relu_model = keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))

    inputs = keras.Input((6,))
    hidden = keras_gelu.GELU("tanh")(keras.layers.Dense(5, name="a")(inputs))
    hidden = keras_gelu.GELU("tanh")(keras.layers.Dense(5, name="b")(hidden))
    hand_built = keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))
    hand_built.set_weights(relu_model.get_weights())

    swapped, swaps = keras_gelu.swap_activations(relu_model, {"relu": keras_gelu.GELU("tanh")}, return_swaps=True)

    assert [str(swap) for swap in swaps] == ["relu_layer: relu -> gelu_tanh", "activation_layer: relu -> gelu_tanh"]
    assert isinstance(swapped.get_layer("relu_layer"), keras_gelu.GELU)
    x = rng.normal(size=(8, 6)).astype(np.float32)
    np.testing.assert_allclose(_outputs(swapped, x), _outputs(hand_built, x), atol=SAME_FUNCTION_ATOL)


@pytest.mark.parametrize("layer_class", ["LeakyReLU", "PReLU", "ELU", "ReLU", "Activation", "LearnableGELU"])
def test_every_stand_alone_activation_layer_class_is_reached(layer_class, rng):
    make = {"Activation": lambda: keras.layers.Activation("swish", name="act"),
            "LearnableGELU": lambda: keras_gelu.LearnableGELU(name="act")}.get(
        layer_class, lambda: getattr(keras.layers, layer_class)(name="act"))
    key = keras_gelu.LearnableGELU if layer_class == "LearnableGELU" else getattr(keras.layers, layer_class)
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(make()(keras.layers.Dense(5, name="a")(inputs))))
    inputs = keras.Input((6,))
    hand_built = keras.Model(inputs, keras.layers.Dense(3, name="head")(
        keras_gelu.GELU("tanh")(keras.layers.Dense(5, name="a")(inputs))))
    x = rng.normal(size=(4, 6)).astype(np.float32)
    model(x)
    hand_built.set_weights([model.get_layer("a").kernel.numpy(), model.get_layer("a").bias.numpy(),
                            model.get_layer("head").kernel.numpy(), model.get_layer("head").bias.numpy()])
    swapped, swaps = keras_gelu.swap_activations(model, {key: keras_gelu.GELU("tanh")}, return_swaps=True)
    assert [swap.layer for swap in swaps] == ["act"]
    np.testing.assert_allclose(_outputs(swapped, x), _outputs(hand_built, x), atol=SAME_FUNCTION_ATOL)


def test_a_function_replacing_an_activation_layer_becomes_an_activation_layer(rng):
    relu_model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.ReLU(name="act")])
    swapped = keras_gelu.swap_activations(relu_model, {keras.layers.ReLU: keras.activations.sigmoid})
    assert isinstance(swapped.get_layer("act"), keras.layers.Activation)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    linear = relu_model.layers[0](x).numpy().astype(np.float64)
    np.testing.assert_allclose(_outputs(swapped, x), 1 / (1 + np.exp(-linear)), rtol=1e-6)


def _nested_relu_model():
    innermost = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5, activation="relu", name="deep")],
                                 name="innermost")
    middle_inputs = keras.Input((5,))
    middle = keras.Model(middle_inputs, keras.layers.ReLU(name="middle_relu")(innermost(middle_inputs)),
                         name="middle")
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(5, activation="relu", name="top")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(middle(hidden)), name="outer")


def _nested_gelu_model():
    innermost = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5, activation="gelu", name="deep")],
                                 name="innermost")
    middle_inputs = keras.Input((5,))
    middle = keras.Model(middle_inputs, keras_gelu.GELU()(innermost(middle_inputs)), name="middle")
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(5, activation="gelu", name="top")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(middle(hidden)), name="outer")


def test_nested_models_are_swapped_at_every_depth(rng):
    relu_model = _nested_relu_model()
    hand_built = _nested_gelu_model()
    hand_built.set_weights(relu_model.get_weights())

    swapped, swaps = keras_gelu.swap_activations(relu_model, {"relu": keras_gelu.GELU()}, return_swaps=True)

    assert sorted(swap.layer for swap in swaps) == ["middle/innermost/deep", "middle/middle_relu", "top"]
    x = rng.normal(size=(8, 6)).astype(np.float32)
    np.testing.assert_allclose(_outputs(swapped, x), _outputs(hand_built, x), atol=SAME_FUNCTION_ATOL)


def test_a_shared_layer_is_swapped_once_and_stays_shared(rng):
    inputs = keras.Input((4,))
    shared = keras.layers.Dense(4, activation="relu", name="shared")
    relu_model = keras.Model(inputs, shared(shared(inputs)))
    swapped, swaps = keras_gelu.swap_activations(relu_model, {"relu": "gelu"}, return_swaps=True)
    assert len(swaps) == 1 and len(swapped.weights) == 2
    x = rng.normal(size=(3, 4)).astype(np.float32)
    kernel, bias = (weight.astype(np.float64) for weight in relu_model.get_weights())
    reference_gelu = np.vectorize(lambda v: 0.5 * v * (1 + __import__("math").erf(v / 2 ** 0.5)))
    expected = reference_gelu(reference_gelu(x @ kernel + bias) @ kernel + bias)
    np.testing.assert_allclose(_outputs(swapped, x), expected, atol=1e-5)


def test_the_original_model_is_left_as_it_was(rng):
    relu_model = _nested_relu_model()
    x = rng.normal(size=(4, 6)).astype(np.float32)
    before, snapshot = _outputs(relu_model, x), _snapshot(relu_model)
    swapped = keras_gelu.swap_activations(relu_model, {"relu": keras_gelu.LearnableGELU})
    swapped.compile(optimizer="sgd", loss="mse")
    swapped.fit(x, np.ones((4, 3), np.float32), epochs=1, verbose=0)  # training the copy...
    _assert_untouched(relu_model, snapshot)  # ...moves nothing of the original
    np.testing.assert_array_equal(_outputs(relu_model, x), before)


def _every_spelling_model():
    inputs = keras.Input((4,))
    layers = [
        keras.layers.Dense(4, activation="relu", name="relu_string"),
        keras.layers.Dense(4, activation=tf.nn.relu, name="tf_nn_relu"),
        keras.layers.ReLU(name="relu_layer"),
        keras.layers.ReLU(max_value=6.0, name="relu6_layer"),
        keras.layers.Dense(4, activation="gelu", name="keras_gelu_string"),
        keras_gelu.GELU(name="our_exact_layer"),
        keras.layers.Dense(4, activation=keras_gelu.gelu_tanh, name="our_tanh"),
        keras.layers.Activation("sigmoid", name="sigmoid_layer"),
    ]
    hidden = inputs
    for layer in layers:
        hidden = layer(hidden)
    return keras.Model(inputs, hidden)


KEYS = {
    "relu": ["relu_string", "tf_nn_relu", "relu_layer"],
    "keras relu function": ["relu_string", "tf_nn_relu", "relu_layer"],
    "ReLU class": ["relu_layer", "relu6_layer"],
    "ReLU(max_value=6) layer": ["relu6_layer"],
    "gelu": ["keras_gelu_string", "our_exact_layer"],
    "GELU('tanh') layer": ["our_tanh"],
    "when(name ends with 'layer')": ["relu_layer", "relu6_layer", "our_exact_layer", "sigmoid_layer"],
}


def _key(name):
    return {
        "relu": "relu",
        "keras relu function": keras.activations.relu,
        "ReLU class": keras.layers.ReLU,
        "ReLU(max_value=6) layer": keras.layers.ReLU(max_value=6.0),
        "gelu": "gelu",
        "GELU('tanh') layer": keras_gelu.GELU("tanh"),
        "when(name ends with 'layer')": keras_gelu.when(lambda layer, activation: layer.name.endswith("layer")),
    }[name]


@pytest.mark.parametrize("key", KEYS, ids=list(KEYS))
def test_a_key_matches_every_spelling_of_its_function_and_nothing_else(key):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a key may leave other activations that match nothing
        _, swaps = keras_gelu.swap_activations(_every_spelling_model(), {_key(key): "elu"}, return_swaps=True)
    assert [swap.layer for swap in swaps] == KEYS[key]


@keras3_only
def test_keras_ops_gelu_as_a_key_means_its_tanh_default():
    _, swaps = keras_gelu.swap_activations(_every_spelling_model(), {keras.ops.gelu: "elu"}, return_swaps=True)
    assert [swap.layer for swap in swaps] == ["our_tanh"]


def test_the_first_matching_key_wins():
    _, swaps = keras_gelu.swap_activations(
        _every_spelling_model(), {keras.layers.ReLU: "elu", "relu": "gelu", "gelu": "gelu_sigmoid"},
        return_swaps=True)
    assert {swap.layer: swap.new for swap in swaps} == {
        "relu_string": "gelu_exact", "tf_nn_relu": "gelu_exact", "relu_layer": "elu", "relu6_layer": "elu",
        "keras_gelu_string": "gelu_sigmoid", "our_exact_layer": "gelu_sigmoid"}


def test_recurrent_activation_is_swapped_on_its_own_key(rng):
    inputs = keras.Input((5, 3))
    model = keras.Model(inputs, keras.layers.LSTM(4, name="lstm")(inputs))
    hand_inputs = keras.Input((5, 3))
    hand_built = keras.Model(hand_inputs, keras.layers.LSTM(4, recurrent_activation=keras_gelu.gelu_sigmoid,
                                                            name="lstm")(hand_inputs))
    hand_built.set_weights(model.get_weights())
    swapped, swaps = keras_gelu.swap_activations(model, {"sigmoid": keras_gelu.gelu_sigmoid}, return_swaps=True)
    assert [str(swap) for swap in swaps] == ["lstm.recurrent_activation: sigmoid -> gelu_sigmoid"]
    x = rng.normal(size=(2, 5, 3)).astype(np.float32)
    np.testing.assert_allclose(_outputs(swapped, x), _outputs(hand_built, x), atol=SAME_FUNCTION_ATOL)


def test_the_replacement_takes_the_dtype_policy_of_what_it_replaces(rng):
    keras.mixed_precision.set_global_policy("mixed_float16")
    inputs = keras.Input((6,))
    hidden = keras.layers.ReLU(name="act")(keras.layers.Dense(8, activation="relu", name="fused")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, dtype="float32", name="head")(hidden))
    keras.mixed_precision.set_global_policy("float32")  # the template is made under float32...
    swapped = keras_gelu.swap_activations(model, {"relu": keras_gelu.GELU("tanh")})
    for name in ("act", "fused"):  # ...but computes in float16 where the ReLU did
        assert swapped.get_layer(name).compute_dtype == "float16"
    assert swapped.get_layer("fused").activation.compute_dtype == "float16"
    x = rng.normal(size=(4, 6)).astype(np.float32)
    assert np.all(np.isfinite(_outputs(swapped, x)))


# Saving: each format in each flavour, loaded without custom_objects.
SAVE_FORMATS = ["keras", "h5", "savedmodel"]


def _save_and_load(model, tmp_path, file_format):
    if file_format == "savedmodel":
        path = str(tmp_path / "swapped_savedmodel")
        if IS_KERAS3:
            model.export(path)
            served = tf.saved_model.load(path)
            return lambda x: served.serve(x)  # the closure keeps `served`, and with it its variables, alive
        model.save(path)
        return keras.models.load_model(path)
    path = str(tmp_path / f"swapped.{file_format}")
    model.save(path)
    return keras.models.load_model(path)


@pytest.mark.parametrize("file_format", SAVE_FORMATS)
@pytest.mark.parametrize("value", ["gelu", keras_gelu.gelu_sigmoid, keras_gelu.GELU("tanh"), keras_gelu.LearnableGELU],
                         ids=["string", "our function", "our layer", "learnable"])
def test_the_swapped_model_saves_and_loads_without_custom_objects(tmp_path, file_format, value, rng):
    relu_model = _nested_relu_model()
    swapped = keras_gelu.swap_activations(relu_model, {"relu": value})
    x = rng.normal(size=(4, 6)).astype(np.float32)
    with keras.saving.custom_object_scope({}):
        reloaded = _save_and_load(swapped, tmp_path, file_format)
    np.testing.assert_allclose(np.asarray(reloaded(x), np.float64), _outputs(swapped, x), atol=1e-6)


# Bad input: one ValueError with "Received:", and the model as it was.

class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3, activation="relu")

    def call(self, inputs):
        return self.dense(inputs)


def test_a_subclassed_model_is_refused_with_what_to_do_instead():
    model = _Subclassed()
    model(np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"subclassed.*set_weights.*Received: model=_Subclassed \(subclassed\)"):
        keras_gelu.swap_activations(model, {"relu": "gelu"})


def test_a_subclassed_model_nested_in_a_functional_one_is_refused_by_path():
    inner = _Subclassed()
    inputs = keras.Input((4,))
    outer = keras.Model(inputs, inner(inputs))
    with pytest.raises(ValueError, match=r"subclassed"):
        keras_gelu.swap_activations(outer, {"relu": "gelu"})


@pytest.mark.parametrize("model", [np.zeros(3), "model.keras", None], ids=["array", "path", "None"])
def test_something_not_a_model_is_refused(model):
    with pytest.raises(ValueError, match=r"takes a Keras model\. Received: model="):
        keras_gelu.swap_activations(model, {"relu": "gelu"})


def test_a_model_of_the_other_keras_is_refused_with_the_flavour_named():
    other_keras = pytest.importorskip("tf_keras" if IS_KERAS3 else "keras")
    if not IS_KERAS3 and not other_keras.__version__.startswith("3."):
        pytest.skip("the other Keras here is not Keras 3")
    other = other_keras.Sequential([other_keras.Input((4,)), other_keras.layers.Dense(2, activation="relu")])
    with pytest.raises(ValueError, match=r"other Keras.*TF_USE_LEGACY_KERAS.*Received: model=Sequential"):
        keras_gelu.swap_activations(other, {"relu": "gelu"})


def test_an_unbuilt_model_is_refused():
    model = keras.Sequential([keras.layers.Dense(2, activation="relu")])
    with pytest.raises(ValueError, match=r"must be built.*Received: model="):
        keras_gelu.swap_activations(model, {"relu": "gelu"})


BAD_MAPPINGS = {
    "key is a number": ({3: "gelu"}, r"mapping key must be an activation.*Received: mapping key=3"),
    "key names nothing": ({"rellu": "gelu"}, r"names no activation.*Received: mapping key='rellu'"),
    "key is a non-layer class": ({int: "gelu"}, r"Keras layer class.*Received: mapping key=<class 'int'>"),
    "value is a number": ({"relu": 0.5}, r"mapping value must be an activation.*Received: mapping value=0.5"),
    "value names nothing": ({"relu": "gelu_fast"}, r"names no activation.*Received: mapping value='gelu_fast'"),
    "value is a non-layer class": ({"relu": dict}, r"mapping value must be an activation.*Received: mapping value="),
    "empty mapping": ({}, r"at least one entry\. Received: mapping=\{\}"),
    "not a mapping": (42, r"must map what to replace.*Received: mapping=42"),
}


@pytest.mark.parametrize("case", BAD_MAPPINGS, ids=list(BAD_MAPPINGS))
def test_a_bad_mapping_is_refused_and_the_model_left_as_it_was(case):
    mapping, message = BAD_MAPPINGS[case]
    model = _nested_relu_model()
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=message):
        keras_gelu.swap_activations(model, mapping)
    _assert_untouched(model, snapshot)


@pytest.mark.parametrize("replacement", [keras.layers.Flatten(), keras.layers.GlobalAveragePooling1D()],
                         ids=["Flatten", "GlobalAveragePooling1D"])
def test_a_replacement_that_changes_the_output_shape_is_refused(replacement):
    inputs = keras.Input((5, 4))
    hidden = keras.layers.ReLU(name="act")(keras.layers.Dense(4, name="proj")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=r"output shape of layer act.*Received: layer=act"):
        keras_gelu.swap_activations(model, {"relu": replacement})
    _assert_untouched(model, snapshot)


# Reports: what was swapped, and what was not.

def test_nothing_matched_is_reported_and_the_copy_computes_the_same(rng):
    model = _nested_relu_model()
    with pytest.warns(UserWarning, match=r"no activation in model 'outer' matched \['tanh'\]"):
        copy, swaps = keras_gelu.swap_activations(model, {"tanh": "gelu"}, return_swaps=True)
    assert swaps == [] and copy is not model
    x = rng.normal(size=(4, 6)).astype(np.float32)
    np.testing.assert_array_equal(_outputs(copy, x), _outputs(model, x))


def test_a_key_that_matched_nothing_is_named_when_others_did():
    with pytest.warns(UserWarning, match=r"swapped nothing in model 'outer': \['tanh'\]"):
        keras_gelu.swap_activations(_nested_relu_model(), {"relu": "gelu", "tanh": "gelu"})


def test_swaps_are_logged(caplog):
    with caplog.at_level("INFO", logger="keras_gelu.swapping"):
        keras_gelu.swap_activations(_nested_relu_model(), {"relu": "gelu"})
    assert "swapped top.activation: relu -> gelu_exact" in caplog.text


@keras.saving.register_keras_serializable(package="keras_gelu_tests")
class _BlockWithOwnRelu(keras.layers.Layer):
    """A layer whose inner Dense's activation is fixed in its code, not an argument."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(4, activation="relu")

    def call(self, inputs):
        return self.inner(inputs)


@keras.saving.register_keras_serializable(package="keras_gelu_tests")
class _BlockWithLayersInADict(keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.by_name = {"inner": keras.layers.Dense(4, activation="relu")}

    def call(self, inputs):
        return self.by_name["inner"](inputs)


def _learnable_gelu(x, alpha, beta):
    return x / (1.0 + np.exp(-(alpha * x + beta)))


def test_an_activation_built_in_a_layers_own_code_is_swapped_and_saves_and_loads(tmp_path, rng):
    inputs = keras.Input((4,))
    first = keras.layers.Dense(4, activation="relu", name="first")
    model = keras.Model(inputs, _BlockWithOwnRelu(name="block")(first(inputs)))
    template = keras_gelu.LearnableGELU(alpha_initializer=keras.initializers.Constant(1.5),
                                        beta_initializer=keras.initializers.Constant(0.25))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is left out of reach
        swapped, swaps = keras_gelu.swap_activations(model, {"relu": template}, return_swaps=True)
    assert [str(swap) for swap in swaps] == ["first.activation: relu -> LearnableGELU",
                                             "block.inner.activation: relu -> LearnableGELU"]
    # The reference: NumPy, on the original's weights (the swap copies them; the new activations start afresh)
    x = rng.normal(size=(8, 4))
    kernel_1, bias_1, kernel_2, bias_2 = (np.asarray(w, np.float64) for w in model.get_weights())
    expected = _learnable_gelu(_learnable_gelu(x @ kernel_1 + bias_1, 1.5, 0.25) @ kernel_2 + bias_2, 1.5, 0.25)
    np.testing.assert_allclose(_outputs(swapped, x.astype(np.float32)), expected, atol=SAME_FUNCTION_ATOL)
    path = str(tmp_path / "swapped.keras")
    swapped.save(path)
    np.testing.assert_allclose(_outputs(keras.models.load_model(path), x.astype(np.float32)), expected,
                               atol=SAME_FUNCTION_ATOL)


def test_an_activation_out_of_reach_is_named_in_a_warning():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, _BlockWithLayersInADict(name="block")(keras.layers.Dense(4, activation="relu")(
        inputs)))
    with pytest.warns(UserWarning, match=r"built by their layer's own code.*\(inside block\)"):
        _, swaps = keras_gelu.swap_activations(model, {"relu": "gelu"}, return_swaps=True)
    assert len(swaps) == 1


# Composition with the rest of the package.

@pytest.mark.parametrize("mode", ["builtin", "native"])
def test_the_swapped_model_converts_to_tflite_with_parity(mode, rng):
    from keras_gelu import converters
    import tflite_helpers

    relu_model = _nested_relu_model()
    swapped = keras_gelu.swap_activations(relu_model, {"relu": keras_gelu.GELU()})
    tflite_model, report = converters.convert(swapped, mode=mode)
    histogram = tflite_helpers.ops(tflite_model)
    assert ("GELU" in histogram) == (mode == "native")
    x = rng.normal(size=(1, 6)).astype(np.float32)
    # builtin computes exact GELU as sigmoid(1.702 x): its 2e-2 error, through two layers of weights
    np.testing.assert_allclose(tflite_helpers.run(tflite_model, x)[0], _outputs(swapped, x),
                               atol=1e-5 if mode == "native" else 5e-2)


@tf_keras_only
def test_the_swapped_model_goes_through_quantize_model(rng):
    pytest.importorskip("tensorflow_model_optimization")
    import keras_gelu.qat

    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    relu_model = keras.Model(inputs, keras.layers.Dense(3, name="head")(hidden))
    swapped = keras_gelu.swap_activations(relu_model, {"relu": keras_gelu.GELU("sigmoid")})
    x = rng.normal(size=(256, 6)).astype(np.float32)
    qat_model = keras_gelu.qat.quantize_model(swapped, mode="builtin", calibration_data=x)
    assert any("gelu" in layer.name for layer in qat_model.layers)  # split out of Dense, as a layer of its own
    float_outputs = _outputs(swapped, x)
    # int8 fake quantization: a few steps of 1/255 of the ranges, through two layers
    np.testing.assert_allclose(_outputs(qat_model, x), float_outputs, atol=0.05 * np.ptp(float_outputs))


# Real model families: keras-hub's Transformer layers take `activation=` by Keras's convention.

@keras3_only
def test_keras_hub_transformer_encoder_swap_equals_the_encoder_built_with_gelu(rng):
    keras_hub = pytest.importorskip("keras_hub")

    def encoder_model(activation):
        inputs = keras.Input((5, 8))
        encoder = keras_hub.layers.TransformerEncoder(intermediate_dim=16, num_heads=2, activation=activation,
                                                      name="encoder")
        return keras.Model(inputs, encoder(inputs))

    relu_model, hand_built = encoder_model("relu"), encoder_model(keras_gelu.gelu_exact)
    hand_built.set_weights(relu_model.get_weights())
    swapped, swaps = keras_gelu.swap_activations(relu_model, {"relu": keras_gelu.gelu_exact}, return_swaps=True)
    assert [str(swap) for swap in swaps] == ["encoder.activation: relu -> gelu_exact"]
    x = rng.normal(size=(3, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(_outputs(swapped, x), _outputs(hand_built, x), atol=SAME_FUNCTION_ATOL)


@keras3_only
def test_keras_hub_bert_backbone_tanh_gelu_swaps_to_sigmoid_and_saves(tmp_path, rng):
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8,
                                             intermediate_dim=16, max_sequence_length=12)
    # keras-hub's BERT uses its own gelu_approximate, the tanh form: "gelu" (exact) must not match it
    with pytest.warns(UserWarning, match="no activation"):
        keras_gelu.swap_activations(backbone, {"gelu": "gelu_sigmoid"})
    swapped, swaps = keras_gelu.swap_activations(backbone, {"gelu_tanh": keras_gelu.gelu_sigmoid},
                                                 return_swaps=True)
    assert [swap.layer for swap in swaps] == ["transformer_layer_0", "transformer_layer_1"]

    # The reference: a plain clone of the backbone, its feed-forward activations patched by hand.
    patched = keras.models.clone_model(backbone, clone_function=lambda layer: layer.__class__.from_config(
        layer.get_config()))
    patched.set_weights(backbone.get_weights())
    for layer in patched.layers:
        if isinstance(layer, keras_hub.layers.TransformerEncoder):
            layer._feedforward_intermediate_dense.activation = keras_gelu.gelu_sigmoid
    inputs = {"token_ids": rng.integers(0, 50, size=(2, 12)).astype("int32"),
              "segment_ids": np.zeros((2, 12), "int32"), "padding_mask": np.ones((2, 12), "int32")}
    expected = patched(inputs)["sequence_output"].numpy()
    np.testing.assert_allclose(swapped(inputs)["sequence_output"].numpy(), expected, atol=SAME_FUNCTION_ATOL)
    path = str(tmp_path / "bert_sigmoid_gelu.keras")
    swapped.save(path)
    np.testing.assert_allclose(keras.models.load_model(path)(inputs)["sequence_output"].numpy(), expected,
                               atol=SAME_FUNCTION_ATOL)


@keras3_only
def test_keras_hub_vit_gelu_built_in_its_mlp_code_swaps_and_saves(tmp_path, rng):
    """ViT's MLP makes its Dense(activation="gelu") in its own build(): no argument reaches it."""
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.ViTBackbone(image_shape=(16, 16, 3), patch_size=8, num_layers=2, num_heads=2,
                                            hidden_dim=8, mlp_dim=16)
    swapped, swaps = keras_gelu.swap_activations(backbone, {"gelu": keras_gelu.gelu_sigmoid}, return_swaps=True)
    assert [str(swap) for swap in swaps] == [
        f"vit_encoder.encoder_layers.{block}.mlp.dense_1.activation: gelu_exact -> gelu_sigmoid" for block in (0, 1)]
    # The reference: the backbone itself, its MLPs' activations patched by hand after a first call built them
    x = rng.uniform(size=(2, 16, 16, 3)).astype(np.float32)
    backbone(x)
    encoder = backbone.get_layer("vit_encoder")
    for block in encoder.encoder_layers:
        block.mlp.dense_1.activation = keras_gelu.gelu_sigmoid
    expected = backbone(x).numpy()
    np.testing.assert_allclose(_outputs(swapped, x), expected, atol=SAME_FUNCTION_ATOL)
    path = str(tmp_path / "vit_sigmoid_gelu.keras")  # keras-hub's ViT layers' own configs do not load back
    swapped.save(path)
    np.testing.assert_allclose(_outputs(keras.models.load_model(path), x), expected, atol=SAME_FUNCTION_ATOL)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# Functions no name identifies, as libraries and tutorials write them (numpy, so that both flavours run them):
# {what they compute: spellings}. Written from the formulas, not from keras_gelu.
UNNAMED_SPELLINGS = {
    "gelu_sigmoid": [lambda x: x * _sigmoid(1.702 * x)],  # CLIP's and MetaCLIP 2's quick_gelu
    "gelu_tanh": [lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))],  # gelu_new
    "gelu_exact": [lambda x: x * 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)).astype(np.float32))],
}
NOT_GELU = [lambda x: x * _sigmoid(x), lambda x: x * _sigmoid(1.6 * x), np.tanh, lambda x: x[0],
            lambda x: x * _sigmoid(1.702 * x) + 1e-3]


@pytest.mark.parametrize("function", [name for name, spellings in UNNAMED_SPELLINGS.items() for _ in spellings])
def test_an_activation_no_name_identifies_is_known_by_its_values(function):
    """A GELU in a library's own spelling is swapped (and, in QAT, quantized) as the GELU it computes: its
    values on a grid agree with one form to float32 rounding, and the forms differ by far more."""
    from keras_gelu import swapping

    for spelling in UNNAMED_SPELLINGS[function]:
        assert swapping.computed_function(spelling) == function


@pytest.mark.parametrize("function", NOT_GELU, ids=["silu", "another_slope", "tanh", "not_elementwise", "shifted"])
def test_a_function_near_gelu_but_not_it_keeps_its_identity(function):
    from keras_gelu import swapping

    assert swapping.computed_function(function) is function
