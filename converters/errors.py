"""User errors of the converter, each with its own exit code.

Raised anywhere in the pipeline; the CLI prints the message as one line and
exits with the code (a traceback only with --debug).
"""


class ConversionError(Exception):
    exit_code = 1

    def __init__(self, message):
        super().__init__(message)
        self.message = message
        self.traceback = None  # where the sandbox's worker raised it, with --debug


class InternalError(ConversionError):
    """Anything unforeseen in the conversion process: a bug of ours, reported in one line."""

    exit_code = 1


class MissingPath(ConversionError):
    exit_code = 3


class NotAModel(ConversionError):
    exit_code = 4


class CorruptModel(ConversionError):
    exit_code = 5


class UnknownSignature(ConversionError):
    exit_code = 6


class OutputExists(ConversionError):
    exit_code = 7


class OutputNotWritable(ConversionError):
    exit_code = 8


class BadInputs(ConversionError):
    exit_code = 9


class ParityFailure(ConversionError):
    exit_code = 10

    def __init__(self, report, message):
        super().__init__(message)
        self.report = report  # the figures that failed, for the CLI to show


class ConverterFailed(ConversionError):
    exit_code = 11


class UntrustedModel(ConversionError):
    """The model could run code or reach outside the process, and --trust-model was not given."""

    exit_code = 12

    @classmethod
    def refused(cls, path, what):
        return cls(f"{path}: refused: {what}; if you made this model or trust its source, pass --trust-model "
                   "(convert(..., trust_model=True))")


class SandboxStopped(ConversionError):
    """The model tried to reach outside the conversion's sandbox (a file, a connection, a program), which denied
    it: what the op checks refuse up front, met while it ran (--trust-model, or a check's blind spot)."""

    exit_code = 12


class DoesNotFitTarget(ConversionError):
    """The .tflite has ops or tensor types the --target's runtime lacks (found from its op table)."""

    exit_code = 13


class TargetRejected(ConversionError):
    """The --target's own runtime or compiler, run on the .tflite, refused it."""

    exit_code = 14


class TargetToolFailed(ConversionError):
    """The --target's runtime or compiler is installed but crashed or answered nothing we can read."""

    exit_code = 15


class TimeLimitExceeded(ConversionError):
    """The conversion process ran past --time-limit and was stopped."""

    exit_code = 16


class MemoryLimitExceeded(ConversionError):
    """The conversion process used more memory than --memory-limit and was stopped."""

    exit_code = 17


class SizeLimitExceeded(ConversionError):
    """Part of a model file (a Keras config, an archive member) would inflate past its limit (--config-limit,
    --memory-limit)."""

    exit_code = 18


class ConversionCrashed(ConversionError):
    """The conversion process died (a signal: a crash in TensorFlow or a runtime) or ended without answering."""

    exit_code = 19


class NonFiniteWeights(ConversionError):
    """The model's weights hold NaN or Inf (a training that diverged): its .tflite would compute garbage."""

    exit_code = 20


class ModelTooLarge(ConversionError):
    """The model's weights pass what the route its flags take can hold (a protocol buffer's 2 GB)."""

    exit_code = 21


# argparse's own code for bad flags.
USAGE_EXIT_CODE = 2


class ScratchLimitExceeded(ConversionError):
    """The conversion wrote more in its scratch folder, in bytes or in files, than a conversion of its model
    needs: stopped."""

    exit_code = 22


class ScratchNotRemoved(ConversionError):
    """The conversion's scratch folder could not be removed afterwards: said, never left behind in silence."""

    exit_code = 23
