"""The runtimes a model can be converted for, as data: what each runs, needs and implies, and where that is from.

No TensorFlow here: the command line resolves --target against its other
flags before TensorFlow starts. `target_checks.py` checks a .tflite against a
profile; `runtimes.py` runs it on the runtime where one can be installed.

Op names are TFLite's builtin operator names (schema BuiltinOperator).
"""

import dataclasses

# TFLite Micro's op resolver: tflite-micro python/tflite_micro/python_ops_resolver.cc
# (commit 90b983c2, 2026-08-20; the tflite-micro 0.dev20261023 wheel), builtin ops only.
# No GELU (tensorflow/tflite-micro#3218), no POW, no TILE.
TFLM_OPS = frozenset("""
ABS ADD ADD_N ARG_MAX ARG_MIN ASSIGN_VARIABLE AVERAGE_POOL_2D BATCH_MATMUL BATCH_TO_SPACE_ND BROADCAST_ARGS
BROADCAST_TO CALL_ONCE CAST CEIL CONCATENATION CONV_2D COS CUMSUM DEPTHWISE_CONV_2D DEPTH_TO_SPACE DEQUANTIZE DIV
DYNAMIC_UPDATE_SLICE ELU EMBEDDING_LOOKUP EQUAL EXP EXPAND_DIMS FILL FLOOR FLOOR_DIV FLOOR_MOD FULLY_CONNECTED GATHER
GATHER_ND GREATER GREATER_EQUAL HARD_SWISH IF L2_NORMALIZATION L2_POOL_2D LEAKY_RELU LESS LESS_EQUAL LOG LOGICAL_AND
LOGICAL_NOT LOGICAL_OR LOGISTIC LOG_SOFTMAX MAXIMUM MAX_POOL_2D MEAN MINIMUM MIRROR_PAD MUL NEG NOT_EQUAL PACK PAD PADV2
PRELU QUANTIZE READ_VARIABLE REDUCE_ALL REDUCE_MAX REDUCE_MIN RELU RELU6 RESHAPE RESIZE_BILINEAR
RESIZE_NEAREST_NEIGHBOR REVERSE_V2 ROUND RSQRT SELECT_V2 SHAPE SIN SLICE SOFTMAX SPACE_TO_BATCH_ND SPACE_TO_DEPTH SPLIT
SPLIT_V SQRT SQUARE SQUARED_DIFFERENCE SQUEEZE STRIDED_SLICE SUB SUM SVDF TANH TRANSPOSE TRANSPOSE_CONV
UNIDIRECTIONAL_SEQUENCE_LSTM UNPACK VAR_HANDLE WHILE ZEROS_LIKE
""".split())

# What Vela 5.2.0 places on the NPU: `vela --supported-ops-report` (SUPPORTED_OPS.md, "Ethos-U55 and Ethos-U65
# TFLite Summary Table"); each op also has constraints Vela checks when it compiles. GELU is a lookup table there.
ETHOS_U55_U65_OPS = frozenset("""
ABS ADD ARG_MAX AVERAGE_POOL_2D BATCH_MATMUL CONCATENATION CONV_2D DEPTHWISE_CONV_2D ELU EXP EXPAND_DIMS
FULLY_CONNECTED GELU HARD_SWISH LEAKY_RELU LOG LOGISTIC MAXIMUM MAX_POOL_2D MEAN MINIMUM MIRROR_PAD MUL NEG PACK PAD
PADV2 PRELU QUANTIZE REDUCE_MAX REDUCE_MIN RELU RELU6 RELU_0_TO_1 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR
RESIZE_NEAREST_NEIGHBOR REVERSE_V2 RSQRT SLICE SOFTMAX SPLIT SPLIT_V SQUARED_DIFFERENCE SQUEEZE STRIDED_SLICE SUB SUM
TANH TILE TRANSPOSE TRANSPOSE_CONV UNIDIRECTIONAL_SEQUENCE_LSTM UNPACK
""".split())
# The same report's "Ethos-U85 TFLite Summary Table".
ETHOS_U85_OPS = ETHOS_U55_U65_OPS | frozenset("""
ASSIGN_VARIABLE CAST DIV EQUAL GATHER GREATER GREATER_EQUAL LESS LESS_EQUAL LOGICAL_AND LOGICAL_NOT LOGICAL_OR
NOT_EQUAL READ_VARIABLE REDUCE_ALL REDUCE_ANY SCATTER_ND SELECT SELECT_V2
""".split())

# Coral's table of operations the Edge TPU compiler maps (https://coral.ai/docs/edgetpu/models-intro/
# #supported-operations). GELU stops the compiler: "Op builtin_code out of range: 150"
# (google-coral/edgetpu#667, #818).
EDGETPU_OPS = frozenset("""
ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D EXPAND_DIMS FULLY_CONNECTED HARD_SWISH L2_NORMALIZATION
LOGISTIC LSTM MAXIMUM MAX_POOL_2D MEAN MINIMUM MUL PACK PAD PRELU QUANTIZE REDUCE_MAX REDUCE_MIN RELU RELU6
RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR RSQRT SLICE SOFTMAX SPACE_TO_DEPTH SPLIT SQUARED_DIFFERENCE
SQUEEZE STRIDED_SLICE SUB SUM TANH TRANSPOSE TRANSPOSE_CONV
""".split())

# The delegates' own checks, LiteRT tflite/delegates (commit f6745779, 2026-08-21): the ops each accepts.
# NNAPI: NNAPIDelegateKernel::Validate in nnapi/nnapi_delegate.cc. It has SELECT, not SELECT_V2.
NNAPI_OPS = frozenset("""
ABS ADD ARG_MAX ARG_MIN AVERAGE_POOL_2D BATCH_MATMUL BATCH_TO_SPACE_ND BIDIRECTIONAL_SEQUENCE_LSTM CAST CONCATENATION
CONV_2D COS DENSIFY DEPTH_TO_SPACE DEPTHWISE_CONV_2D DEQUANTIZE DIV ELU EMBEDDING_LOOKUP EQUAL EXP EXPAND_DIMS FILL
FLOOR FULLY_CONNECTED GATHER GREATER GREATER_EQUAL HARD_SWISH HASHTABLE_LOOKUP L2_NORMALIZATION L2_POOL_2D LEAKY_RELU
LESS LESS_EQUAL LOCAL_RESPONSE_NORMALIZATION LOG LOG_SOFTMAX LOGICAL_AND LOGICAL_NOT LOGICAL_OR LOGISTIC LSH_PROJECTION
LSTM MAX_POOL_2D MAXIMUM MEAN MINIMUM MIRROR_PAD MUL NEG NOT_EQUAL PACK PAD PADV2 POW PRELU QUANTIZE REDUCE_ANY
REDUCE_MAX REDUCE_MIN REDUCE_PROD RELU RELU6 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR REVERSE_V2
RNN RSQRT SELECT SIN SLICE SOFTMAX SPACE_TO_BATCH_ND SPACE_TO_DEPTH SPLIT SPLIT_V SQRT SQUARED_DIFFERENCE SQUEEZE
STRIDED_SLICE SUB SUM SVDF TANH TILE TOPK_V2 TRANSPOSE TRANSPOSE_CONV UNIDIRECTIONAL_SEQUENCE_LSTM
UNIDIRECTIONAL_SEQUENCE_RNN UNPACK
""".split())
# Hexagon: IsNodeSupportedByHexagon in hexagon/utils.cc; every op there wants uint8/int8 inputs.
HEXAGON_OPS = frozenset("""
ADD ARG_MAX ARG_MIN AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTH_TO_SPACE DEPTHWISE_CONV_2D FULLY_CONNECTED HARD_SWISH
L2_NORMALIZATION LOGISTIC MAX_POOL_2D MAXIMUM MEAN MINIMUM MIRROR_PAD MUL NEG PACK PAD QUANTIZE RELU RELU6 RESHAPE
RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR SLICE SOFTMAX SPACE_TO_DEPTH SPLIT STRIDED_SLICE SUB TANH TRANSPOSE
TRANSPOSE_CONV
""".split())
# Core ML: IsNodeSupportedByDelegate in coreml/coreml_delegate.mm. No SUB, no MAXIMUM.
COREML_OPS = frozenset("""
ADD AVERAGE_POOL_2D CONCATENATION CONV_2D DEPTHWISE_CONV_2D FULLY_CONNECTED HARD_SWISH LOGISTIC MAX_POOL_2D MEAN
MIRROR_PAD MUL PAD PADV2 RELU RELU6 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR SOFTMAX TANH TRANSPOSE_CONV
""".split())
# GPU: the builder switch in gpu/common/model_builder.cc. Its OpenGL backend computes GELU as the tanh form
# even when exact GELU is asked for (gpu/gl/kernels/elementwise.cc).
GPU_OPS = frozenset("""
ABS ADD ADD_N AVERAGE_POOL_2D BATCH_MATMUL CAST CONCATENATION CONV_2D COS CUMSUM DENSIFY DEPTH_TO_SPACE
DEPTHWISE_CONV_2D DEQUANTIZE DIV ELU EQUAL EXP FLOOR FLOOR_DIV FLOOR_MOD FULLY_CONNECTED GATHER GELU GREATER
GREATER_EQUAL HARD_SWISH LEAKY_RELU LESS LESS_EQUAL LOG LOGICAL_AND LOGISTIC LSTM MAX_POOL_2D MAXIMUM MEAN MINIMUM
MIRROR_PAD MUL NEG NOT_EQUAL ONE_HOT PACK PAD PADV2 POW PRELU QUANTIZE REDUCE_MAX REDUCE_MIN REDUCE_PROD RELU
RELU_0_TO_1 RELU6 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR RSQRT SELECT SELECT_V2 SIGN SIN SLICE
SOFTMAX SPACE_TO_DEPTH SPLIT SPLIT_V SQRT SQUARE SQUARED_DIFFERENCE STRIDED_SLICE SUB SUM TANH TILE TRANSPOSE
TRANSPOSE_CONV UNPACK
""".split())

# What keras_gelu's inf/NaN guards compile to: the -inf clamp of the fixed forms and of the float replacements
# (MAXIMUM), LearnableGELU's +-inf clamp (ABS, EQUAL, GREATER, SELECT_V2) and its 0 * inf guard (ZEROS_LIKE).
GUARD_OPS = frozenset({"MAXIMUM", "ABS", "EQUAL", "GREATER", "SELECT_V2", "ZEROS_LIKE"})
# Ops TFLite computes under either name where their operands share one shape (equivalent_ops.py renames them).
TWINS = {"SELECT": "SELECT_V2", "SELECT_V2": "SELECT"}

# Tensor types, by what an op outputs.
INT8_ONLY = frozenset({"int8", "int32", "bool"})  # int32/bool: indices, shapes and masks beside int8 data
FLOAT_ONLY = frozenset({"float32", "float16", "int32", "bool"})
NO_INT16 = frozenset({"float32", "float16", "int8", "uint8", "int32", "int64", "bool"})


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    runtime: str  # what the user ships to
    ops: frozenset  # the builtin ops it runs; None: every builtin op
    modes: tuple  # the conversion modes whose output it runs, the implied one first
    exact_as: tuple  # the builtin-mode exact_as values it runs, the implied one first
    output_types: frozenset = None  # what its ops may output; None: any
    op_output_types: dict = dataclasses.field(default_factory=dict)  # {op: what it may output} narrower still
    op_input_types: dict = dataclasses.field(default_factory=dict)  # {op: what its first input may be}
    int8: bool = False  # runs integer models only: --int8 is implied
    int8_io: bool = False  # int8 inputs and outputs: a float edge would be QUANTIZE/DEQUANTIZE off the accelerator
    static_shapes: bool = False  # shapes fixed at compile or allocation time: the batch axis becomes 1
    fallback: object = None  # with --allow-cpu-fallback, the ops of the CPU beside the accelerator (a frozenset)
    verifier: str = None  # the runtime check when its tool is installed: "tflm", "vela", "gpu-analyzer", "litert"
    vela_config: tuple = ()  # Vela's --accelerator-config, --system-config and --memory-mode
    lacks: str = ""  # what the runtime lacks, for the README and the report
    notes: tuple = ()  # what the report says about running there

    def has(self, op):
        """Whether the runtime has `op`, of some type."""
        return self.ops is None or op in self.ops

    def runs(self, op, output_type):
        """Whether the runtime has `op` with a kernel that outputs `output_type`."""
        outputs = self.output_types is None or output_type in self.output_types
        return self.has(op) and outputs and output_type in self.op_output_types.get(op, {output_type})

    @property
    def takes_int8(self):
        """Whether the runtime runs int8 models: a quantization-aware model converts to int8 for it unasked."""
        return self.output_types is None or "int8" in self.output_types

    @property
    def takes_int16(self):
        """Whether the runtime runs 16x8 models (int16 activations, int8 weights)."""
        return self.output_types is None or "int16" in self.output_types

    @property
    def keeps_non_finite_guards(self):
        """Whether the runtime has the ops of keras_gelu's inf/NaN guards (else they are dropped: NaN at +-inf)."""
        return all(self.has(op) or self.has(TWINS.get(op)) for op in GUARD_OPS)

    @property
    def verifier_modules(self):
        """The Python modules its runtime check imports (runtimes.py), where they are installed."""
        return {"tflm": ("tflite_micro.runtime",), "vela": ("ethosu.vela.vela",)}.get(self.verifier, ())


TARGETS = {target.name: target for target in (
    Target("tflm", "TensorFlow Lite for Microcontrollers", TFLM_OPS, ("builtin",), ("sigmoid", "tanh", "erf"),
           static_shapes=True, verifier="tflm",
           lacks="GELU, POW, TILE; int32 SELECT_V2 and CUMSUM; int8 SQRT, SIN, COS, LOG and SQUARE; float16 weights; "
                 "dynamic shapes",
           # tflite-micro's kernels/select.cc: "Does not support type other than int8|int16|float32"; cumsum.cc:
           # float32 or int8 in; elementwise.cc: SQRT, SIN, COS, LOG and SQUARE float32 alone (EvalNumeric)
           op_output_types={"SELECT_V2": frozenset({"int8", "int16", "float32"}),
                            "CUMSUM": frozenset({"int8", "float32"}),
                            **dict.fromkeys(("SQRT", "SIN", "COS", "LOG", "SQUARE"), frozenset({"float32"}))},
           # kernels/dequantize_common.cc: int8, int16 or uint8 in (float16 weights are not)
           op_input_types={"DEQUANTIZE": frozenset({"int8", "int16", "uint8"})}),
    *(Target(f"ethos-u{size}", f"Arm Ethos-U{size} NPU (Vela 5.2)", ops, ("native", "builtin"), ("sigmoid", "tanh"),
             output_types=INT8_ONLY, int8=True, int8_io=True, static_shapes=True, fallback=TFLM_OPS, verifier="vela",
             vela_config=config, lacks="float; GELU before Vela 5.2; DIV" + ("" if size == "85" else ", SELECT_V2"))
      for size, ops, config in (
          ("55", ETHOS_U55_U65_OPS, ("ethos-u55-128", "Ethos_U55_High_End_Embedded", "Shared_Sram")),
          ("65", ETHOS_U55_U65_OPS, ("ethos-u65-256", "Ethos_U65_High_End", "Dedicated_Sram")),
          ("85", ETHOS_U85_OPS, ("ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Dedicated_Sram")))),
    Target("edgetpu", "Coral Edge TPU", EDGETPU_OPS, ("builtin",), ("sigmoid", "tanh"), output_types=INT8_ONLY,
           int8=True, int8_io=True, static_shapes=True, lacks="GELU, DIV, EXP, SELECT_V2; float; dynamic shapes",
           notes=("the Edge TPU compiler is not on any package registry: checked against Coral's op table, not run",)),
    Target("gpu", "LiteRT GPU delegate", GPU_OPS, ("native", "builtin"), ("sigmoid", "tanh", "erf"),
           output_types=FLOAT_ONLY, static_shapes=True, verifier="gpu-analyzer", lacks="ZEROS_LIKE; int8 kernels",
           notes=("the GPU delegate's OpenGL backend computes GELU as the tanh form, also where exact GELU is asked "
                  "for (gpu/gl/kernels/elementwise.cc); its OpenCL backend computes exact GELU",)),
    # NNAPI has int16 tensors for a few ops only (TENSOR_QUANT16_SYMM: LSTM's state, QUANTIZE): no 16x8 model
    Target("nnapi", "Android NNAPI delegate", NNAPI_OPS, ("builtin",), ("sigmoid", "tanh", "erf"), static_shapes=True,
           output_types=NO_INT16, lacks="GELU; SELECT_V2, ZEROS_LIKE; 16x8"),
    Target("coreml", "Core ML delegate", COREML_OPS, ("builtin",), ("sigmoid", "tanh"), output_types=FLOAT_ONLY,
           static_shapes=True, lacks="GELU, SUB, MAXIMUM, SELECT; int8"),
    Target("hexagon", "Hexagon delegate", HEXAGON_OPS, ("builtin",), ("sigmoid", "tanh"), output_types=INT8_ONLY,
           int8=True, int8_io=True, static_shapes=True, lacks="GELU, DIV, EXP, SELECT_V2, DEQUANTIZE; float"),
    Target("cpu", "LiteRT CPU (XNNPACK)", None, ("native", "builtin", "select"), ("sigmoid", "tanh", "erf"),
           verifier="litert", lacks="nothing: every builtin op, GELU included"),
)}
TARGET_NAMES = tuple(TARGETS)


def check_int16(name, float16_weights):
    """ValueError where a 16x8 conversion cannot be had: with float16 weights (16x8's are int8), or for target
    `name` (None: none) whose runtime runs no 16x8 model."""
    if float16_weights:
        raise ValueError("--int16 and --float16-weights exclude each other")
    target = TARGETS.get(name)
    if target is not None and not target.takes_int16:
        raise ValueError(f"--target {name}: {target.runtime} runs no 16x8 model (int16 activations); drop --int16")


def check_mixed_precision(name, int16, allow_cpu_fallback):
    """ValueError where --mixed-precision cannot be had: with --int16 (a 16x8 model is quantized in one step,
    which keeps no op float on request), or for target `name` (None: none) whose runtime runs no float op."""
    if int16:
        raise ValueError("--mixed-precision lifts int8 ops to float, and a 16x8 conversion keeps none float on "
                         "request; drop one of --int16 and --mixed-precision")
    target = TARGETS.get(name)
    if target is None or target.output_types is None or "float32" in target.output_types:
        return
    if target.fallback is not None and allow_cpu_fallback:
        return
    hint = " (--allow-cpu-fallback runs float ops on the CPU beside it)" if target.fallback is not None else ""
    raise ValueError(f"--target {name}: {target.runtime} runs no float op, and --mixed-precision lifts ops to "
                     f"float{hint}")


def resolve(name, mode=None, exact_as=None, int8=False, int8_io=False, float16_weights=False):
    """(mode, exact_as, int8, int8_io) of a conversion for target `name`, completing what was not given.

    A given flag the target contradicts is a ValueError naming both, so
    `--target tflm --mode native` is refused rather than quietly changed.
    """
    if name not in TARGETS:
        raise ValueError(f"Argument `target` must be one of {TARGET_NAMES}. Received: target={name!r}")
    target = TARGETS[name]
    why = f" ({target.runtime} lacks {target.lacks})"
    if mode is not None and mode not in target.modes:
        raise ValueError(f"--target {name} takes --mode {' or '.join(target.modes)}, not {mode}{why}")
    mode = mode or target.modes[0]
    if exact_as is not None and exact_as not in target.exact_as:
        raise ValueError(f"--target {name} takes --form {' or '.join(target.exact_as)}, not {exact_as}{why}")
    if mode == "builtin" and exact_as is None:
        exact_as = target.exact_as[0]
    if (int8 or int8_io) and target.output_types is not None and "int8" not in target.output_types:
        raise ValueError(f"--target {name}: {target.runtime} runs float models only; drop --int8")
    if float16_weights and target.int8:
        raise ValueError(f"--target {name}: {target.runtime} runs int8 models only; drop --float16-weights")
    return mode, exact_as, int8 or target.int8, int8_io or target.int8_io
