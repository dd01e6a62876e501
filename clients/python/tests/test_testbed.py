"""`volley testbed --python-role la`: the testbed's LA role as a Python process
(volley.testbed_la) among the Rust roles, a mixed system end to end. The testbed itself fails
unless every configuration's answers agree and match a brute-force scan, so a Python analysis
that differs from the Rust one fails the run."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from volley.testbed_la import stem, term_frequencies

from conftest import volley_bin


def test_the_python_analysis_is_the_rust_one_on_the_rust_tests_cases():
    for word, want in [("running", "runn"), ("ponies", "pony"), ("classes", "class"), ("churches", "church")]:
        assert stem(word) == want
    assert stem("status") == "status" and stem("is") == "is" and stem("ties") == "tie"
    tf = term_frequencies("Cats chase cats. The dog watches the cats")
    assert tf == ([["cat", 3], ["chase", 1], ["dog", 1], ["watch", 1]], 6)


def test_the_testbed_runs_with_a_python_la_role(tmp_path):
    # The interpreter is started through a wrapper that leaves a mark: proof that the LA
    # process was the Python one.
    mark = tmp_path / "python-la-started"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho "$@" > "{mark}"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    out = subprocess.run(
        [volley_bin(), "testbed", "--processes", "--codec", "general", "--python-role", "la"]
        + ["--python", str(wrapper), "--docs", "300", "--queries", "40"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all configurations agree" in out.stdout, out.stdout
    assert mark.read_text().startswith("-m volley.testbed_la --role la"), mark.read_text()


def test_a_python_role_needs_the_general_codec():
    out = subprocess.run(
        [volley_bin(), "testbed", "--processes", "--python-role", "la"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    assert "--codec general" in out.stderr, out.stderr
