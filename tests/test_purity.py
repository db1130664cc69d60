"""The scheduling core is pure: no event loop, clock, I/O or heavy framework imports."""

import ast
from pathlib import Path

import tangram_sdk

FORBIDDEN = {"asyncio", "anyio", "time", "trio", "threading", "socket", "os", "subprocess", "aiodocker",
             "torch", "ray", "datetime", "random", "logging"}


def test_scheduler_package_imports_nothing_impure():
    root = Path(tangram_sdk.__file__).parent / "scheduler"
    files = sorted(root.glob("*.py"))
    assert files
    for f in files:
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{f.name} imports {n}"
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                # relative imports out of scheduler/ may only reach pure modules
                assert node.module in {"spec", "pool", "errors", "_cpuset"}, f"{f.name} imports ..{node.module}"


def test_core_import_does_not_pull_optional_dependencies():
    import subprocess
    import sys

    code = ("import sys, tangram_sdk; bad=[m for m in ('torch','aiodocker','ray','matplotlib','prometheus_client')"
            " if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_all_is_sorted_and_complete():
    names = tangram_sdk.__all__
    assert list(names) == sorted(names)
    for n in names:
        assert hasattr(tangram_sdk, n), n
    public = {n for n in vars(tangram_sdk) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(names), public - set(names)
