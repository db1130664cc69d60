"""What the scheduler actor says about itself: its statistics snapshot and its invariant checks.

Kept apart from :mod:`.actor` because both only read the actor's state (its nodes, connections and
counters) and assemble a report; nothing here grants, releases or awaits.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..snapshot import ClusterStatistics, NodeStatistics
from ._state import _Node

if TYPE_CHECKING:
    from .actor import SchedulerActor


def _node_stats(node: _Node) -> NodeStatistics:
    """One node's snapshot (its runtime's statistics while it is alive)."""
    return NodeStatistics(
        alive=node.alive, reason=node.reason, ray_node_id=node.ray_node_id, agent=node.agent_name,
        pool=node.pool, containers=sorted(node.containers), peak_cpus_used=node.peak_cpus,
        peak_gpus_used=node.peak_gpus, peak_memory_used=node.peak_memory,
        runtime=node.rt.statistics() if node.alive else None)


def _cluster_statistics(actor: SchedulerActor) -> ClusterStatistics:
    """The actor's snapshot: per node, per quota, clients, counters, the first invariant errors."""
    quotas: dict[str, dict[str, Any]] = {}
    if actor._quota_rt is not None:
        for n, q in actor._quota_rt.statistics().quotas.items():
            quotas[n] = {**q, "peak_used": actor._peak_quota.get(n, 0)}
    return ClusterStatistics(
        name=actor.name, pid=os.getpid(), scheduler_node=actor._ray_node_id,
        nodes={k: _node_stats(n) for k, n in actor._nodes.items()}, quotas=quotas,
        clients=len(actor._conns), held=sum(len(c.held) for c in actor._conns.values()),
        pending=sum(len(c.pending) for c in actor._conns.values()),
        granted=actor.granted, released=actor.released, lost=actor.lost, expired_clients=actor.expired,
        failed_acquires=actor.failed_acquires, lost_nodes=list(actor._lost_nodes),
        invariant_errors=list(actor._errors[:20]))


def _invariant_errors(actor: SchedulerActor) -> list[str]:
    """Every runtime's ledger checks, plus: what the actor thinks clients hold is what the
    schedulers think is running (meaningful when no acquire is in flight). The caller has let
    the releases in flight land first (:meth:`SchedulerActor.check_invariants`)."""
    errs = list(actor._errors)
    quiet = not any(c.pending for c in actor._conns.values())
    held_per_node: dict[str, int] = {}
    held_q = 0
    for c in actor._conns.values():
        for h in c.held.values():
            if h.node is not None:
                held_per_node[h.node.label] = held_per_node.get(h.node.label, 0) + 1
            if h.qlease is not None:
                held_q += 1
    for n in actor._nodes.values():
        if not n.alive:
            continue
        try:
            n.rt.check_invariants()
        except AssertionError as exc:
            errs.append(f"node {n.label}: {exc}")
        inside = n.rt.statistics().waiters  # acquired and not yet left, per the runtime
        if quiet and inside != held_per_node.get(n.label, 0):
            errs.append(f"node {n.label}: the runtime has {inside} leases out but clients hold "
                        f"{held_per_node.get(n.label, 0)}")
    assert actor._quota_rt is not None
    try:
        actor._quota_rt.check_invariants()
    except AssertionError as exc:
        errs.append(f"quotas: {exc}")
    inside = actor._quota_rt.statistics().waiters
    if quiet and inside != held_q:
        errs.append(f"quotas: the runtime has {inside} leases out but clients hold {held_q}")
    held = sum(len(c.held) for c in actor._conns.values())
    if actor.granted != actor.released + actor.lost + held:
        errs.append(f"granted {actor.granted} != released {actor.released} + lost {actor.lost} + held {held}")
    return errs
