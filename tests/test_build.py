"""The build's own tools: `.ci/python`, which names the interpreter `make` makes its environments from."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.legs("keras3")

PICKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".ci", "python")


def _pick(*candidates):
    result = subprocess.run([sys.executable, PICKER, *candidates], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture
def fake_interpreter(tmp_path):
    """A program answering the picker's probe as an interpreter of `version` would, shared or not (None: its
    maps unread)."""
    def make(name, version, shared):
        path = tmp_path / name
        answer = json.dumps({"version": list(version), "shared": shared})
        path.write_text(f"#!/bin/sh\necho '{answer}'\n")
        path.chmod(0o755)
        return str(path)
    return make


def test_the_first_candidate_s_version_is_kept_and_a_linked_in_build_preferred(fake_interpreter):
    shared = fake_interpreter("shared", (3, 11), True)
    linked_in = fake_interpreter("linked_in", (3, 11), False)
    other_version = fake_interpreter("other_version", (3, 12), False)
    assert _pick(shared, other_version, linked_in) == linked_in
    assert _pick(shared, other_version) == shared
    assert _pick(linked_in, shared) == linked_in


def test_where_nothing_is_known_the_first_candidate_is_named(fake_interpreter, tmp_path):
    shared = fake_interpreter("shared", (3, 11), True)
    unknown = fake_interpreter("unknown", (3, 11), None)
    missing = str(tmp_path / "no_such_interpreter")
    assert _pick(shared, unknown, missing) == shared
    assert _pick(missing, fake_interpreter("linked_in", (3, 11), False)) == missing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the ELF's needed libraries with ldd")
def test_real_interpreters_are_told_apart_as_their_executables_link_libpython():
    """The probe against another reading: ldd's list of the libraries each executable needs."""
    candidates = [sys.executable] + [path for path in ("/usr/bin/python3",) if os.path.exists(path)]

    def version_and_linked_in(interpreter):
        version = subprocess.run([interpreter, "-c", "import sys; print(sys.version_info[:2])"],
                                 capture_output=True, text=True).stdout
        needs = subprocess.run(["ldd", os.path.realpath(interpreter)], capture_output=True, text=True).stdout
        return version, "libpython" not in needs

    read = [version_and_linked_in(candidate) for candidate in candidates]
    expected = next((candidate for candidate, (version, linked_in) in zip(candidates, read)
                     if version == read[0][0] and linked_in), candidates[0])
    assert _pick(*candidates) == expected
