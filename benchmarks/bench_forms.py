"""What each builtin GELU spelling costs in TFLite, and how close to exact GELU it is: the trade-off curve.

Every row is one spelling of x * Phi(x) from ops every target has (LOGISTIC,
MUL, ADD, MINIMUM, MAXIMUM), converted alone (512 x 512 float32) and timed
single-threaded against TFLite's GELU op in interleaved rounds, with its max
abs error against float64 GELU measured through the .tflite on a dense grid
(-12..12) and far out (to +-1e30). Each is timed twice: as shipped, with its
bounds (the -inf guard and the clamp that keeps XNNPACK's LOGISTIC from
NaN), and without them, which prices the guards.

The polynomial rows are x sigmoid(x q(x^2)), q of degree d fitted minimax
here (scipy's linprog), with the square clamped at 30 where q of that degree
needs it; `keras_gelu.replacements.EXACT_GATE_POLYNOMIAL` is the degree-5 fit,
which --fit prints beside the others.

Ratios measured in one run on a shared, noisy machine; not a test.

    python benchmarks/bench_forms.py [--rounds 200] [--fit]
"""

import argparse
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import machine  # noqa: E402
import timing  # noqa: E402

from keras_gelu import replacements  # noqa: E402
from keras_gelu.converters.running import verify  # noqa: E402
from keras_gelu.formulas import constant_like  # noqa: E402

SHAPE = (512, 512)
SQUARE_CLAMP = replacements.EXACT_GATE_SQUARE_CLAMP


def fit_gate_polynomial(degree, square_clamp):
    """Coefficients of q minimising max |x| Phi(1 - Phi) |x q(min(x^2, clamp)) - logit Phi(x)| on |x| <= 12.

    The weight turns an error in the gate's argument into the error it causes
    in x Phi(x), so this is the minimax fit of GELU itself to first order; as
    a linear program it has an exact solution.
    """
    from scipy import optimize
    from scipy import special

    x = np.linspace(-12.0, 12.0, 6000)
    x = x[x != 0.0]
    cdf = special.ndtr(x)
    target = special.log_ndtr(x) - special.log_ndtr(-x)
    weight = np.abs(x) * cdf * (1.0 - cdf)
    square = x * x if square_clamp is None else np.minimum(x * x, square_clamp)
    columns = weight[:, None] * np.stack([x * square**k for k in range(degree + 1)], axis=1)
    ones = np.ones((len(x), 1))
    result = optimize.linprog(np.r_[np.zeros(degree + 1), 1.0],
                              A_ub=np.vstack([np.hstack([columns, -ones]), np.hstack([-columns, -ones])]),
                              b_ub=np.r_[weight * target, -weight * target],
                              bounds=[(None, None)] * (degree + 2), method="highs")
    return tuple(float(c) for c in result.x[:-1])


def _float64_gelu(x):
    erfc = np.vectorize(math.erfc)
    return x * 0.5 * erfc(-x / math.sqrt(2.0))


def candidates():
    """name -> build(x, alpha, mark), cheapest first; the GELU op last."""
    rows = {"sigmoid form, x*sigmoid(1.702x)": replacements.sigmoid_from_builtins,
            "tanh form": replacements.tanh_from_builtins}
    for degree, clamp in ((2, SQUARE_CLAMP), (3, SQUARE_CLAMP), (4, None), (5, SQUARE_CLAMP), (6, None)):
        name = f"poly degree {degree}" + (f", x^2 clamped at {clamp:g}" if clamp else "")
        if degree == 5:
            rows[name + " (shipped exact form)"] = replacements.exact_from_builtins
        else:
            rows[name] = replacements.gate_polynomial_form(fit_gate_polynomial(degree, clamp), clamp)
    rows["A&S 7.1.26 erfc (previous exact form)"] = _abramowitz_stegun_form
    rows["GELU op"] = lambda x, alpha, mark=None: tf.nn.gelu(x, approximate=False)
    return rows


def _abramowitz_stegun_form(x, alpha, mark=None):
    """The exact form before the polynomial gate: Phi from A&S's erfc, DIV and EXP (kept for bare Erf ops)."""
    if mark is None:
        x = tf.maximum(x, constant_like(x.dtype.min, x))
    tail = constant_like(0.5, x) * replacements.erfc_of_nonnegative(tf.abs(x) * constant_like(math.sqrt(0.5), x))
    return x * tf.where(x < constant_like(0.0, x), tail, constant_like(1.0, x) - tail)


# One op each (the converter keeps a MUL by a constant as one MUL).
UNIT_OPS = {
    "MUL by a constant": lambda x, alpha, mark=None: x * constant_like(1.5, x),
    "MUL x*x": lambda x, alpha, mark=None: x * x,
    "ADD a constant": lambda x, alpha, mark=None: x + constant_like(1.5, x),
    "MINIMUM with a constant": lambda x, alpha, mark=None: tf.minimum(x, constant_like(1.5, x)),
    "LOGISTIC": lambda x, alpha, mark=None: tf.math.sigmoid(x),
}


def to_tflite(build, bounded, shape):
    mark = None if bounded else replacements.unmarked
    function = tf.function(lambda x: build(x, 1.0, mark=mark), input_signature=[tf.TensorSpec(shape, tf.float32)])
    return tf.lite.TFLiteConverter.from_concrete_functions([function.get_concrete_function()]).convert()


def op_count(tflite_model):
    from keras_gelu.converters.tflite import operators

    return sum(operators.op_histogram(tflite_model).values())


def max_error(tflite_model):
    x = np.concatenate([np.linspace(-12.0, 12.0, 200001), np.geomspace(12.0, 1e30, 2000),
                        -np.geomspace(12.0, 1e30, 2000)]).astype(np.float32)
    x = np.resize(x, (math.ceil(x.size / SHAPE[1]), SHAPE[1]))
    (y,) = verify.invoke(tflite_model, [x])
    return float(np.max(np.abs(y.astype(np.float64) - _float64_gelu(x.astype(np.float64)))))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="interleaved timing rounds (default 200)")
    parser.add_argument("--fit", action="store_true", help="print each degree's fitted coefficients too")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.fit:
        for degree in range(2, 7):
            for clamp in (None, SQUARE_CLAMP):
                print(f"degree {degree}, clamp {clamp}: {fit_gate_polynomial(degree, clamp)}")
        print(f"shipped: degree 5, clamp {SQUARE_CLAMP:g}: {replacements.EXACT_GATE_POLYNOMIAL}\n")

    x = np.random.default_rng(1).normal(0.0, 2.0, SHAPE).astype(np.float32)
    rows, interpreters = {}, {}
    for name, build in candidates().items():
        bounded = to_tflite(build, True, [None, SHAPE[1]])
        rows[name] = (op_count(bounded), max_error(bounded))
        interpreters[name, "bounded"] = timing.interpreter(to_tflite(build, True, SHAPE), [x])
        if name != "GELU op":
            interpreters[name, "bare"] = timing.interpreter(to_tflite(build, False, SHAPE), [x])
    for name, build in UNIT_OPS.items():
        interpreters[name, "unit"] = timing.interpreter(to_tflite(build, True, SHAPE), [x])
    medians = timing.interleaved_medians(interpreters, args.rounds)
    reference = medians["GELU op", "bounded"]
    print(f"## Builtin GELU spellings: ops, error and TFLite latency ({SHAPE[0]}x{SHAPE[1]} float32)\n")
    print(f"{machine.header(threads=1)}; {timing.runtime_name()}; median of {args.rounds} interleaved rounds\n")
    print("| spelling | ops | max abs error vs float64 GELU | vs GELU op | without the bounds | the bounds cost |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (ops, error) in rows.items():
        shipped = medians[name, "bounded"] / reference
        bare = medians.get((name, "bare"))
        bare_text, cost = ("", "") if bare is None else (f"{bare / reference:.2f}x",
                                                         f"{medians[name, 'bounded'] / bare - 1:+.0%}")
        print(f"| {name} | {ops} | {error:.1e} | {shipped:.2f}x | {bare_text} | {cost} |", flush=True)
    print("\nWhat one op costs, alone, as a share of the GELU op: every elementwise op is a pass over memory.\n")
    print("| op | vs GELU op |")
    print("|---|---:|")
    for name in UNIT_OPS:
        print(f"| {name} | {medians[name, 'unit'] / reference:.2f}x |")


if __name__ == "__main__":
    main()
