"""The GELU kernels on Keras 3's JAX and PyTorch backends, through `keras.ops.custom_gradient`.

The forward pass is the formulas' own, in the backend's ops (`array_ops`); the
backward pass is the same hand-written derivative as on TensorFlow
(`xla_kernels`), computed from x alone and finite at +-inf. Under `jax.jit`
(Keras's `jit_compile=True` on JAX) XLA fuses each pass into one loop, as the
TensorFlow kernels' own XLA functions do, and so does torch.compile; there
exact GELU's gate is the normal tail's polynomial (`formulas`), which costs
less than one erfc compiled, and more than one erfc op by op.

Half-precision inputs are computed wide and rounded once, as on TensorFlow:
float16 in float32, bfloat16 in float64 where the backend computes it
(PyTorch; JAX with `jax_enable_x64`), else in float32: there the gate is
subnormal below x = -12.9 (exact form), which XLA flushes to zero, so GELU
values bfloat16 could hold below 1e-37 come out as 0.
"""

import warnings

import keras

from keras_gelu import array_ops
from keras_gelu import formulas

_WIDER = {"float16": "float32", "bfloat16": "float64"}


def _float64_computes():
    """Whether the backend computes float64 (JAX only with jax_enable_x64: else it silently gives float32)."""
    if keras.backend.backend() != "jax":
        return True
    import jax

    return bool(jax.config.jax_enable_x64)


def compute_dtype_for(dtype):
    """The dtype a GELU of `dtype` inputs is evaluated in."""
    dtype = keras.backend.standardize_dtype(dtype)
    wider = _WIDER.get(dtype, dtype)
    return "float32" if wider == "float64" and dtype != "float64" and not _float64_computes() else wider


def _as_float_tensor(x):
    x = keras.ops.convert_to_tensor(x)
    if not keras.backend.is_float_dtype(x.dtype):
        x = keras.ops.cast(x, "float32")
    return x


def _upstream(args, upstream):
    """The incoming gradient, however the backend passes it (positionally on JAX, by keyword on PyTorch)."""
    return args[0] if upstream is None else upstream


def _exporting_from_pytorch():
    """Whether PyTorch is tracing the model for export (`torch.export`, which Keras's LiteRT export runs through
    litert-torch), rather than running or compiling it."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.compiler.is_exporting()


def _fused(pass_function, one_shape=True):
    """`pass_function` (one pass, forward or backward) run as one compiled loop where PyTorch would run it op by op.

    On PyTorch, called eagerly, it runs through torch.compile, as `xla_kernels` runs the same formulas through XLA
    on TensorFlow: on first use, once per dtype where its tensors are `one_shape` (an activation's x and the
    gradient flowing into it: `_as_one_dimension`), else once per rank and dtype. In a model
    PyTorch is compiling already, and under jax.jit, the formulas are traced as they are: the compiler around them
    fuses them. Where torch.compile cannot compile (no C++ compiler, say), PyTorch runs them op by op, slower, after
    one warning.
    """
    if keras.backend.backend() != "torch":
        return pass_function
    import torch

    # Without PyTorch's FX graph cache: it keys a compiled CPU kernel without the vector instructions it was built
    # for (PyTorch 2.13), and a cache made on an AVX-512 machine, read where the kernels are built for AVX2 (the
    # same disk on another machine; ATEN_CPU_CAPABILITY=avx2 here), computed GELU of -9.8 as 1.9e31, or corrupted
    # the heap. Its C++ code cache, keyed by the compiler's flags, still spares the compile.
    compiled = [torch.compile(pass_function, dynamic=True, options={"fx_graph_cache": False})]
    # The formulas look up their array operations in a dict that fills at its first use: filled before the first
    # trace, so that the compiler's guard on it holds from then on (the first pass traced compiled twice).
    array_ops.of(torch.empty(0))

    def call(*tensors):
        # Keras infers shapes by running layers on "meta" tensors, which have no values to compute.
        if not compiled or torch.compiler.is_compiling() or tensors[0].device.type == "meta":
            return pass_function(*tensors)
        try:
            # Detached (in `_as_one_dimension` too): each pass is one side of a custom gradient, and Dynamo reads a
            # tensor's .grad otherwise.
            if not one_shape:
                return compiled[0](*(tensor.detach().contiguous() for tensor in tensors))
            result = compiled[0](*(_as_one_dimension(tensor) for tensor in tensors))
            return result[:tensors[0].numel()].reshape(tensors[0].shape)
        except Exception as error:  # the compiler's failure; an error of the formulas' own recurs just below
            result = pass_function(*tensors)
            compiled.clear()
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            warnings.warn(f"keras_gelu: torch.compile failed here, so GELU runs op by op (slower): {reason}",
                          stacklevel=2)
            return result

    return call


def _as_one_dimension(tensor):
    """`tensor`'s elements as one contiguous dimension of two or more, for a pass that computes element by element.

    torch.compile's dynamic shapes still compile anew for another rank, for a dimension of size 0 or 1 (a batch
    of one, a gradient summed to a scalar), for another stride (that gradient broadcast back, a stride of 0 where
    a size of 1 leaves `contiguous` nothing to copy), and for a view of a tensor of another shape (its guards read
    the base's): each a few seconds of C++ compilation, on first use. So the pass is given a tensor that is no
    view, on the same memory (no copy where `tensor` is contiguous).
    """
    import torch

    dense = tensor.detach().contiguous()
    if dense.numel() < _FEWEST_UNSPECIALIZED:
        return torch.cat([dense.reshape(-1), dense.new_zeros(_FEWEST_UNSPECIALIZED - dense.numel())])
    return dense.new_empty(0).set_(dense.untyped_storage(), dense.storage_offset(), (dense.numel(),), (1,))


_FEWEST_UNSPECIALIZED = 2


def _gated_activation(forward, derivative, exported=None):
    """The activation; `exported`, if given, is what its forward pass becomes in a PyTorch export."""
    fused_forward = _fused(forward)
    fused_backward = _fused(lambda upstream, x: upstream * derivative(x))

    @keras.ops.custom_gradient
    def activation_in_compute_dtype(x):
        def grad(*args, upstream=None):
            return fused_backward(_upstream(args, upstream), x)

        return fused_forward(x), grad

    def activation(x):
        x = _as_float_tensor(x)
        dtype = keras.backend.standardize_dtype(x.dtype)
        x_wide = keras.ops.cast(x, compute_dtype_for(dtype))
        if exported is not None and _exporting_from_pytorch():
            return keras.ops.cast(exported(x_wide), dtype)
        return keras.ops.cast(activation_in_compute_dtype(x_wide), dtype)

    return activation


def _pytorch_exact_gelu(x):
    """PyTorch's own exact GELU, for export: litert-torch lowers no erfc (0.10.0: "Lowering not found:
    aten.erfc.default"), and its erf is a rational approximation that misses our bound in the tail; this becomes
    TFLite's GELU op, which keras-gelu-convert rewrites for runtimes that lack it."""
    import torch

    return torch.nn.functional.gelu(x, approximate="none")


exact = _gated_activation(formulas.exact_forward, formulas.exact_derivative, exported=_pytorch_exact_gelu)
tanh = _gated_activation(formulas.tanh_forward, formulas.tanh_derivative)
sigmoid = _gated_activation(formulas.sigmoid_forward, formulas.sigmoid_derivative)


def _sum_to_shape(grad, shape):
    """Sum a gradient taken at the broadcast shape back down to `shape` (static, as the parameters' are)."""
    shape = tuple(shape)
    leading = len(grad.shape) - len(shape)
    if leading:
        grad = keras.ops.sum(grad, axis=tuple(range(leading)))
    broadcast = tuple(axis for axis, size in enumerate(shape) if size == 1 and grad.shape[axis] != 1)
    if broadcast:
        grad = keras.ops.sum(grad, axis=broadcast, keepdims=True)
    return keras.ops.reshape(grad, shape)


def _learnable_gradients_at_full_shape(upstream, x, alpha, beta):
    by_x, by_alpha, by_beta = formulas.learnable_partials(x, alpha, beta)
    return upstream * by_x, upstream * by_alpha, upstream * by_beta


# alpha and beta broadcast against x: these passes keep their tensors' shapes.
_learnable_forward = _fused(formulas.learnable_forward, one_shape=False)
_learnable_backward = _fused(_learnable_gradients_at_full_shape, one_shape=False)


@keras.ops.custom_gradient
def _learnable_in_compute_dtype(x, alpha, beta):
    def grad(*args, upstream=None):
        grad_x, grad_alpha, grad_beta = _learnable_backward(_upstream(args, upstream), x, alpha, beta)
        return grad_x, _sum_to_shape(grad_alpha, alpha.shape), _sum_to_shape(grad_beta, beta.shape)

    return _learnable_forward(x, alpha, beta), grad


def learnable(x, alpha, beta):
    """x * sigmoid(alpha x + beta); alpha and beta broadcast against x, used in the compute dtype."""
    x = _as_float_tensor(x)
    dtype = keras.backend.standardize_dtype(x.dtype)
    compute_dtype = compute_dtype_for(dtype)
    y = _learnable_in_compute_dtype(keras.ops.cast(x, compute_dtype), keras.ops.cast(alpha, compute_dtype),
                                    keras.ops.cast(beta, compute_dtype))
    return keras.ops.cast(y, dtype)
