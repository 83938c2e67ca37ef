"""The sandbox, its bounds and its crash isolation: what runs a model can act nowhere outside, hang nothing, crash
nothing of ours, and fake no success.

* The confinement on its own, in a bare process (no TensorFlow): the policy the worker applies, and every kind
  of escape it must deny (files, TCP, sockets, programs, processes, signals), beside what it must allow.
* Bounds: time (a loop of 2^62 trips), memory (a 3 GiB tf.fill), the size a Keras config or archive member
  inflates to; each one line with its own exit code, nothing written.
* Crash isolation: a worker made to die of SIGSEGV in each step; the step and the signal named, exit 19.
* Never garbage: NaN weights refused; a .tflite with a NaN scale, an index past its lists or a buffer past
  its end refused before any runtime reads it; a .tflite that gives NaN where the model is finite fails parity.
* Linear in the graph: the transform of nested control flow does work proportional to the nest, not its square.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
import tensorflow as tf

import spelling_models
import tflite_helpers
from conftest import IS_KERAS3
from conftest import keras
from conftest import last_error_line
from conftest import on_a_terminal
from conversions import convert_here
from keras_gelu import converters
from keras_gelu.converters import cli
from keras_gelu.converters import errors
from keras_gelu.converters.reading import loading
from keras_gelu.converters.rewriting import graph
from keras_gelu.converters.running import pipeline
from keras_gelu.converters.sandbox import landlock
from keras_gelu.converters.tflite import flatbuffer_model
from keras_gelu.converters.tflite import validation

# One leg: the sandbox is the same for either Keras (the corpus runs in every leg, in test_trust.py).
pytestmark = [pytest.mark.legs("tf_keras"), pytest.mark.through_the_sandbox]

try:
    LANDLOCK = landlock.abi_version()
except landlock.Unavailable:
    LANDLOCK = None
needs_landlock = pytest.mark.skipif(LANDLOCK is None, reason="this kernel offers no Landlock")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return spelling_models.save("tf_nn_gelu", str(tmp_path_factory.mktemp("small") / "model"))


# --- the confinement on its own ----------------------------------------------------------------------------

_PROBE = textwrap.dedent("""
    import json, os, socket, sys
    import keras_gelu_launcher
    keras_gelu_launcher._create_packages_without_running_them()  # no TensorFlow: the policy is plain Python
    from keras_gelu.converters.sandbox import landlock, policy, seccomp
    model, scratch, secret, port, parent = sys.argv[1:6]
    policy.static_reads()  # made before the fork, as the zygote makes them: the worker inherits them
    if os.fork():
        sys.exit(os.waitstatus_to_exitcode(os.wait()[1]))
    zygote = os.getppid()
    landlock.restrict(policy.file_rules([model], scratch))
    seccomp.restrict(policy.system_calls(os.getpid()))
    def attempt(action):
        try:
            action()
            return "allowed"
        except OSError as error:
            return "denied"
    def connect():
        with socket.create_connection(("127.0.0.1", int(port)), timeout=2):
            pass
    results = {
        "read the model": attempt(lambda: open(model, "rb").read()),
        "write in the scratch folder": attempt(lambda: open(os.path.join(scratch, "f"), "w").write("x")),
        "import a module not loaded yet": attempt(lambda: __import__("xml.dom.minidom")),
        "read the secret": attempt(lambda: open(secret).read()),
        "list the secret's folder": attempt(lambda: os.listdir(os.path.dirname(secret))),
        "write beside the secret": attempt(lambda: open(secret + ".copy", "w")),
        "write in /tmp": attempt(lambda: open("/tmp/keras_gelu_sandbox_probe", "w")),
        "read the home folder": attempt(lambda: os.listdir(os.path.expanduser("~"))),
        "connect over TCP": attempt(connect),
        "open a unix socket": attempt(lambda: socket.socket(socket.AF_UNIX)),
        "start a program": attempt(lambda: os.execv("/bin/true", ["/bin/true"])),
        "fork": attempt(os.fork),
        "signal its parent": attempt(lambda: os.kill(int(parent), 0)),
        "read its own /proc entry": attempt(lambda: open("/proc/self/status").read()),
        "read the /proc entry of the process it forked from": attempt(lambda: open(f"/proc/{zygote}/environ").read()),
    }
    print(json.dumps(results), flush=True)
    os._exit(0)
""")


@needs_landlock
def test_a_confined_process_reaches_its_model_and_scratch_folder_and_nothing_else(tmp_path):
    """The worker's policy, applied in a bare Python process forked, as a worker is, from one that made the static
    reads: everything a model could do outside is denied; /proc/self is the worker's own, not the process it was
    forked from."""
    from keras_gelu.converters.sandbox import seccomp

    try:
        seccomp._library()
    except seccomp.Unavailable:
        pytest.skip("no libseccomp here")
    model, scratch, private = tmp_path / "model.bin", tmp_path / "scratch", tmp_path / "private"
    model.write_bytes(b"weights")
    scratch.mkdir()
    private.mkdir()
    (private / "secret").write_text("hunter2")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        result = subprocess.run([sys.executable, "-c", _PROBE, str(model), str(scratch), str(private / "secret"),
                                 str(port), str(os.getpid())], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout)
    allowed = {"read the model", "write in the scratch folder", "import a module not loaded yet",
               "read its own /proc entry"}
    assert {what for what, outcome in results.items() if outcome == "allowed"} == allowed, results
    assert not (private / "secret.copy").exists() and not os.path.exists("/tmp/keras_gelu_sandbox_probe")


def test_the_reads_a_worker_inherits_are_its_own_in_fewer_rules(tmp_path, monkeypatch):
    """The reads every worker makes (the installation, the code loaded, the system's files), made once where the
    zygote forks (policy.static_reads): each one a worker would make itself, and every other lies beneath one of
    them where the kernel finds it (its real path), so the rules grant the same in fewer (a tenth as many here);
    /proc/self left for each worker to resolve (here it would name this process); made again once a module is
    loaded from a folder of its own."""
    from keras_gelu.converters.sandbox import policy

    every, inherited = policy._static_reads(), policy.static_reads()
    assert set(inherited) <= every and len(inherited) < len(every) / 2, (len(inherited), len(every))
    places = {os.path.realpath(path) for path in inherited if not path.startswith("/proc/")}
    folders = {place for place in places if os.path.isdir(place)}
    for path in every - set(inherited):
        place = os.path.realpath(path)
        assert place in places or any(place.startswith(folder + os.sep) for folder in folders), path
    assert "/proc/self" in inherited
    package = tmp_path / "loaded_late"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        __import__("loaded_late")
        assert str(package) in policy.static_reads()
    finally:
        sys.modules.pop("loaded_late", None)


def test_the_zygote_holds_no_thread_of_tensorflow_s(small_model):
    """A worker is a fork of the zygote, which copies only the forking thread: a thread pool TensorFlow had started
    in the zygote (for any graph it built, a session, an eager op; a conversion of a model of our own to warm it)
    would be missing in every worker, its work queued for ever (measured: a conversion in a process forked after
    one hangs). So the zygote imports and runs nothing, and TensorFlow names each thread it starts."""
    from keras_gelu.converters.sandbox import supervisor

    converters.convert(small_model)
    zygote = next(iter(supervisor._zygotes.values())).process.pid
    names = []
    for thread in os.listdir(f"/proc/{zygote}/task"):
        with open(f"/proc/{zygote}/task/{thread}/comm") as stream:
            names.append(stream.read().strip())
    assert names and not [name for name in names if name.startswith("tf_")], names


def test_a_worker_traces_the_gelu_kernels_as_plain_functions_not_for_xla(small_model, tmp_path, monkeypatch, capsys):
    """A worker runs its model once, for parity: the zygote has the GELU kernels traced without XLA
    (xla_kernels.compile_with_xla), which would compile each for each shape it meets in every worker."""
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent("""
        import tensorflow as tf
        import keras_gelu
        traced = tf.function(lambda x: keras_gelu.gelu(x, "exact")).get_concrete_function(tf.TensorSpec(None))
        library = traced.graph.as_graph_def().library.function
        compiled = [function for function in library if function.attr["_XlaMustCompile"].b]
        print(f"kernels traced: {len(library)}, for XLA: {len(compiled)}", flush=True)
    """))
    monkeypatch.setenv("KERAS_GELU_TEST_PAYLOAD", str(payload))
    converters.convert(small_model)
    traced, for_xla = map(int, re.search(r"kernels traced: (\d+), for XLA: (\d+)", capsys.readouterr().err).groups())
    assert traced >= 1 and for_xla == 0


def test_a_worker_s_garbage_collections_walk_none_of_what_the_zygote_imported(small_model, tmp_path, monkeypatch,
                                                                               capsys):
    """The zygote freezes its objects before it forks: a worker's full collection walks only what the worker
    made, where it would walk (and so copy the pages of) every object of TensorFlow's and Keras's."""
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent("""
        import gc
        print(f"frozen: {gc.get_freeze_count()}, collectable: {len(gc.get_objects())}", flush=True)
    """))
    monkeypatch.setenv("KERAS_GELU_TEST_PAYLOAD", str(payload))
    converters.convert(small_model)
    frozen, collectable = map(int, re.search(r"frozen: (\d+), collectable: (\d+)", capsys.readouterr().err).groups())
    # TensorFlow and Keras alone make some hundred thousand objects the collector tracks; the payload, a few
    assert frozen > 100_000 and collectable < frozen / 20, (frozen, collectable)


def test_a_worker_finds_what_tracing_a_keras_file_converts_with_autograph_already_converted(tmp_path, monkeypatch,
                                                                                            capsys):
    """The zygote converts ahead, with autograph, what tracing a Keras model converts (loading.autograph_ahead):
    in a worker, tracing a tf-keras .h5 of keras_gelu's layers parses and rewrites no function's source (each one
    took 0.02-0.1 s of every conversion). The payload notes each conversion autograph makes in the worker, its
    own function's too: the note is seen. And the worker inherits no generated module in sys.modules: their
    files, written in the shared /tmp, became read rules of every worker (and a file another user could plant
    the bytecode of), where the zygote now writes them in a folder of its own, removed."""
    import keras_gelu

    inputs = keras.Input((8,))
    hidden = keras_gelu.LearnableGELU()(keras_gelu.GELU(approximate="tanh")(keras.layers.Dense(16)(inputs)))
    path = str(tmp_path / "model.h5")
    keras.Model(inputs, keras.layers.Dense(4, activation=keras_gelu.GELU())(hidden)).save(path)
    payload = tmp_path / "payload.py"
    payload.write_text(textwrap.dedent("""
        import os
        import sys

        import tensorflow as tf
        from tensorflow.python.autograph.pyct import transpiler

        original = transpiler.GenericTranspiler.transform_function

        def noted(self, function, context):
            print(f"autograph converts {function.__qualname__}", flush=True)
            return original(self, function, context)

        transpiler.GenericTranspiler.transform_function = noted
        generated = [name for name in sys.modules if name.startswith("__autograph_generated_file")]
        print(f"generated modules inherited: {len(generated)}", flush=True)
        try:  # a function of the worker's own: noted, then refused (the worker may not read that module's source)
            tf.autograph.to_graph(os.path.basename)
        except Exception:
            pass
    """))
    monkeypatch.setenv("KERAS_GELU_TEST_PAYLOAD", str(payload))
    converters.convert(path)
    printed = capsys.readouterr().err
    assert re.findall(r"autograph converts (\S+)", printed) == ["basename"]
    assert re.search(r"generated modules inherited: 0\b", printed), printed


def test_a_package_registered_after_the_zygote_started_is_imported_there_once_not_by_each_worker(
        small_model, tmp_path, monkeypatch, capsys):
    """Each job names the packages the caller has registered Keras classes of (supervisor._registering_packages),
    and the zygote imports one registered since it started before it forks the job's worker, as it imports those
    registered before at its start: no worker imports it again for its file (keras-hub, registered after a first
    conversion: each conversion of a BERT backbone 1.3-1.4 s, 1.0-1.1 s so). The payload looks, in the worker,
    before the file is loaded. A package the zygote could not import (in the caller's own folder, not on the
    zygote's path) is not tried again before each later job: a module of its name planted since in a folder on
    the zygote's path would run there, unconfined (an attacker helper's reproduction)."""
    site, own = tmp_path / "site", tmp_path / "own"
    (site / "late_registered_layers").mkdir(parents=True)
    own.mkdir()
    layer = textwrap.dedent("""
        from keras_gelu.flavour import keras

        @keras.saving.register_keras_serializable(package="{package}")
        class Doubled(keras.layers.Layer):
            def call(self, x):
                return 2.0 * x
    """)
    (site / "late_registered_layers" / "__init__.py").write_text(layer.format(package="late_registered_layers"))
    (own / "callers_own_layers.py").write_text(layer.format(package="callers_own_layers"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    converters.convert(small_model)  # this environment's zygote, started before the packages are registered
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(own))
    import callers_own_layers  # noqa: F401
    import late_registered_layers

    try:
        path = str(tmp_path / "model.keras")
        keras.Sequential([keras.Input((4,)), late_registered_layers.Doubled(), keras.layers.Dense(2)]).save(path)
        payload = tmp_path / "payload.py"
        payload.write_text("import sys\nprint('imported before the file:', 'late_registered_layers' in sys.modules)\n")
        monkeypatch.setenv("KERAS_GELU_TEST_PAYLOAD", str(payload))
        capsys.readouterr()
        converters.convert(path)
        assert "imported before the file: True" in capsys.readouterr().err
        planted = tmp_path / "the planted module ran"
        (site / "callers_own_layers.py").write_text(f"open({str(planted)!r}, 'w').close()\n")
        converters.convert(small_model)
        assert not planted.exists()
    finally:  # the next tests' jobs name none of it
        for name in ("late_registered_layers", "callers_own_layers"):
            keras.saving.get_custom_objects().pop(f"{name}>Doubled", None)
            sys.modules.pop(name, None)


def test_only_names_an_import_could_take_reach_the_zygote_as_packages_to_import(monkeypatch):
    """The packages the caller registered Keras classes of, by their classes' modules: a module named with a NUL
    (which no process argument can hold), a path, or nothing is none (an attacker helper's find: a traceback)."""
    from keras_gelu.converters.sandbox import supervisor

    custom = {f"odd>{index}": type("Odd", (), {"__module__": module})
              for index, module in enumerate(["bad\x00name.layers", "/etc", "", None, "fine_name.layers"])}
    monkeypatch.setattr(keras.saving, "get_custom_objects", lambda: custom)
    assert "fine_name" in supervisor._registering_packages()
    assert not [name for name in supervisor._registering_packages() if not name.isidentifier()]


def test_a_line_from_the_zygote_that_is_not_an_event_is_a_zygote_gone_not_a_traceback():
    """Whatever reaches the supervisor's end of the channel that is not a JSON object (a zygote's channel holds
    only its events, but the supervisor need not trust that) reads as a zygote that said nothing, which the
    supervisor closes and reports in one line."""
    from keras_gelu.converters.sandbox import channel
    from keras_gelu.converters.sandbox import supervisor

    reading, writing = os.pipe()
    zygote = supervisor._Zygote.__new__(supervisor._Zygote)
    zygote._events = channel.Lines(reading)
    try:
        for line in (b"sitecustomize: no JSON\n", b'"ready"\n', b"[1, 2]\n", b'{"started": 7}\n'):
            os.write(writing, line)
            assert zygote.next_event(5) == ({"started": 7} if line.startswith(b"{") else None)
    finally:
        os.close(reading)
        os.close(writing)


def test_a_package_that_runs_a_tensorflow_op_as_it_is_imported_is_left_to_each_worker(small_model, tmp_path,
                                                                                     monkeypatch):
    """A zygote forks only with no thread but its own: a package whose import runs a TensorFlow op (a constant
    computed at module level) starts TensorFlow's thread pools, and a worker forked after it waited on them until
    its time limit (an attacker helper's find). The zygote ends instead, naming the package, and the next leaves
    it to each worker, which imports it confined (its folder among what it may read; tf-keras, this leg's,
    imports no module a file names): the model converts, and so does every later one, from a zygote that still
    holds no thread. Only a thread
    the import started counts: with numpy's OpenBLAS pool there (no thread count set: the make legs set one),
    nothing else is blamed (an attacker helper's find). A thread that appears only later, before a fork (a
    package that starts one when its `__file__` is first read, as the zygote reads every module's), ends the
    zygote too, naming every package it imported for the caller. What a package prints, by Python or straight
    to the descriptor, as it is imported or as Python starts (a sitecustomize), goes to the zygote's log, not
    into its channel to the supervisor (an attacker helper's finds)."""
    from keras_gelu.converters.sandbox import supervisor

    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    site = tmp_path / "site"
    (site / "op_at_import_layers").mkdir(parents=True)
    (site / "op_at_import_layers" / "__init__.py").write_text(textwrap.dedent("""
        import os
        import tensorflow as tf
        from keras_gelu.flavour import keras

        print("op_at_import_layers: a banner on standard output")
        os.write(1, b"op_at_import_layers: and one written to its descriptor\\n")
        SCALE = float(tf.constant(2.0) * 1.0)

        @keras.saving.register_keras_serializable(package="op_at_import_layers")
        class Scaled(keras.layers.Layer):
            def call(self, x):
                return SCALE * x
    """))
    (site / "lazy_thread_layers").mkdir()
    (site / "lazy_thread_layers" / "__init__.py").write_text(textwrap.dedent("""
        import sys, threading, time, types
        from keras_gelu.flavour import keras

        class _StartsAThreadWhenAskedItsFile(types.ModuleType):
            @property
            def __file__(self):
                if not getattr(self, "started", False):
                    self.started = True
                    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
                return __spec__.origin

        @keras.saving.register_keras_serializable(package="lazy_thread_layers")
        class Same(keras.layers.Layer):
            def call(self, x):
                return x

        sys.modules[__name__].__class__ = _StartsAThreadWhenAskedItsFile
    """))
    (site / "sitecustomize.py").write_text("import os\nos.write(1, b'sitecustomize: no JSON\\n')\n")
    os.chmod(tmp_path, 0o755)  # the worker, as nobody where it may be, reads the package
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    converters.convert(small_model)  # this environment's zygote, started before the package is registered
    assert not supervisor._unforkable
    monkeypatch.syspath_prepend(str(site))
    import lazy_thread_layers
    import op_at_import_layers

    try:
        path = str(tmp_path / "model.keras")
        keras.Sequential([keras.Input((4,)), op_at_import_layers.Scaled(), lazy_thread_layers.Same(),
                          keras.layers.Dense(2)]).save(path)
        _, report = converters.convert(path, time_limit=60)
        assert report.verified and all(c["passed"] for c in report.fidelity), report.fidelity
        assert {"op_at_import_layers", "lazy_thread_layers"} <= supervisor._unforkable
        converters.convert(small_model, time_limit=60)
        zygote = next(iter(supervisor._zygotes.values())).process.pid
        assert os.listdir(f"/proc/{zygote}/task") == [str(zygote)]
    finally:  # the next tests' jobs name none of it, and their zygotes preload what they would
        for name in ("op_at_import_layers>Scaled", "lazy_thread_layers>Same"):
            keras.saving.get_custom_objects().pop(name, None)
        for name in ("op_at_import_layers", "lazy_thread_layers"):
            sys.modules.pop(name, None)
        supervisor._unforkable.clear()


@needs_landlock
def test_the_report_says_what_confined_the_conversion(small_model):
    _, report = converters.convert(small_model)
    assert report.containment.startswith("contained: Landlock ABI "), report.containment
    assert " + seccomp allow-list" in report.containment or "seccomp:" in report.containment
    closed = re.search(r"an unprivileged uid: (.*) is closed to other users\)$", report.containment)
    if os.getuid() != 0:
        assert report.containment.endswith("no capabilities") or "namespaces:" in report.containment
    elif closed is None:
        assert "uid 65534 (nobody), no capabilities" in report.containment, report.containment
    else:  # kept uid 0, naming what nobody could not reach: which util-linux's setpriv, as nobody, confirms
        assert "uid 0 without capabilities" in report.containment, report.containment
        if shutil.which("setpriv"):
            as_nobody = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "ls",
                                        closed[1]], capture_output=True)
            assert as_nobody.returncode != 0, closed[1]
    assert report.containment in report.to_text()
    assert report.peak_bytes > 0


def test_a_live_model_says_it_ran_in_your_process(rng):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="gelu")])
    _, report = converters.convert(model)
    assert report.containment.startswith("not contained: a live model object runs in your own process")


def test_the_command_imports_no_tensorflow_and_quiet_prints_nothing(small_model, tmp_path):
    """The command's own process reads no model and imports no TensorFlow: a conversion runs in the sandbox.
    Quiet, an int8 conversion (TensorFlow's start-up, the converter's and the calibrator's chatter, all in the
    worker's log) prints nothing, not even progress on a terminal. In a process of its own, at TensorFlow's
    default log level, its stderr a terminal."""
    probe = ("import sys\nfrom keras_gelu_launcher import main\nsys.argv = ['keras-gelu-convert'] + sys.argv[1:]\n"
             "code = main()\nprint('tensorflow' in sys.modules, 'keras' in sys.modules, code)")
    output = tmp_path / "m.tflite"
    code, stdout, shown = on_a_terminal([sys.executable, "-c", probe, small_model, "-o", str(output), "-q", "--int8",
                                         "--calibration", "random:4"], {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert code == 0 and stdout.split() == ["False", "False", "0"] and shown == "", shown
    assert output.read_bytes()[4:8] == b"TFL3"


# --- bounds ------------------------------------------------------------------------------------------------


def _saved(tmp_path, name, function):
    module = tf.Module()
    path = str(tmp_path / name)
    tf.saved_model.save(module, path, signatures={"serving_default": tf.function(
        function, input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])})
    return path


def test_a_loop_that_never_ends_stops_at_the_time_limit(tmp_path, capsys):
    def forever(x):
        steps = tf.while_loop(lambda i: i < 2**62, lambda i: i + 1, [tf.constant(0, tf.int64)])
        return {"y": tf.nn.gelu(x) + tf.cast(steps, tf.float32) * 0.0}

    output = tmp_path / "m.tflite"
    code = cli.main([_saved(tmp_path, "forever", forever), "-o", str(output), "--time-limit", "3"])
    line = last_error_line(capsys.readouterr().err)
    assert code == errors.TimeLimitExceeded.exit_code and not output.exists()
    assert "ran past the time limit of 3 s (--time-limit); nothing written" in line


def test_an_allocation_past_the_memory_limit_is_stopped_and_said_in_one_last_line(tmp_path, capsys):
    def fills(x):
        return {"y": tf.nn.gelu(x) + tf.reduce_sum(tf.fill([3 * 2**28], 1.0)) * 0.0}  # 3 GiB of float32

    output = tmp_path / "m.tflite"
    code = cli.main([_saved(tmp_path, "fills", fills), "-o", str(output), "--memory-limit", "2"])
    stderr = capsys.readouterr().err
    line = last_error_line(stderr)
    assert code == errors.MemoryLimitExceeded.exit_code and not output.exists(), stderr
    assert "used more than 2 GiB of memory (--memory-limit); nothing written" in line
    assert "allocator" not in stderr.lower()


def _keras_file_with_config(path, config_bytes):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.0"}))
        archive.writestr("config.json", config_bytes)
    return str(path)


def test_a_keras_config_that_inflates_past_its_limit_is_refused_before_it_is_read(tmp_path, capsys):
    """A zip bomb in config.json: 80 MB of JSON in 80 kB. Refused by its declared size, with nothing inflated."""
    bomb = _keras_file_with_config(tmp_path / "bomb.keras", b'{"class_name": "Sequential", "config": {}}'
                                   + b" " * (80 << 20))
    assert os.path.getsize(bomb) < 1 << 20
    code = cli.main([bomb, "-o", str(tmp_path / "m.tflite")])
    line = last_error_line(capsys.readouterr().err)
    assert code == errors.SizeLimitExceeded.exit_code
    assert f"config.json inflates to {(80 << 20) + 42:,} bytes, past the limit of {64 << 20:,} (--config-limit)" in line


def test_an_h5_config_past_a_small_limit_is_refused(tmp_path, capsys):
    import h5py

    path = str(tmp_path / "large_config.h5")
    with h5py.File(path, "w") as stream:
        stream.attrs["model_config"] = json.dumps({"class_name": "Sequential", "config": {"pad": "x" * (2 << 20)}})
    assert cli.main([path, "-o", str(tmp_path / "m.tflite"), "--config-limit", "1"]) == \
        errors.SizeLimitExceeded.exit_code
    assert "its model_config inflates to" in last_error_line(capsys.readouterr().err)


@pytest.mark.legs("keras3")  # a .keras archive is Keras 3's
def test_an_archive_member_past_the_memory_limit_is_refused_before_it_is_inflated(tmp_path, capsys):
    path = tmp_path / "member.keras"
    _keras_file_with_config(path, json.dumps({"class_name": "Sequential", "config": {"name": "s", "layers": []}}))
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive, \
            archive.open("model.weights.h5", "w", force_zip64=True) as member:
        for _ in range(5):
            member.write(bytes(1 << 28))  # 1.25 GiB of zeros, a few MB compressed
    code = cli.main([str(path), "-o", str(tmp_path / "m.tflite"), "--memory-limit", "1"])
    line = last_error_line(capsys.readouterr().err)
    assert code == errors.SizeLimitExceeded.exit_code, line
    assert "archive member model.weights.h5 inflates to 1,342,177,280 bytes" in line and "(--memory-limit)" in line


# --- crash isolation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage, options", [
    ("load", []), ("convert", []), ("verify: LiteRT", []), ("verify: TFLite Micro", ["--target", "tflm"]),
])
def test_a_worker_that_dies_of_a_signal_is_one_line_naming_the_step(small_model, stage, options, tmp_path, capsys,
                                                                    monkeypatch):
    if stage.endswith("TFLite Micro") and __import__("importlib").util.find_spec("tflite_micro") is None:
        pytest.skip("tflite-micro is not installed")
    monkeypatch.setenv("KERAS_GELU_TEST_CRASH_AT", stage)
    output = tmp_path / "m.tflite"
    code = cli.main([small_model, "-o", str(output), *options])
    line = last_error_line(capsys.readouterr().err)
    assert code == errors.ConversionCrashed.exit_code and not output.exists()
    assert (f"the conversion process died of SIGSEGV (Segmentation fault) during {stage}, without an answer; "
            "nothing written") in line
    monkeypatch.delenv("KERAS_GELU_TEST_CRASH_AT")
    assert cli.main([small_model, "-o", str(output), *options]) == 0  # the zygote serves on


# --- never garbage -----------------------------------------------------------------------------------------


@pytest.mark.legs("keras3", "tf_keras")  # a Keras file of each flavour
def test_a_model_whose_weights_diverged_is_refused_naming_how_many_and_the_first(tmp_path, capsys):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="gelu", name="first"),
                              keras.layers.Dense(2, name="second")])
    kernel, bias = model.get_layer("first").get_weights()
    kernel[0, :3] = np.nan
    model.get_layer("first").set_weights([kernel, bias])
    with pytest.raises(errors.NonFiniteWeights, match=r"1 of 4 weight variables hold NaN or Inf \(the first, "
                                                      r"\S*first\S*kernel\S*: 3 of 32 values\)"):
        converters.convert(model)
    path = str(tmp_path / ("diverged.keras" if IS_KERAS3 else "diverged.h5"))
    model.save(path)
    output = tmp_path / "m.tflite"
    assert cli.main([path, "-o", str(output), "--int8", "--calibration", "random:4"]) == \
        errors.NonFiniteWeights.exit_code and not output.exists()
    assert "weight variables hold NaN or Inf" in last_error_line(capsys.readouterr().err)


@pytest.fixture(scope="module")
def int8_tflite(small_model):
    return converters.convert(small_model, int8=True, calibration="random:8")[0]


def _edited(tflite_model, edit):
    model = flatbuffer_model.as_object(bytearray(tflite_model))  # writable arrays
    edit(model)
    return flatbuffer_model.as_bytes(model, len(tflite_model))


def _first_quantized(model):
    return next(tensor for tensor in model.subgraphs[0].tensors if tensor.quantization is not None
                and tensor.quantization.scale is not None and len(tensor.quantization.scale))


@pytest.mark.parametrize("edit, problem", [
    (lambda model: _first_quantized(model).quantization.scale.__setitem__(0, np.nan), "has quantization scale nan"),
    (lambda model: _first_quantized(model).quantization.scale.__setitem__(0, -0.5), "has quantization scale -0.5"),
    (lambda model: _first_quantized(model).quantization.zeroPoint.__setitem__(0, 300), "has zero point 300"),
    (lambda model: model.subgraphs[0].operators[0].inputs.__setitem__(0, 10_000), "names tensor 10000"),
    (lambda model: setattr(model.subgraphs[0].operators[0], "opcodeIndex", 99), "has op code 99"),
    (lambda model: setattr(model.buffers[1], "offset", 1 << 40) or setattr(model.buffers[1], "size", 8),
     "lies outside the file"),
    # the file fuzzer's find: LiteRT and the report read names as text
    (lambda model: setattr(model.subgraphs[0].tensors[0], "name", b"\xff\xfe"), "is not UTF-8 text"),
    (lambda model: setattr(model.signatureDefs[0], "signatureKey", b"serving\xff"), "is not UTF-8 text"),
    # the file fuzzer's find: a signature's tensor index with a bit flipped, which LiteRT read as an internal error
    (lambda model: setattr(model.signatureDefs[0].outputs[0], "tensorIndex", 67108871),
     "signature 0 names tensor 67108871"),
    (lambda model: setattr(model.signatureDefs[0], "subgraphIndex", 3), "signature 0 names subgraph 3"),
])
def test_a_tflite_a_runtime_must_not_read_is_refused_before_any_does(int8_tflite, edit, problem, tmp_path, capsys):
    assert validation.problem(int8_tflite) is None
    broken = _edited(int8_tflite, edit)
    assert problem in validation.problem(broken)
    path = tmp_path / "broken.tflite"
    path.write_bytes(broken)
    assert cli.main([str(path), "--target", "tflm", "-o", str(tmp_path / "m.tflite")]) == errors.CorruptModel.exit_code
    assert problem in last_error_line(capsys.readouterr().err)


def test_a_tflite_that_gives_nan_where_the_model_is_finite_fails_parity(small_model, monkeypatch):
    """The converter made to write NaN weights into the .tflite, where the original model's are finite."""
    to_tflite = pipeline.to_tflite

    def poisoned(*args, **kwargs):
        return tflite_helpers.with_weight_matrices_scaled(to_tflite(*args, **kwargs), np.nan)

    monkeypatch.setattr(pipeline, "to_tflite", poisoned)
    with pytest.raises(errors.ParityFailure, match="the .tflite gives NaN or Inf where the original model is finite"):
        convert_here(small_model)


# --- linear in the graph -----------------------------------------------------------------------------------


def _nested_conds(tmp_path, depth):
    def nest(y, level):
        if level == 0:
            return tf.nn.gelu(y)
        return tf.cond(tf.reduce_sum(y) > float(level), lambda: nest(y * 1.01, level - 1), lambda: tf.nn.gelu(y))

    return _saved(tmp_path, f"nest{depth}", lambda x: {"y": nest(x, depth)})


def test_the_transform_of_nested_control_flow_is_linear_in_the_nest(tmp_path, monkeypatch):
    """The functions every graph import holds, summed over loading and freezing a nest: twice the nest, twice the
    work (a body converted with the whole library, as before, made it four times)."""
    imported = []
    import_graph_def = tf.compat.v1.import_graph_def

    def counting(graph_def, *args, **kwargs):
        imported.append(len(graph_def.library.function) + len(graph_def.node))
        return import_graph_def(graph_def, *args, **kwargs)

    monkeypatch.setattr(tf.compat.v1, "import_graph_def", counting)
    work = {}
    for depth in (8, 16, 32):
        source = loading.load(_nested_conds(tmp_path, depth), kind="SavedModel")
        imported.clear()
        graph.with_passes(source.graph_def, [lambda body: None])  # every control-flow body taken out and put back
        assert graph.constant_arguments_inlined(source.graph_def) >= 0
        work[depth] = sum(imported)
    assert work[16] / work[8] < 2.5 and work[32] / work[16] < 2.5, work


def test_a_denial_wrapped_in_a_library_s_lines_keeps_the_path_that_was_denied():
    """Keras wraps a layer's error in lines of its own, the call's arguments last; the one line shown is the one
    naming what was denied, not a cut that ends in 'training=None'."""
    from keras_gelu.converters.sandbox import worker

    wrapped = ("Exception encountered when calling Lambda.call().\n\n\x1b[1m[Errno 13] Permission denied: "
               "'/home/user/.ssh/id_ed25519'\x1b[0m\n\nArguments received by Lambda.call():\n" +
               "".join(f"  • inputs=tf.Tensor(shape=(None, {size}), dtype=float32)\n" for size in range(40)) +
               "  • mask=None\n  • training=None")
    error = PermissionError(wrapped)
    try:
        raise RuntimeError("the layer failed") from error
    except RuntimeError as outer:
        shown = worker._denial(outer)
    assert "Permission denied: '/home/user/.ssh/id_ed25519'" in shown and "training" not in shown, shown
    assert worker._denial(ValueError("nothing denied")) is None
    assert worker.essence("x" * 400 + " '/the/path'").endswith("'/the/path'")


def test_the_environment_a_conversion_sees_is_named_not_inherited(tmp_path, monkeypatch):
    """Only the variables that change how Python, TensorFlow and their libraries load and compute; PYTHONPATH's
    folders absolute (the zygote works in a folder of its own, where '' or 'src' would name another)."""
    from keras_gelu.converters.sandbox import policy

    monkeypatch.chdir(tmp_path)
    caller = {"PATH": "/usr/bin", "TF_ENABLE_ONEDNN_OPTS": "0", "AWS_SECRET_ACCESS_KEY": "x", "GITHUB_TOKEN": "y",
              "TF_VAR_password": "z", "PYTHONPATH": os.pathsep.join(["src", "", "/opt/lib"]), "KERAS_BACKEND": "jax",
              "PYTHONSTARTUP": "evil.py", "LD_PRELOAD": "/tmp/evil.so"}
    environment = policy.environment(caller)
    assert environment == {"PATH": "/usr/bin", "TF_ENABLE_ONEDNN_OPTS": "0", "KERAS_BACKEND": "tensorflow",
                           "PYTHONPATH": os.pathsep.join([str(tmp_path / "src"), "/opt/lib"]),
                           "HDF5_USE_FILE_LOCKING": "FALSE"}


@pytest.mark.parametrize("plan, root, line", [
    ({"landlock": 7, "seccomp": True, "namespaces": True, "pid_namespace": True, "missing": []}, True,
     "contained: Landlock ABI 7 (files, TCP, signals) + seccomp allow-list + own user, PID, IPC and network "
     "namespaces, uid 65534 (nobody), no capabilities"),
    ({"landlock": 3, "seccomp": True, "namespaces": False, "pid_namespace": False,
      "missing": ["namespaces: refused"]}, False,
     "contained: Landlock ABI 3 (files) + seccomp allow-list, no capabilities (namespaces: refused)"),
    ({"landlock": 0, "seccomp": True, "namespaces": True, "pid_namespace": False,
      "missing": ["Landlock: off at boot", "PID namespace: refused"]}, False,
     "partly contained: seccomp allow-list + own user, IPC and network namespaces, no capabilities "
     "(Landlock: off at boot; PID namespace: refused)"),
    ({"landlock": 0, "seccomp": False, "namespaces": False, "pid_namespace": False,
      "missing": ["Landlock: none", "seccomp: none"]}, False,
     "not contained: op checks only, no capabilities (Landlock: none; seccomp: none)"),
])
def test_the_containment_line_says_what_held_and_what_is_missing(plan, root, line):
    from keras_gelu.converters.sandbox import policy

    assert policy.describe({**plan, "root": root}) == line
    kept = policy.describe({**plan, "root": root}, uid_refused="an unprivileged uid: /root is closed to other users")
    assert kept == line if not root else kept == line.replace("uid 65534 (nobody), no capabilities", (
        "uid 0 without capabilities (an unprivileged uid: /root is closed to other users)"))
    assert policy.describe({**plan, "root": root}, sandbox=False).startswith("not contained: switched off")


@pytest.fixture
def open_tmp_path():
    """A folder any user may pass (pytest's own are root's alone): in the system's temporary folder, 0755."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="keras_gelu_open_")
    os.chmod(folder, 0o755)
    yield __import__("pathlib").Path(folder)
    shutil.rmtree(folder, ignore_errors=True)


def test_an_unprivileged_uid_is_taken_only_where_every_file_read_is_open_to_others(open_tmp_path, monkeypatch):
    """The gate on nobody: search permission on every folder on the way, read on the file; what every worker
    reads (the Python installation, the code loaded) first, then the job's."""
    from keras_gelu.converters.sandbox import policy
    from keras_gelu.converters.sandbox import privileges

    tmp_path = open_tmp_path
    open_folder, closed_folder = tmp_path / "open", tmp_path / "closed"
    for folder, mode in ((open_folder, 0o755), (closed_folder, 0o700)):
        folder.mkdir()
        (folder / "model.keras").write_bytes(b"x")
        os.chmod(folder, mode)
    (open_folder / "private.npz").write_bytes(b"x")
    os.chmod(open_folder / "private.npz", 0o600)
    assert privileges.closed_to_others([str(tmp_path)]) is None
    assert privileges.closed_to_others([str(closed_folder / "model.keras")]) == str(closed_folder)
    assert privileges.closed_to_others([str(open_folder / "private.npz")]) == str(open_folder / "private.npz")
    assert privileges.closed_to_others([str(tmp_path / "gone")]) is None  # nothing there to read
    # What every worker reads, as on a machine whose Python is open to others (here it lies in /root): the code
    # loaded from this test's folders, decided again as code is loaded (a package the caller registered after
    # the zygote started, imported there for its job, may lie in a folder closed to others).
    monkeypatch.setattr(policy, "_static_reads", lambda: {
        module.__file__ for module in list(sys.modules.values())
        if str(getattr(module, "__file__", None)).startswith(str(tmp_path))})
    plan = {"root": True}
    for folder in (open_folder, closed_folder):
        (folder / f"loaded_from_{folder.name}.py").write_text("")
    monkeypatch.syspath_prepend(str(open_folder))
    monkeypatch.syspath_prepend(str(closed_folder))
    try:
        __import__("loaded_from_open")
        assert policy.job_uid(plan, [str(open_folder / "model.keras")]) == (privileges.NOBODY, None)
        uid, why = policy.job_uid(plan, [str(closed_folder / "model.keras")])
        assert uid is None and why == f"an unprivileged uid: {closed_folder} is closed to other users"
        __import__("loaded_from_closed")
        assert policy.job_uid(plan, [str(open_folder / "model.keras")]) == (None, why)
    finally:
        for name in ("loaded_from_open", "loaded_from_closed"):
            sys.modules.pop(name, None)
    assert policy.job_uid({"root": False}, []) == (None, None)


@pytest.mark.skipif(os.getuid() != 0, reason="becoming nobody is root's")
def test_a_process_that_becomes_nobody_writes_its_folder_and_reads_none_of_roots_files(open_tmp_path):
    """The kernel's own permission checks, in a child that became nobody: its scratch folder is its own, a file
    only root may read is not, and no capability is left to change that."""
    from keras_gelu.converters.sandbox import privileges

    tmp_path = open_tmp_path
    scratch, secret = tmp_path / "scratch", tmp_path / "secret"
    scratch.mkdir(mode=0o700)
    secret.write_text("root's")
    os.chmod(secret, 0o600)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            privileges.become_nobody([str(scratch)])
            (scratch / "written").write_text("ok")
            try:
                secret.read_text()
            except PermissionError:
                held = privileges.capabilities_held()
                status = 0 if os.getuid() == os.geteuid() == privileges.NOBODY and not held["CapEff"] else 2
        finally:
            os._exit(status)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert (scratch / "written").read_text() == "ok" and (scratch / "written").stat().st_uid == privileges.NOBODY


def test_the_plan_takes_every_namespace_util_linux_can_make_here():
    """util-linux's unshare, an implementation of its own, makes the namespaces the plan tries (user, PID with a
    /proc of its own, IPC, network): where it can, the plan must hold them all, and where it cannot, not claim
    the PID namespace."""
    from keras_gelu.converters.sandbox import policy

    probe = subprocess.run(["unshare", "--user", "--map-current-user", "--pid", "--fork", "--mount-proc", "--ipc",
                            "--net", "sh", "-c", "test $$ = 1 && test -d /proc/1 && ! test -d /proc/2"],
                           capture_output=True)
    plan = policy.plan()
    assert plan["pid_namespace"] == (probe.returncode == 0), (plan, probe.stderr)
    if plan["pid_namespace"]:
        assert plan["namespaces"] and not [why for why in plan["missing"] if "namespace" in why], plan
