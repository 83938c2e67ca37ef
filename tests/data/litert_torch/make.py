"""Makes the PyTorch models of tests/test_tflite_input.py: .tflite files from litert-torch, with PyTorch's own
outputs as the reference.

litert-torch needs torch and jax, not TensorFlow, so it runs in a venv of its own, here as when these were made:

    python3 -m venv /tmp/litert-torch && /tmp/litert-torch/bin/pip install litert-torch==0.10.0
    /tmp/litert-torch/bin/python tests/data/litert_torch/make.py

Each model's GELU reaches the .tflite as TFLite's GELU op (litert-torch 0.10.0, torch 2.14.1).
"""

import os

import litert_torch
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def models():
    """{name: (module, example input)}: a GELU MLP each way, and a transformer encoder layer with exact GELU."""
    return {
        "gelu_exact": (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)),
                       torch.randn(1, 8)),
        "gelu_tanh": (torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(approximate="tanh"),
                                          torch.nn.Linear(16, 4)), torch.randn(1, 8)),
        "transformer_layer": (torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32,
                                                               activation="gelu", dropout=0.0, batch_first=True),
                              torch.randn(1, 6, 16)),
    }


def main():
    torch.manual_seed(0)
    references = {}
    for name, (module, example) in models().items():
        module.eval()
        litert_torch.convert(module, (example,)).export(os.path.join(HERE, f"{name}.tflite"))
        inputs = torch.randn(8, *example.shape[1:]) * 3.0  # wide enough to reach both tails of the GELU
        with torch.no_grad():
            outputs = torch.cat([module(sample[None]) for sample in inputs])
        references[f"{name}/inputs"] = inputs.numpy()
        references[f"{name}/outputs"] = outputs.numpy()
    np.savez(os.path.join(HERE, "torch_outputs.npz"), **references)


if __name__ == "__main__":
    main()
