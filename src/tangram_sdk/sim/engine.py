"""Discrete-event simulator: closed-loop trajectories driving the real :class:`Scheduler` on virtual time.

A trajectory alternates *think* (LLM decode) and *action*: the next action arrives ``think`` seconds
after the previous one completed, so queueing feeds back into arrivals exactly as in a rollout.
Events are kept in one heap ordered by ``(time, class, sequence)``: at equal times completions come
before arrivals, and otherwise the order of scheduling, so a run is a pure function of its inputs.
Each event is handed to the scheduler on its own (``handle``), as the live runtime does with
``batch=False``; timer ticks are armed at ``Scheduler.next_wakeup`` exactly like the runtime's timer.

An action's real duration is ``work x spec.relative_duration(units)`` plus system overhead: the
policy's per-grant cost (a cgroup/cpuset update) and, for GPU services, a restore when the service is
not resident on the granted cell (residency is modelled per GPU with LRU eviction, and reported back
to the scheduler as ``ServiceResidency`` events, as the GPU manager would).
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import attrs

from ..scheduler import Event, Grant, Observer, Reject, Released, Resize, Scheduler, ServiceResidency, Submitted, Tick
from ..spec import ActionSpec, Efficiency, malleable_workers
from .baselines import Policy

__all__ = ["Act", "Change", "Trajectory", "Result", "simulate", "Observer"]

# event classes: at equal times, completions first, then trajectory ends, then arrivals, sandboxes
# ready, ticks (residency reports are fed inline, right after the event that caused them)
_DONE, _END, _SUBMIT, _READY, _TICK = 0, 1, 2, 3, 4


@attrs.frozen(slots=True)
class Act:
    """One action: think ``think`` seconds, then ask for ``spec`` and run ``work`` seconds (at the
    spec's minimum units; scaled by ``spec.relative_duration(units)``, or by ``truth`` when the
    action really scales differently from what its spec declares) plus ``overhead`` seconds.
    ``hint``: what its caller tells Tangram about ``work`` (``Submitted.expected``; only the
    ``tangram`` policy is told: the fixed policies stand for a user without it)."""

    spec: ActionSpec
    work: float
    think: float = 0.0
    overhead: float = 0.0
    truth: Efficiency | None = None  # how it really scales, when not as its spec declares
    hint: float | None = None  # the caller's estimate of work (a length hint), or None
    startup: float = 0.0  # CPU seconds each worker of its command spends starting (a test runner's)
    per_core: int | None = None  # malleable: workers its command starts per core held (None: the most)

    def exec_s(self, units: int, workers: int | None = None) -> float:
        """Seconds the work takes on ``units`` cores when its command starts ``workers`` workers
        (default: one per core), each paying :attr:`startup` once: a malleable lease starts
        ``lease.workers`` (the most it may be grown to), so on fewer cores they share them."""
        if not units or (workers is None and not self.startup):
            return self.work * self.relative_duration(units)
        w = workers or units
        # w workers run on at most w cores, and each starts once on the cores held
        ex = self.work * self.relative_duration(min(units, w))
        return ex + self.startup * w / min(units, w) if self.startup else ex

    def relative_duration(self, units: int) -> float:
        """``T(units) / T(min)`` as the action really runs (its declared model unless ``truth``)."""
        spec = self.spec
        if spec.elastic is None or not units:
            return 1.0
        t = self.truth
        if t is None:
            return spec.relative_duration(units)
        return t.speedup(spec.min_units) / t.speedup(units)

    def parallelism(self, units: int, overhead: float = 0.0) -> float:
        """Cores' worth the action's work gets on ``units`` cores, as ``lease.run``/``exec``
        measure it (CPU seconds over wall seconds, ``overhead`` seconds of the wall idle): work
        that conserves its CPU time runs at its true speedup."""
        if not units or self.spec.elastic is None:
            return 1.0
        wall = self.work * self.relative_duration(units) + overhead
        return self.cpu_seconds() / wall if wall > 0 else 1.0

    def cpu_seconds(self) -> float:
        """CPU seconds the work takes at any size (it conserves its CPU time)."""
        spec = self.spec
        t = self.truth if self.truth is not None else spec.elastic.efficiency if spec.elastic else None
        return self.work * (t.speedup(spec.min_units) if t is not None else 1.0)


@attrs.frozen(slots=True)
class Trajectory:
    """Starts at ``start``; runs ``acts`` in a closed loop; decodes ``tail`` seconds after the last.

    ``step``: the RL step it belongs to. Step 0 starts at time 0; step ``k`` once every trajectory
    of step ``k - 1`` has ended (the trainer updates the policy in between), each of its
    trajectories ``start`` seconds after that barrier. The scheduler runs on across steps with
    what it learned, as a live runtime does for a whole job."""

    acts: tuple[Act, ...]
    start: float = 0.0
    tail: float = 0.0
    step: int = 0


class Change(NamedTuple):
    """A resource change point of :attr:`Result.changes`: at ``t``, units allocated and busy
    moved by these deltas (a sandbox is allocated while idle; an action in it only makes it busy)."""

    t: float
    cpu_alloc: int
    cpu_busy: int
    gpu_alloc: int
    gpu_busy: int


class _Entry(NamedTuple):
    """One event in the heap, ordered as a tuple: time, then class (see above), then sequence."""

    t: float
    cls: int
    seq: int
    a: int  # trajectory (submit, end), action id (done, ready) or lane (tick)
    b: int = 0  # the tick's timer generation (a stale tick is dropped)


class Result:
    """Per-action columns (index = action number in submission order) plus per-trajectory ends and
    resource timelines. ``metrics.summarise`` turns it into numbers."""

    def __init__(self, policy: str, workload: str, pool_cpus: int, pool_gpus: int) -> None:
        self.policy = policy
        self.workload = workload
        self.pool_cpus = pool_cpus
        self.pool_gpus = pool_gpus
        self.kind: list[str] = []
        self.submit: list[float] = []
        self.grant: list[float] = []
        self.end: list[float] = []
        self.exec_s: list[float] = []
        self.overhead: list[float] = []
        self.units: list[int] = []
        self.traj_end: list[float] = []
        self.traj: list[int] = []  # per action: the index of its trajectory
        self.traj_step: list[int] = []  # per trajectory: its RL step (:attr:`Trajectory.step`)
        self.step_start: list[float] = [0.0]  # per RL step: its barrier plus its first trajectory's start
        self.changes: list[Change] = []
        self.restores = 0
        self.wall_s = 0.0
        self.scheduler_stats: list[dict[str, Any]] = []


class _Lane:
    __slots__ = ("sched", "timer_at", "timer_gen", "slots", "resident", "restore_s", "seen_restore")

    def __init__(self, sched: Scheduler, slots: float, restore_s: dict[str, float]) -> None:
        self.sched = sched
        self.timer_at: float | None = None
        self.timer_gen = 0
        self.slots = slots
        self.resident: dict[tuple[str, tuple[int, ...]], float] = {}  # truth: instance -> last use
        self.restore_s = restore_s
        self.seen_restore: set[str] = set()


def simulate(
    trajectories: Sequence[Trajectory],
    policy: Policy,
    *,
    workload: str = "custom",
    observers: Sequence[Observer] = (),
    restore_s: dict[str, float] | None = None,
    gpu_slots: float = 1.0,
    prewarm: Sequence[tuple[int, str, tuple[int, ...]]] = (),
    time_resolution: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    measured: bool = False,
) -> Result:
    """Run ``trajectories`` under ``policy`` (see :mod:`.baselines`) and return the :class:`Result`.

    ``restore_s``: seconds to restore each GPU service onto a cell when it is not resident there.
    ``gpu_slots``: how many full model copies one GPU's memory holds (a TP-k instance uses 1/k). ``prewarm``: (lane, service, gpus)
    instances resident at time 0. ``time_resolution``: round event times to this grid (e.g. 1e-6,
    as looptime does) so a run matches the live runtime on virtual time bit for bit. ``measured``:
    elastic CPU actions report the parallelism their work got when released, as ``lease.run`` and
    ``lease.exec`` (cgroup readable) do live; off, the scheduler learns from durations alone.
    """
    import time as _time

    t_wall = _time.perf_counter()
    restore = dict(restore_s or {})
    lanes = [_Lane(s, gpu_slots, restore) for s in policy.lanes]
    hinted = policy.name == "tangram"  # length hints and malleability are what a Tangram user can use
    res = Result(policy.name, workload, sum(len(s.pool.cpus) for s in policy.lanes),
                 sum(len(s.pool.gpus) for s in policy.lanes) // max(1, policy.batch))
    rr = None if time_resolution is None else round(1.0 / time_resolution)

    def q(t: float) -> float:
        return t if rr is None else round(t * rr) / rr

    def q_timer(t: float) -> float:
        """A timer fires at the first grid time not before it (minus asyncio's clock resolution),
        as a timer armed with ``loop.call_at`` does on looptime's clock."""
        return t if rr is None else (math.floor((t - 1e-9) * rr) + 1) / rr

    heap: list[_Entry] = []
    seq = 0

    def push(t: float, cls: int, a: int, b: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, _Entry(t, cls, seq, a, b))

    n_traj = len(trajectories)
    pos = [0] * n_traj  # next act index per trajectory
    hold_of: list[int] = [0] * n_traj  # aid of the trajectory's sandbox (static policy), 0 = none
    hold_units: list[int] = [0] * n_traj
    pending_first: dict[int, int] = {}  # hold aid -> action index waiting for that sandbox
    # per action id
    rec_of: dict[int, int] = {}  # aid -> record index (actions only, not holds)
    act_of: list[Act] = []
    traj_of: list[int] = res.traj
    lane_of: dict[int, int] = {}
    grant_of: dict[int, Grant] = {}
    par_of: dict[int, float] = {}  # measured: what each running elastic CPU action's work gets
    prog: dict[int, tuple[float, float, float]] = {}  # resized: (since, fraction done then, fraction/s)
    done_gen: dict[int, int] = {}  # resized: the generation of its live completion event
    workers_of: dict[int, int] = {}  # malleable, with a worker start-up: the workers its command started
    direct: set[int] = set()
    hold_traj: dict[int, int] = {}
    next_id = 1
    total_acts = sum(len(t.acts) for t in trajectories)
    done_acts = 0
    res.traj_end = [math.nan] * n_traj
    changes = res.changes
    # isolated model servers hold their GPU slices for the whole step, busy or not: allocated from
    # the start (as a static sandbox's cores are while its trajectory thinks); a call only makes
    # its GPUs busy
    dedicated = bool(getattr(policy, "service_lane", None))
    if dedicated and res.pool_gpus:
        changes.append(Change(0.0, 0, 0, res.pool_gpus, 0))
    hold = policy.hold
    if hold is not None and any(getattr(o, "sees_every_action", False) for o in observers):
        # under trajectory-static, actions run inside held sandboxes the scheduler never sees: a
        # recorder would write the sandboxes only, and their replay would be another workload
        raise ValueError(f"policy {policy.name!r} runs actions inside held sandboxes the scheduler does not "
                         "see, so a TraceRecorder would record the sandboxes only: record under tangram or "
                         "a fifo policy (its replay can then run any policy)")
    cpu_cost = policy.cpu_overhead_s
    startup = policy.hold_startup_s
    sb_rate = policy.sandbox_rate
    sb_slope = policy.sandbox_startup_per_inflight
    create_next = 0.0
    creating = 0
    startup_of: dict[int, float] = {}
    batch = policy.batch
    batch_cost = policy.batch_cost
    phys_active: dict[int, int] = {}
    phys = policy.phys_gpu
    phys_busy_delta = [0]
    for li, service, gpus in prewarm:
        lane = lanes[li]
        lane.resident[(service, tuple(gpus))] = 0.0
        r0 = restore.get(service)
        # reported like a restore of that instance: a TP-k copy loads 1/k of the weights per GPU
        lane.sched.handle(ServiceResidency(service, tuple(gpus), True,
                                           None if r0 is None else r0 / len(gpus)), 0.0)

    res.traj_step = [tr.step for tr in trajectories]
    n_steps = max(res.traj_step, default=0) + 1
    by_step: list[list[int]] = [[] for _ in range(n_steps)]
    for i, st in enumerate(res.traj_step):
        if st < 0:
            raise ValueError(f"trajectory {i}: step must be >= 0, got {st}")
        by_step[st].append(i)
    if trajectories and any(not b for b in by_step):
        raise ValueError(f"steps must be numbered 0..{n_steps - 1} without a gap, each with a trajectory")
    left = [len(b) for b in by_step]  # trajectories of each step still running
    res.step_start = [0.0] + [math.nan] * (n_steps - 1)

    def open_step(st: int, t0: float) -> None:
        for i in by_step[st]:
            tr = trajectories[i]
            if tr.acts:
                push(q(t0 + tr.start + tr.acts[0].think), _SUBMIT, i)
            else:
                push(q(t0 + tr.start + tr.tail), _END, i)

    open_step(0, 0.0)

    def arm(li: int) -> None:
        lane = lanes[li]
        nw = lane.sched.next_wakeup
        if nw != lane.timer_at:
            lane.timer_at = nw
            lane.timer_gen += 1
            if nw is not None:
                push(q_timer(nw), _TICK, li, lane.timer_gen)

    def feed(li: int, ev: Event, now: float) -> None:
        decs = lanes[li].sched.handle(ev, now)
        for obs in observers:
            obs((ev,), now, decs)
        for d in decs:
            if isinstance(d, Grant):
                on_grant(li, d, now)
            elif isinstance(d, Resize):
                on_resize(d, now)
            elif isinstance(d, Reject):
                raise ValueError(f"action {d.action_id} can never run on this pool: {d.reason}")
        arm(li)

    def on_resize(d: Resize, now: float) -> None:
        """A running malleable action's cores change: its remaining work runs at the new size
        from ``now`` plus one resize (the per-grant CPU cost); its completion is re-timed. A
        restartable one is killed and starts its work over on the new cores after that cost."""
        aid = d.action_id
        g = grant_of[aid]
        r = rec_of[aid]
        act = act_of[r]
        t0, f0, rate = prog.get(aid) or (res.grant[r] + res.overhead[r], 0.0, 1.0 / max(res.exec_s[r], 1e-12))
        t_eff = max(now + cpu_cost, t0)
        el = act.spec.elastic
        restarted = el is not None and el.restartable
        f = 0.0 if restarted else min(1.0, f0 + (t_eff - t0) * rate)
        new_rate = 1.0 / max(act.exec_s(d.units, workers_of.get(aid)), 1e-12)
        end = q(t_eff + (1.0 - f) / new_rate)
        prog[aid] = (t_eff, f, new_rate)
        gen = done_gen[aid] = done_gen.get(aid, 0) + 1
        dn = len(d.cpus) - len(g.cpus)
        grant_of[aid] = g._replace(cpus=d.cpus, units=d.units)
        changes.append(Change(now, dn, dn, 0, 0))
        res.exec_s[r] = end - res.grant[r] - res.overhead[r]
        res.units[r] = d.units
        if aid in par_of:  # measured: the cores' worth over the whole run, resizes included
            par_of[aid] = (act.parallelism(d.units) if restarted  # what the new run gets
                           else act.cpu_seconds() / max(end - res.grant[r], 1e-12))
        push(end, _DONE, aid, gen)

    def on_grant(li: int, g: Grant, now: float) -> None:
        aid = g.action_id
        grant_of[aid] = g
        nc, ng = len(g.cpus), len(g.gpus)
        if aid in hold_traj:  # a trajectory's sandbox: ready after container start-up
            nonlocal create_next, creating
            ti = hold_traj[aid]
            hold_units[ti] = nc
            changes.append(Change(now, nc, 0, ng, 0))
            begin = now
            if sb_rate:  # creations are rate limited: wait for the next slot
                begin = max(now, create_next)
                create_next = begin + 1.0 / sb_rate
            su = startup + sb_slope * creating  # start-up grows with the creations in flight
            creating += 1
            startup_of[aid] = su
            push(q(begin + su), _READY, aid)
            return
        r = rec_of[aid]
        act = act_of[r]
        spec = act.spec
        units = g.units
        over = act.overhead + (cpu_cost if nc else 0.0)
        svc = spec.service
        if svc is not None and ng:
            over += restore_cost(li, svc, g.gpus, now)
        w = None
        if ((act.startup or act.per_core is not None) and nc and hinted and spec.elastic is not None
                and spec.elastic.malleable):
            # its command started more workers than it holds cores, for a grow to use (lease.workers)
            most = min(spec.elastic.max_units, policy.lanes[li].pool.node_cores(g.cpus[0]))
            w = workers_of[aid] = malleable_workers(units, most, act.per_core)
        ex = act.exec_s(units, w)
        if batch > 1 and ng:  # a batching server: the calls sharing a GPU slow each other
            n = 0
            for gid in g.gpus:
                p = phys(gid)
                phys_active[p] = phys_active.get(p, 0) + 1
                n = max(n, phys_active[p])
                if phys_active[p] == 1:
                    phys_busy_delta[0] += 1
            ex *= 1.0 + batch_cost * (n - 1)
        res.grant[r] = now
        res.exec_s[r] = ex
        res.overhead[r] = over
        res.units[r] = units or nc or ng
        if measured and nc and spec.elastic is not None and spec.elastic.resource == "cpu":
            par_of[aid] = act.parallelism(units, over)
        if batch > 1 and ng:
            d = phys_busy_delta[0]
            phys_busy_delta[0] = 0
            changes.append(Change(now, nc, nc, 0 if dedicated else d, d))
        else:
            changes.append(Change(now, nc, nc, 0 if dedicated else ng, ng))
        push(q(now + (ex + over)), _DONE, aid)

    def restore_cost(li: int, svc: str, gpus: tuple[int, ...], now: float) -> float:
        lane = lanes[li]
        key = (svc, gpus)
        if key in lane.resident:
            lane.resident[key] = now
            return 0.0
        k = len(gpus)
        cost = lane.restore_s.get(svc, 0.0) / k  # k GPUs each load 1/k of the weights, in parallel
        res.restores += 1
        # a TP-k instance takes 1/k of a model's memory on each of its GPUs; a GPU holds ``slots``
        # models' worth. Evict least recently used instances on these GPUs until the new one fits.
        mine = set(gpus)
        while True:
            use = {g: 0.0 for g in gpus}
            for (_s, gs) in lane.resident:
                for g in gs:
                    if g in use:
                        use[g] += 1.0 / len(gs)
            if all(u + 1.0 / k <= lane.slots + 1e-9 for u in use.values()):
                break
            victims = [(t, kk) for kk, t in lane.resident.items() if mine & set(kk[1])]
            if not victims:  # the core refuses such grants (a copy larger than its GPUs' memory)
                raise ValueError(f"a copy of {svc!r} on GPUs {gpus} does not fit gpu_slots={lane.slots:g}")
            _t, victim = min(victims)
            del lane.resident[victim]
            pending_resid.append((li, ServiceResidency(victim[0], victim[1], False)))
        lane.resident[key] = now
        pending_resid.append((li, ServiceResidency(svc, gpus, True, cost)))
        return cost

    pending_resid: list[tuple[int, ServiceResidency]] = []
    handle_resid = policy.report_residency

    def flush_resid(now: float) -> None:
        while pending_resid:
            li, ev = pending_resid.pop(0)
            if handle_resid:
                feed(li, ev, now)

    def new_record(ti: int, act: Act, now: float) -> int:
        r = len(act_of)
        act_of.append(act)
        traj_of.append(ti)
        res.kind.append(act.spec.kind)
        res.submit.append(now)
        res.grant.append(math.nan)
        res.end.append(math.nan)
        res.exec_s.append(0.0)
        res.overhead.append(0.0)
        res.units.append(0)
        return r

    def run_in_sandbox(ti: int, r: int, now: float) -> None:
        """Trajectory-static: a CPU action runs at once on its trajectory's sandbox cores."""
        nonlocal next_id
        aid = next_id
        next_id += 1
        rec_of[aid] = r
        direct.add(aid)
        act = act_of[r]
        spec = act.spec
        units = hold_units[ti]
        m = min(units, spec.max_units) if spec.elastic is not None else 0
        ex = act.exec_s(m)
        res.grant[r] = now
        res.exec_s[r] = ex
        res.overhead[r] += act.overhead
        res.units[r] = m or spec.cpus
        busy = m or spec.cpus
        changes.append(Change(now, 0, busy, 0, 0))
        push(q(now + (ex + act.overhead)), _DONE, aid)

    last_report = 0
    while heap:
        now, cls, _s, a, b = heapq.heappop(heap)
        if cls == _SUBMIT:
            ti = a
            act = trajectories[ti].acts[pos[ti]]
            r = new_record(ti, act, now)
            spec = act.spec
            if hold is not None and policy.in_sandbox(spec):
                if hold_of[ti] == 0:  # first sandboxed action: create the trajectory's sandbox
                    hid = next_id
                    next_id += 1
                    hold_of[ti] = hid
                    hold_traj[hid] = ti
                    pending_first[hid] = r
                    lane_of[hid] = 0
                    feed(0, Submitted(hid, hold), now)
                else:
                    run_in_sandbox(ti, r, now)
            else:
                aid = next_id
                next_id += 1
                rec_of[aid] = r
                li, sspec = policy.route_traj(spec, ti)
                lane_of[aid] = li
                hint = act_of[r].hint if hinted else None
                feed(li, Submitted(aid, sspec, expected=hint), now)
            flush_resid(now)
        elif cls == _DONE:
            aid = a
            if done_gen and done_gen.get(aid, 0) != b:
                continue  # a completion re-timed by a resize
            if done_gen and aid in done_gen:
                done_gen[aid] = -1  # done: its older, re-timed completion events are stale too
                prog.pop(aid, None)
            r = rec_of.pop(aid)
            res.end[r] = now
            if workers_of:
                workers_of.pop(aid, None)
            if aid in direct:
                direct.discard(aid)
                act = act_of[r]
                changes.append(Change(now, 0, -(res.units[r]), 0, 0))
            else:
                g = grant_of.pop(aid)
                nc, ng = len(g.cpus), len(g.gpus)
                if batch > 1 and ng:
                    d = 0
                    for gid in g.gpus:
                        p = phys(gid)
                        phys_active[p] -= 1
                        if not phys_active[p]:
                            d += 1
                    changes.append(Change(now, -nc, -nc, 0 if dedicated else -d, -d))
                else:
                    changes.append(Change(now, -nc, -nc, 0 if dedicated else -ng, -ng))
                li = lane_of.pop(aid)
                feed(li, Released(aid, parallelism=par_of.pop(aid, None)) if measured else Released(aid), now)
                flush_resid(now)
            ti = traj_of[r]
            pos[ti] += 1
            tr = trajectories[ti]
            if pos[ti] < len(tr.acts):
                push(q(now + tr.acts[pos[ti]].think), _SUBMIT, ti)
            else:
                push(q(now + tr.tail), _END, ti)
            done_acts += 1
            if progress is not None and done_acts - last_report >= 2000:
                last_report = done_acts
                progress(done_acts, total_acts)
        elif cls == _END:
            ti = a
            res.traj_end[ti] = now
            st = res.traj_step[ti]
            left[st] -= 1
            if not left[st] and st + 1 < n_steps:  # the step's barrier: the next one starts
                res.step_start[st + 1] = now + min(trajectories[i].start for i in by_step[st + 1])
                open_step(st + 1, now)
            hid = hold_of[ti]
            if hid:
                g = grant_of.pop(hid)
                changes.append(Change(now, -len(g.cpus), 0, -len(g.gpus), 0))
                feed(0, Released(hid), now)
        elif cls == _READY:
            hid = a
            r = pending_first.pop(hid)
            su = startup_of.pop(hid)
            creating -= 1
            res.overhead[r] += su
            ti = hold_traj[hid]
            run_in_sandbox(ti, r, now)
            # the wait for the sandbox (and for a creation slot) counts as the first action's
            # queueing; the start-up as overhead
            res.grant[r] = now - su
        elif cls == _TICK:
            lane = lanes[a]
            if b == lane.timer_gen and lane.timer_at is not None:
                lane.timer_at = None
                feed(a, Tick(), now)
                flush_resid(now)
    if progress is not None:
        progress(total_acts, total_acts)
    for lane in lanes:
        if lane.sched.queued or lane.sched.running:
            raise RuntimeError(f"simulation ended with work left: {lane.sched!r}")
        res.scheduler_stats.append(dict(lane.sched.statistics()))
    res.wall_s = _time.perf_counter() - t_wall
    return res


def text_progress(label: str, stream: Any = None) -> Callable[[int, int], None]:
    """A dependency-free progress bar on stderr: ``label [#####.....] 52% 1234/2345``."""
    out = stream if stream is not None else sys.stderr

    def report(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        n = int(frac * 30)
        out.write(f"\r{label} [{'#' * n}{'.' * (30 - n)}] {frac:4.0%} {done}/{total}")
        if done >= total:
            out.write("\n")
        out.flush()

    return report
