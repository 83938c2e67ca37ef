"""What a conversion can be asked for, and the defaults: plain data, no TensorFlow.

The installed command (keras_gelu_launcher) checks its flags against these
without starting TensorFlow, so this module imports nothing heavy.
"""

import dataclasses

from keras_gelu import vocabulary

from . import targets

# Fidelity tolerance (the .tflite against the rewritten graph in TensorFlow):
# TFLite and TensorFlow kernels round differently (fused multiply-adds,
# XNNPACK's exp/sigmoid polynomials, summation order in matmuls). Measured
# over this package's test models and the real model families of the suite,
# the worst difference was ~1e-6 relative to the output scale; 1e-4 leaves
# two orders of magnitude of headroom while still catching any wrong op (a
# wrong GELU replacement moves outputs by >= 1e-3).
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-4
DEFAULT_DYNAMIC_SIZE = 2

# int8 fidelity of a QAT model: the .tflite against its fake-quant graph in
# TensorFlow, in steps of each output's int8 scale. Both compute the same ops
# on the same grids, but a value on a rounding boundary can round the other
# way (TFLite's fixed-point rescaling, its int8 SOFTMAX), and later layers
# amplify that one step: a flipped 1/256 in an attention probability scales
# a whole value vector. Measured: up to 2 steps on MLPs, 7 on the tiny
# Transformer of examples/qat_transformer.py. A wrong range or a float
# island is off by tens of steps.
DEFAULT_QAT_STEPS = 10.0

# The precision an int8 model must keep: the cosine of its worst output against the float model's, on the
# calibration samples (or --inputs, or the parity inputs). An int8 model that lost its signal to one outlier
# channel scored 0.48 while passing its own rounding envelope; a sound per-tensor int8 conversion of the suite's
# models scores above 0.999, and an untrained deep one (DeiT) 0.999 at 19 steps.
DEFAULT_MIN_COSINE = 0.99
# How many calibration samples judge the budget, and explain, where no --inputs are given. Measured with
# random:32 on the suite's models, the worst output's cosine on 8 was within 0.005 of that on 32 (on 2, 0.008
# off: a model at 0.998 scored 0.990), at a quarter of the parity runs (a static-shape target runs each row
# alone, in three runtimes).
JUDGED_SAMPLES = 8

# The largest model config (a .keras file's config.json, an .h5 file's model_config) read, in MiB: the
# configs of the suite's real models (keras-hub backbones, keras.applications) are under 1 MiB; a config that
# inflates to gigabytes (a zip bomb) is refused before it is read.
DEFAULT_CONFIG_LIMIT_MIB = 64.0


@dataclasses.dataclass
class Options:
    mode: str = None  # vocabulary.MODES; None: the target's, or builtin
    exact_as: str = None  # how builtin mode computes exact GELU (--form); None: the mode's default
    signature: str = None
    float16_weights: bool = False
    verify: bool = True
    inputs: str = None  # .npz path
    seed: int = 0
    dynamic_size: int = DEFAULT_DYNAMIC_SIZE
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    max_drift: float = None
    int8: bool = False
    calibration: str = None  # "random:N" or an .npz of samples, for float models
    int8_io: bool = False
    int16: bool = False  # 16x8: int16 activations, int8 weights (an integer conversion, as int8 is)
    max_steps: float = None  # int8 fidelity tolerance in output steps
    trust_model: bool = False  # skip trust/'s refusals: the user made the model or trusts its source
    target: str = None  # targets.TARGETS: the runtime to convert for, which completes mode, exact_as and int8
    allow_cpu_fallback: bool = False  # a target's ops may run on the CPU beside its accelerator
    input_shapes: dict = None  # {input name: static shape} (--input-shape), for dimensions the model leaves open
    time_limit: float = None  # seconds the contained conversion may take; None: sandbox.limits' default
    memory_limit: float = None  # GiB it may use; None: sandbox.limits' default
    config_limit: float = DEFAULT_CONFIG_LIMIT_MIB  # MiB a Keras file's model config may inflate to
    min_cosine: float = DEFAULT_MIN_COSINE  # an int8 model's budget against the float model; 0: none
    explain: str = None  # a folder for the per-tensor explanation (written outside the sandbox); None: none
    mixed_precision: bool = False  # int8: ops lifted to float, the worst first, until min_cosine holds

    def __post_init__(self):
        if self.target is not None:
            self.mode, self.exact_as, self.int8, self.int8_io = targets.resolve(
                self.target, self.mode, self.exact_as, self.int8, self.int8_io, self.float16_weights)
        elif self.allow_cpu_fallback:
            raise ValueError("Argument `allow_cpu_fallback` applies to a `target` only. Received: target=None")
        if self.int16:
            targets.check_int16(self.target, self.float16_weights)
            self.int8 = True
        self.mode = self.mode or "builtin"
        self.exact_as = vocabulary.resolve_exact_as(self.mode, self.exact_as)
        if self.input_shapes:
            self.input_shapes = {name: tuple(shape) for name, shape in self.input_shapes.items()}
        if self.explain and not self.verify:
            raise ValueError("Argument `explain` runs the model to compare its tensors, which `verify=False` skips. "
                             f"Received: explain={self.explain!r}, verify=False")
        if self.min_cosine is None or not 0.0 <= self.min_cosine <= 1.0:
            raise ValueError(f"Argument `min_cosine` must be from 0 (no budget) to 1. Received: "
                             f"min_cosine={self.min_cosine}")
        if self.mixed_precision:
            if not self.int8 or not self.verify or not self.min_cosine:
                raise ValueError("Argument `mixed_precision` lifts an int8 model's ops until `min_cosine` holds on "
                                 "samples it runs: it needs int8=True, verify=True and min_cosine > 0. Received: "
                                 f"int8={self.int8}, verify={self.verify}, min_cosine={self.min_cosine}")
            targets.check_mixed_precision(self.target, self.int16, self.allow_cpu_fallback)
        for name in ("time_limit", "memory_limit", "config_limit"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"Argument `{name}` must be positive. Received: {name}={value}")
