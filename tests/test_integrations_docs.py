"""Every snippet in docs/integrations/ runs, against the installed veRL and OpenRLHF.

The pages follow one convention, checked here:

* a ```python block is a complete program: it runs as ``python snippet.py`` in a fresh directory
  (one per page, shared by that page's blocks) and must exit 0;
* a block preceded by ``<!-- file: NAME -->`` is written to NAME in that directory instead (a tool
  module, a tool YAML, an agent file...); a later block of the page must use it by name;
* ``<!-- expect: TEXT -->`` right after a block: its output must contain TEXT;
* no other fenced blocks (an install command is written inline, not as a snippet).

A snippet that imports Ray starts a small local cluster itself (marked ``ray``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs" / "integrations").glob("*.md"))
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(file|expect):\s*(.+?)\s*-->\s*$")


def _blocks(page: Path) -> list[dict[str, Any]]:
    lines = page.read_text().splitlines()
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        assert j < len(lines), f"{page.name}:{start + 1}: unterminated code block"
        block: dict[str, Any] = {"lang": m.group(1), "code": "\n".join(lines[i + 1:j]) + "\n", "line": start + 1}
        before = MARK.match(lines[start - 1]) if start else None
        if before and before.group(1) == "file":
            block["file"] = before.group(2)
        after = MARK.match(lines[j + 1]) if j + 1 < len(lines) else None
        if after and after.group(1) == "expect":
            block["expect"] = after.group(2)
        out.append(block)
        i = j + 1
    return out


def test_every_page_follows_the_convention() -> None:
    assert {p.name for p in PAGES} >= {"verl.md", "openrlhf.md", "plain.md", "pools.md"}
    for page in PAGES:
        blocks = _blocks(page)
        assert blocks, f"{page.name} has no snippet"
        for n, b in enumerate(blocks):
            where = f"{page.name}:{b['line']}"
            assert b["lang"] in ("python", "yaml"), f"{where}: a {b['lang'] or 'plain'} block is not a snippet"
            if b["lang"] == "yaml" or "file" in b:
                assert "file" in b, f"{where}: a yaml block needs <!-- file: NAME --> before it"
                stem = Path(b["file"]).stem
                later = [x["code"] for x in blocks[n + 1:]]  # a snippet, or a file a snippet loads
                assert any(b["file"] in c or re.search(rf"\b{re.escape(stem)}\b", c) for c in later), \
                    f"{where}: no later snippet uses {b['file']}"


def _params() -> list[Any]:
    out = []
    for page in PAGES:
        for b in _blocks(page):
            if b["lang"] == "python" and "file" not in b:
                marks = [pytest.mark.ray] if re.search(r"^import ray\b", b["code"], re.M) else []
                out.append(pytest.param(page, b["line"], marks=marks, id=f"{page.stem}:{b['line']}"))
    return out


@pytest.mark.parametrize(("page", "line"), _params())
def test_snippet_runs(page: Path, line: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    blocks = _blocks(page)
    work = tmp_path_factory.mktemp(page.stem)
    for b in blocks:  # the page's files, and the snippet itself
        if "file" in b:
            (work / b["file"]).write_text(b["code"])
    (block,) = [b for b in blocks if b["line"] == line]
    (work / "snippet.py").write_text(block["code"])
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(work), str(ROOT / "src"), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=work, env=env, capture_output=True, text=True,
                          timeout=240, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{page.name}:{line} exited {proc.returncode}:\n{output[-4000:]}"
    if "expect" in block:
        assert block["expect"] in output, f"{page.name}:{line} did not print {block['expect']!r}:\n{output[-3000:]}"
