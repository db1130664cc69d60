"""Every example in examples/ runs to the end as a user would run it, and prints what it promises.

Examples that need Docker (the ``docker`` marker: the docker_engine fixture probes the daemon and,
under CI=true, fails instead of skipping) or torch, veRL or OpenRLHF are skipped where those are
missing. An example listed here but not written yet is skipped with that reason (no marker, so
CI does not count it as a skipped Docker test). The notebook runs with nbclient on a real
ipykernel (the venv's own ``python3`` kernel, so no kernel registration is needed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from docker_fixtures import docker_engine  # noqa: F401  (fixture, used via getfixturevalue)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# (file, what it needs, substrings its output must contain, time limit in seconds)
CASES: list[tuple[str, tuple[str, ...], tuple[str, ...], float]] = [
    ("quickstart.py", (), ("trajectory 0 turn 0: test on cores", "statistics:", "completed: 24", "failed: 0"), 20),
    ("verl_tool.py", ("verl",), ("call 0: ran on", "was not run: argument 'cores'", "completed: 6"), 120),
    ("openrlhf_agent.py", ("openrlhf", "torch"), ("episode paris: reward=1.0 steps=2", "completed: 8"), 120),
    ("coding_sandbox.py", ("docker",), ("trajectory 3 turn 2:", "/tmp/log has 3 line(s)", "completed: 12, failed: 0"), 120),
    ("reward_model.py", ("torch",), ("call 11", "bit-identical to first call: True", "completed: 12, failed: 0"), 120),
]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _params() -> list[object]:
    out: list[object] = []
    for name, needs, expect, limit in CASES:
        if not (EXAMPLES / name).exists():
            out.append(pytest.param(name, needs, expect, limit, id=name,
                                    marks=pytest.mark.skip(reason=f"examples/{name} is not written yet")))
            continue
        marks = [pytest.mark.docker] if "docker" in needs else []
        out.append(pytest.param(name, needs, expect, limit, id=name, marks=marks))
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@pytest.mark.parametrize(("name", "needs", "expect", "limit"), _params())
def test_example_runs(name: str, needs: tuple[str, ...], expect: tuple[str, ...], limit: float,
                      request: pytest.FixtureRequest) -> None:
    for need in needs:
        if need == "docker":
            request.getfixturevalue("docker_engine")
        elif not _importable(need):
            pytest.skip(f"examples/{name} needs {need}, which is not installed")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], cwd=ROOT, env=_env(), capture_output=True, check=False,
                          text=True, timeout=max(limit * 3, 60))
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"examples/{name} exited {proc.returncode}:\n{output[-4000:]}"
    for text in expect:
        assert text in output, f"examples/{name} did not print {text!r}:\n{output[-4000:]}"
    assert elapsed < limit, f"examples/{name} took {elapsed:.1f} s (limit {limit} s)"


def test_notebook_runs_top_to_bottom() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any failing cell
    text = "\n".join(
        str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
        for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    )
    for expected in ("test 0: cores", "at most 2 searches at once", "completed actions: 14", "[closed]"):
        assert expected in text, f"notebook output lacks {expected!r}:\n{text[-3000:]}"


# (example, module hidden from it, what the one-line message must name)
MISSING = [
    ("reward_model.py", "torch", "pip install 'tangram-sdk[torch]'"),
    ("openrlhf_agent.py", "torch", "pip install 'tangram-sdk[torch]'"),
    ("openrlhf_agent.py", "openrlhf", "pip install openrlhf"),
    ("verl_tool.py", "torch", "pip install 'tangram-sdk[torch]'"),
    ("verl_tool.py", "verl", "pip install verl"),
    ("coding_sandbox.py", "aiodocker", "pip install 'tangram-sdk[docker]'"),
]


@pytest.mark.parametrize(("name", "hidden", "hint"), MISSING, ids=[f"{n}-without-{m}" for n, m, _ in MISSING])
def test_example_without_an_optional_package_says_what_to_install(name: str, hidden: str, hint: str) -> None:
    """With ``hidden`` unimportable (``sys.modules[name] = None``), the example stops at once with one
    line that names the right install command (the torch extra and the CPU index, never ``pip install
    openrlhf`` for a missing torch) and no traceback."""
    code = ("import runpy, sys; sys.modules[sys.argv[1]] = None; sys.argv = sys.argv[2:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, hidden, str(EXAMPLES / name)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, check=False, timeout=120)
    err = proc.stderr.strip()
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert hint in err and repr(hidden) in err, err
    if hidden == "torch":
        assert "--index-url https://download.pytorch.org/whl/cpu" in err, err
