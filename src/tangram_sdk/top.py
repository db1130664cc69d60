"""``tangram top``: a live, refreshing view of a running pool.

Long RL runs are watched, not read afterwards. Two sources, one screen:

* ``--prometheus URL``: the endpoint a :class:`~tangram_sdk.observe.PrometheusMetrics` serves
  (``prometheus_client.start_http_server(port)``) in the process that runs the Tangram. It has
  everything: per-resource allocated vs busy units, queue length and oldest wait per action kind,
  ACT split into queueing / overhead / execution, restores and evictions per GPU service.
* ``--ray NAME``: the job-wide pool of :mod:`tangram_sdk.ray` (the named scheduler actor), read
  with ``TangramCluster.get(NAME).statistics()``. That API gives per-node allocated units, queue
  length, mean ACT / queueing / execution and evictions, but not per-kind queues, busy units or
  per-service restores; those rows say so instead of showing a number.

On a terminal the view is redrawn in place every ``--interval`` seconds until Ctrl-C; otherwise
(a log, a pipe) each refresh is printed as one block. ``--once`` prints one view and exits.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from ._args import missing_module, positive_float, positive_int

__all__ = ["add_arguments", "check", "run", "parse_prometheus", "from_prometheus", "from_ray", "render"]

_NA = "n/a"


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prometheus", metavar="URL",
                     help="a PrometheusMetrics endpoint, e.g. http://127.0.0.1:9100/metrics")
    src.add_argument("--ray", metavar="NAME", help="the name of a deployed tangram_sdk.ray pool (its scheduler actor)")
    p.add_argument("--namespace", default="tangram", help="Ray namespace of the pool (default: tangram)")
    p.add_argument("--address", default="auto", help="Ray cluster address for ray.init (default: auto)")
    p.add_argument("--interval", type=positive_float, default=2.0, help="seconds between refreshes (default 2)")
    p.add_argument("--iterations", type=positive_int, default=None, help="stop after this many refreshes")
    p.add_argument("--once", action="store_true", help="print one view and exit (same as --iterations 1)")
    p.add_argument("--timeout", type=positive_float, default=5.0,
                   help="seconds to wait for the endpoint or the actor on each refresh (default 5)")


_URL = re.compile(r"https?://([^\s/:\[\]]+|\[[0-9a-fA-F:.]+\])(:[0-9]{1,5})?(/\S*)?")  # a name, IPv4 or [IPv6]


def check(args: argparse.Namespace) -> str | None:
    if not args.prometheus and not args.ray:
        return "give a pool to watch: --prometheus URL or --ray NAME"
    if args.prometheus:
        url = args.prometheus if "://" in args.prometheus else f"http://{args.prometheus}"
        m = _URL.fullmatch(url)
        if m is None:
            return f"argument --prometheus: expected a URL like http://host:9100/metrics, got {args.prometheus!r}"
        port = m.group(2)
        if port and not 0 < int(port[1:]) < 65536:
            return f"argument --prometheus: port must be 1..65535, got {port[1:]}"
        args.prometheus = url
    if args.ray is not None:
        if not args.ray.strip():
            return "argument --ray: the pool's name is empty"
        if missing_module("ray"):
            return "--ray needs ray: pip install 'tangram-sdk[ray]'"
    elif args.namespace != "tangram" or args.address != "auto":
        return "--namespace and --address need --ray NAME"
    if args.once:
        args.iterations = 1
    return None


# ------------------------------------------------------------------------------------- sources
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition -> ``{metric name: [(labels, value), ...]}`` (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# TYPE "):  # a family with no samples yet still says it exists
            parts = line.split()
            if len(parts) >= 3:
                out.setdefault(parts[2], [])
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, _, labels, value = m.group(1), m.group(2), m.group(3), m.group(4)
        try:
            v = float(value)
        except ValueError:
            continue
        lab = {k: _unescape(x) for k, x in _LABEL.findall(labels or "")}
        out.setdefault(name, []).append((lab, v))
    return out


def _unescape(value: str) -> str:
    """A label value as the exposition format escapes it (only backslash, quote and newline):
    ``unicode_escape`` read UTF-8 text as Latin-1 ("café" came out as "cafÃ©")."""
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


_ESCAPE = re.compile(r"\\(.)", re.S)


def _first(*values: float | None) -> float | None:
    """The first value that is there (0 is a value: ``a or b`` took it for missing)."""
    return next((v for v in values if v is not None), None)


def _one(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    for lab, v in m.get(name, ()):
        if all(lab.get(k) == x for k, x in labels.items()):
            return v
    return None


def from_prometheus(text: str, ns: str = "tangram") -> dict[str, Any]:
    """The view's snapshot from one scrape of a PrometheusMetrics endpoint."""
    m = parse_prometheus(text)
    if not any(k.startswith(f"{ns}_") for k in m):
        raise ValueError(f"no {ns}_* metrics at this endpoint (is a PrometheusMetrics registered there?)")
    resources = []
    names = sorted({lab.get("resource", "") for lab, _ in m.get(f"{ns}_resource_units", ())} - {""},
                   key=lambda r: (r.startswith("quota:"), r))
    for r in names:
        used = _one(m, f"{ns}_resource_units", resource=r, state="used")
        free = _one(m, f"{ns}_resource_units", resource=r, state="free")
        busy = _one(m, f"{ns}_resource_busy_units", resource=r)
        total = (used or 0) + free if free is not None else None
        resources.append({"name": r, "allocated": used, "total": total, "busy": busy})
    kinds: dict[str, dict[str, Any]] = {}
    for metric, key in ((f"{ns}_queued_by_kind", "queued"), (f"{ns}_running_by_kind", "running"),
                        (f"{ns}_oldest_wait_seconds", "oldest_wait_s")):
        for lab, v in m.get(metric, ()):
            kinds.setdefault(lab.get("kind", "?"), {"queued": 0, "running": 0, "oldest_wait_s": 0.0})[key] = v
    act = {"queue_s": _one(m, f"{ns}_act_part_seconds", part="queue"),
           "overhead_s": _one(m, f"{ns}_act_part_seconds", part="overhead"),
           "exec_s": _one(m, f"{ns}_act_part_seconds", part="execution"),
           "act_s": _one(m, f"{ns}_mean_act_seconds")}
    if act["queue_s"] is None:  # an older exporter: the runtime's own means (overhead inside execution)
        act.update(queue_s=_one(m, f"{ns}_mean_queue_seconds"), exec_s=_one(m, f"{ns}_mean_exec_seconds"))
    elif act["exec_s"] is not None:  # the parts and their sum from the same completed actions
        act["act_s"] = act["queue_s"] + (act["overhead_s"] or 0.0) + act["exec_s"]
    services: dict[str, dict[str, Any]] = {}
    for metric, key in ((f"{ns}_service_restores_total", "restores"), (f"{ns}_service_evictions_total", "evictions"),
                        (f"{ns}_service_restore_seconds_total", "restore_s")):
        for lab, v in m.get(metric, ()):
            services.setdefault(lab.get("service", "?"), {"restores": 0, "evictions": 0, "restore_s": 0.0})[key] = v
    notes: list[str] = []
    fb = _one(m, f"{ns}_fallback_dop")
    if fb:
        notes.append(_fallback_note(int(fb)))
    missing = None
    if f"{ns}_queued_by_kind" not in m:
        missing = "this exporter predates the per-kind and per-service metrics: upgrade tangram-sdk there"
    return {"resources": resources, "running": _one(m, f"{ns}_running"), "queued": _one(m, f"{ns}_queued"),
            "completed": _first(_one(m, f"{ns}_completed_total"), _one(m, f"{ns}_completed")),
            "kinds": kinds, "per_kind": f"{ns}_queued_by_kind" in m,
            "act": act, "services": services, "per_service": any(k in m for k in (f"{ns}_service_restores", f"{ns}_service_restores_total")), "notes": notes,
            "missing": missing}


def _fallback_note(dop: int, where: str = "") -> str:
    """Why a pool's elastic kind runs at one size: the user should know sizing is not elastic now."""
    return (f"{where}CPU sizing: fixed DoP {dop}, the fallback (elastic sizing is measurably behind that "
            "fixed DoP on this stream; it is tried again now and then, and when the load moves)")


def from_ray(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The view's snapshot from ``TangramCluster.statistics()`` (the job-wide Ray pool)."""
    resources = []
    running = queued = completed = 0
    evictions = 0
    sums = {"mean_act_s": 0.0, "mean_queue_s": 0.0, "mean_exec_s": 0.0}
    weight = 0
    fallbacks: list[str] = []  # nodes whose elastic CPU kind runs at a fixed DoP
    for label, n in sorted((stats.get("nodes") or {}).items()):
        label = label if len(label) <= 12 else label[:8]  # a Ray node id: its first 8 hex digits
        if not n.get("alive", True):
            resources.append({"name": f"{label}: lost ({n.get('reason') or 'no reason given'})",
                              "allocated": None, "total": None, "busy": None})
            continue
        if n.get("fallback_dop"):
            fallbacks.append(_fallback_note(int(n["fallback_dop"]), f"{label}: "))
        for r in ("cpus", "gpus"):
            total, free = n.get(f"{r}_total"), n.get(f"{r}_free")
            if total:
                resources.append({"name": f"{label}/{r}", "allocated": total - (free or 0), "total": total,
                                  "busy": None})
        for r, c in sorted((n.get("counted") or {}).items()):  # memory (when counted), declared kinds
            resources.append({"name": f"{label}/{r}", "allocated": c.get("used"), "total": c.get("total"),
                              "busy": None})
        running += n.get("running") or 0
        queued += n.get("queued") or 0
        done = n.get("completed") or 0
        completed += done
        evictions += n.get("evictions") or 0
        if done and n.get("mean_act_s") is not None:
            weight += done
            for k in sums:
                sums[k] += (n.get(k) or 0.0) * done
    for name, q in sorted((stats.get("quotas") or {}).items()):
        resources.append({"name": f"quota:{name}", "allocated": q.get("used"), "total": q.get("concurrency"),
                          "busy": None})
    act: dict[str, float | None] = {"queue_s": None, "overhead_s": None, "exec_s": None, "act_s": None}
    if weight:
        act.update(queue_s=sums["mean_queue_s"] / weight, exec_s=sums["mean_exec_s"] / weight,
                   act_s=sums["mean_act_s"] / weight)
    notes = [f"Ray pool {stats.get('name', '?')!r}: {stats.get('clients', 0)} client(s), {stats.get('held', 0)} "
             f"lease(s) held, {stats.get('pending', 0)} pending, {evictions} GPU eviction(s) in all"]
    notes += fallbacks
    if stats.get("lost_nodes"):
        notes.append(f"lost nodes: {', '.join(map(str, stats['lost_nodes']))}")
    return {"resources": resources, "running": running, "queued": queued,
            "completed": completed, "kinds": {}, "per_kind": False, "act": act, "services": {},
            "per_service": False, "notes": notes,
            "missing": "the Ray actor's statistics() has no per-kind queues, busy units or per-service restores"}


def _prometheus_reader(url: str, timeout: float) -> Callable[[], dict[str, Any]]:
    def read() -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (a URL the user gave)
            text = resp.read().decode("utf-8", "replace")
        return from_prometheus(text)

    return read


def _ray_reader(name: str, namespace: str, address: str, timeout: float) -> Callable[[], dict[str, Any]]:
    import ray

    from .ray.client import TangramCluster

    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.ERROR)
    cluster = TangramCluster.get(name, namespace=namespace, timeout=timeout)
    return lambda: from_ray(cluster.statistics())


# ------------------------------------------------------------------------------------- render
def _num(v: float | None, fmt: str = "{:g}") -> str:
    return _NA if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _bar(part: float | None, total: float | None, width: int = 20) -> str:
    if part is None or not total:
        return " " * (width + 2)
    n = max(0, min(width, round(width * part / total)))
    return "[" + "#" * n + "." * (width - n) + "]"


def render(snap: dict[str, Any], *, source: str, now: float | None = None, error: str | None = None) -> list[str]:
    """The view as lines of text (no colours, no cursor codes)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now if now is not None else time.time()))
    lines = [f"tangram top - {source} - {stamp}"
             + (f"   running {_num(snap.get('running'))}, queued {_num(snap.get('queued'))}, "
                f"completed {_num(snap.get('completed'))}" if snap else "")]
    if error:
        lines.append(f"  ! {error}" + (" (showing the last good view)" if snap else ""))
    if not snap:
        return lines
    w = max([16] + [len(r["name"]) + 1 for r in snap["resources"]] + [len(k) + 1 for k in snap["kinds"]]
            + [len(k) + 1 for k in snap["services"]])
    lines += ["", f"{'resource':<{w}}{'allocated':>10}{'busy':>8}{'total':>8}  allocated of total"]
    for r in snap["resources"]:
        lines.append(f"{r['name']:<{w}}{_num(r['allocated']):>10}{_num(r['busy'], '{:.1f}'):>8}"
                     f"{_num(r['total']):>8}  {_bar(r['allocated'], r['total'])}")
    lines += ["", f"{'action kind':<{w}}{'queued':>8}{'running':>9}{'oldest wait s':>15}"]
    if not snap.get("per_kind", True):
        lines.append(f"  {_NA}: {snap.get('missing', 'not exposed by this source')}")
    elif not snap["kinds"]:
        lines.append("  (no actions in flight)")
    for kind, k in sorted(snap["kinds"].items(), key=lambda kv: (-kv[1]["queued"], kv[0])):
        lines.append(f"{kind:<{w}}{_num(k['queued']):>8}{_num(k['running']):>9}"
                     f"{_num(k['oldest_wait_s'], '{:.2f}'):>15}")
    a = snap["act"]
    lines += ["", "ACT (action completion time, mean of completed actions, s): "
              f"{_num(a.get('act_s'), '{:.3f}')} = queue {_num(a.get('queue_s'), '{:.3f}')} + overhead "
              f"{_num(a.get('overhead_s'), '{:.3f}')} + execution {_num(a.get('exec_s'), '{:.3f}')}"]
    lines += ["", f"{'GPU service':<{w}}{'restores':>10}{'evictions':>11}{'restore s':>11}"]
    if not snap.get("per_service", True):
        lines.append(f"  {_NA}: {snap.get('missing', 'not exposed by this source')}")
    elif not snap["services"]:
        lines.append("  (no restores or evictions yet)")
    for svc, v in snap["services"].items():
        lines.append(f"{svc:<{w}}{_num(v['restores']):>10}{_num(v['evictions']):>11}{_num(v['restore_s'], '{:.2f}'):>11}")
    if any(r["busy"] is not None for r in snap["resources"]):
        lines.append("note: busy = cores' worth of time the OS saw those cores busy since the last scrape "
                     "(any process on them)")
    for n in snap.get("notes", ()):
        lines.append(f"note: {n}")
    return lines


# ------------------------------------------------------------------------------------- loop
def run(args: argparse.Namespace) -> int:
    """Entry point of ``tangram top``; returns the exit code."""
    source = args.prometheus or f"ray pool {args.ray!r} (namespace {args.namespace})"
    try:
        if args.prometheus:
            read = _prometheus_reader(args.prometheus, args.timeout)
        else:
            read = _ray_reader(args.ray, args.namespace, args.address, args.timeout)
        snap = read()
    except Exception as exc:  # the first read: nothing to show, so say why and stop
        print(f"tangram top: cannot read {source}: {_why(exc)}", file=sys.stderr)
        return 1
    tty = sys.stdout.isatty()
    shown = 0
    try:
        while True:
            error = None
            if shown:
                try:
                    snap = read()
                except Exception as exc:  # keep watching: the pool may come back
                    error = f"cannot read {source}: {_why(exc)}"
            frame = "\n".join(render(snap, source=source, error=error))
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J" + frame + "\n")
            else:
                sys.stdout.write(frame + "\n\n")
            sys.stdout.flush()
            shown += 1
            if args.iterations is not None and shown >= args.iterations:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        if tty:
            sys.stdout.write("\n")
        return 0


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}" if not str(exc).startswith(type(exc).__name__) else str(exc)
