"""Whether this process is `python -m keras_gelu.converters`, the `keras-gelu-convert` command, starting.

Python imports a module's packages, running their __init__ files, before it runs the module: keras_gelu's imports
TensorFlow and Keras (5 s, and TensorFlow's start-up lines on stderr before the command's --help), which the
command never uses: its conversions run in the sandbox's processes, which import them there. While Python locates
the module, sys.argv[0] is "-m" and the module's own arguments follow, as they end sys.orig_argv, so the element
of sys.orig_argv before them names the module ("keras_gelu.converters", or "-m…" where the flag holds it). The
packages' __init__ files then leave their imports to the processes that use them, as the command's launcher
(`keras_gelu_launcher`, outside keras_gelu) does. Standard library only.
"""

import sys

COMMAND_MODULE = "keras_gelu.converters"


def the_command_is_starting():
    """True while Python locates keras_gelu.converters to run it as `python -m` (Python 3.10 and later, which
    record sys.orig_argv; on 3.9 the packages import as they always do, the command no different but slower)."""
    original = getattr(sys, "orig_argv", None)
    if sys.argv[:1] != ["-m"] or not original or len(original) <= len(sys.argv):
        return False
    named = original[len(original) - len(sys.argv)]
    return named == COMMAND_MODULE or (named.startswith("-") and named.endswith("m" + COMMAND_MODULE))
