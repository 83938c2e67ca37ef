"""keras-gelu-convert: the command line, a thin layer over convert.convert_to_file.

Three steps, so that a mistake costs no TensorFlow start-up: `parse` and `preflight` check the flags, the
model path, the input and output files, and `run` hands the model to the sandbox. This process never imports
TensorFlow and never reads the model: the conversion runs in a confined process of its own (see `sandbox`),
and what it printed comes out here before the report or the one error line, which is always last. The
installed command goes through keras_gelu_launcher, which keeps keras_gelu's own TensorFlow import away.
"""

import argparse
import shutil
import sys
import time

from keras_gelu import vocabulary

from . import errors
from . import explanation
from . import native_logs
from . import paths
from . import safe_text
from . import targets
from .options import DEFAULT_ATOL
from .options import DEFAULT_CONFIG_LIMIT_MIB
from .options import DEFAULT_DYNAMIC_SIZE
from .options import DEFAULT_MIN_COSINE
from .options import DEFAULT_RTOL
from .sandbox import limits

EPILOG = """examples:
  keras-gelu-convert saved_model_dir                       # builtin ops, GELU as x*sigmoid(1.702x)
  keras-gelu-convert model.keras --mode builtin --form erf # exact GELU without the GELU op
  keras-gelu-convert saved_model_dir --mode native         # every GELU spelling -> TFLite's GELU op
  keras-gelu-convert saved_model_dir --mode select -o m.tflite --force
  keras-gelu-convert model.h5 --inputs batch.npz --max-drift 0.05 --report-json report.json
  keras-gelu-convert qat_saved_model --int8 --mode native  # a keras_gelu.qat QAT model -> int8
  keras-gelu-convert saved_model_dir --int8 --calibration samples.npz --int8-io   # post-training int8
  keras-gelu-convert model.keras --int8 --calibration samples.npz --explain why/  # every tensor's error, a page
  keras-gelu-convert model.keras --int16 --calibration samples.npz --target tflm  # 16x8, run in TFLite Micro
  keras-gelu-convert model.keras --int8 --calibration samples.npz --mixed-precision  # float where int8 loses it
  keras-gelu-convert model.keras --target tflm --int8 --calibration samples.npz   # run and sized in TFLite Micro
  keras-gelu-convert qat_saved_model --target ethos-u55                           # compiled by Vela, 100% NPU

exit codes: 0 ok (the .tflite written), 2 bad flags (an unknown --target among them), 3 missing path,
4 not a model, 5 corrupt model, 6 unknown signature, 7 output exists, 8 output folder missing or not
writable, 9 bad --inputs or --calibration, 10 parity failure (an int8 model below --min-cosine too),
11 the TFLite converter failed, 12 the model carries code or file-system ops (see --trust-model), 13 the
model has ops or types the --target lacks, 14 the --target's runtime or compiler refused it, 15 that tool
crashed, 16 past --time-limit, 17 past --memory-limit, 18 part of the file past its size limit (--config-limit),
19 the conversion process crashed, ended without an answer or left what no conversion leaves, 20 NaN or
Inf weights, 21 weights past what the route holds (2 GB frozen), 22 the conversion wrote past its scratch
folder's limits, 23 its scratch folder could not be removed, 1 internal error
"""


def _parser():
    parser = argparse.ArgumentParser(
        prog="keras-gelu-convert",
        description="Convert a SavedModel, .keras, .h5 or .tflite model to .tflite, rewriting every GELU spelling "
                    "into the op set the target runtime has, and verify the result.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="SavedModel directory, .keras, .h5 or .tflite file")
    parser.add_argument("-o", "--output", help="the .tflite to write (default: <model>.tflite beside the input)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    parser.add_argument("--target", choices=targets.TARGET_NAMES, metavar="RUNTIME",
                        help="convert for this runtime and check the result against it: "
                             + ", ".join(targets.TARGET_NAMES) + " (picks --mode/--form/--int8 when not given)")
    parser.add_argument("--allow-cpu-fallback", action="store_true",
                        help="--target: let ops the accelerator lacks run on the CPU beside it")
    parser.add_argument("--input-shape", action="append", metavar="NAME=D1,D2,...", default=[],
                        help="fix an input's shape (repeatable), e.g. input_ids=1,128: for --target runtimes that "
                             "need static shapes, where the model leaves a dimension open")
    parser.add_argument("--mode", choices=vocabulary.MODE_NAMES,
                        help="; ".join(f"{mode.name}: {mode.summary}" for mode in vocabulary.MODES.values()))
    parser.add_argument("--form", choices=vocabulary.EXACT_AS, dest="exact_as",
                        help="builtin mode: how exact GELU is computed (default sigmoid: x*sigmoid(1.702x); "
                             "tanh; erf: exact GELU within 1e-6, from LOGISTIC/MUL/ADD/MINIMUM)")
    parser.add_argument("--signature", help="signature to convert (default: serving_default or the only one)")
    parser.add_argument("--float16-weights", action="store_true", help="store weights as float16")
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="skip the parity check")
    parser.add_argument("--inputs", help=".npz with one array per signature input (default: seeded random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--dynamic-size", type=int, default=DEFAULT_DYNAMIC_SIZE,
                        help=f"size given to dynamic dimensions of random inputs and random:N calibration samples "
                             f"(default {DEFAULT_DYNAMIC_SIZE})")
    parser.add_argument("--atol", type=float, default=DEFAULT_ATOL,
                        help=f"fidelity tolerance, absolute (default {DEFAULT_ATOL})")
    parser.add_argument("--rtol", type=float, default=DEFAULT_RTOL,
                        help=f"fidelity tolerance, relative (default {DEFAULT_RTOL})")
    parser.add_argument("--max-drift", type=float,
                        help="fail if the .tflite differs from the original model by more than this (absolute)")
    parser.add_argument("--int8", action="store_true",
                        help="integer model: a quantization-aware (tfmot) model uses its trained ranges, a float "
                             "model needs --calibration")
    parser.add_argument("--calibration", metavar="FILE.npz|random:N",
                        help="post-training int8: samples along the first axis of one array per input, or N seeded "
                             "random samples")
    parser.add_argument("--int8-io", action="store_true", help="int8 inputs and outputs instead of float32 (int16 "
                                                                 "with --int16)")
    parser.add_argument("--int16", action="store_true",
                        help="16x8: int16 activations, int8 weights (TFLite Micro and LiteRT run it); like --int8, "
                             "a float model needs --calibration")
    parser.add_argument("--max-steps", type=float,
                        help="int8 fidelity tolerance in steps of each output's int8 scale (default "
                             "10 for quantization-aware models; post-training differences are only reported)")
    parser.add_argument("--min-cosine", type=float, default=DEFAULT_MIN_COSINE,
                        help=f"int8: the least cosine any output may keep against the float model, on the "
                             f"calibration samples or --inputs (default {DEFAULT_MIN_COSINE:g}; 0: no budget)")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="int8 below --min-cosine: lift the ops that lose the most to float, the worst first, "
                             "until it holds, keeping only the lifts it needs; the report lists what was lifted and "
                             "why")
    parser.add_argument("--explain", metavar="DIR",
                        help="write DIR/index.html, report.json and model_explorer.json: every tensor's error "
                             "against the float model, the worst first (also when the budget refuses the model)")
    parser.add_argument("--trust-model", action="store_true",
                        help="convert a model that carries Python code (a Lambda layer) or ops that reach outside "
                             "the process (file I/O, Python calls); only for models you made or trust")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help=f"stop the conversion after this long (default {limits.TIME_BASE_SECONDS} s plus "
                             f"{limits.TIME_PER_GIB_SECONDS} s per GiB of model)")
    parser.add_argument("--memory-limit", type=float, metavar="GIB",
                        help=f"stop the conversion past this much memory (default {limits.MEMORY_SHARE * 100:.0f}%% "
                             "of the machine's)")  # %%: argparse formats help with %
    parser.add_argument("--config-limit", type=float, metavar="MIB", default=DEFAULT_CONFIG_LIMIT_MIB,
                        help=f"refuse a Keras file whose model config inflates past this (default "
                             f"{DEFAULT_CONFIG_LIMIT_MIB:g} MiB)")
    parser.add_argument("--report-json", help="also write the report as JSON to this file")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    verbosity.add_argument("-v", "--verbose", action="store_true", help="print more detail")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"%(prog)s {keras_gelu_version()}")
    return parser


def keras_gelu_version():
    """The installed distribution's version, read without importing keras_gelu (and TensorFlow with it)."""
    from importlib import metadata

    try:
        return metadata.version("keras-gelu")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _input_shapes(parser, given):
    """{name: shape} from --input-shape NAME=D1,D2,... flags."""
    shapes = {}
    for text in given:
        name, _, dims = text.partition("=")
        try:
            shape = tuple(int(size) for size in dims.split(","))
        except ValueError:
            shape = ()
        if not name or not shape or min(shape) < 1:
            parser.error(f"--input-shape {text}: expected NAME=D1,D2,... with positive sizes, e.g. input_ids=1,128")
        shapes[name] = shape
    return shapes


def _check_flags(parser, args):
    args.input_shapes = _input_shapes(parser, args.input_shape)
    if args.int16:
        try:
            targets.check_int16(args.target, args.float16_weights)
        except ValueError as error:
            parser.error(str(error))
        args.int8 = True
    if args.target is not None:
        try:
            args.mode, args.exact_as, args.int8, args.int8_io = targets.resolve(
                args.target, args.mode, args.exact_as, args.int8, args.int8_io, args.float16_weights)
        except ValueError as error:
            parser.error(str(error))
    elif args.allow_cpu_fallback:
        parser.error("--allow-cpu-fallback applies to --target only")
    args.mode = args.mode or "builtin"
    if args.exact_as is not None and not vocabulary.MODES[args.mode].exact_as:
        parser.error(f"--form applies to --mode builtin only (got --mode {args.mode})")
    if not args.verify and (args.inputs or args.max_drift is not None):
        parser.error("--inputs and --max-drift need verification; drop --no-verify")
    for name in ("atol", "rtol", "max_drift"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.dynamic_size < 1:
        parser.error("--dynamic-size must be >= 1")
    for name in ("time_limit", "memory_limit", "config_limit"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if not args.int8:
        # A quantization-aware model converts to int8 for a target that runs int8, unasked: its limit may be set
        int8_implied = args.target is not None and targets.TARGETS[args.target].takes_int8
        for flag, given in (("--calibration", args.calibration is not None), ("--int8-io", args.int8_io),
                            ("--max-steps", args.max_steps is not None and not int8_implied),
                            ("--mixed-precision", args.mixed_precision)):
            if given:
                parser.error(f"{flag} applies to --int8 only")
    elif args.float16_weights:
        parser.error("--int8 and --float16-weights exclude each other")
    if args.max_steps is not None and not args.max_steps >= 0:
        parser.error("--max-steps must be >= 0")
    if not 0.0 <= args.min_cosine <= 1.0:
        parser.error("--min-cosine must be from 0 (no budget) to 1")
    if args.explain and not args.verify:
        parser.error("--explain runs the model to compare its tensors; drop --no-verify")
    if args.mixed_precision:
        if not args.verify or not args.min_cosine:
            parser.error("--mixed-precision lifts ops until --min-cosine holds on samples it runs: drop "
                         + ("--no-verify" if not args.verify else "--min-cosine 0"))
        try:
            targets.check_mixed_precision(args.target, args.int16, args.allow_cpu_fallback)
        except ValueError as error:
            parser.error(str(error))


def parse(argv=None):
    """The checked arguments; argparse exits with code 2 on bad flags."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check_flags(parser, args)
    args.output = args.output or paths.default_output(args.model, args.mode or "builtin")
    return args


def _say(text):
    """Print our text, its lines (split at line feeds, which we write) each made inert: a model's name it
    quotes can break no line and move no cursor."""
    print("\n".join(safe_text.inert(line) for line in text.split("\n")), file=sys.stderr)


class _ProgressLine:
    """On a terminal, one line of stderr naming the step and the time so far, rewritten in place from a few
    seconds in, and cleared before anything else is printed; nothing on a pipe or a file."""

    _AFTER_SECONDS = 3.0

    def __init__(self, stream):
        self._stream, self._started, self._shown = stream, time.monotonic(), ""
        self.enabled = stream.isatty()

    def __call__(self, step):
        elapsed = time.monotonic() - self._started
        if not self.enabled or elapsed < self._AFTER_SECONDS:
            return
        text = safe_text.inert(f"keras-gelu-convert: {step}, {elapsed:.0f} s")
        text = text[:shutil.get_terminal_size().columns - 1]  # a line that wraps cannot be rewritten in place
        if text != self._shown:
            self._stream.write("\r" + text + "\x1b[K")
            self._stream.flush()
            self._shown = text

    def clear(self):
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = ""


def _fail(error, args):
    """Print a user error as one line, the last; its exit code."""
    if args.debug and error.traceback:  # the conversion process's, attributed as all it prints
        _say("\n".join(native_logs.attributed(error.traceback.rstrip().split("\n"))))
    # one line even where the message quotes a model's name with a line break in it (the file fuzzer's find)
    _say(safe_text.inert(f"keras-gelu-convert: error: {error.message}"))
    return error.exit_code


def preflight(args):
    """Check the paths before any work: None if they are fine, else the exit code after a one-line error."""
    try:
        paths.model_kind(args.model)
        for option, path in (("--inputs", args.inputs), ("--calibration", args.calibration)):
            if path is not None and not path.startswith("random:"):
                paths.check_readable_file(path, option)
        paths.check_output_path(args.output, args.force)
        if args.report_json:
            paths.check_output_path(args.report_json, force=True)
        if args.explain:
            explanation.check_folder(args.explain, args.force)
    except errors.ConversionError as error:
        return _fail(error, args)
    return None


def run(args):
    """Convert, verify and write, in the sandbox; the exit code."""
    from .convert import convert_to_file

    progress = _ProgressLine(sys.stderr)
    progress.enabled = progress.enabled and not args.quiet

    def log(lines):  # the conversion process's own lines, attributed to it (convert_to_file)
        progress.clear()
        for line in [] if args.quiet else lines:
            _say(line)

    try:
        report = convert_to_file(
            args.model, args.output, force=args.force, log=log, debug=args.debug, mode=args.mode,
            exact_as=args.exact_as, signature=args.signature, float16_weights=args.float16_weights,
            verify=args.verify, inputs=args.inputs, seed=args.seed, dynamic_size=args.dynamic_size, atol=args.atol,
            rtol=args.rtol, max_drift=args.max_drift, int8=args.int8, calibration=args.calibration,
            int8_io=args.int8_io, int16=args.int16, max_steps=args.max_steps, trust_model=args.trust_model,
            target=args.target, allow_cpu_fallback=args.allow_cpu_fallback, input_shapes=args.input_shapes,
            time_limit=args.time_limit,
            memory_limit=args.memory_limit, config_limit=args.config_limit, min_cosine=args.min_cosine,
            explain=args.explain, mixed_precision=args.mixed_precision, progress=progress)
        if args.report_json:
            paths.write_atomically(report.to_json().encode(), args.report_json, force=True)
    except errors.ConversionError as error:
        progress.clear()
        if isinstance(error, errors.ParityFailure) and not args.quiet:
            _say(error.report.to_text(args.verbose))
        return _fail(error, args)
    except KeyboardInterrupt:
        progress.clear()
        _say("keras-gelu-convert: error: interrupted; nothing written")
        return 130
    if not args.quiet:
        _say(report.to_text(args.verbose))
    return 0


def main(argv=None):
    args = parse(argv)
    failed = preflight(args)
    return failed if failed is not None else run(args)
