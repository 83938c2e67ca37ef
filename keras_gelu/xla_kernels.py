"""The GELU kernels on TensorFlow (Keras 3's TensorFlow backend and tf-keras): fast, mixed-precision safe,
built from the formulas.

Why XLA: TensorFlow runs 0.5 * x * erfc(-x/sqrt(2)) as four separate kernels,
each reading and writing the whole tensor, and its automatic gradient adds a
dozen more. Compiling the forward pass and the hand-written derivative as two
small XLA functions fuses each into a single loop over memory. The functions
are called from the ordinary (non-XLA) graph, so nothing else in the user's
model has to be compiled; under whole-model `jit_compile=True` they are simply
inlined.

Why the gradient takes only x: the backward pass then reads two tensors, as
ReLU's does, and recomputes the gate (`formulas`: the exact one from a cheap
float32 normal tail). Recovering the gate as y / x from a third tensor, the
forward output, was slower in every form: XLA's division, not the memory, was
the cost (2048 x 2048 float32 on an AMD EPYC, forward and backward over
ReLU's time: exact 1.59x then, 1.14x now; sigmoid 1.57x, 1.04x; docs/speed.md).

Half-precision inputs are computed in a wider dtype and rounded once at the
end, so results are within an ulp of the true value:

* float16 in float32, whose range and precision dwarf float16's.
* bfloat16 in float64. bfloat16 shares float32's exponent range, so it can
  hold GELU values down to 1.2e-38 (x near -13) whose float32 intermediates,
  erfc(9.2) ~ 6e-39, are subnormal, and TensorFlow's CPU kernels flush
  subnormals to zero. float64 has the headroom; bfloat16 is rarely the CPU
  fast path, so exactness wins over speed there.

float32 and float64 are computed in their own dtype.
"""

import functools

import tensorflow as tf

from keras_gelu import formulas

_WIDER_COMPUTE_DTYPE = {tf.float16: tf.float32, tf.bfloat16: tf.float64}
# Whether kernels traced from now on are XLA functions (`compile_with_xla`).
_compiling = [True]


def compile_with_xla(enabled):
    """Trace the kernels from now on as XLA functions (the default) or, with `enabled` False, as plain TensorFlow
    functions of the same ops. For a process that runs each model once, as the converter's worker runs the
    original model for parity: XLA compiles each kernel for each shape it meets, 0.06-0.09 s of a small model's
    0.5 s conversion (measured on the Xeon), which one run never earns back. The converter reads the ops, which
    are the same either way."""
    _compiling[0] = bool(enabled)


def _xla(fn):
    """`fn` as an XLA function traced once per dtype, for arguments of that dtype and any shapes (a plain function
    of the same ops after `compile_with_xla(False)`, traced once more per dtype).

    One tf.function per dtype, each with an input signature of unknown
    shapes: a single tf.function called with float32, then float16, then
    bfloat16 arguments of changing shapes retraced on every new combination
    and warned about it. XLA still compiles one kernel per concrete shape.

    Each is traced once, but TensorFlow counts traces per Python code object
    (`__code__`), and every form's backward pass is the same lambda: twelve
    first calls of exact, tanh and sigmoid in four dtypes looked like one
    function retraced twelve times. A functools.partial has no code of its
    own, so each tf.function is counted by itself.
    """
    traced = {}

    def call(*args):
        key = dtype, compiling = args[0].dtype, _compiling[0]
        if key not in traced:
            signature = [tf.TensorSpec(None, dtype)] * len(args)
            traced[key] = tf.function(functools.partial(fn), input_signature=signature, jit_compile=compiling,
                                      autograph=False)
        return traced[key](*args)

    return call


# The kernels are straight-line TensorFlow, nothing for autograph to convert; tf-keras traces a layer's call through
# autograph, which converted them and each function they call once per process: 0.05 s of each conversion's
# worker, a fresh process, for a model with GELUs (Keras 3 converts no layer's call).
_not_converted = tf.autograph.experimental.do_not_convert


def compute_dtype_for(dtype):
    """The dtype a GELU of `dtype` inputs is evaluated in."""
    dtype = tf.as_dtype(dtype)
    return _WIDER_COMPUTE_DTYPE.get(dtype, dtype)


def _as_float_tensor(x):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        x = tf.cast(x, tf.float32)
    return x


def _gated_activation(forward, derivative):
    """An elementwise activation with an XLA forward and backward pass."""
    forward_xla = _xla(forward)
    backward_xla = _xla(lambda upstream, x: upstream * derivative(x))

    @tf.custom_gradient
    def activation_in_compute_dtype(x):
        def grad(upstream):
            return backward_xla(upstream, x)

        return forward_xla(x), grad

    @_not_converted
    def activation(x):
        x = _as_float_tensor(x)
        compute_dtype = compute_dtype_for(x.dtype)
        y = activation_in_compute_dtype(tf.cast(x, compute_dtype))
        return tf.cast(y, x.dtype)

    return activation


exact = _gated_activation(formulas.exact_forward, formulas.exact_derivative)
tanh = _gated_activation(formulas.tanh_forward, formulas.tanh_derivative)
sigmoid = _gated_activation(formulas.sigmoid_forward, formulas.sigmoid_derivative)


def _sum_to_shape(grad, shape):
    """Sum a gradient taken at the broadcast shape back down to `shape`."""
    _, reduce_axes = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(grad), s1=shape)
    return tf.reshape(tf.reduce_sum(grad, axis=reduce_axes), shape)


@_xla
def _learnable_input_gradient(upstream, x, alpha, beta):
    by_x, _, _ = formulas.learnable_partials(x, alpha, beta)
    return upstream * by_x


@_xla
def _learnable_parameter_gradients(upstream, x, alpha, beta):
    _, by_alpha, by_beta = formulas.learnable_partials(x, alpha, beta)
    return (
        _sum_to_shape(upstream * by_alpha, tf.shape(alpha)),
        _sum_to_shape(upstream * by_beta, tf.shape(beta)),
    )


_learnable_forward = _xla(formulas.learnable_forward)


@tf.custom_gradient
def _learnable_in_compute_dtype(x, alpha, beta):
    y = _learnable_forward(x, alpha, beta)

    def grad(upstream):
        # Two XLA calls, not one: on CPU a single fusion with all three outputs
        # ran the whole backward pass 2x slower (benchmarks/bench_layers.py).
        grad_alpha, grad_beta = _learnable_parameter_gradients(upstream, x, alpha, beta)
        return _learnable_input_gradient(upstream, x, alpha, beta), grad_alpha, grad_beta

    return y, grad


@_not_converted
def learnable(x, alpha, beta):
    """x * sigmoid(alpha x + beta); alpha and beta broadcast against x.

    The parameters are used in the compute dtype (at least float32), so float32
    variables keep their precision under mixed precision.
    """
    x = _as_float_tensor(x)
    compute_dtype = compute_dtype_for(x.dtype)
    y = _learnable_in_compute_dtype(
        tf.cast(x, compute_dtype), tf.cast(alpha, compute_dtype), tf.cast(beta, compute_dtype)
    )
    return tf.cast(y, x.dtype)
