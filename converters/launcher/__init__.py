"""The `keras-gelu-convert` command: a process that never imports TensorFlow.

Importing keras_gelu.converters.cli the ordinary way first runs
keras_gelu/__init__.py, which imports TensorFlow and Keras (about 5 s). The
command needs none of that: its flag and path checks take well under a
second, and the conversion itself runs in the sandbox's own process, which
imports TensorFlow there. So this launcher, a package of its own outside
keras_gelu, creates the keras_gelu and keras_gelu.converters package
objects without running their __init__ files, and imports the CLI module
(which needs only the standard library) beneath them.

The converter computes in TensorFlow, so the conversion runs Keras 3 on its TensorFlow backend whatever
KERAS_BACKEND or ~/.keras/keras.json say (`sandbox.supervisor` sets it): a .keras file saved on JAX or PyTorch
loads there (the format is the same on every backend), and a JAX user never switches backends by hand.
"""

import importlib.util
import sys

_HELD_BACK = ("keras_gelu", "keras_gelu.converters")


def _create_packages_without_running_them():
    for name in _HELD_BACK:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def _run_held_back_packages():
    """Run the __init__ files held back, into the package objects already made (TensorFlow's and Keras's
    import): the sandbox's zygote does it at the moment it chooses (`zygote.main`)."""
    for name in _HELD_BACK:
        module = sys.modules[name]
        module.__spec__.loader.exec_module(module)


def main():
    _create_packages_without_running_them()
    from keras_gelu.converters import cli

    return cli.main()


def zygote():
    """The sandbox's zygote (`python -c "import keras_gelu_launcher; keras_gelu_launcher.zygote()"`): started
    as `python -m keras_gelu.converters.sandbox.zygote`, Python would import keras_gelu, and with it TensorFlow
    and Keras, before the zygote could choose what they import."""
    _create_packages_without_running_them()
    from keras_gelu.converters.sandbox import zygote as the_zygote

    return the_zygote.main(_run_held_back_packages)
