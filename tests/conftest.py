"""Test set-up shared by the whole suite.

The suite runs once per Keras flavour (`make test` sets TF_USE_LEGACY_KERAS),
and its backend-neutral part once more on Keras 3's JAX and PyTorch backends
(KERAS_BACKEND), in environments without TensorFlow. TensorFlow is given two
logical CPU devices before anything else touches it, so MirroredStrategy
tests have two replicas on this one-CPU machine; JAX gets two host devices,
for keras.distribution.DataParallel.
"""

import contextlib
import datetime
import gc
import os
import pty
import subprocess
import sys
import zlib
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The collector is off through the imports (TensorFlow's, Keras's, then each test module's as it is collected):
# the heap they make grows to about a million objects, which the collector walked again and again as it grew, to
# free next to nothing (1.9 s of each leg's collection). The first test's collection (pytest_runtest_setup) frees
# what they left, once, and turns it on.
gc.disable()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
if BACKEND == "jax":  # two host devices for keras.distribution.DataParallel, before JAX starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
if BACKEND == "tensorflow":
    import tensorflow as tf

    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )

settings.register_profile("keras_gelu", deadline=None, max_examples=100, derandomize=True)
settings.load_profile("keras_gelu")

import keras_gelu  # noqa: E402
from keras_gelu.flavour import keras  # noqa: E402

IS_KERAS3 = keras_gelu.KERAS_FLAVOUR == "keras3"

# The legs of `make test`, each a Keras flavour on a TensorFlow version (the Makefile sets oneDNN per leg), or
# Keras 3 on JAX or PyTorch. A test module says which legs it belongs to with `pytestmark = pytest.mark.legs(...)`:
# what differs between the legs runs in each, what does not runs once. Unmarked tests run in every TensorFlow leg.
LEGS = ("keras3", "tf_keras", "tf218", "jax", "torch")
if BACKEND != "tensorflow":
    LEG = BACKEND
else:
    LEG = "tf218" if tf.__version__.startswith("2.18") else "keras3" if IS_KERAS3 else "tf_keras"


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("legs")
        if marker is None and LEG in ("jax", "torch"):  # unmarked tests are TensorFlow's (every TensorFlow leg)
            item.add_marker(pytest.mark.skip(reason="runs in the TensorFlow legs"))
            continue
        if marker is not None and LEG not in marker.args:
            assert set(marker.args) <= set(LEGS), marker.args
            item.add_marker(pytest.mark.skip(reason=f"runs in the {' and '.join(marker.args)} leg(s)"))


# KG_EVERY_CASE=1 (`make test-every-case`): every case of the matrices `rotated` and `todays_share` take a share of.
EVERY_CASE = os.environ.get("KG_EVERY_CASE") == "1"


def todays_seed():
    """The seed of today's draws (`rotated`, `todays_share`, the graph fuzzer's programs): the day's ordinal, so
    that each day's run takes other cases; KG_SEED repeats a day's draw (the report header names it)."""
    return int(os.environ.get("KG_SEED", datetime.date.today().toordinal()))


FLAVOUR_LEGS = ("keras3", "tf_keras")


def _todays_leg(index, legs):
    return legs[(index + todays_seed()) % len(legs)]


def rotated(cases, legs=FLAVOUR_LEGS):
    """The share of `cases` (a parametrize list) this leg runs, where running each in every one of `legs` would
    repeat what does not differ between them: case i in legs[(i + day) % len(legs)] (todays_seed), so that each
    runs in one of them a day and in every one of them within len(legs) days, and what does differ (the flavour's
    model beside the conversion's mode, say) varies across the cases. A leg outside `legs`, or KG_EVERY_CASE=1,
    runs them all."""
    cases = list(cases)
    if LEG not in legs or EVERY_CASE:
        return cases
    return [case for index, case in enumerate(cases) if _todays_leg(index, legs) == LEG]


def rotated_test(index, legs=FLAVOUR_LEGS):
    """A mark that runs the test in one of `legs` a day, as `rotated` runs its case number `index`: for tests
    that are not one parametrize list (tests of one subject, `index` telling them apart)."""
    today = _todays_leg(index, legs)
    return pytest.mark.skipif(LEG in legs and LEG != today and not EVERY_CASE, reason=f"runs in the {today} leg today")


def todays_share(cases, count):
    """`count` of `cases` (a parametrize list) for a matrix whose cases run one mechanism on another parameter (a
    spelling, a mode, a layer): `make test` runs a share, and which share changes daily, where running them all
    in every run spent its budget on repeating one case. The cases in a fixed shuffled order (so that a share
    mixes every parameter), then a window of `count` of them that moves by `count` a day (todays_seed) and
    stands `count` further on in each leg: every case runs within ceil(len / count) days in each leg, and legs
    running the same matrix take different cases on a day. KG_EVERY_CASE=1 (`make test-every-case`) takes them
    all."""
    cases = list(cases)
    if EVERY_CASE or count >= len(cases):
        return cases
    order = np.random.default_rng(len(cases)).permutation(len(cases))
    start = (todays_seed() + LEGS.index(LEG)) * count
    return [cases[index] for index in sorted(order[(start + offset) % len(cases)] for offset in range(count))]


# Where a test's conversions of a model file run. The product has one route for a file: the sandbox, a confined process
# per model (a fork of a zygote, then a fresh process to check what it wrote), about 0.3 CPU-s a conversion beyond the
# conversion itself, mostly the kernel's forking and unmapping. Where the sandbox is a test's subject
# (`pytest.mark.through_the_sandbox`: its own modules, the file fuzzer's, memory's; the command's tests start the
# command) every conversion goes through it; of every other test, a quarter a day, which quarter changing daily
# (todays_seed), so that each test's conversions go through the sandbox within four days and each day's run sends about
# a quarter of every module's through it. The rest run the same pipeline in this process (conversions.convert_here),
# their reports read back as the supervisor reads a worker's. KG_EVERY_CASE=1 sends every conversion through the
# sandbox.
SANDBOXED_SHARE = 4


def through_the_sandbox(item):
    """Whether `item`'s conversions of a model file go through the sandbox today (see SANDBOXED_SHARE)."""
    return (EVERY_CASE or item.get_closest_marker("through_the_sandbox") is not None
            or (zlib.crc32(item.nodeid.encode()) + todays_seed()) % SANDBOXED_SHARE == 0)


@pytest.fixture(autouse=True)
def _conversions_route(request):
    if BACKEND != "tensorflow" or through_the_sandbox(request.node):
        yield
        return
    import conversions
    from keras_gelu import converters

    converters.convert = conversions.convert_here
    try:
        yield
    finally:
        converters.convert = conversions.CONVERT


class BuiltOnFirstUse(dict):
    """key -> what `build(key)` makes, each built when a test first asks for it: a module-scoped fixture of
    costly cases of which a leg's share of the tests uses some."""

    def __init__(self, build):
        super().__init__()
        self._build = build

    def __missing__(self, key):
        self[key] = built = self._build(key)
        return built


def run_command(*argv, terminal=False, **environment):
    """The installed keras-gelu-convert in a process of its own, as a user's shell runs it: at TensorFlow's
    default log level (the suite's is quieter), so that the native chatter the command filters is there, with
    `environment` added; (exit code, stderr). With `terminal`, its stderr is a terminal's (see on_a_terminal)."""
    command = os.path.join(os.path.dirname(sys.executable), "keras-gelu-convert")
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", **environment}
    if terminal:
        code, _, shown = on_a_terminal([command, *argv], environment)
        return code, shown
    result = subprocess.run([command, *argv], capture_output=True, text=True, timeout=600, env=environment)
    return result.returncode, result.stderr


def on_a_terminal(argv, environment):
    """Run argv with its stderr on a pseudo-terminal and its stdout on a pipe: (exit code, stdout, what the
    terminal received, its line ends made "\n")."""
    terminal, its_end = pty.openpty()
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=its_end,
                          env=environment) as process:
        os.close(its_end)
        received = []
        while True:
            try:
                chunk = os.read(terminal, 1 << 16)
            except OSError:  # EIO: the last process that had the terminal closed it
                break
            if not chunk:
                break
            received.append(chunk)
        os.close(terminal)
        stdout = process.stdout.read().decode()
        code = process.wait(timeout=600)
    return code, stdout, b"".join(received).decode(errors="replace").replace("\r\n", "\n")


def last_error_line(stderr):
    """The command's one error line, the last on stderr, after no traceback."""
    lines = stderr.strip().splitlines()
    assert lines and "Traceback" not in stderr, stderr
    assert lines[-1].startswith("keras-gelu-convert: error: "), stderr
    return lines[-1]


keras3_only = pytest.mark.skipif(not IS_KERAS3, reason="Keras 3 API (TF_USE_LEGACY_KERAS unset)")
tf_keras_only = pytest.mark.skipif(IS_KERAS3, reason="tf-keras API (TF_USE_LEGACY_KERAS=1)")


def clear_keras_state():
    """keras.backend.clear_session(), in Keras 3 without the full garbage collection it adds by default: over a
    whole leg's heap that took a second or more per call, most of the leg's time. Python's own collector frees the
    same objects as it goes. On PyTorch, without the reset of PyTorch's compiler (dynamo) it adds too: what dynamo
    keeps is PyTorch's, each entry guarded by what it was compiled for, and its reset made every test compile
    keras_gelu's kernels again (25-39 s of the PyTorch leg's 114, from an empty kernel cache)."""
    if not IS_KERAS3:
        keras.backend.clear_session()
        return
    with mock.patch("torch._dynamo.reset", lambda: None) if BACKEND == "torch" else contextlib.nullcontext():
        keras.backend.clear_session(free_memory=False)


@pytest.fixture(autouse=True)
def _float32_policy_and_fresh_session():
    """Each test starts and ends under the float32 policy with a clean Keras state."""
    keras.mixed_precision.set_global_policy("float32")
    clear_keras_state()
    yield
    keras.mixed_precision.set_global_policy("float32")


# A full garbage collection walks every object the process holds, and a flavour leg's heap grows to 1.4-1.7 million
# of them (TensorFlow's and Keras's imports, then what each test module leaves in their caches); TensorFlow's
# converter asks for one at each conversion, Python for one as the heap grows: 32 s of the Keras 3 leg, 22 s of
# the tf-keras leg. What is left when a module's first test starts is frozen (gc.freeze: no later collection
# walks it; what nothing refers to any more is still freed), so that a collection walks what the current module
# made.
_module_of_the_last_test = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.module is not _module_of_the_last_test[0]:
        if _module_of_the_last_test[0] is None:
            gc.enable()  # off since the imports (above)
        _module_of_the_last_test[0] = item.module
        gc.collect()
        gc.freeze()


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)


def _cpu_kind():
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return "unknown CPU"
    return " ".join(flag for flag in ("avx2", "avx512f", "avx512_vnni") if flag in flags) or "no AVX2"


def pytest_report_header(config):
    framework = f"tensorflow {tf.__version__}" if BACKEND == "tensorflow" else f"backend {BACKEND}"
    return (f"keras_gelu flavour: {keras_gelu.KERAS_FLAVOUR} (keras {keras.__version__}), {framework}, "
            f"TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS', '(unset: the CPU default)')}, "
            f"CPU: {_cpu_kind()}, matrices: "
            + ("every case (KG_EVERY_CASE=1)" if EVERY_CASE else f"today's share (KG_SEED={todays_seed()})"))
