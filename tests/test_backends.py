"""keras_gelu on every Keras 3 backend: TensorFlow, JAX and PyTorch, tested on each.

Written in `keras.ops` and numpy only, so the very same tests run in the
Keras 3 leg (TensorFlow's XLA kernels) and in the JAX and PyTorch legs
(`portable_kernels`), the latter in environments without TensorFlow: the
layers' guarantees, swapping, QAT, models saved on one backend and loaded on
another, and (JAX) data-parallel training. The references are the float64
formulas of `references.py` and the outputs each model had on the backend it
was saved on (`tests/data/keras_backends/make.py`).
"""

import os
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest

import keras_gelu
import references
from conftest import BACKEND
from conftest import keras

pytestmark = pytest.mark.legs("keras3", "jax", "torch")

SAVED_ON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "keras_backends")
DENSE_GRID = np.linspace(-10.0, 10.0, 20_001, dtype=np.float32)
# JAX computes float64 only with jax_enable_x64, which the JAX leg leaves off (as most JAX users do).
FLOAT64 = BACKEND != "jax"
DTYPES = ["float16", "bfloat16", "float32"] + (["float64"] if FLOAT64 else [])
HALF_TYPES = {"float16": (np.float16, np.int16), "bfloat16": (ml_dtypes.bfloat16, np.int16)}


def _numpy(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def _value_and_gradient(function, x, compiled=False):
    """function(x) and d sum(function(x)) / dx, on the active backend's own autodiff; `compiled`, as a compiled
    training step computes them (jax.jit, torch.compile, TensorFlow's XLA)."""
    x = keras.ops.convert_to_tensor(x)
    if BACKEND == "jax":
        import jax

        def step(v):
            return function(v), jax.grad(lambda w: keras.ops.sum(function(w)))(v)

        y, grad = (jax.jit(step) if compiled else step)(x)
        return _numpy(y), _numpy(grad)
    if BACKEND == "torch":
        import torch

        x = x.detach().requires_grad_(True)
        y = (torch.compile(function) if compiled else function)(x)
        keras.ops.sum(y).backward()
        return _numpy(y.detach()), _numpy(x.grad)
    import tensorflow as tf

    def step(v):
        with tf.GradientTape() as tape:
            tape.watch(v)
            y = function(v)
        return y, tape.gradient(y, v)

    y, grad = (tf.function(step, jit_compile=True) if compiled else step)(x)
    return _numpy(y), _numpy(grad)


def _as(values, dtype):
    """`values` as a tensor of `dtype` (through float64: float64's largest value does not fit float32)."""
    return keras.ops.convert_to_tensor(np.asarray(values, np.float64).astype(ml_dtypes.finfo(dtype).dtype))


def _assert_values_within_the_float32_bound(function, values, where=None):
    """Values on DENSE_GRID against the float64 reference, within the form's float32 bound; `where` names them."""
    expected = references.BY_FUNCTION[function](DENSE_GRID)
    tolerance = references.FLOAT32_TOLERANCE[function]
    excess = np.abs(values.astype(np.float64) - expected) - (tolerance["atol"] + tolerance["rtol"] * np.abs(expected))
    assert excess.max() <= 0, (where, DENSE_GRID[np.argmax(excess)])


def _assert_within_the_float32_bounds(function, values, grads):
    """Values and gradients on DENSE_GRID against the float64 references, within the form's float32 bounds."""
    assert values.dtype == np.float32
    _assert_values_within_the_float32_bound(function, values)
    np.testing.assert_allclose(grads, references.derivative(function, DENSE_GRID), rtol=0,
                               atol=references.FLOAT32_DERIVATIVE_ATOL[function])


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_float32_values_and_gradients_on_a_dense_grid(function, compiled):
    """Called eagerly and in a compiled step. Exact GELU's gate is erfc's or, where the formulas are compiled, the
    normal tail's polynomial (every backward pass on TensorFlow; JAX under jit; PyTorch's own kernels, eagerly
    too): every way keeps the same bounds."""
    _assert_within_the_float32_bounds(function, *_value_and_gradient(lambda v: keras_gelu.gelu(v, function),
                                                                     DENSE_GRID, compiled))


def _eager_torch_cases(torch):
    """(name, x, upstream) for an eager pass of every kind a model gives: ranks one to three, a batch of one, an
    empty batch, a transposed view, and a gradient broadcast from a sum (stride 0), of sizes one and more."""
    grid = torch.linspace(-9.5, 9.5, 24)
    return [("rank 1", grid, None), ("rank 2", grid.reshape(4, 6), None), ("rank 3", grid.reshape(2, 3, 4), None),
            ("a batch of one", grid[:1].reshape(1, 1), None), ("one element", grid[5:6], None),
            ("an empty batch", grid[:0].reshape(0, 6), None), ("a transposed view", grid.reshape(4, 6).T, None),
            ("a sum's gradient", grid.reshape(6, 4), torch.ones(()).expand(6, 4)),
            ("a sum's gradient of one element", grid[3:4], torch.ones(()).expand(1))]


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's eager kernels are compiled by keras_gelu itself")
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_pytorch_compiles_each_pass_once_whatever_the_shape_and_the_values_stay_gelu_s(function):
    """Eagerly on PyTorch, each pass compiles once per dtype: torch.compile's dynamic shapes compiled again for
    another rank, a batch of one, a stride of 0 and a view of another shape, seconds each (in this leg's tests of
    infinities alone, 24 compilations beyond each test's first). Each case's values and gradient are the float64
    references', within the form's float32 bounds."""
    import torch
    from torch._dynamo.utils import counters

    graphs = []
    for name, x, upstream in _eager_torch_cases(torch):
        x = x.detach().requires_grad_(True)
        y = keras_gelu.gelu(x, function)
        y.backward(torch.ones_like(y) if upstream is None else upstream)
        graphs.append((name, counters["stats"]["unique_graphs"]))
        assert y.shape == x.shape, name
        x64 = x.detach().numpy().astype(np.float64)
        np.testing.assert_allclose(y.detach().numpy(), references.BY_FUNCTION[function](x64),
                                   **references.FLOAT32_TOLERANCE[function], err_msg=name)
        np.testing.assert_allclose(x.grad.numpy(), references.derivative(function, x64), rtol=0,
                                   atol=references.FLOAT32_DERIVATIVE_ATOL[function], err_msg=name)
    assert {count for _, count in graphs} == {graphs[0][1]}, graphs


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's eager kernels are compiled by keras_gelu itself")
def test_without_a_working_compiler_pytorch_runs_the_formulas_op_by_op_after_one_warning(monkeypatch):
    """Called eagerly on PyTorch, each pass runs through torch.compile; where that fails (Inductor without a C++
    compiler, say), the same formulas run op by op, erfc and all, within the same bounds, after one warning."""
    import torch

    from keras_gelu import formulas
    from keras_gelu import portable_kernels

    def compile_without_a_compiler(function, **options):
        def fail(*tensors):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

        return fail

    monkeypatch.setattr(torch, "compile", compile_without_a_compiler)
    exact = portable_kernels._gated_activation(formulas.exact_forward, formulas.exact_derivative)
    with pytest.warns(UserWarning, match=r"torch.compile failed here, so GELU runs op by op \(slower\): "
                                         r"InvalidCxxCompiler: No working C\+\+ compiler found"):
        values, grads = _value_and_gradient(exact, DENSE_GRID)
    _assert_within_the_float32_bounds("exact", values, grads)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _value_and_gradient(exact, DENSE_GRID)  # no second attempt, no second warning


# Compiled once per form, in float32: what differs compiled (the normal tail) is computed in float32, and each
# compilation costs PyTorch seconds.
@pytest.mark.parametrize("dtype, compiled", [(dtype, False) for dtype in DTYPES] + [("float32", True)],
                         ids=[*DTYPES, "float32-compiled"])
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_infinities_nan_and_huge_inputs_with_finite_gradients(function, dtype, compiled):
    largest = float(ml_dtypes.finfo(dtype).max) if dtype != "float64" else float(np.finfo(np.float64).max)
    finite = [v for v in (-largest, -1e30, -1e4, 1e4, 1e30, largest) if abs(v) <= largest]
    values, grads = _value_and_gradient(lambda v: keras_gelu.gelu(v, function),
                                        _as([-np.inf, np.inf, *finite], dtype), compiled)
    values, grads = values.astype(np.float64), grads.astype(np.float64)
    assert values[0] == 0.0 and values[1] == np.inf  # tf.nn.gelu gives NaN at -inf
    assert grads[0] == 0.0 and grads[1] == 1.0  # and a NaN gradient at +inf
    as_typed = np.asarray(finite, np.float64).astype(ml_dtypes.finfo(dtype).dtype).astype(np.float64)
    np.testing.assert_array_equal(values[2:], np.where(as_typed < 0, 0.0, as_typed))
    np.testing.assert_array_equal(grads[2:], np.where(np.array(finite) < 0, 0.0, 1.0))
    nan, nan_grad = _value_and_gradient(lambda v: keras_gelu.gelu(v, function), _as([np.nan], dtype), compiled)
    assert np.isnan(nan.astype(np.float64)).all() and np.isnan(nan_grad.astype(np.float64)).all()  # the guards clip


def _every_half_value(dtype, low=-20.0, high=20.0):
    numpy_type, int_type = HALF_TYPES[dtype]
    every = np.arange(np.iinfo(int_type).min, np.iinfo(int_type).max + 1).astype(int_type).view(numpy_type)
    as_float = every.astype(np.float32)
    return every[(as_float >= low) & (as_float <= high)]


@pytest.mark.parametrize("dtype", sorted(HALF_TYPES))
@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_half_precision_is_computed_wide_and_rounded_once(function, dtype):
    """Every float16/bfloat16 value in [-20, 20] within 1 ulp of the float64 reference rounded to the type.
    Where the input, the gate y / x or the output is below float32's normal range (bfloat16 only), a float32
    computation meets subnormals, which XLA and TensorFlow flush to zero: there the result is within float32's
    smallest normal number (times |x|, for the gate) of GELU, the most float32 can promise."""
    values = _every_half_value(dtype)
    got = _numpy(keras_gelu.gelu(keras.ops.convert_to_tensor(values), function)).astype(np.float64)
    numpy_type = HALF_TYPES[dtype][0]
    x = values.astype(np.float64)
    exact = references.BY_FUNCTION[function](x)
    distance = references.ulp_distance(got.astype(numpy_type), exact.astype(np.float32).astype(numpy_type))
    reach = np.finfo(np.float32).tiny * np.maximum(1.0, np.abs(x))
    subnormal = (np.abs(x) < np.finfo(np.float32).tiny) | (np.abs(exact) < reach)
    assert distance[~subnormal].max() <= 1
    assert np.all(np.abs(got - exact)[subnormal] <= reach[subnormal])


@pytest.mark.parametrize("approximate, function", [("none", "exact"), (False, "exact"), (True, "tanh"),
                                                   ("tanh", "tanh"), ("sigmoid", "sigmoid")])
def test_approximate_names(approximate, function):
    np.testing.assert_array_equal(_numpy(keras_gelu.gelu(DENSE_GRID, approximate)),
                                  _numpy(keras_gelu.gelu(DENSE_GRID, function)))
    with pytest.raises(ValueError, match="Received: approximate="):
        keras_gelu.gelu(DENSE_GRID, "fast")


def _model():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation=keras_gelu.gelu_tanh),
                             keras_gelu.GELU(), keras.layers.Dense(16), keras_gelu.LearnableGELU(),
                             keras.layers.Dense(1)])


def test_a_model_trains_under_jit_compile_and_its_learnable_gelu_moves(rng):
    """fit() compiled whole (XLA on TensorFlow and JAX, torch.compile on PyTorch): the loss falls, alpha moves."""
    keras.utils.set_random_seed(3)
    model = _model()
    model.compile(keras.optimizers.Adam(0.01), "mse", jit_compile=True)
    x = rng.normal(size=(256, 8)).astype(np.float32)
    y = (np.maximum(x[:, :1], 0.0) + 0.5 * x[:, 1:2]).astype(np.float32)
    learnable = model.layers[3]
    before = float(np.mean((_numpy(model(x)) - y) ** 2))  # eager: only the training step is compiled
    alpha_before = _numpy(learnable.alpha).copy()
    if BACKEND == "torch":  # torch.compile guards on each weight's .grad being None: the first step would be
        import torch  # compiled for no gradients, then again for gradients (26 s); start with them

        for weight in model.trainable_weights:
            weight.value.grad = torch.zeros_like(weight.value)
    losses = model.fit(x, y, epochs=4, batch_size=32, verbose=0).history["loss"]
    assert losses[-1] < 0.7 * before, (before, losses)
    assert np.abs(_numpy(learnable.alpha) - alpha_before).max() > 1e-3


def test_a_model_round_trips_through_keras_files(tmp_path, rng):
    model = _model()
    x = rng.normal(size=(4, 8)).astype(np.float32)
    expected = _numpy(model(x))
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(_numpy(loaded(x)), expected)
    assert [type(layer).__name__ for layer in loaded.layers] == [type(layer).__name__ for layer in model.layers]


@pytest.mark.skipif(BACKEND == "tensorflow", reason="on TensorFlow, Keras itself imports TensorFlow")
def test_keras_gelu_imports_no_tensorflow():
    code = ("import sys, keras_gelu, keras_gelu.layers; "
            "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)[:5]")
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "KERAS_BACKEND": BACKEND},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(BACKEND != "jax", reason="one leg suffices, and the JAX one imports no TensorFlow")
def test_another_keras_backend_is_refused_naming_the_three():
    result = subprocess.run([sys.executable, "-c", "import keras_gelu"], env={**os.environ, "KERAS_BACKEND": "numpy"},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert ("keras_gelu runs on Keras 3's TensorFlow, JAX and PyTorch backends. Set KERAS_BACKEND to one of them. "
            "Received: backend=numpy") in result.stderr


def saved_on(backend, kind):
    """(model, {inputs, outputs[, labels]}): a `kind` ("float" or "qat") model saved on `backend`, loaded here,
    and what it computed there. compile=False, as the converter loads: a .keras file saved on PyTorch with its
    optimizer names PyTorch's optimizer module, which no other backend can import (Keras 3.15)."""
    model = keras.saving.load_model(os.path.join(SAVED_ON, f"{backend}_{kind}.keras"), compile=False)
    with np.load(os.path.join(SAVED_ON, f"{backend}_outputs.npz")) as recorded:
        return model, {name.split("/")[1]: recorded[name] for name in recorded.files if name.startswith(kind)}


# A recorded output is compared with a bound derived from the computation, not with bits: each Dense layer's sums
# run in an order the backend, its kernels and the CPU choose (XLA's and PyTorch's matrix products pick their
# kernels by instruction set: AVX2 against AVX-512 moved JAX's outputs by 6.6e-7), and each GELU evaluates its
# formula in float32. `rounding_bound` carries, layer by layer in float64, the magnitudes and the error of
# float32 arithmetic in any order. The worst case (a sum of n products off by n u sum |x_i| |w_i|, every error
# aligned through every layer) is 6,000 times what two machines differ by here, a blanket. So the bound is
# Higham and Mary's probabilistic one (A New Approach to Probabilistic Rounding Error Analysis, SIAM J. Sci.
# Comput. 41(5), 2019): rounding errors are independent and of mean zero, so a sum of n products is off by at
# most LAMBDA sqrt(n) u sum |x_i| |w_i| except with probability 2 exp(-LAMBDA^2 / 2) (2e-8 at LAMBDA 6, per
# element), and independent errors carried through a layer add in quadrature. An activation passes an error on
# times its largest slope and adds its own formula's rounding. Two machines, each within the bound, are within
# twice it of each other.
_UNIT = float(np.finfo(np.float32).eps) / 2
_LAMBDA = 6.0
# An activation's own rounding, in units of its output's magnitude (at least an ulp of 1.0 near 0): the GELU
# forms are a few float32 operations each (erfc's or tanh's polynomial, an exp, two products).
_ACTIVATION_ROUNDINGS = 16
# The largest slope of every GELU form: exact and tanh 1.129, the sigmoid form 1.0998 (found numerically).
_GELU_SLOPE = 1.13


def _activation(layer):
    """(value, slope bound, given the input's magnitude) of the activation a layer applies, or None."""
    if isinstance(layer, keras_gelu.LearnableGELU):
        alpha, beta = (float(np.max(np.abs(_numpy(weight)))) for weight in (layer.alpha, layer.beta))
        # d/dx x sigmoid(a x + b) = sigmoid(z) + a x sigmoid'(z): at most 1 + |a| |x| / 4
        return lambda x: references.learnable_gelu(x, _numpy(layer.alpha), _numpy(layer.beta)), \
            lambda magnitude: 1 + alpha * magnitude / 4
    # a GELU layer, or a layer's GELU activation (keras_gelu's GELUActivation): each knows its form
    form = getattr(layer, "approximate", None) or getattr(getattr(layer, "activation", None), "approximate", None)
    if form is None:
        return None
    return getattr(references, f"gelu_{form}"), lambda magnitude: _GELU_SLOPE


def rounding_bound(model, inputs):
    """Per output element, the difference float32 arithmetic in any summation order makes to `model`'s output on
    `inputs` (the probabilistic bound above): a chain of Dense layers and GELU activations (the recorded
    models)."""
    value = np.asarray(inputs, np.float64)
    error = np.zeros_like(value)
    for layer in model.layers[1:]:
        if isinstance(layer, keras.layers.Dense):
            kernel, bias = (np.asarray(_numpy(weight), np.float64) for weight in (layer.kernel, layer.bias))
            magnitude = np.abs(value) @ np.abs(kernel) + np.abs(bias)
            own = _LAMBDA * np.sqrt(kernel.shape[0] + 1) * _UNIT * magnitude
            error = np.sqrt(error ** 2 @ kernel ** 2 + own ** 2)
            value = value @ kernel + bias
        activation = _activation(layer)
        if activation is not None:
            function, slope = activation
            error = slope(np.abs(value) + error) * error
            value = function(value)
            error += _ACTIVATION_ROUNDINGS * _UNIT * np.maximum(np.abs(value), 1.0)
    return error


@pytest.mark.parametrize("source", ["jax", "torch"])
def test_a_model_saved_on_any_backend_computes_here_what_it_did_there(source):
    model, recorded = saved_on(source, "float")
    assert sum(isinstance(layer, (keras_gelu.GELU, keras_gelu.LearnableGELU)) for layer in model.layers) == 3
    actual = _numpy(model(recorded["inputs"]))
    bound = 2 * rounding_bound(model, recorded["inputs"])  # the recording machine's error, and this one's
    assert np.all(np.abs(actual - recorded["outputs"]) <= bound), np.max(np.abs(actual - recorded["outputs"]) - bound)
    # No blanket: under a thousandth of the outputs' scale (2e-4 of it measured here)
    assert np.max(bound) < 1e-3 * np.max(np.abs(recorded["outputs"]))


@pytest.mark.parametrize("source", ["jax", "torch"])
def test_a_qat_model_saved_on_any_backend_loads_here_with_its_ranges(source):
    """With the same fake quantization (Keras's own, on JAX and PyTorch), the same outputs, sample for sample: on
    the recording CPU bit for bit (measured there and on an AMD EPYC). On another CPU the matrix products may sum in
    another order (see rounding_bound), and a value within a float ulp of an int8 rounding boundary then
    takes the next step: one sample in a hundred may differ. Under TensorFlow a value exactly halfway between two
    int8 steps may round the other way: the digits are k/16 and the input grid's step 1/255, so k = 8 is a tie that
    each backend's fake quantization decides by its own float arithmetic (TensorFlow's FakeQuant op against Keras's
    own; measured: 15% of the logits differ, by at most 0.26; no class changed)."""
    model, recorded = saved_on(source, "qat")
    actual = _numpy(model(recorded["inputs"]))
    if source == BACKEND or {source, BACKEND} == {"jax", "torch"}:
        assert np.mean(np.all(actual == recorded["outputs"], axis=-1)) >= 0.99
    assert np.mean(actual.argmax(-1) == recorded["outputs"].argmax(-1)) >= 0.99
    assert references.cosine(actual, recorded["outputs"]) >= 0.999
    assert np.mean(actual.argmax(-1) == recorded["labels"]) >= 0.95  # it was trained: digits at 97%


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's export")
def test_a_pytorch_export_carries_the_exact_gelu_as_pytorch_s_own():
    """Keras's LiteRT export on PyTorch traces the model with torch.export for litert-torch, which lowers no erfc
    (litert-torch 0.10.0). While exporting, the exact form is PyTorch's own exact GELU, which litert-torch lowers to
    TFLite's GELU op (keras-gelu-convert rewrites that for runtimes without it); the tanh form keeps its sigmoid."""
    import torch

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation=keras_gelu.GELU()),
                              keras_gelu.GELU("tanh"), keras.layers.Dense(4)])
    x = np.random.default_rng(3).normal(size=(5, 8)).astype(np.float32) * 3
    exported = torch.export.export(model, (torch.from_numpy(x),))
    called = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert "aten.gelu.default" in called and "aten.sigmoid.default" in called, called
    assert not any("erfc" in name for name in called), called
    # F.gelu against our exact GELU: 1e-7 apart at most (F.gelu's 1 + erf), through a Dense layer of 16
    np.testing.assert_allclose(_numpy(exported.module()(torch.from_numpy(x))), _numpy(model(x)), rtol=0, atol=2e-6)


def _dense_stack(activation):
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation=activation, name="first"),
                             keras.layers.Dense(4, name="head")])


@pytest.mark.parametrize("function", references.FUNCTIONS)
def test_swapping_relu_for_gelu_computes_the_reference_gelu_with_the_same_weights(function, rng):
    original = _dense_stack("relu")
    swapped = keras_gelu.swap_activations(original, {"relu": f"gelu_{function}"})
    (kernel, bias), (head_kernel, head_bias) = (swapped.get_layer(name).get_weights() for name in ("first", "head"))
    for name in ("first", "head"):
        for old, new in zip(original.get_layer(name).get_weights(), swapped.get_layer(name).get_weights()):
            np.testing.assert_array_equal(old, new)
    x = rng.normal(size=(32, 8)).astype(np.float32)
    hidden = references.BY_FUNCTION[function](x.astype(np.float64) @ kernel + bias)
    expected = hidden @ head_kernel + head_bias
    tolerance = references.FLOAT32_TOLERANCE[function]  # the GELU's own error, through a head of 16 inputs
    np.testing.assert_allclose(_numpy(swapped(x)), expected, rtol=0, atol=20 * tolerance["atol"] + 1e-5)


def _digits_like(rng, count=512):
    """A 4-class task the QAT models learn in a few epochs: which of four feature groups sums highest."""
    x = rng.normal(size=(count, 16)).astype(np.float32)
    return x, np.argmax(x.reshape(count, 4, 4).sum(-1), axis=-1).astype(np.int32)


def _gelu_mlp():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((16,))
    hidden = keras_gelu.GELU("exact")(keras.layers.Dense(32)(inputs))
    hidden = keras_gelu.LearnableGELU()(keras.layers.Dense(32)(hidden))
    return keras.Model(inputs, keras.layers.Dense(4)(hidden))


def test_qat_trains_saves_and_loads_on_this_backend(rng, tmp_path):
    """quantize_model -> fit (compiled whole, but on PyTorch) -> .keras -> load: the loss falls, LearnableGELU's
    beta leaves 0 (its range starts empty, [0, 0], which Keras's fake quantization on JAX and PyTorch, and XLA's
    FakeQuant, would turn into NaN), and the loaded model computes what the trained one did."""
    from keras_gelu import qat

    x, y = _digits_like(rng)
    model = qat.quantize_model(_gelu_mlp(), calibration_data=x[:128])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # torch.compile recompiles a QAT step many times over (measured: 123 s for this test, against 2 s eagerly)
    model.compile(keras.optimizers.Adam(3e-3), loss, metrics=["accuracy"], jit_compile=BACKEND != "torch")
    history = model.fit(x, y, epochs=4, batch_size=64, verbose=0).history
    assert np.all(np.isfinite(history["loss"])) and history["loss"][-1] < 0.7 * history["loss"][0], history
    beta = next(weight for weight in model.weights if weight.path.endswith("learnable_gelu/beta"))
    assert np.all(_numpy(beta) != 0.0)
    path = str(tmp_path / "qat.keras")
    model.save(path)
    np.testing.assert_array_equal(_numpy(keras.saving.load_model(path)(x[:64])), _numpy(model(x[:64])))


def test_qat_of_a_layer_normalization_whose_variance_rounds_to_zero_trains_to_finite_variables(rng):
    """Without calibration data, two Adam steps at 1e-3 on batches of 4, as a newcomer trains: rows of equal
    values (DeiT's zero-initialized tokens, padding) have a variance of 0, and small ones round to 0 on the
    variance's int8 grid. RSQRT saturates there in int8; rsqrt(0) = inf in the QAT graph gave NaN gradients
    (the range's clipping times inf), which two steps spread to 228 of 244 variables of a ViT."""
    from keras_gelu import qat

    keras.utils.set_random_seed(8)
    inputs = keras.Input((4, 8))
    hidden = keras.layers.LayerNormalization()(keras.layers.Dense(8, bias_initializer="zeros")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras_gelu.GELU("exact")(hidden)))
    x = rng.normal(size=(8, 4, 8)).astype(np.float32)
    x[:, 0] = 0.0  # a token of zeros: its row after the Dense is the zero bias, its variance 0
    quantized = qat.quantize_model(model)
    quantized.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=BACKEND != "torch")
    history = quantized.fit(x, rng.normal(size=(8, 4, 2)).astype(np.float32), batch_size=4, epochs=1,
                            verbose=0).history
    spoilt = [variable.path for variable in quantized.variables if not np.all(np.isfinite(_numpy(variable)))]
    assert np.all(np.isfinite(history["loss"])) and not spoilt, (history, spoilt)


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution is JAX's")
@pytest.mark.parametrize("quantized", [False, True], ids=["float", "qat"])
def test_data_parallel_over_two_host_devices_takes_the_single_device_step(quantized, rng):
    """keras.distribution.DataParallel over the two host devices conftest asks XLA for: one SGD step on a batch
    split between them equals the step on one device (the gradients are averaged across the devices)."""
    from keras_gelu import qat

    x, y = _digits_like(rng, count=64)

    def one_step(distribution):
        keras.distribution.set_distribution(distribution)
        try:
            model = _gelu_mlp()
            if quantized:
                model = qat.quantize_model(model, calibration_data=x)
            model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.fit(x, y, epochs=1, batch_size=64, verbose=0)
            return [_numpy(weight) for weight in model.weights]
        finally:
            keras.distribution.set_distribution(None)

    devices = keras.distribution.list_devices("cpu")
    assert len(devices) == 2
    distributed, single = one_step(keras.distribution.DataParallel(devices=devices)), one_step(None)
    for after_distributed, after_single in zip(distributed, single):
        np.testing.assert_allclose(after_distributed, after_single, rtol=1e-5, atol=1e-6)


@keras.saving.register_keras_serializable(package="tests")
class ScaledRMS(keras.layers.Layer):
    """A layer no rule names, computing with keras.ops alone (as keras-hub's RMS normalizations and LayerScales
    do): x * rsqrt(mean(x^2) + eps) * gamma, with a reshape and back between, which only moves values."""

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],),
                                     initializer=keras.initializers.RandomUniform(0.5, 2.0, seed=3))

    def call(self, x):
        mean = keras.ops.mean(keras.ops.square(x), axis=-1, keepdims=True)
        normalized = keras.ops.multiply(x, keras.ops.rsqrt(keras.ops.add(mean, 1e-6)))
        rows = keras.ops.reshape(normalized, (-1, x.shape[-1]))
        return keras.ops.multiply(keras.ops.reshape(rows, (-1,) + tuple(x.shape[1:])), self.gamma)


def test_a_layer_of_keras_ops_alone_is_quantized_op_by_op_as_the_int8_model_computes_it(rng, tmp_path):
    """No rule names ScaledRMS: each keras.ops result it computes is rounded on a range of its own, as each
    int8 op of the converted model rescales to its own; the reshapes keep their input's grid (TFLite's RESHAPE
    has one scale on both sides) and take none. Checked against the same chain in float64 with every result
    passed through TensorFlow's documented fake quantization on the range QAT learnt for it."""
    from keras_gelu import qat

    inputs = keras.Input((4, 8), name="features")
    model = keras.Model(inputs, ScaledRMS(name="rms")(inputs))
    x = rng.normal(size=(16, 4, 8)).astype(np.float32)
    quantized = qat.quantize_model(model, calibration_data=x)
    wrapper = quantized.get_layer("quant_rms")
    computed = ["square", "mean", "add", "rsqrt", "multiply", "multiply"]
    assert sorted(wrapper.operation_ranges.values()) == [f"operation_{n}" for n in range(len(computed))]

    def on_its_range(value, number):
        quantizer = wrapper.ranges[f"operation_{number}"]
        return references.fake_quant(value, float(_numpy(quantizer.low)), float(_numpy(quantizer.high)))[0]

    input_range = quantized.get_layer("quantize_features").input_range
    value = references.fake_quant(x, float(_numpy(input_range.low)), float(_numpy(input_range.high)))[0]
    squared = on_its_range(value**2, 0)
    mean = on_its_range(squared.mean(axis=-1, keepdims=True), 1)
    scale = on_its_range(1.0 / np.sqrt(on_its_range(mean + 1e-6, 2)), 3)
    gamma = _numpy(wrapper.layer.gamma).astype(np.float64)
    expected = on_its_range(on_its_range(value * scale, 4) * gamma, 5)
    step = references.fake_quant(0.0, float(_numpy(wrapper.ranges["operation_5"].low)),
                                 float(_numpy(wrapper.ranges["operation_5"].high)))[1]
    got = _numpy(quantized(x)).astype(np.float64)
    # float32 arithmetic may round a value at a step's midpoint the other way, and that step carries on down
    # the chain: at most one output step anywhere, and nearly every value exact
    assert np.max(np.abs(got - expected)) <= 1.01 * step
    assert np.mean(np.abs(got - expected) < 1e-3 * step) > 0.95
    quantized.compile(keras.optimizers.Adam(1e-3), "mse", jit_compile=BACKEND != "torch")
    history = quantized.fit(x, x, batch_size=4, epochs=1, verbose=0).history
    assert np.all(np.isfinite(history["loss"])), history
    path = str(tmp_path / "ops.keras")
    quantized.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(_numpy(loaded(x)), _numpy(quantized(x)))


def _pytorch_builds_for_avx512():
    import torch

    return torch.backends.cpu.get_cpu_capability() == "AVX512"


@pytest.mark.skipif(BACKEND != "torch", reason="torch.compile's caches are PyTorch's")
def test_a_kernel_cache_made_for_other_vector_instructions_leaves_the_values_right(tmp_path):
    """PyTorch's FX graph cache keys a compiled CPU kernel without the vector instructions it was built for: a cache
    made where PyTorch builds for AVX-512, read where it builds for AVX2 (ATEN_CPU_CAPABILITY=avx2 here; the same
    disk on another machine), gave GELU of -9.8 as 1.9e31, or corrupted the heap. keras_gelu's kernels keep out
    of it: computed here, then in a process building for AVX2 on the same cache, each is within exact GELU's
    float32 bound of float64 erfc. Where PyTorch builds for AVX2 here too (a CPU without AVX-512, `make
    test-as-avx2`), both processes build the same kernels and there is nothing to tell apart: skipped, its 14-26
    s spent where the suite's budget is tightest."""
    if not _pytorch_builds_for_avx512():
        pytest.skip("PyTorch builds for AVX2 here: the other process would build the same kernels")
    code = ("import sys, numpy as np, keras, keras_gelu; "
            "x = np.linspace(-10.0, 10.0, 20_001, dtype=np.float32); "
            "y = keras.ops.convert_to_numpy(keras_gelu.gelu(keras.ops.convert_to_tensor(x), 'exact')); "
            "np.save(sys.argv[1], y)")
    here = _numpy(keras_gelu.gelu(keras.ops.convert_to_tensor(DENSE_GRID), "exact"))
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "avx2.npy")], capture_output=True, text=True,
                            env={**os.environ, "KERAS_BACKEND": "torch", "ATEN_CPU_CAPABILITY": "avx2"}, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    for where, values in (("here", here), ("avx2", np.load(tmp_path / "avx2.npy"))):
        _assert_values_within_the_float32_bound("exact", values, where)
