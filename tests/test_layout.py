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


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (function-level imports included: a lazy import
    is still a circle; ``if TYPE_CHECKING:`` blocks excluded)."""
    mods: dict[str, Path] = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    graph: dict[str, set[str]] = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        hidden = {id(x) for n in ast.walk(tree)
                  if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test) for x in ast.walk(n)}
        base = m if p.name == "__init__.py" else m.rpartition(".")[0]
        edges: set[str] = set()
        for n in ast.walk(tree):
            if id(n) in hidden:
                continue
            if isinstance(n, ast.ImportFrom):
                target = n.module or ""
                if n.level:
                    b = base
                    for _ in range(n.level - 1):
                        b = b.rpartition(".")[0]
                    target = b + ("." + n.module if n.module else "")
                for a in n.names:
                    full = f"{target}.{a.name}"
                    edges.add(full if full in mods else target)
            elif isinstance(n, ast.Import):
                edges.update(a.name for a in n.names)
        graph[m] = {e for e in edges if e in mods and e != m}
    return graph


def test_no_import_circles() -> None:
    graph = _import_graph()
    assert "tangram_sdk.process" in graph["tangram_sdk.lease"]  # the edge the old circle ran through
    circles = []
    for start in graph:  # depth-first search for a path back to start
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join((*path, start)))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert not circles, "import circles: " + "; ".join(sorted(set(circles))[:5])


def test_nothing_in_the_package_imports_a_moved_module_or_a_private_of_spec() -> None:
    bad = []
    for path, tree in _modules():
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom):
                mod = n.module or ""
                if mod.endswith("managers.process") or (mod == "process" and n.level == 1 and path.parent.name == "managers"):
                    if path.name != "process.py":
                        bad.append(f"{path.relative_to(SRC)}:{n.lineno} imports managers.process")
                if mod.endswith("spec") and any(a.name.startswith("_") for a in n.names):
                    bad.append(f"{path.relative_to(SRC)}:{n.lineno} imports a private of spec.py")
    assert not bad, bad


def test_managers_package_is_a_face() -> None:
    import tangram_sdk.managers as managers

    for name in ("Manager", "ManagerContext", "BaseManager", "Offer", "Applied", "DockerCpuManager",
                 "SandboxPool", "TorchGpuManager", "HttpSleepWake", "OffloadableService"):
        assert name in managers.__all__ and getattr(managers, name) is not None, name


def test_scheduler_package_is_a_face_with_one_observer_contract() -> None:
    import tangram_sdk.runtime as runtime
    import tangram_sdk.scheduler as scheduler
    import tangram_sdk.sim.engine as engine
    from tangram_sdk.scheduler.core import Scheduler

    for name in ("Scheduler", "SchedulerStats", "Observer", "Event", "Submitted", "Released", "Cancelled",
                 "Tick", "TokensUsed", "ServiceResidency", "Decision", "Grant", "Reject"):
        assert name in scheduler.__all__ and getattr(scheduler, name) is not None, name
    assert scheduler.Scheduler is Scheduler
    # the runtime and the simulator take the same observers: one contract, not two copies
    assert runtime.Observer is engine.Observer is scheduler.Observer
    copies = []
    for path, tree in _modules():
        for n in ast.walk(tree):
            named = (n.name == "Observer" if isinstance(n, ast.ClassDef)
                     else isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "Observer" for t in n.targets))
            if named and path.name != "observer.py":
                copies.append(f"{path.relative_to(SRC)}:{n.lineno}")
    assert not copies, f"a second Observer: {copies}"
