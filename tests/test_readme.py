"""The README's instructions work as written: its Python snippet runs as pasted (a complete
program, sized to this machine's cores, needing nothing optional), its simulator command runs, and
every file and section it links to exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.S | re.M)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


def test_the_python_snippet_runs_as_pasted(tmp_path: Path) -> None:
    (snippet,) = _blocks("python")
    ast.parse(snippet)  # a complete program: no top-level `async with` outside a function
    path = tmp_path / "first.py"
    path.write_text(snippet)
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"run_tests: granted (\d+) core\(s\) \[([0-9, ]+)\], the process saw \[([0-9, ]+)\]", proc.stdout)
    assert m, proc.stdout
    mine = sorted(os.sched_getaffinity(0))
    granted = [int(x) for x in m.group(2).split(",")]
    # sized to this machine: never more cores than it has, and the process ran on exactly the granted ones
    assert 1 <= int(m.group(1)) == len(granted) <= len(mine) and set(granted) <= set(mine)
    assert [int(x) for x in m.group(3).split(",")] == granted
    assert "search: one quota unit held" in proc.stdout and "completed actions: 2" in proc.stdout


def test_the_simulator_command_runs() -> None:
    cmds = [line.strip() for block in _blocks("bash") for line in block.splitlines()
            if line.strip().startswith(".venv/bin/tangram simulate")]
    assert cmds, "the README shows no simulator command"
    for cmd in cmds:
        args = cmd.split()[1:]
        proc = subprocess.run([sys.executable, "-m", "tangram_sdk", *args, "--no-progress"], cwd=ROOT, env=_env(),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (cmd, proc.stderr[-2000:])
        for pol in ("tangram", "static", "fifo1", "fifo4", "fifo16"):
            assert re.search(rf"^\s*{pol}\s+128\s", proc.stdout, re.M), proc.stdout


def test_commands_shown_exist() -> None:
    for cmd in ("demo", "simulate", "top"):
        proc = subprocess.run([sys.executable, "-m", "tangram_sdk", cmd, "--help"], env=_env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and "usage: tangram " + cmd in proc.stdout
    assert (ROOT / "scripts" / "test.sh").exists() and (ROOT / ".ci" / "run").exists()
    assert "kill \"$(cat /var/run/docker.pid)\"" in README  # how to stop the dockerd the tests start
    assert "https://download.pytorch.org/whl/cpu" in README  # the CPU build of torch, anywhere


@pytest.mark.parametrize("target", sorted(set(re.findall(r"\]\(((?!https?://)[^)\s]+)\)", README))))
def test_links_resolve(target: str) -> None:
    path, _, anchor = target.partition("#")
    file = ROOT / path
    assert file.exists(), target
    if anchor:
        heads = re.findall(r"^#+ (.*)$", file.read_text(), re.M)
        slugs = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-") for h in heads}
        assert anchor in slugs, (target, sorted(slugs))


def test_examples_named_exist() -> None:
    bullet = re.search(r"^\* \[`examples/`\].*?(?=^\* )", README, re.S | re.M)
    assert bullet, "the README does not say what is in examples/"
    names = re.findall(r"`([a-z_]+\.(?:py|ipynb))`", bullet.group(0))
    assert sorted(names) == sorted(p.name for p in (ROOT / "examples").iterdir() if p.suffix in (".py", ".ipynb"))
