"""The public API is typed (py.typed ships) and stays so: mypy --strict and ruff pass on the tree."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_strict_passes_on_the_package():
    """``mypy --strict`` (pyproject's [tool.mypy]) on src/: part of every ``bash scripts/test.sh`` and
    ``.ci/run``, where a missing mypy is a failure, not a skip."""
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true: mypy is not installed (scripts/test.sh installs the dev extra)")
        pytest.skip("mypy is not installed")
    r = subprocess.run([sys.executable, "-m", "mypy", "src/tangram_sdk"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_passes():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed")
    r = subprocess.run([ruff, "check", "src", "tests", "benchmarks", "examples"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-4000:]


def test_py_typed_marker_ships():
    assert (ROOT / "src" / "tangram_sdk" / "py.typed").exists()
