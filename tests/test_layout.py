"""The package's faces hold: one error tree, one manager face, no private reach-ins, no import circle.

Static checks (the source is parsed, not imported), so they name the file and line that broke a rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tangram_sdk.errors as errors

SRC = Path(__file__).resolve().parent.parent / "src" / "tangram_sdk"


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(SRC.rglob("*.py"))]


def _is_exception_class(node: ast.ClassDef, known: set[str]) -> bool:
    for b in node.bases:
        name = b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
        if name in known or name.endswith(("Error", "Exception")) or name == "BaseException":
            return True
    return False


def test_every_public_exception_class_lives_in_errors_py() -> None:
    known = set(errors.__all__)
    stray = []
    for path, tree in _modules():
        if path.name == "errors.py" and path.parent == SRC:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and _is_exception_class(node, known):
                stray.append(f"{path.relative_to(SRC)}:{node.lineno} class {node.name}")
    assert not stray, "exception classes outside errors.py: " + "; ".join(stray)


def test_errors_docstring_tree_names_every_class() -> None:
    doc = errors.__doc__ or ""
    missing = [n for n in errors.__all__ if n not in doc]
    assert not missing, f"errors.py's tree does not show {missing}"
    for n in errors.__all__:
        assert issubclass(getattr(errors, n), errors.TangramError), n


def test_errors_are_the_same_class_wherever_they_are_imported_from() -> None:
    import tangram_sdk
    import tangram_sdk.integrations as integrations
    import tangram_sdk.ray as tray
    import tangram_sdk.sim as sim
    from tangram_sdk.managers import _cgroup

    assert tray.LeaseLostError is errors.LeaseLostError and tray.NodeLostError is errors.NodeLostError
    assert tray.RayNotInstalledError is errors.RayNotInstalledError
    assert sim.TraceError is errors.TraceError
    assert integrations.SpecMappingError is errors.SpecMappingError
    assert integrations.IntegrationUnavailable is tangram_sdk.IntegrationUnavailable is errors.IntegrationUnavailable
    assert _cgroup.MemoryBusyError is errors.MemoryBusyError
