"""Workload generators: seeded, closed-loop trajectories plus the pool they run on.

Every parameter is documented with its source in docs/simulator.md (the papers' published figures
where there are some, stated assumptions otherwise). Random draws use one
``numpy.random.Generator`` per workload, so a seed fixes the whole trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from ..errors import SpecError
from ..pool import Pool, Quota
from ..spec import ActionSpec, Amdahl, Elasticity
from .engine import Act, Trajectory

__all__ = ["Workload", "ai_coding", "deepsearch", "mopd", "WORKLOADS", "build"]


@attrs.frozen
class Workload:
    name: str
    pool: Pool
    trajectories: tuple[Trajectory, ...]
    services: tuple[str, ...] = ()
    service_share: dict[str, float] = attrs.field(factory=dict)
    restore_s: dict[str, float] = attrs.field(factory=dict)
    gpu_slots: float = 1.0
    policies: tuple[str, ...] = ("tangram",)
    params: dict[str, Any] = attrs.field(factory=dict)

    @property
    def n_actions(self) -> int:
        return sum(len(t.acts) for t in self.trajectories)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    """Lognormal draws with the given *mean* (not median) and log-space sigma."""
    mu = math.log(mean) - sigma * sigma / 2
    return rng.lognormal(mu, sigma, n)


def cpu_pool(nodes: int, cores: int) -> Pool:
    """``nodes`` machines of ``cores`` cores, one NUMA cell per machine (a grant never spans two)."""
    return Pool(cpus=nodes * cores, numa=[list(range(i * cores, (i + 1) * cores)) for i in range(nodes)])


# ----------------------------------------------------------------------------------------- ai-coding
CODING = dict(
    actions_min=20, actions_max=60,          # SWE-style agent turns per trajectory (assumption)
    test_frac=0.4,                           # share of actions that run tests/builds (assumption)
    test_work_mean=4.0, test_sigma=1.0,      # seconds at 1 core, lognormal (heavy tail)
    test_parallel=0.9, test_max_cpus=16,     # Amdahl p of test runs (pytest -n / make -j), cap
    test_malleable=False,                    # tests can use cores added mid-run (make -j over a cpuset)
    test_restartable=False,                  # tests may be killed and run again on more cores (idempotent)
    test_worker_startup=0.0,                 # CPU s each test worker spends starting (pytest-xdist's
                                             # import and collection); a malleable test starts as many
                                             # workers as it may be grown to (lease.workers) ...
    test_workers_per_core=None,              # ... or this many per core it holds, up to that
    shell_work_mean=0.5, shell_sigma=0.8,    # edits, grep, cat: serial, 1 core
    busy_frac=0.47,                          # paper: sandbox busy ~47% of a trajectory's life
    think_sigma=0.6,                         # decode pause spread (lognormal)
    sandbox_cpus=3,                          # static sizing: 3840 cores / 1280 trajectories
    sandbox_rate=None,                       # static: sandbox creations per second (None: unlimited)
    sandbox_startup_per_inflight=0.0,        # static: extra start-up seconds per creation in flight
    true_parallel=None,                      # how tests really scale, if not as declared (Amdahl p)
    test_hint_sigma=None,                    # tests carry a length hint, off by this log-sigma (None: none)
    test_traj_sigma=None,                    # log-sigma of a per-trajectory test-length factor (one repo's
                                             # suite is long every time); test_sigma stays the total spread
    sandbox_names=False,                     # specs name their trajectory's sandbox (container="sb<i>"),
                                             # or its group ("group": group="sb<i>", what adapters set),
                                             # or its task ("task": group="task<i // task_size>")
    task_size=1,                             # trajectories per task (GRPO: samples of one prompt, one
                                             # repository): they share the test_traj_sigma factor
    build_frac=0.0,                          # share of the test actions that are builds instead: kind
                                             # "build", the same work, scaling as build_parallel (a
                                             # mixed pool: two elastic kinds that gain differently)
    build_parallel=0.99,                     # Amdahl p of builds (make -j of many small units)
    think_parallel=None,                     # the Amdahl p the think time is calibrated with (None: the
                                             # declared test_parallel); set it to compare declarations
                                             # of one workload: the same trajectories, declared otherwise
)


def ai_coding(batch: int = 1280, *, nodes: int = 15, cores: int = 256, seed: int = 0,
              **over: Any) -> Workload:
    """SWE-style coding agents: decode -> shell/test action -> decode ... on a CPU sandbox pool."""
    p = _params(CODING, over, "ai_coding")  # ranges checked there (test_frac, task_size, ...)
    rng = np.random.default_rng(seed)
    def tests(kind: str, parallel: float) -> ActionSpec:  # tests and builds differ in kind and scaling
        return ActionSpec(kind=kind, cpus=1, elastic=Elasticity("cpu", p["test_max_cpus"], Amdahl(parallel),
                                                                malleable=bool(p["test_malleable"]),
                                                                restartable=bool(p["test_restartable"])))

    test, build = tests("test", p["test_parallel"]), tests("build", p["build_parallel"])
    shell = ActionSpec(kind="shell", cpus=1)
    test0, shell0, build0 = test, shell, build
    bf = float(p["build_frac"])
    if not 0.0 <= bf <= 1.0:
        raise ValueError(f"build_frac must be in [0, 1], got {bf!r}")
    # which tests are builds, from its own stream: every other draw is the workload without builds
    brng = np.random.default_rng([seed, 3]) if bf else None
    # mean action seconds in a 3-core sandbox; think is set so the sandbox is busy busy_frac of the time
    sb = p["sandbox_cpus"]
    tp = p["think_parallel"]
    calib = test if tp is None else tests("test", float(tp))
    act_mean = (p["test_frac"] * p["test_work_mean"] * calib.relative_duration(min(sb, p["test_max_cpus"]))
                + (1 - p["test_frac"]) * p["shell_work_mean"])
    think_mean = act_mean * (1 - p["busy_frac"]) / p["busy_frac"]
    p["think_mean"] = round(think_mean, 4)
    truth = Amdahl(p["true_parallel"]) if p.get("true_parallel") is not None else None
    hs = p.get("test_hint_sigma")
    # hints from their own stream, so a workload with hints is the same workload without them
    hrng = np.random.default_rng([seed, 1]) if hs is not None else None
    ts = float(p.get("test_traj_sigma") or 0.0)
    # the trajectory factor from its own stream too: every other draw is the uncorrelated workload's
    trng = np.random.default_rng([seed, 2]) if ts else None
    if ts and not 0.0 < ts < p["test_sigma"]:
        raise ValueError(f"test_traj_sigma must be in (0, test_sigma), got {ts!r}")
    a_sigma = math.sqrt(p["test_sigma"] ** 2 - ts * ts)
    su = float(p["test_worker_startup"])
    pc = p["test_workers_per_core"]
    if pc is not None and (isinstance(pc, bool) or not isinstance(pc, int) or pc < 1):
        raise ValueError(f"test_workers_per_core must be None or an int >= 1, got {pc!r}")
    trajs = []
    named = p["sandbox_names"]
    if named not in (False, True, "group", "task"):
        raise ValueError(f"sandbox_names must be False, True, 'group' or 'task', got {named!r}")
    tsz = p["task_size"]
    factor = 1.0
    for i in range(batch):
        if named == "group":
            test, shell, build = (attrs.evolve(x, group=f"sb{i}") for x in (test0, shell0, build0))
        elif named == "task":
            test, shell, build = (attrs.evolve(x, group=f"task{i // tsz}") for x in (test0, shell0, build0))
        elif named:
            test, shell, build = (attrs.evolve(x, container=f"sb{i}") for x in (test0, shell0, build0))
        n = int(rng.integers(p["actions_min"], p["actions_max"] + 1))
        is_test = rng.random(n) < p["test_frac"]
        tw = _lognormal(rng, p["test_work_mean"], a_sigma, n)
        if trng is not None:
            f = _lognormal(trng, 1.0, ts, 1)[0]  # drawn for every trajectory: one stream whatever the task size
            if i % tsz == 0:
                factor = f  # a task's trajectories share its first one's factor
            tw = tw * factor
        sw = _lognormal(rng, p["shell_work_mean"], p["shell_sigma"], n)
        th = _lognormal(rng, think_mean, p["think_sigma"], n + 1)
        # a hint is right on average: work times a lognormal error of mean 1
        hint = None if hrng is None else tw * _lognormal(hrng, 1.0, hs, n) if hs else tw
        is_build = brng.random(n) < bf if brng is not None else np.zeros(n, dtype=bool)
        acts = tuple(Act(build if is_build[k] else test, float(tw[k]), float(th[k]),
                         truth=None if is_build[k] else truth,
                         hint=None if hint is None else float(hint[k]), startup=su, per_core=pc) if is_test[k]
                     else Act(shell, float(sw[k]), float(th[k])) for k in range(n))
        trajs.append(Trajectory(acts, 0.0, float(th[n])))
    return Workload("ai-coding", cpu_pool(nodes, cores), tuple(trajs),
                    policies=("tangram", "static", "fifo1", "fifo4", "fifo16"), params=p)


# ----------------------------------------------------------------------------------------- deepsearch
SEARCH = dict(
    turns_min=4, turns_max=16,               # search calls per trajectory (assumption)
    think_mean=12.0, think_sigma=0.5,        # Qwen3-32B decode of ~400 tokens at ~35 tok/s (assumption)
    search_mean=1.5, search_sigma=0.6,       # web-search API latency, seconds (assumption)
    search_concurrency=512, search_rate=200.0,  # API quota: in flight, requests/s (assumption)
    judge_work_mean=0.5, judge_sigma=0.5,    # GPT-OSS judge/reward, seconds at 1 GPU (assumption; 6 s
                                             # kept all 8 GPUs ~97 % busy under every policy)
    judge_parallel=0.85, judge_max_gpus=8,
    gpus=8,                                  # one 8-GPU node for the judge (paper: reward GPUs <3% busy)
    restore_s=4.0,                           # judge restore from pinned host memory (assumption)
    search_procs=1,                          # fixed policies: per-process search semaphores (1: one quota)
    iso_batch=1, iso_batch_cost=0.9,         # isolated judge server batching (1: a FIFO per GPU)
    iso_tp=1,                                # isolated judge: GPUs per call
)


def deepsearch(batch: int = 2048, *, seed: int = 0, gpus: int | None = None, **over: Any) -> Workload:
    """Search agents: decode -> web search (API quota) ... -> final GPU judge/reward call."""
    p = _params(SEARCH, over, "deepsearch")
    if gpus is not None:
        p["gpus"] = gpus
    rng = np.random.default_rng(seed)
    search = ActionSpec(kind="search", quotas={"search": 1})
    judge = ActionSpec(kind="judge", gpus=1, service="judge",
                       elastic=Elasticity("gpu", p["judge_max_gpus"], Amdahl(p["judge_parallel"])))
    trajs = []
    for _ in range(batch):
        n = int(rng.integers(p["turns_min"], p["turns_max"] + 1))
        th = _lognormal(rng, p["think_mean"], p["think_sigma"], n + 1)
        sw = _lognormal(rng, p["search_mean"], p["search_sigma"], n)
        jw = float(_lognormal(rng, p["judge_work_mean"], p["judge_sigma"], 1)[0])
        acts = [Act(search, float(sw[k]), float(th[k])) for k in range(n)]
        acts.append(Act(judge, jw, float(th[n])))
        trajs.append(Trajectory(tuple(acts), 0.0, 0.0))
    pool = Pool(gpus=p["gpus"], quotas={"search": Quota(p["search_concurrency"], rate=p["search_rate"])})
    return Workload("deepsearch", pool, tuple(trajs), services=("judge",), service_share={"judge": 1.0},
                    restore_s={"judge": p["restore_s"]}, policies=("tangram", "isolated", "fifo1", "fifo4"),
                    params=p)


# ----------------------------------------------------------------------------------------- mopd
MOPD = dict(
    teachers=9, zipf_s=1.0,                  # paper: 9 teacher models, called very unevenly (Zipf assumed)
    calls_min=8, calls_max=16,               # teacher calls per trajectory: 8k-token chunks of a long response
    chunk_tokens=8192, decode_tok_s=15.0,    # student decode between calls -> think ~546 s (assumption),
                                             # set so the isolated 36-GPU pool is under 5 % busy (~3 %)
    think_sigma=0.3,
    work_mean=0.5, work_sigma=0.5,           # teacher log-prob prefill of a chunk at 1 GPU (assumption)
    teacher_parallel=0.8, teacher_max_gpus=4,
    nodes=5, gpus_per_node=8,                # paper: GPU pool 5 nodes x 8 GPUs
    restore_s=3.0,                           # ~60 GB of weights from pinned host memory (assumption)
    gpu_slots=2,                             # 141 GB H200 holds two ~60 GB teachers (TP-k: 1/k each)
    iso_gpus=4,                              # paper: task-isolated 9 teachers x 4 GPUs = 36
    iso_tp=1,                                # isolated servers: GPUs per call (4: one TP-4 server a teacher)
    iso_batch=1, iso_batch_cost=0.9,         # isolated servers: concurrent calls batched per GPU (1: a
                                             # FIFO per GPU); a batch of n takes 1 + cost (n - 1) calls
)


def mopd(batch: int = 2048, *, seed: int = 0, gpus: int | None = None, **over: Any) -> Workload:
    """Multi-teacher on-policy distillation: decode a chunk -> one teacher scores it -> decode ..."""
    p = _params(MOPD, over, "mopd")
    rng = np.random.default_rng(seed)
    k = p["teachers"]
    names = tuple(f"teacher{i}" for i in range(k))
    w = np.array([1.0 / (i + 1) ** p["zipf_s"] for i in range(k)])
    w /= w.sum()
    specs = [ActionSpec(kind=n, gpus=1, service=n,
                        elastic=Elasticity("gpu", p["teacher_max_gpus"], Amdahl(p["teacher_parallel"])))
             for n in names]
    think_mean = p["chunk_tokens"] / p["decode_tok_s"]
    p["think_mean"] = round(think_mean, 3)
    trajs = []
    for _ in range(batch):
        n = int(rng.integers(p["calls_min"], p["calls_max"] + 1))
        teacher = rng.choice(k, size=n, p=w)
        th = _lognormal(rng, think_mean, p["think_sigma"], n)
        wk = _lognormal(rng, p["work_mean"], p["work_sigma"], n)
        acts = tuple(Act(specs[int(teacher[j])], float(wk[j]), float(th[j])) for j in range(n))
        trajs.append(Trajectory(acts, 0.0, 0.0))
    ng = gpus if gpus is not None else p["nodes"] * p["gpus_per_node"]
    return Workload("mopd", Pool(gpus=ng), tuple(trajs), services=names,
                    service_share={n: float(x) for n, x in zip(names, w)},
                    restore_s={n: p["restore_s"] for n in names}, gpu_slots=p["gpu_slots"],
                    policies=("tangram", "isolated", "fifo1", "fifo4"), params=p)


WORKLOADS: dict[str, Callable[..., Workload]] = {"ai-coding": ai_coding, "deepsearch": deepsearch, "mopd": mopd}
PARAMS: dict[str, dict[str, Any]] = {"ai-coding": CODING, "deepsearch": SEARCH, "mopd": MOPD}


# What each numeric parameter may be (every other number: finite and >= 0). A zero mean or rate
# divided by zero, a negative restore gave an ACT below the execution time, and a negative
# ``iso_tp`` never finished sizing the slices.
_COUNTS = frozenset({"actions_min", "actions_max", "test_max_cpus", "sandbox_cpus", "turns_min", "turns_max",
                     "search_concurrency", "judge_max_gpus", "gpus", "search_procs", "iso_batch", "iso_tp",
                     "teachers", "calls_min", "calls_max", "teacher_max_gpus", "nodes", "gpus_per_node",
                     "iso_gpus", "task_size"})  # ints >= 1
_POSITIVE = frozenset({"test_work_mean", "shell_work_mean", "search_mean", "judge_work_mean", "work_mean",
                       "think_mean", "decode_tok_s", "chunk_tokens", "search_rate", "sandbox_rate", "gpu_slots"})
_FRACTIONS = {"busy_frac": (False, True), "test_frac": (True, True), "test_parallel": (True, True),
              "true_parallel": (True, True), "judge_parallel": (True, True), "teacher_parallel": (True, True),
              "iso_batch_cost": (False, True)}  # (0 allowed, 1 allowed)
_MOST = 1e9  # larger than any real figure: a 1e308 overflowed to inf inside the scheduler


def rl_steps(make: Callable[..., Workload], batch: int, *, steps: int = 2, update_s: float = 120.0,
             seed: int = 0, **kw: Any) -> Workload:
    """``steps`` RL steps of ``make(batch, seed=..., **kw)`` back to back, each drawn with its own
    seed (``seed``, ``seed + 1000``, ...), step ``k`` starting ``update_s`` seconds (the trainer's
    update) after every trajectory of step ``k - 1`` has ended (:attr:`.Trajectory.step`).

    One step from a cold scheduler is what the matrix measures by default; a job runs many, and a
    live runtime carries what it learned (lengths, rates, widths, resident copies) from one to the
    next. ``summarise(result, step=steps - 1)`` measures the last one."""
    if steps < 1 or update_s < 0:
        raise ValueError("steps must be >= 1 and update_s >= 0")
    parts = [make(batch, seed=seed + 1000 * k, **kw) for k in range(steps)]
    trajs = tuple(attrs.evolve(tr, step=k, start=tr.start + (update_s if k else 0.0))
                  for k, wl in enumerate(parts) for tr in wl.trajectories)
    first = parts[0]
    return attrs.evolve(first, trajectories=trajs,
                        params={**first.params, "steps": steps, "update_s": update_s})


def _check_value(workload: str, name: str, v: Any, default: Any) -> None:
    where = f"{workload}: parameter {name}"
    if isinstance(v, bool) and not isinstance(default, bool):  # True is 1 to Python, not to a model
        raise ValueError(f"{where} must be a number, got {v!r}")
    if v is None or isinstance(v, (bool, str)) or not isinstance(v, (int, float)):
        return  # switches, names and optional parameters turned off: the builders check those
    if not math.isfinite(v) or abs(v) > _MOST:
        raise ValueError(f"{where} must be a finite number of at most {_MOST:g}, got {v!r}")
    if name in _COUNTS:
        if not (float(v).is_integer() and v >= 1):
            raise ValueError(f"{where} must be an integer >= 1, got {v!r}")
    elif name in _POSITIVE:
        if not v > 0:
            raise ValueError(f"{where} must be > 0, got {v!r}")
    elif name in _FRACTIONS:
        zero, one = _FRACTIONS[name]
        if not ((0 <= v if zero else 0 < v) and (v <= 1 if one else v < 1)):
            raise ValueError(f"{where} must be in {'[' if zero else '('}0, 1{']' if one else ')'}, got {v!r}")
    elif v < 0:
        raise ValueError(f"{where} must be >= 0, got {v!r}")


def _params(defaults: dict[str, Any], over: dict[str, Any], workload: str) -> dict[str, Any]:
    """The workload's parameters with ``over`` applied; a name it does not have is an error (a
    misspelt ``test_max_cpu=32`` used to run the defaults without a word), and so is a value the
    model cannot take (a zero mean, a negative restore, a NaN)."""
    unknown = sorted(set(over) - set(defaults))
    if unknown:
        raise SpecError(f"{workload}: unknown parameter(s) {unknown}; known: {sorted(defaults)}")
    p = {**defaults, **over}
    for name, v in over.items():
        _check_value(workload, name, v, defaults[name])
        if name in _COUNTS and isinstance(v, float):
            p[name] = int(v)
    for lo, hi in (("actions_min", "actions_max"), ("turns_min", "turns_max"), ("calls_min", "calls_max")):
        if lo in p and p[lo] > p[hi]:
            raise ValueError(f"{workload}: {lo} ({p[lo]}) is above {hi} ({p[hi]})")
    return p


def build(name: str, batch: int | None = None, **kw: Any) -> Workload:
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)} or trace")
    fn = WORKLOADS[name]
    return fn(batch, **kw) if batch is not None else fn(**kw)


def isolated_prewarm(wl: Workload, policy: Any) -> list[tuple[int, str, tuple[int, ...]]]:
    """Isolated slices keep their models loaded: one instance per ``tp``-GPU cell of each slice."""
    out = []
    for svc, li in policy.service_lane.items():
        ids = policy.lanes[li].pool.gpus
        tp = policy.tp
        for i in range(0, len(ids) - tp + 1, tp):
            out.append((li, svc, tuple(ids[i:i + tp])))
    return out


def shared_prewarm(wl: Workload, policy: Any) -> list[tuple[int, str, tuple[int, ...]]]:
    """One copy of every service for a shared pool, at the width the core first grants its calls
    (``Scheduler.initial_gpu_width``), hottest first, each on the next aligned cell with room
    (``gpu_slots`` models per GPU; a TP-k copy uses 1/k of one per GPU)."""
    first: dict[str, ActionSpec] = {}
    for tr in wl.trajectories:
        for act in tr.acts:
            svc = act.spec.service
            if svc is not None and svc not in first:
                first[svc] = act.spec
        if len(first) == len(wl.services):
            break
    ids = policy.lanes[0].pool.gpus
    use = [0.0] * len(ids)
    at = 0
    out = []
    for svc in sorted(first, key=lambda s: -wl.service_share.get(s, 0.0)):
        _lane, spec = policy.route(first[svc])
        k = policy.lanes[0].initial_gpu_width(spec, services=len(first))
        cells = [o for o in range(0, len(ids) - k + 1, k)]
        if not cells:
            continue
        for step in range(len(cells)):
            o = cells[(at + step) % len(cells)]
            if all(use[p] + 1.0 / k <= wl.gpu_slots + 1e-9 for p in range(o, o + k)):
                for p in range(o, o + k):
                    use[p] += 1.0 / k
                out.append((0, svc, tuple(ids[o:o + k])))
                at = (cells.index(o) + 1) % len(cells)
                break
    return out


def run_policy(wl: Workload, name: str, *, progress: Any = None, iso_gpus: int | None = None,
               warm_start: bool = True, measured: bool = False, observers: Sequence[Any] = (),
               **sched_opts: Any) -> Any:
    """Simulate ``wl`` under policy ``name`` (a fresh scheduler) and return the Result.

    ``warm_start``: a shared GPU pool starts with one copy of every service resident, as the
    isolated slices start with theirs (a rollout step follows the previous one, whose copies are
    still cached; without it a one-step simulation charges every policy but isolated a cold start).
    ``measured``: released actions report the parallelism their work got (see :func:`.simulate`).
    ``iso_gpus`` (isolated): GPUs per service; None splits the whole pool in proportion to call
    share (the CLI's ``--iso-gpus share``; its default is ``wl.params["iso_gpus"]``).
    ``observers``: passed to :func:`.simulate` (each sees every event batch and its decisions).
    """
    from .engine import simulate

    pol = build_policy(wl, name, iso_gpus=iso_gpus, **sched_opts)
    if name == "isolated":
        prewarm = isolated_prewarm(wl, pol)
    elif warm_start and wl.services and len(pol.lanes) == 1:
        prewarm = shared_prewarm(wl, pol)
    else:
        prewarm = []
    return simulate(wl.trajectories, pol, workload=wl.name, restore_s=wl.restore_s, gpu_slots=wl.gpu_slots,
                    prewarm=prewarm, progress=progress, measured=measured, observers=observers)


def build_policy(wl: Workload, name: str, *, iso_gpus: int | None = None, **sched_opts: Any) -> Any:
    """Policy ``name`` for ``wl`` as :func:`run_policy` simulates it (the workload's failure-mode
    parameters applied to the fixed policies, the GPU capacity to the core): built without running,
    so a CLI can refuse a policy the workload cannot run before any other policy has run."""
    from .baselines import make_policy

    kw: dict[str, Any] = {}
    p = wl.params
    if name == "isolated":
        kw = dict(services=wl.services, service_share=wl.service_share, gpus_per_service=iso_gpus,
                  iso_batch=int(p.get("iso_batch", 1)), iso_batch_cost=float(p.get("iso_batch_cost", 1.0)),
                  iso_tp=int(p.get("iso_tp", 1)))
    if name == "static":
        kw = dict(sandbox_cpus=p.get("sandbox_cpus", 3), sandbox_rate=p.get("sandbox_rate"),
                  sandbox_startup_per_inflight=float(p.get("sandbox_startup_per_inflight", 0.0)))
    if name != "tangram" and int(p.get("search_procs", 1)) > 1:
        kw["quota_procs"] = int(p["search_procs"])
    if (name == "tangram" or name.startswith("fifo")) and "gpu_slots" not in sched_opts and wl.pool.gpus:
        # the core knows device capacity: tangram and the fixed-DoP FIFOs run the same core, so
        # the comparison isolates elasticity (isolated slices keep their models resident anyway)
        sched_opts = {**sched_opts, "gpu_slots": wl.gpu_slots}
    return make_policy(name, wl.pool, **kw, **sched_opts)
