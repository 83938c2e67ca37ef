"""A converted model on its target's own runtime or compiler, where that can be installed.

* TFLite Micro (`pip install 'keras-gelu[tflm]'`): the real TFLM interpreter runs the model; we keep its
  outputs for parity and the tensor arena it allocated, which is what an MCU's RAM must hold.
* Vela (`pip install 'keras-gelu[vela]'`): compiles the model for an Ethos-U NPU, in this process, and says
  how many operators run on the NPU and how many fall back to the CPU.
* The GPU delegate's compatibility analyzer, which ships with TensorFlow.

Each returns a `RuntimeCheck`, or None where its tool is not installed.
"""

import contextlib
import dataclasses
import io
import os
import re
import tempfile

import numpy as np
from tensorflow.lite.python import schema_py_generated as schema

from .. import errors
from .. import native_logs
from . import progress
from . import verify

_ARENA_TOTAL = re.compile(r"Arena allocation total (\d+) bytes")
_VELA_COUNT = re.compile(r"^(CPU|NPU) operators = (\d+)", re.MULTILINE)
# TFLM's first guess is 10x the model; a model whose activations outgrow it gets up to this much.
_LARGEST_ARENA = 1 << 30


@dataclasses.dataclass
class RuntimeCheck:
    tool: str  # what ran: "tflite-micro 0.dev2026...", "vela 5.2.0", ...
    verdict: str  # one line for the report
    figures: dict = dataclasses.field(default_factory=dict)  # arena bytes, NPU/CPU operator counts
    outputs: list = None  # the runtime's outputs, in the model's output order, where it ran the model


def _version(distribution):
    from importlib import metadata

    return f"{distribution} {metadata.version(distribution)}"


def _tflm_interpreter(runtime, tflite_model):
    """A TFLM interpreter with an arena big enough for the model; what TFLM printed if it refused the model."""
    arena = len(tflite_model) * 10
    while True:
        with native_logs.captured() as printed:
            try:
                return runtime.Interpreter.from_bytes(bytes(tflite_model), arena_size=arena)
            except RuntimeError as error:
                failure = error
        said = " ".join(line.strip() for line in printed)
        if "Failed to allocate" not in said or arena >= _LARGEST_ARENA:
            reason = next((line.strip() for line in printed if "Didn't find op" in line), said or str(failure))
            raise errors.TargetRejected(f"TFLite Micro refused the model: {reason[:300]}")
        arena *= 4


def run_tflm(tflite_model, samples):
    """Run the model in TFLite Micro on each of `samples` (one array per input, in input order), as an MCU would:
    one interpreter, one invocation per sample. Outputs are stacked along the first axis. None if tflite-micro
    is not installed."""
    try:
        from tflite_micro import runtime
    except ImportError:
        return None
    progress.entered("verify: TFLite Micro")
    interpreter = _tflm_interpreter(runtime, tflite_model)
    output_count = schema.Model.GetRootAsModel(tflite_model, 0).Subgraphs(0).OutputsLength()
    input_details = [_litert_style(interpreter.get_input_details(index)) for index in range(len(samples[0]))]
    output_details = [_litert_style(interpreter.get_output_details(index)) for index in range(output_count)]
    results = []
    for arrays in samples:
        for index, (detail, array) in enumerate(zip(input_details, arrays)):
            interpreter.set_input(np.ascontiguousarray(verify.input_value(detail, array)), index)
        failure = None
        with native_logs.captured() as printed:
            try:
                interpreter.invoke()
            except RuntimeError as error:
                failure = error
        if failure is not None:  # what TFLM printed is in `printed` only once the block has closed
            said = " ".join(line.strip() for line in printed) or str(failure)
            raise errors.TargetRejected(f"TFLite Micro failed to run the model: {said}"[:300])
        results.append([verify.output_value(detail, interpreter.get_output(index))
                        for index, detail in enumerate(output_details)])
    outputs = [np.concatenate([result[index] for result in results]) for index in range(output_count)]
    with native_logs.captured() as printed:
        interpreter.print_allocations()
    arena = next((int(match.group(1)) for match in map(_ARENA_TOTAL.search, printed) if match), None)
    if arena is None:
        raise errors.TargetToolFailed("TFLite Micro ran the model but reported no arena size: "
                                      + " ".join(printed)[:200])
    return RuntimeCheck(_version("tflite-micro"), f"ran in TFLite Micro, tensor arena {arena:,} bytes",
                        {"arena_bytes": arena}, outputs)


def _litert_style(detail):
    """A TFLM tensor detail as LiteRT's interpreter gives it, for verify's (de)quantization."""
    parameters = detail.get("quantization_parameters", {})
    scales, zero_points = parameters.get("scales", []), parameters.get("zero_points", [])
    quantization = (float(scales[0]), int(zero_points[0])) if len(scales) == 1 else (0.0, 0)
    return {"dtype": np.dtype(detail["dtype"]).type, "quantization": quantization}


_VELA_PLACED_ON_CPU = re.compile(r"^Warning \(supported operators\) operator: (\w+).*\n(?:Reason: (.*))?", re.MULTILINE)


def _cpu_operator_reasons(printed):
    """{operator type: (how many Vela left on the CPU, its first reason)} from Vela's warnings."""
    reasons = {}
    for operator, reason in _VELA_PLACED_ON_CPU.findall(printed):
        count, first = reasons.get(operator, (0, reason.strip()))
        reasons[operator] = (count + 1, first)
    return reasons


def run_vela(tflite_model, vela_config):
    """Compile for an Ethos-U NPU with Vela; None if it is not installed. Figures: NPU and CPU operator counts.

    Vela runs in this process (the sandbox's worker, which may start no program), its report read from what
    it prints."""
    try:
        tool = _version("ethos-u-vela")
        from ethosu.vela import vela
    except Exception:  # noqa: BLE001 - importlib.metadata.PackageNotFoundError, ImportError
        return None
    progress.entered("verify: Vela")
    accelerator, system, memory = vela_config
    printed = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="keras_gelu_vela_") as directory:
        model = os.path.join(directory, "model.tflite")
        with open(model, "wb") as file:
            file.write(tflite_model)
        arguments = [model, "--accelerator-config", accelerator, "--config", "Arm/vela.ini", "--system-config",
                     system, "--memory-mode", memory, "--output-dir", os.path.join(directory, "out")]
        # Vela's Python prints through sys.stdout, its compiler (regor) writes to descriptor 1
        with native_logs.captured((1, 2)) as native, contextlib.redirect_stdout(printed), \
                contextlib.redirect_stderr(printed):
            try:
                status = vela.main(arguments)
            except SystemExit as exit_:  # argparse's way of refusing a flag
                status = exit_.code
            except Exception as error:  # noqa: BLE001 - Vela's own failure, in its words
                status, printed_error = 1, f"{type(error).__name__}: {error}"
                print(printed_error)
    text = printed.getvalue() + "\n".join(native)
    counts = {kind.lower(): int(count) for kind, count in _VELA_COUNT.findall(text)}
    if status != 0 or set(counts) != {"cpu", "npu"}:
        last = (text.strip() or "no output").splitlines()[-1]
        raise errors.TargetToolFailed(f"Vela ({accelerator}) failed (exit {status}): {last[:300]}")
    figures = {"npu_operators": counts["npu"], "cpu_operators": counts["cpu"],
               "cpu_operator_reasons": _cpu_operator_reasons(text)}
    return RuntimeCheck(tool, f"Vela {accelerator}: {counts['npu']} operators on the NPU, {counts['cpu']} on the CPU",
                        figures)


def analyze_for_gpu(tflite_model):
    """TensorFlow's GPU-delegate compatibility analyzer; its verdict and the ops it warns about."""
    import tensorflow as tf

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        tf.lite.experimental.Analyzer.analyze(model_content=bytes(tflite_model), gpu_compatibility=True)
    text = printed.getvalue()
    warnings = sorted({line.strip() for line in text.splitlines() if "GPU COMPATIBILITY WARNING" in line})
    if warnings:
        raise errors.TargetRejected("the GPU compatibility analyzer warns: " + "; ".join(warnings)[:300])
    if "looks compatible with GPU delegate" not in text:
        raise errors.TargetToolFailed("the GPU compatibility analyzer gave no verdict")
    return RuntimeCheck(f"tf.lite.experimental.Analyzer (TF {tf.__version__})",
                        "the GPU compatibility analyzer finds the model compatible")
