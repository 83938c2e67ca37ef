"""The `keras-gelu-convert` command: argument and path errors in well under a second.

Importing keras_gelu.converters.cli the ordinary way first runs
keras_gelu/__init__.py, which imports TensorFlow and Keras (about 5 s) so that
keras_gelu's layers are registered before any model is loaded. The command's
flag and path checks need none of that. So this launcher, a package of its
own outside keras_gelu, creates the keras_gelu and keras_gelu.converters
package objects without running their __init__ files, imports the CLI module
(which needs only the standard library), runs `parse` and `preflight`, and
only then, inside `cli.run` (whose log filter is by then in place), runs the
two __init__ files in their import order. Every module is imported once, under its ordinary name.

The converter computes in TensorFlow, so the command runs Keras 3 on its TensorFlow backend whatever
KERAS_BACKEND or ~/.keras/keras.json say: a .keras file saved on JAX or PyTorch loads there (the format is the
same on every backend), and a JAX user never switches backends by hand.
"""

import importlib.util
import os
import sys

_HELD_BACK = ("keras_gelu", "keras_gelu.converters")


def _create_packages_without_running_them():
    """[(module, spec)] for the packages created here (those not imported already)."""
    created = []
    for name in _HELD_BACK:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)
        created.append((module, spec))
    return created


def main():
    os.environ["KERAS_BACKEND"] = "tensorflow"
    created = _create_packages_without_running_them()
    from keras_gelu.converters import cli

    args = cli.parse()
    failed = cli.preflight(args)
    if failed is not None:
        return failed

    def run_package_initialisers():
        for module, spec in created:
            spec.loader.exec_module(module)

    return cli.run(args, before_import=run_package_initialisers)
