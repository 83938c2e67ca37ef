"""keras-gelu-convert: the command line, a thin layer over convert.convert."""

import argparse
import os
import sys

EPILOG = """examples:
  keras-gelu-convert saved_model_dir                       # builtin ops, GELU as x*sigmoid(1.702x)
  keras-gelu-convert model.keras --mode builtin --form erf # exact GELU without the GELU op
  keras-gelu-convert saved_model_dir --mode native         # every GELU spelling -> TFLite's GELU op
  keras-gelu-convert saved_model_dir --mode select -o m.tflite --force
  keras-gelu-convert model.h5 --inputs batch.npz --max-drift 0.05 --report-json report.json
  keras-gelu-convert qat_saved_model --int8 --mode native  # a keras_gelu.quantization QAT model -> int8
  keras-gelu-convert saved_model_dir --int8 --calibration samples.npz --int8-io   # post-training int8

exit codes: 0 ok, 2 bad flags, 3 missing path, 4 not a model, 5 corrupt model,
6 unknown signature, 7 output exists, 8 output folder missing or not writable,
9 bad --inputs, 10 parity failure, 11 the TFLite converter failed, 1 internal error
"""


def _parser():
    from .convert import FORMS
    from .convert import MODES
    from .verify import DEFAULT_ATOL
    from .verify import DEFAULT_DYNAMIC_SIZE
    from .verify import DEFAULT_RTOL

    parser = argparse.ArgumentParser(
        prog="keras-gelu-convert",
        description="Convert a SavedModel, .keras or .h5 model to .tflite, rewriting every GELU spelling "
                    "into the op set the target runtime has, and verify the result.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="SavedModel directory, .keras or .h5 file")
    parser.add_argument("-o", "--output", help="the .tflite to write (default: <model>.tflite beside the input)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    parser.add_argument("--mode", choices=MODES, default="builtin",
                        help="builtin: TFLITE_BUILTINS only and no GELU op (default); native: TFLite's GELU op; "
                             "select: no rewrite, TFLITE_BUILTINS + SELECT_TF_OPS")
    parser.add_argument("--form", choices=FORMS,
                        help="builtin mode: how exact GELU is spelled (default sigmoid: x*sigmoid(1.702x); "
                             "tanh; erf: exact from a builtin erf polynomial)")
    parser.add_argument("--signature", help="signature to convert (default: serving_default or the only one)")
    parser.add_argument("--float16-weights", action="store_true", help="store weights as float16")
    parser.add_argument("--no-verify", dest="verify", action="store_false", help="skip the parity check")
    parser.add_argument("--inputs", help=".npz with one array per signature input (default: seeded random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--dynamic-size", type=int, default=DEFAULT_DYNAMIC_SIZE,
                        help=f"size given to dynamic dimensions of random inputs (default {DEFAULT_DYNAMIC_SIZE})")
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
    parser.add_argument("--int8-io", action="store_true", help="int8 inputs and outputs instead of float32")
    parser.add_argument("--max-steps", type=float,
                        help="int8 fidelity tolerance in steps of each output's int8 scale (default "
                             "10 for quantization-aware models; post-training differences are only reported)")
    parser.add_argument("--report-json", help="also write the report as JSON to this file")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    verbosity.add_argument("-v", "--verbose", action="store_true", help="print more detail")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def _check_flags(parser, args):
    if args.form is not None and args.mode != "builtin":
        parser.error(f"--form applies to --mode builtin only (got --mode {args.mode})")
    if not args.verify and (args.inputs or args.max_drift is not None):
        parser.error("--inputs and --max-drift need verification; drop --no-verify")
    for name in ("atol", "rtol", "max_drift"):
        value = getattr(args, name)
        if value is not None and not value >= 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    if args.dynamic_size < 1:
        parser.error("--dynamic-size must be >= 1")
    if not args.int8:
        for flag, value in (("--calibration", args.calibration), ("--int8-io", args.int8_io),
                            ("--max-steps", args.max_steps)):
            if value:
                parser.error(f"{flag} applies to --int8 only")
    elif args.float16_weights:
        parser.error("--int8 and --float16-weights exclude each other")
    if args.max_steps is not None and not args.max_steps >= 0:
        parser.error("--max-steps must be >= 0")


def _default_output(model):
    stripped = os.path.normpath(model)
    for suffix in (".keras", ".h5", ".hdf5"):
        if stripped.endswith(suffix):
            stripped = stripped[: -len(suffix)]
    return stripped + ".tflite"


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    _check_flags(parser, args)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported

    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # TF's deprecation notices are not the user's business

    from .convert import check_output_path
    from .convert import convert
    from .convert import write_atomically
    from . import errors

    output = args.output or _default_output(args.model)
    try:
        check_output_path(output, args.force)
        if args.report_json:
            check_output_path(args.report_json, force=True)
        tflite_model, report = convert(
            args.model, mode=args.mode, form=args.form or "sigmoid", signature=args.signature,
            float16_weights=args.float16_weights, verify=args.verify, inputs=args.inputs, seed=args.seed,
            dynamic_size=args.dynamic_size, atol=args.atol, rtol=args.rtol, max_drift=args.max_drift,
            int8=args.int8, calibration=args.calibration, int8_io=args.int8_io, max_steps=args.max_steps)
        write_atomically(tflite_model, output, args.force)
        report.output = output
        if args.report_json:
            write_atomically(report.to_json().encode(), args.report_json, force=True)
    except errors.ConversionError as error:
        if args.debug:
            raise
        if isinstance(error, errors.ParityFailure) and not args.quiet:
            print(error.report.to_text(args.verbose), file=sys.stderr)
        print(f"keras-gelu-convert: error: {error.message}", file=sys.stderr)
        return error.exit_code
    except Exception as error:  # noqa: BLE001 - one line, not a traceback, for anything unforeseen
        if args.debug:
            raise
        print(f"keras-gelu-convert: internal error: {type(error).__name__}: {' '.join(str(error).split())[:300]} "
              "(rerun with --debug for a traceback)", file=sys.stderr)
        return 1
    if not args.quiet:
        print(report.to_text(args.verbose), file=sys.stderr)
    return 0
