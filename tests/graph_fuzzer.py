"""Generated TensorFlow graphs that put GELU spellings where a converter can miss them.

A *program* is a list of placements, summed into the signature's output:

* a leaf applies a spelling to a tensor of its own (sin(h + 0.1 k): a
  non-arithmetic op, so no two leaves share an input), with its constants
  inline, computed from other constants, or captured from outside the
  function; that tensor as it is, plus a constant vector (a bias folded
  in), or times another tensor (a LayerScale): a GELU's x computed by
  arithmetic, which a matcher must not mistake for part of the spelling;
* a `pair` applies two spellings to one tensor, where a converter's
  common-subexpression pass can merge their ops;
* `cond` puts placements in one or both branches of a tf.cond, the same one
  in both too;
* `while` puts one in a tf.while_loop body, on the loop-carried value or on
  one plus a tensor captured from outside the loop;
* `nested` puts one in a tf.function of its own.

`strategies.programs()` draws them for hypothesis; `save` writes a program as
a SavedModel, optionally with a second signature.
"""

import itertools
import math
import typing

import keras
import numpy as np
import tensorflow as tf
from hypothesis import strategies as st

SQRT2 = math.sqrt(2.0)
SQRT_HALF = 0.70710677
TANH_SCALE = 0.7978846
erf, erfc, tanh, sigmoid = tf.math.erf, tf.math.erfc, tf.math.tanh, tf.math.sigmoid

class Spelling(typing.NamedTuple):
    build: object  # build(x, k): the spelling of x, with its constants from k(value)
    function: str  # the GELU it computes, or None for a look-alike
    alpha: float = 1.0  # of x Phi(alpha x)


SPELLINGS = {
    "erf": Spelling(lambda x, k: k(0.5) * x * (k(1.0) + erf(x * k(SQRT_HALF))), "exact"),
    "erf_div_sqrt2": Spelling(lambda x, k: x * k(0.5) * (k(1.0) + erf(x / k(SQRT2))), "exact"),
    "erf_half_plus_half": Spelling(lambda x, k: x * (k(0.5) + k(0.5) * erf(x * k(SQRT_HALF))), "exact"),
    "erfc": Spelling(lambda x, k: k(0.5) * x * erfc(-x * k(SQRT_HALF)), "exact"),
    "erf_scaled_1_3": Spelling(lambda x, k: k(0.5) * x * (k(1.0) + erf(k(1.3) * x * k(SQRT_HALF))), "exact", 1.3),
    "tanh": Spelling(lambda x, k: k(0.5) * x * (k(1.0) + tanh(k(TANH_SCALE) * (x + k(0.044715) * x * x * x))),
                     "tanh"),
    "sigmoid": Spelling(lambda x, k: x * sigmoid(k(1.702) * x), "sigmoid"),
    "tf_nn_gelu": Spelling(lambda x, k: tf.nn.gelu(x, approximate=False), "exact"),
    "tf_nn_gelu_tanh": Spelling(lambda x, k: tf.nn.gelu(x, approximate=True), "tanh"),
    "keras_ops_gelu": Spelling(lambda x, k: keras.ops.gelu(x, approximate=False), "exact"),
    "keras_ops_gelu_tanh": Spelling(lambda x, k: keras.ops.gelu(x, approximate=True), "tanh"),
    "silu": Spelling(lambda x, k: x * sigmoid(x), None),
    "bare_erf": Spelling(lambda x, k: erf(x) + k(0.25) * x, None),
}
CONSTANT_KINDS = ("inline", "computed", "captured")
INPUT_KINDS = ("op", "plus_constant", "times_tensor")
# Every constant a spelling asks for, made eagerly once per model for the captured kind.
_CONSTANTS = (0.5, 1.0, SQRT_HALF, SQRT2, 1.3, TANH_SCALE, 0.044715, 1.702, 0.25)
WIDTH = 8


class strategies:  # noqa: N801 - a namespace, as hypothesis.strategies is
    @staticmethod
    def leaves():
        return st.tuples(st.just("gelu"), st.sampled_from(sorted(SPELLINGS)), st.sampled_from(CONSTANT_KINDS),
                         st.sampled_from(INPUT_KINDS))

    @staticmethod
    def placements():
        pairs = st.tuples(st.just("pair"), strategies.leaves(), strategies.leaves())
        return st.recursive(st.one_of(strategies.leaves(), pairs), lambda children: st.one_of(
            st.tuples(st.just("cond"), children, st.one_of(st.none(), children)),
            children.map(lambda child: ("cond", child, child)),  # the same placement in sibling branches
            st.tuples(st.just("while"), children, st.booleans()),
            st.tuples(st.just("nested"), children)), max_leaves=3)

    @staticmethod
    def programs():
        return st.lists(strategies.placements(), min_size=1, max_size=3)


# Where a converter can miss a GELU, each a function of the leaf it places: the enumeration below puts every
# spelling in each, so that none is left to the draw (tf.nn.gelu in both branches of a tf.cond, and one in a
# loop body in native mode, were missed while the random programs passed).
PLACEMENTS = {
    "main graph": lambda leaf: leaf,
    "one branch": lambda leaf: ("cond", leaf, None),
    "sibling branches": lambda leaf: ("cond", leaf, leaf),
    "loop body": lambda leaf: ("while", leaf, False),
    "loop body, with a captured operand": lambda leaf: ("while", leaf, True),
    "nested function": lambda leaf: ("nested", leaf),
    "branches in a loop body": lambda leaf: ("while", ("cond", leaf, leaf), False),
}


def every_spelling_in(placement):
    """A program with every spelling in `placement`, their constant and input kinds rotating, so that across
    the placements each spelling meets each kind."""
    shift = sorted(PLACEMENTS).index(placement)
    return [PLACEMENTS[placement](("gelu", name, CONSTANT_KINDS[(index + shift) % len(CONSTANT_KINDS)],
                                   INPUT_KINDS[(index + 2 * shift) % len(INPUT_KINDS)]))
            for index, name in enumerate(sorted(SPELLINGS))]


def leaves(program):
    """Every leaf of a program, depth first (both of a pair's)."""
    for placement in program:
        if placement[0] == "gelu":
            yield placement
        else:
            yield from leaves([child for child in placement[1:] if isinstance(child, tuple)])


def pairs(program):
    """Every pair of a program: (its first leaf, its second leaf)."""
    for placement in program:
        if placement[0] == "pair":
            yield placement[1:]
        elif placement[0] != "gelu":
            yield from pairs([child for child in placement[1:] if isinstance(child, tuple)])


class _Builder:
    """Traces a program into the signature function being traced."""

    def __init__(self, captured):
        self.captured = captured
        self.counter = itertools.count()

    def constants(self, kind):
        if kind == "inline":
            return lambda value: value
        if kind == "computed":  # a Mul of two Consts, which a matcher must fold
            return lambda value: tf.constant(2.0 * value) * 0.5
        return lambda value: self.captured[value]

    def _leaf(self, leaf, x):
        _, name, constants, _ = leaf
        return SPELLINGS[name].build(x, self.constants(constants))

    def _input(self, kind, h):
        x = tf.sin(h + 0.1 * next(self.counter))
        if kind == "plus_constant":
            return x + tf.constant(np.linspace(-0.5, 0.5, WIDTH, dtype=np.float32))
        if kind == "times_tensor":
            return x * tf.cos(h)
        return x

    def __call__(self, placement, h):
        kind = placement[0]
        if kind in ("gelu", "pair"):
            x = self._input((placement if kind == "gelu" else placement[1])[3], h)
            return self._leaf(placement, x) if kind == "gelu" else self._leaf(placement[1], x) + self._leaf(
                placement[2], x)
        if kind == "cond":
            _, then, otherwise = placement
            return tf.cond(tf.reduce_mean(h) > 0.0, lambda: self(then, h),
                           lambda: h * 0.5 if otherwise is None else self(otherwise, h))
        if kind == "while":
            _, body, with_captured = placement
            outer = tf.reduce_mean(h, axis=-1, keepdims=True)  # a tensor from outside the loop

            def step(i, value):
                return i + 1, 0.5 * self(body, value + outer if with_captured else value)

            return tf.while_loop(lambda i, value: i < 2, step, (tf.constant(0), h))[1]
        _, inner = placement
        return tf.function(lambda value: self(inner, value), autograph=False)(h)


_INPUT = [tf.TensorSpec([None, WIDTH], tf.float32, name="x")]


class _Weights(tf.Module):
    """The two Dense kernels around a program, and the eager constants the captured kind uses."""

    def __init__(self, seed=0):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.w1 = tf.Variable(rng.normal(size=(WIDTH, WIDTH)).astype(np.float32) * 0.5)
        self.w2 = tf.Variable(rng.normal(size=(WIDTH, 4)).astype(np.float32) * 0.5)
        self.captured = {value: tf.constant(value, tf.float32) for value in _CONSTANTS}


class Model(_Weights):
    """Dense -> the program -> Dense, as serving_default, and a second program as a second signature."""

    def __init__(self, program, second=None, seed=0):
        super().__init__(seed)
        spec = _INPUT
        self.functions = {"serving_default": tf.function(lambda x: self._serve(program, x), input_signature=spec)}
        if second is not None:
            self.functions["second"] = tf.function(lambda x: self._serve(second, x), input_signature=spec)

    def _serve(self, program, x):
        build = _Builder(self.captured)
        h = tf.matmul(x, self.w1)
        return {"y": tf.matmul(tf.add_n([build(placement, h) for placement in program]), self.w2)}


def save(path, program, second=None):
    model = Model(program, second)
    tf.saved_model.save(model, path, signatures=model.functions)
    return path


class _EveryLeaf(_Weights):
    """Every spelling with one kind of constants, each on its own tensor of the main graph, each an output."""

    def __init__(self, kind):
        super().__init__()

        def serve(x):
            build, h = _Builder(self.captured), tf.matmul(x, self.w1)
            return {name: build(("gelu", name, kind, "op"), h) for name in sorted(SPELLINGS)}

        self.serve = tf.function(serve, input_signature=_INPUT)


def save_every_leaf(path, kind):
    """A SavedModel whose output <spelling> is that spelling in the main graph (the reference placement)."""
    module = _EveryLeaf(kind)
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path
