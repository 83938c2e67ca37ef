"""Fits the polynomial of keras_gelu's float32 normal tail, `formulas.NORMAL_TAIL_POLYNOMIAL`, and prints it.

The upper tail of the normal distribution, Q(t) = Phi(-t) = 0.5 erfc(t/sqrt 2),
is written Q(t) = exp(-t^2/2) R(t): R = 0.5 erfcx(t/sqrt 2) is smooth and
tame (0.5 at 0, falling like 1/(t sqrt(2 pi))), so a polynomial fits it where
erfc itself, which falls like exp(-t^2/2), needs a rational function and two
branches. The fit is minimax (Lawson's iteration of weighted least squares on
Chebyshev nodes) in u = 2t/T - 1 over t in [0, T], weighted by the float32
GELU bound 2e-7 |y| + 1e-7 at x = -t, the stricter side: there y = -t Q(t),
so Q may be off by (2e-7 + 1e-7 / (t Q)) relative. Beyond T the bound is
absolute in effect (|y| < 1.5e-6 at x = -5), and R(T) serves.

Not a test and not run by the package: it records where the coefficients
came from. Needs only NumPy; references are float64 math.erfc.

    python benchmarks/fit_normal_tail.py [--degree 12] [--t-max 5.0]
"""

import argparse
import math

import numpy as np
from numpy.polynomial import chebyshev


# The derivative, Phi(x) + x phi(x), takes Phi's error as it is: half of float32's ulp at 0.5.
DERIVATIVE_BOUND = 3e-8


def tail_ratio(t):
    """R(t) = Q(t) exp(t^2/2), in float64 (math.erfc is relatively accurate; exp(t^2/2) <= exp(18) here)."""
    return np.array([0.5 * math.erfc(v / math.sqrt(2.0)) * math.exp(0.5 * v * v) for v in t])


def fit(degree, t_max, samples=20_001, iterations=60):
    """(power-series coefficients in u, constant first; the worst error as a fraction of the bound)."""
    t = np.linspace(0.0, t_max, samples)
    ratio = tail_ratio(t)
    tail = ratio * np.exp(-0.5 * t * t)
    gelu_bound = 2e-7 * t * tail + 1e-7  # |error of y| at x = -t, where y = -t Q
    relative_bound = np.minimum(gelu_bound / np.maximum(t, 1e-300), DERIVATIVE_BOUND) / tail
    u = t * (2.0 / t_max) - 1.0
    weights = np.ones_like(t)
    for _ in range(iterations):
        coefficients = chebyshev.chebfit(u, ratio, degree, w=np.sqrt(weights) / (ratio * relative_bound))
        error = (chebyshev.chebval(u, coefficients) - ratio) / (ratio * relative_bound)
        weights = weights * np.abs(error)
        weights /= weights.sum()
    return chebyshev.cheb2poly(coefficients), float(np.abs(error).max())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--degree", type=int, default=12)
    parser.add_argument("--t-max", type=float, default=5.0)
    args = parser.parse_args()
    for degree in range(args.degree - 2, args.degree + 2):
        _, worst = fit(degree, args.t_max)
        print(f"degree {degree}: worst error {worst:.3f} of the float32 bound (before float32 rounding)")
    coefficients, _ = fit(args.degree, args.t_max)
    print(f"\nNORMAL_TAIL_T_MAX = {args.t_max!r}")
    print("NORMAL_TAIL_POLYNOMIAL = (" + ", ".join(repr(float(c)) for c in coefficients) + ")")


if __name__ == "__main__":
    main()
