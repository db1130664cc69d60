"""Where an acquire goes inside the scheduler actor: its quota part to the job-wide quota runtime, its
node part to one node, chosen here.

Kept apart from :mod:`.actor` because routing is a decision over the nodes' records alone (no
awaits, no connections), and its refusals are what a caller reads when no node can serve a spec.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ..errors import InfeasibleSpecError, SpecError
from ..spec import ActionSpec
from ._errors import NodeLostError
from ._state import _Node


def _split(spec: ActionSpec) -> tuple[ActionSpec | None, ActionSpec | None]:
    """``spec``'s quota part and node part (either may be None; a spec needing both is cut in two)."""
    needs_node = bool(spec.cpus or spec.gpus or spec.memory or spec.needs or spec.container or spec.service)
    if not needs_node:
        return spec, None
    if not spec.quotas and not spec.tokens:
        return None, spec
    qspec = ActionSpec(kind=spec.kind, quotas=spec.quotas, tokens=spec.tokens, duration=spec.duration,
                       priority=spec.priority)
    return qspec, attrs.evolve(spec, quotas=(), tokens=())


def _route(nodes: Mapping[str, _Node], spec: ActionSpec, hint: str | None, caller: str | None) -> _Node:
    """Which of ``nodes`` serves ``spec``: the one named, the container's, else the feasible nodes
    (having the service, if any) preferring the caller's own node while it has room, then the
    emptiest."""
    if hint is not None:
        node = nodes.get(hint)
        if node is None:
            raise SpecError(f"unknown node {hint!r}; nodes: {sorted(nodes)}")
        if not node.alive:
            raise NodeLostError(f"node {hint!r} left the pool: {node.reason}")
        if spec.container is not None:
            owner = [n.label for n in nodes.values() if n.alive and spec.container in n.containers]
            if owner and hint not in owner:
                raise SpecError(f"container {spec.container!r} lives on node {owner[0]!r}, not {hint!r}")
        cands = [node]
    elif spec.container is not None:
        cands = [n for n in nodes.values() if n.alive and spec.container in n.containers]
        if not cands:
            alive = [n for n in nodes.values() if n.alive]
            if len(alive) == 1 and len(nodes) == 1:
                cands = alive
            else:
                raise SpecError(
                    f"container {spec.container!r} is not registered with any live node; pass "
                    f"acquire(..., node=...) or register it (deploy(containers=...)/register_containers)")
    else:
        cands = [n for n in nodes.values() if n.alive]
        if spec.service is not None:
            cands = [n for n in cands if n.services is None or spec.service in n.services]
    if not cands:
        raise InfeasibleSpecError(f"{spec.kind}: no live node can serve it (nodes: {sorted(nodes)})")
    reasons: list[tuple[str, str]] = []
    ok = []
    for n in cands:
        r = n.rt.feasibility(spec)
        if r is None:
            ok.append(n)
        else:
            reasons.append((n.label, r))
    if not ok:
        raise InfeasibleSpecError(f"{spec.kind}: {_reasons(reasons)}")
    if len(ok) == 1:
        return ok[0]

    def room(n: _Node) -> tuple[int, int, int]:
        rt = n.rt
        free = rt.free_gpus if spec.gpus else rt.free_cpus
        need = spec.gpus if spec.gpus else spec.cpus
        return (int(free >= need and rt.queued == 0), free, -rt.queued)

    if caller is not None:
        mine = [n for n in ok if n.ray_node_id == caller]
        if mine and room(mine[0])[0]:
            return mine[0]
    return max(ok, key=room)


def _reasons(reasons: list[tuple[str, str]]) -> str:
    """Why no node can serve a spec, for the caller (often the model, through an adapter): one
    reason once when every node gives it, else per node, with Ray's 56-hex node ids cut to 12."""
    if len({r for _, r in reasons}) == 1:
        only = reasons[0][1]
        return only if len(reasons) == 1 else f"{only} (on each of the {len(reasons)} nodes)"
    return "; ".join(f"{label[:12] + '...' if len(label) == 56 else label}: {r}" for label, r in reasons)
