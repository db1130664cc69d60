"""The scheduling core is pure: no event loop, clock, I/O or heavy framework imports."""

import ast
from pathlib import Path

import tangram_sdk

FORBIDDEN = {"asyncio", "anyio", "time", "trio", "threading", "socket", "os", "subprocess", "aiodocker",
             "torch", "ray", "datetime", "random", "logging"}
# the modules outside scheduler/ that the core may import: values and checks, themselves pure
PURE_SIBLINGS = {"spec", "pool", "resources", "errors", "_cpuset", "_validate", "options", "snapshot"}


def _check_pure(f: Path, level: int) -> None:
    """``f`` imports nothing impure; relative imports ``level`` dots up reach only PURE_SIBLINGS."""
    tree = ast.parse(f.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for n in names:
            assert n.split(".")[0] not in FORBIDDEN, f"{f.name} imports {n}"
        if isinstance(node, ast.ImportFrom) and node.level == level and not _type_only(tree, node):
            assert node.module in PURE_SIBLINGS, f"{f.name} imports {'.' * level}{node.module}"


def _type_only(tree: ast.Module, imp: ast.ImportFrom) -> bool:
    """``imp`` sits under ``if TYPE_CHECKING:`` (an annotation, never imported at run time)."""
    return any(isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
               and imp in n.body for n in ast.walk(tree))


def test_scheduler_package_imports_nothing_impure():
    root = Path(tangram_sdk.__file__).parent / "scheduler"
    files = sorted(root.glob("*.py"))
    assert files
    for f in files:
        _check_pure(f, level=2)  # relative imports out of scheduler/ may only reach pure modules
    for name in sorted(PURE_SIBLINGS):  # and those are pure too, importing only each other
        _check_pure(root.parent / f"{name}.py", level=1)


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
