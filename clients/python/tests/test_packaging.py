"""The package as pip builds it: what the wheel holds, and what building leaves behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def test_a_wheel_carries_py_typed_and_building_leaves_no_build_directory(tmp_path):
    """PEP 561: the py.typed marker is in the wheel (type checkers then read the package's
    annotations); and building from a checkout leaves no build/ in it."""
    checkout = tmp_path / "python"
    checkout.mkdir()
    shutil.copy(PACKAGE / "pyproject.toml", checkout)
    shutil.copy(PACKAGE / "README.md", checkout)
    shutil.copytree(PACKAGE / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    before = sorted(p.name for p in checkout.iterdir())
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(checkout)],
        check=True,
        timeout=300,
    )
    assert sorted(p.name for p in checkout.iterdir()) == before
    (wheel,) = out.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "volley/py.typed" in names and "volley/client.py" in names


def test_the_conformance_driver_answers_help_and_bad_addresses_without_a_traceback():
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "volley.conformance", *args], capture_output=True, text=True, timeout=120
    )
    help = run("--help")
    assert help.returncode == 0 and "usage: python -m volley.conformance" in help.stdout, help
    bad = run("nowhere")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "invalid address" in bad.stderr, bad
