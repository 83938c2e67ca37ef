"""The package's words as data: which GELU, how builtin ops spell exact GELU, and the conversion modes.

Layers, converter, QAT, report and README all use these names. No TensorFlow
here: the command line checks its flags against them before TensorFlow starts.

* A GELU *function* is "exact" (x * Phi(x)), "tanh" or "sigmoid"
  (x * sigmoid(1.702 x)). Other libraries' names are accepted too:
  PyTorch's approximate="none" is exact, Keras's False and True are exact
  and tanh.
* *exact_as* is how builtin mode computes exact GELU, which TFLite has no
  builtin op for: "sigmoid", "tanh" or "erf" (the command's --form).
* A *mode* is the op set a conversion targets, with what follows from it.
"""

import dataclasses

FUNCTIONS = ("exact", "tanh", "sigmoid")
_PYTORCH_NAMES = {"none": "exact"}
_KERAS_BOOLEANS = {False: "exact", True: "tanh"}

EXACT_AS = ("sigmoid", "tanh", "erf")

# The float types a converted graph computes in float32 instead, as TFLite computes floats (the report names them).
RETYPED_TO_FLOAT32 = ("bfloat16", "float16", "float64")


def gelu_function(approximate):
    """The canonical name of the GELU that `approximate` names.

    Accepts "exact", "tanh" and "sigmoid", PyTorch's "none", and Keras's
    booleans (False is exact, True is tanh).
    """
    if isinstance(approximate, bool):
        return _KERAS_BOOLEANS[approximate]
    if isinstance(approximate, str):
        function = _PYTORCH_NAMES.get(approximate, approximate)
        if function in FUNCTIONS:
            return function
    raise ValueError(
        'Argument `approximate` must be one of "exact" (or "none"), "tanh", "sigmoid", '
        f"False or True. Received: approximate={approximate!r}"
    )


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    op_sets: tuple  # tf.lite.OpsSet names the .tflite may use
    rewrites: bool  # whether GELUs and bare erf are rewritten at all
    int8_as: str  # the mode whose int8 replacements an --int8 conversion uses
    exact_as: tuple  # the exact_as values it takes, the default first; () where exact GELU has an op
    summary: str


MODES = {
    mode.name: mode
    for mode in (
        Mode("builtin", ("TFLITE_BUILTINS",), True, "builtin", EXACT_AS,
             "TFLITE_BUILTINS only and no GELU op (default)"),
        Mode("native", ("TFLITE_BUILTINS",), True, "native", (), "TFLite's GELU op"),
        # Flex kernels compute in float: an int8 GELU left to them would be a
        # float island, so an int8 conversion rewrites as native mode does.
        Mode("select", ("TFLITE_BUILTINS", "SELECT_TF_OPS"), False, "native", (),
             "no rewrite, TFLITE_BUILTINS + SELECT_TF_OPS"),
    )
}
MODE_NAMES = tuple(MODES)
# The modes an int8 model can be trained for: those with int8 replacements of their own.
INT8_MODE_NAMES = tuple(name for name, mode in MODES.items() if mode.int8_as == name)


def check_mode(mode, choices=MODE_NAMES):
    if mode not in choices:
        raise ValueError(f"Argument `mode` must be one of {choices}. Received: mode={mode!r}")
    return MODES[mode]


def resolve_exact_as(mode, exact_as):
    """The exact_as a conversion in `mode` uses: the mode's default for None; None where the mode takes none."""
    choices = check_mode(mode).exact_as
    if exact_as is None:
        return choices[0] if choices else None
    if exact_as not in choices:
        if not choices:
            raise ValueError(f"Argument `exact_as` (the command's --form) applies to mode 'builtin' only. "
                             f"Received: mode={mode!r}, exact_as={exact_as!r}")
        raise ValueError(f"Argument `exact_as` must be one of {choices}. Received: exact_as={exact_as!r}")
    return exact_as


def conversion_mode(mode, int8):
    """The Mode a conversion in `mode` rewrites as: int8 uses the mode's int8_as."""
    chosen = check_mode(mode)
    return MODES[chosen.int8_as] if int8 else chosen
