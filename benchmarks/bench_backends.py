"""Speed of keras_gelu on Keras 3's JAX and PyTorch backends against each framework's own GELU, as ratios from
one run (the TensorFlow backend: bench_layers.py). Forward and backward, the way training runs them: under
jax.jit on JAX; eagerly and under torch.compile on PyTorch. Not a test: nothing here asserts.

    KERAS_BACKEND=jax .venv-jax/bin/python benchmarks/bench_backends.py [--size 2048] [--rounds 15]
    KERAS_BACKEND=torch .venv-torch/bin/python benchmarks/bench_backends.py

Ratios are keras_gelu's median time over the stock function's (below 1.00: keras_gelu is faster), each pair
timed in interleaved rounds in one process.
"""

import argparse
import os

import numpy as np

import keras_gelu
import machine
import timing

BACKEND = keras_gelu.BACKEND


def _jax_candidates():
    import jax
    import jax.numpy as jnp

    def forward_backward(function):
        def step(x, upstream):
            y, backward = jax.vjp(function, x)
            return y, backward(upstream)[0]

        step = jax.jit(step)
        return lambda x, upstream: jax.block_until_ready(step(x, upstream))

    return jnp.asarray, {
        # keras_gelu's form: (its function, the stock function it is compared with)
        "exact": (forward_backward(lambda x: keras_gelu.gelu(x, "exact")),
                  forward_backward(lambda x: jax.nn.gelu(x, approximate=False)), "jax.nn.gelu(approximate=False)"),
        "tanh": (forward_backward(lambda x: keras_gelu.gelu(x, "tanh")),
                 forward_backward(lambda x: jax.nn.gelu(x, approximate=True)), "jax.nn.gelu(approximate=True)"),
        "sigmoid": (forward_backward(lambda x: keras_gelu.gelu(x, "sigmoid")),
                    forward_backward(lambda x: x * jax.nn.sigmoid(1.702 * x)), "x * jax.nn.sigmoid(1.702 x)"),
    }


def _torch_candidates():
    import torch
    import torch.nn.functional as F

    def forward_backward(function, compiled):
        function = torch.compile(function) if compiled else function

        def run(x, upstream):
            x = x.detach().requires_grad_(True)
            y = function(x)
            y.backward(upstream)
            return y, x.grad

        return run

    candidates = {}
    stock = {"exact": (lambda x: F.gelu(x), "F.gelu"), "tanh": (lambda x: F.gelu(x, approximate="tanh"),
                                                                "F.gelu(approximate='tanh')"),
             "sigmoid": (lambda x: x * torch.sigmoid(1.702 * x), "x * torch.sigmoid(1.702 x)")}
    for compiled in (False, True):
        for form, (stock_function, stock_name) in stock.items():
            ours = (lambda form: lambda x: keras_gelu.gelu(x, form))(form)
            label = f"{form}, {'torch.compile' if compiled else 'eager'}"
            candidates[label] = (forward_backward(ours, compiled), forward_backward(stock_function, compiled),
                                 stock_name)
    return torch.from_numpy, candidates


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=2048, help="the input is size x size float32")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    args = parser.parse_args()
    if BACKEND not in ("jax", "torch"):
        parser.error(f"set KERAS_BACKEND to jax or torch (TensorFlow: bench_layers.py). Received: backend={BACKEND}")
    as_tensor, candidates = _jax_candidates() if BACKEND == "jax" else _torch_candidates()
    # The output and the input's gradient for an upstream gradient, as a layer in training makes them (a sum of the
    # output instead would let a compiler fold the forward pass into its reduction and never write the output).
    rng = np.random.default_rng(0)
    x, upstream = (as_tensor(rng.normal(scale=3.0, size=(args.size, args.size)).astype(np.float32)) for _ in "xu")
    print(machine.header())
    print(f"Keras backend {BACKEND}; fwd+bwd on {args.size}x{args.size} float32; median of {args.rounds} "
          f"interleaved rounds\n")
    print("| form | keras_gelu ms | stock ms | stock | keras_gelu / stock |")
    print("|---|---|---|---|---|")
    for form, (ours, stock, stock_name) in candidates.items():
        calls = {"ours": lambda: ours(x, upstream), "stock": lambda: stock(x, upstream)}
        for call in calls.values():
            call()  # compile/warm up
        medians = timing.call_medians(calls, args.rounds)
        print(f"| {form} | {medians['ours'] * 1e3:.1f} | {medians['stock'] * 1e3:.1f} | {stock_name} | "
              f"{medians['ours'] / medians['stock']:.2f}x |")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
