"""The import structure: no cycle between our modules, the core never imports the converter, and
`import keras_gelu` stays light. Imports are read from the source, function-local ones included."""

import ast
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.legs("keras3", "tf_keras")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Source folder -> installed package name, as setup.cfg's package_dir maps them.
PACKAGE_DIRS = {"keras_gelu": "keras_gelu", "converters/launcher": "keras_gelu_launcher",
                "converters": "keras_gelu.converters"}
CONVERTERS = "keras_gelu.converters"


def _module_files():
    """{module name: (path, whether it is a package's __init__)} of every installed module."""
    modules = {}
    for folder, package in PACKAGE_DIRS.items():
        for directory, _, files in os.walk(os.path.join(ROOT, folder)):
            relative = os.path.relpath(directory, os.path.join(ROOT, folder))
            if "__pycache__" in relative or (folder == "converters" and relative.startswith("launcher")):
                continue
            prefix = package if relative == "." else package + "." + relative.replace(os.sep, ".")
            for name in files:
                if name.endswith(".py"):
                    is_init = name == "__init__.py"
                    module = prefix if is_init else f"{prefix}.{name[:-3]}"
                    modules[module] = (os.path.join(directory, name), is_init)
    return modules


def import_edges(modules):
    """{module: set of our modules it imports}, at module level or inside functions."""
    edges = {}
    for module, (path, is_init) in modules.items():
        package = module if is_init else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.add(submodule if submodule in modules else base)
        edges[module] = {target for target in targets if target in modules and target != module}
    return edges


def cycles(edges):
    """Every strongly connected group of two or more modules (Tarjan), as sorted lists."""
    index, lowlink, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = lowlink[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges.get(module, ()):
            if target not in index:
                visit(target)
                lowlink[module] = min(lowlink[module], lowlink[target])
            elif target in on_stack:
                lowlink[module] = min(lowlink[module], index[target])
        if lowlink[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_reader_sees_function_local_and_relative_imports():
    edges = import_edges(_module_files())
    assert "keras_gelu.qat" in edges["keras_gelu.converters.reading.loading"]  # imported inside a function
    assert "keras_gelu.converters.errors" in edges["keras_gelu.converters.running.pipeline"]  # from . import errors
    assert "keras_gelu.converters.cli" in edges["keras_gelu_launcher"]


def test_no_two_modules_import_each_other():
    assert cycles(import_edges(_module_files())) == []


def test_the_core_never_imports_the_converter():
    edges = import_edges(_module_files())
    offenders = {module: sorted(target for target in targets if target.startswith(CONVERTERS))
                 for module, targets in edges.items()
                 if module.split(".")[0] == "keras_gelu" and not module.startswith(CONVERTERS)}
    assert {module: targets for module, targets in offenders.items() if targets} == {}


def _modules_after(*statements):
    """The modules loaded after each statement, run one after the other in one fresh process (the leg's own
    environment: TF_USE_LEGACY_KERAS as the leg sets it)."""
    code = "import sys\n" + "\n".join(f"{statement}\nprint(' '.join(sorted(sys.modules)))" for statement in statements)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, check=True)
    return [set(line.split()) for line in result.stdout.splitlines()[-len(statements):]]


# `import tensorflow` itself loads the TFLite schema and flatbuffer tools
# (tensorflow.lite.python.schema_py_generated, tensorflow.lite.tools.
# flatbuffer_utils; TF 2.21), so what the core can keep out is our own
# conversion pipeline and tfmot.

_QAT_UNDER_TFMOT = "import keras_gelu.qat.tfmot.configs"


@pytest.fixture(scope="module")
def loaded_after():
    """{statement: the modules loaded once it has run}: `import keras_gelu`, then tfmot's QAT; one process for
    both, as a start costs TensorFlow's import (15-30 s on a slow 2-core machine). In the tf-keras leg only, the
    one where both statements apply: what the core imports, for either flavour, is read from the source above,
    and this process sees what only running shows (an import made by a function the core calls)."""
    statements = ["import keras_gelu"]
    if importlib.util.find_spec("tensorflow_model_optimization") is not None:
        statements.append(_QAT_UNDER_TFMOT)
    return dict(zip(statements, _modules_after(*statements)))


@pytest.mark.legs("tf_keras")
def test_import_keras_gelu_loads_neither_tfmot_nor_the_converter(loaded_after):
    loaded = loaded_after["import keras_gelu"]
    assert "keras_gelu.layers" in loaded  # the check sees our modules at all
    assert not {name for name in loaded if name.startswith(("tensorflow_model_optimization", CONVERTERS))}


@pytest.mark.legs("tf_keras")  # tfmot QAT is tf-keras's
def test_quantization_aware_training_loads_no_conversion_pipeline(loaded_after):
    if _QAT_UNDER_TFMOT not in loaded_after:
        pytest.skip("tfmot QAT needs tensorflow-model-optimization")
    loaded = loaded_after[_QAT_UNDER_TFMOT]
    assert "tensorflow_model_optimization" in loaded
    assert not {name for name in loaded if name.startswith(CONVERTERS)}


@pytest.mark.legs("keras3", "tf218")  # the two environments with TensorFlow the Makefile makes, each once
def test_every_installed_module_this_process_loaded_comes_with_its_bytecode():
    """The install compiles (uv's --compile-bytecode, as pip does): a process that finds no .pyc compiles what it
    imports, and does so at every start where PYTHONDONTWRITEBYTECODE is set or it may not write (the sandbox's
    workers). The converter's import took 12-13 s so, where it takes 5."""
    site_packages = os.path.dirname(os.path.dirname(np.__file__))
    sources = {module.__file__ for module in list(sys.modules.values())
               if (getattr(module, "__file__", None) or "").startswith(site_packages)
               and module.__file__.endswith(".py")}
    assert len(sources) > 500  # TensorFlow's and Keras's among them
    assert sorted(path for path in sources if not os.path.exists(importlib.util.cache_from_source(path))) == []
