"""The discrete Fourier transform of a real tensor, spelled as matrix products with cosine and sine matrices.

TFLite has no builtin for Complex, FFT, FFT2D or FFT3D (its RFFT2D is a custom
op TFLite Micro does not run and int8 does not quantize), so a model that
mixes tokens with a Fourier transform, as FNet does (`real(fft2(complex(x,
0)))` over sequence and hidden), converts only with Flex. Where the
transform's input is real (Complex(x, zeros) or a Cast from a real tensor) and
only its real part, imaginary part or magnitude is read, the transform is
linear algebra on real tensors: along an axis of size n,

    (re, im) -> (re·C + im·S, im·C - re·S),  C[j, k] = cos(2πjk/n), S[j, k] = sin(2πjk/n)

(C and S are symmetric, so the product is taken along any axis as it is
along the last). From (x, 0), the real part of FFT2D is C_m·x·C_n - S_m·x·S_n:
BATCH_MATMUL and FULLY_CONNECTED, which every runtime has and int8 quantizes,
the matrices' values in [-1, 1] (the real part of a 2-D transform: four
products and a SUB). The matrices are constants computed in
float64 where the axis's size is known; on a dynamic axis (FNet's sequence)
they are computed in the graph from RANGE, the index product taken modulo n in
int32 first, so that every angle is 2π·r/n with r < n and as precise in
float32 as a constant's.
"""

import numpy as np
import tensorflow as tf

from . import graph
from . import int8

_SCOPE = "/keras_gelu_dft/"
_TRANSFORMS = {"FFT": 1, "FFT2D": 2, "FFT3D": 3}  # how many of the last axes each transforms
_PARTS = ("Real", "Imag", "ComplexAbs")


def _real_input(node, nodes):
    """The real tensor a complex64 transform input is made from, Complex(x, zeros) or Cast(x), or None."""
    if node is None:
        return None
    if node.op == "Cast" and not tf.as_dtype(node.attr["SrcT"].type).is_complex:
        return graph.data_inputs(node)[0]
    if node.op != "Complex":
        return None
    real, imaginary = graph.data_inputs(node)
    return real if _zeros(imaginary, nodes) else None


def _zeros(name, nodes):
    """Whether tensor `name` is all zeros: ZerosLike, Fill with 0, a zero constant."""
    node = graph.producer(name, nodes)
    if node is None:
        return False
    if node.op == "ZerosLike":
        return True
    value = graph.constant_value(graph.data_inputs(node)[1] if node.op == "Fill" else node.name, nodes)
    return value is not None and not np.any(value)


def _dft_matrices(x, axis, size):
    """(C, S) for axis `axis` of x, of its `size` (None where dynamic), in x's dtype."""
    if size is not None:  # constants, computed in float64
        product = np.outer(np.arange(size), np.arange(size)) % size
        angle = 2 * np.pi * product / size
        return tf.constant(np.cos(angle), x.dtype), tf.constant(np.sin(angle), x.dtype)
    n = tf.shape(x)[axis]
    index = tf.range(n)
    # int32 is exact for n up to 46,340, past which the n x n matrices alone would hold 8 GB
    product = tf.math.floormod(index[:, None] * index[None, :], n)
    angle = tf.cast(product, x.dtype) * (2 * np.pi / tf.cast(n, x.dtype))
    return tf.cos(angle), tf.sin(angle)


def _along(x, matrix, axis, rank):
    """x multiplied by the symmetric `matrix` along `axis` (negative)."""
    if axis == -1:
        return tf.matmul(x, matrix)
    if axis == -2:
        return tf.matmul(matrix, x)
    order = list(range(rank))
    order[axis], order[-1] = order[-1], order[axis]
    return tf.transpose(tf.matmul(tf.transpose(x, order), matrix), order)


def _transformed(x, sizes, rank, parts):
    """[value of each part] (Real, Imag, ComplexAbs) of the DFT of real x over its last len(sizes) axes.

    The imaginary part is carried negated, n = -im, so that none of the products needs a NEG:
    (re, n) -> (re·C - n·S, n·C + re·S), from (x, 0)."""
    x = tf.cast(x, tf.float32)
    real, negated = x, None
    for offset, size in enumerate(reversed(sizes)):
        axis = -1 - offset
        cosine, sine = _dft_matrices(x, axis, size)
        if negated is None:
            real, negated = _along(real, cosine, axis, rank), _along(real, sine, axis, rank)
        else:
            real, negated = (_along(real, cosine, axis, rank) - _along(negated, sine, axis, rank),
                             _along(negated, cosine, axis, rank) + _along(real, sine, axis, rank))
    values = {"Real": lambda: real, "Imag": lambda: -negated,
              "ComplexAbs": lambda: tf.sqrt(tf.square(real) + tf.square(negated))}
    return [values[part]() for part in parts]


def real_transforms_as_matmuls(graph_def):
    """Rewrite each Real, Imag or ComplexAbs of FFT, FFT2D or FFT3D (complex64) of a real tensor as matrix
    products with cosine and sine matrices; a transform anything else reads is left (the converter names it)."""
    if int8.is_quantization_aware(graph_def):
        # The matrices and their products would carry no trained ranges: the stock converter then writes a
        # FULLY_CONNECTED of an int8 input and float weights, which LiteRT cannot prepare (FNet's QAT model). Left,
        # the transform is named in one line.
        return 0
    transforms = [node for node in graph_def.node if node.op in _TRANSFORMS
                  and graph.attribute(node, "Tcomplex", tf.complex64.as_datatype_enum) == tf.complex64.as_datatype_enum]
    if not transforms:
        return 0
    nodes = graph.nodes_by_name(graph_def)
    readers = graph.consumers(graph_def)
    found = []
    for node in transforms:
        x = _real_input(graph.producer(graph.data_inputs(node)[0], nodes), nodes)
        reading = readers.get(graph.canonical(node.name), [])
        if x is not None and reading and all(reader.op in _PARTS for reader, _ in reading):
            found.append((node, x, reading))
    if not found:
        return 0
    graph.drop_dangling_colocations(graph_def)
    with tf.Graph().as_default() as scratch:
        tf.compat.v1.import_graph_def(graph_def, name="")
    rewritten = 0
    for node, x, reading in found:
        shape = scratch.get_tensor_by_name(graph.canonical(x)).shape
        count = _TRANSFORMS[node.op]
        if shape.rank is None or shape.rank < count:
            continue
        sizes = shape.as_list()[-count:]
        parts = sorted({reader.op for reader, _ in reading})
        dtype = tf.as_dtype(scratch.get_tensor_by_name(graph.canonical(x)).dtype)
        values = graph.splice_many(graph_def, lambda value: _transformed(value, sizes, shape.rank, parts),
                                   [(x, dtype, shape)], node.name + _SCOPE, nodes)
        for reader, _ in reading:
            graph.redirect(graph_def, reader.name, values[parts.index(reader.op)])
        rewritten += 1
    return rewritten
