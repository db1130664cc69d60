"""The fast path: set a container's cpuset and CFS quota by writing its cgroup files directly.

Why: a Docker Engine ``/containers/{id}/update`` call costs milliseconds to hundreds of
milliseconds (the daemon serialises updates and rewrites its on-disk state); two ``write(2)`` calls
into cgroupfs cost tens of microseconds. Allocate-on-execution pays this twice per action, so the
difference is the manager's whole overhead.

Safety: every path is derived from a *full* 64-hex container id, resolved (symlinks included) and
checked to stay under the controller's mount root and to end in the container's own directory
(``<id>`` or ``docker-<id>.scope``) before anything is written. Only the fixed file names below are
ever opened. Every OS error becomes :class:`~tangram_sdk.errors.CgroupError` naming the path.

Layouts handled: cgroup v1 (``cpuset`` and ``cpu`` hierarchies: ``cpuset.cpus``,
``cpu.cfs_quota_us``/``cpu.cfs_period_us``) and cgroup v2 (one hierarchy: ``cpuset.cpus``,
``cpu.max``); Docker's ``cgroupfs`` driver (``docker/<id>``) and ``systemd`` driver
(``system.slice/docker-<id>.scope``), or whatever ``/proc/<pid>/cgroup`` of the container's init
process says (custom ``--cgroup-parent``).

Memory (per-action limits, :class:`MemoryCgroup`): v1 ``memory.limit_in_bytes`` /
``memory.memsw.limit_in_bytes`` (memory + swap), peak ``memory.max_usage_in_bytes`` (reset by
writing 0), OOM kills ``oom_kill`` in ``memory.oom_control``; v2 ``memory.max`` /
``memory.swap.max`` (swap alone), peak ``memory.peak`` (reset per open file on kernels >= 6.12,
else the cgroup's lifetime peak), OOM kills ``oom_kill`` in ``memory.events``. Limits are given as
Docker gives them: ``memory`` and ``memory_swap`` = memory + swap in bytes, None = unlimited.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import attrs

from .._cpuset import format_cpuset, parse_cpuset
from ..errors import CgroupError, MemoryBusyError, SpecError

__all__ = [
    "CgroupLayout",
    "ContainerCgroup",
    "MemoryBusyError",
    "MemoryCgroup",
    "MemoryLimits",
    "detect_layout",
    "locate",
    "own_memory_dir",
    "parse_cpu_max",
    "read_cpuset",
    "validate_full_id",
]

_FULL_ID = re.compile(r"[0-9a-f]{64}")


def validate_full_id(container_id: str) -> str:
    """Return ``container_id`` if it is a full 64-hex Docker id; raise CgroupError otherwise.

    Only full ids reach a path: a name or short id could contain ``..``/``/`` or match another
    container's directory by prefix."""
    if not isinstance(container_id, str) or not _FULL_ID.fullmatch(container_id):
        raise CgroupError(
            f"cgroup paths need a full 64-hex container id, got {container_id!r}", resource=repr(container_id)
        )
    return container_id


@attrs.frozen
class CgroupLayout:
    """Where the controllers we write are mounted. On v2 both roots are the unified mount."""

    version: Literal[1, 2]
    cpuset_root: Path
    cpu_root: Path
    cpuset_prefix: str = "/"  # the mount's root inside the hierarchy (non-"/" under cgroup namespaces)
    cpu_prefix: str = "/"
    memory_root: Path | None = None  # None: no memory controller (memory limits then go through the API)
    memory_prefix: str = "/"
    cpuacct_root: Path | None = None  # v1 CPU time (``cpuacct.usage``); on v2 ``cpu.stat`` in the cpu dir
    cpuacct_prefix: str = "/"

    def writable(self) -> bool:
        """True when we may write the controllers' files (root, rw mount): decides auto backend."""
        files = [self.cpuset_root / "cpuset.cpus"] if self.version == 1 else [self.cpuset_root / "cgroup.procs"]
        files.append(self.cpu_root / ("cpu.cfs_quota_us" if self.version == 1 else "cgroup.procs"))
        return all(f.exists() and os.access(f, os.W_OK) for f in files)


def detect_layout(mountinfo: str | None = None) -> CgroupLayout | None:
    """Find the cpuset and cpu controllers in ``/proc/self/mountinfo`` (v1 preferred when both
    exist: a hybrid host mounts an empty v2 tree at ``unified``). None when neither is mounted."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    v1: dict[str, tuple[Path, str]] = {}
    v2: tuple[Path, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, mountpoint, fstype = fields[3], _unescape(fields[4]), tail[0]
        if fstype == "cgroup":
            for opt in tail[2].split(","):
                if opt in ("cpuset", "cpu", "cpuacct", "memory") and opt not in v1:
                    v1[opt] = (Path(mountpoint), root)
        elif fstype == "cgroup2" and v2 is None:
            v2 = (Path(mountpoint), root)
    if "cpuset" in v1 and "cpu" in v1:
        mem = v1.get("memory")
        acct = v1.get("cpuacct")
        return CgroupLayout(1, v1["cpuset"][0], v1["cpu"][0], v1["cpuset"][1], v1["cpu"][1],
                            None if mem is None else mem[0], "/" if mem is None else mem[1],
                            None if acct is None else acct[0], "/" if acct is None else acct[1])
    if v2 is not None and (v2[0] / "cgroup.controllers").exists():
        ctrls = (v2[0] / "cgroup.controllers").read_text().split()
        if "cpuset" in ctrls and "cpu" in ctrls:
            has_mem = "memory" in ctrls
            return CgroupLayout(2, v2[0], v2[0], v2[1], v2[1], v2[0] if has_mem else None, v2[1])
    return None


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def confine(root: Path, candidate: Path, container_id: str) -> Path:
    """Resolve ``candidate`` and prove it is the container's own cgroup directory under ``root``.

    Raises CgroupError when it escapes ``root`` (``..``, a symlink) or does not end in ``<id>`` or
    ``docker-<id>.scope``."""
    validate_full_id(container_id)
    try:
        root_r = root.resolve(strict=False)
        resolved = candidate.resolve(strict=False)
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop on older Pythons
        raise CgroupError(f"cannot resolve cgroup path {candidate}: {exc}", resource=str(candidate)) from exc
    if resolved == root_r or root_r not in resolved.parents:
        raise CgroupError(f"cgroup path {candidate} escapes the cgroup root {root}", resource=str(candidate))
    if resolved.name not in (container_id, f"docker-{container_id}.scope"):
        raise CgroupError(
            f"cgroup path {candidate} is not container {container_id[:12]}'s own directory",
            resource=str(candidate),
        )
    return resolved


def _proc_cgroups(pid: int | str, proc: Path) -> dict[str, str] | None:
    """``/proc/<pid>/cgroup`` as {controller: path} (v2's unified entry under "")."""
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except (OSError, ValueError):
        return None
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _hid, ctrls, rel = parts
        names = ctrls.split(",") if ctrls else [""]
        for name in names:
            found.setdefault(name, rel)
    return found


def _from_proc(pid: int, layout: CgroupLayout, proc: Path) -> tuple[Path, Path, Path | None] | None:
    """The container's cgroup dirs as its init process sees them (handles --cgroup-parent)."""
    try:
        found = _proc_cgroups(int(pid), proc)
    except ValueError:
        return None
    if found is None:
        return None
    if layout.version == 2:
        if "" not in found:
            return None
        d = _join(layout.cpuset_root, layout.cpuset_prefix, found[""])
        return d, d, (d if layout.memory_root is not None else None)
    if "cpuset" not in found or "cpu" not in found:
        return None
    mem = None
    if layout.memory_root is not None and "memory" in found:
        mem = _join(layout.memory_root, layout.memory_prefix, found["memory"])
    return (
        _join(layout.cpuset_root, layout.cpuset_prefix, found["cpuset"]),
        _join(layout.cpu_root, layout.cpu_prefix, found["cpu"]),
        mem,
    )


def _join(root: Path, prefix: str, rel: str) -> Path:
    if prefix != "/" and (rel == prefix or rel.startswith(prefix.rstrip("/") + "/")):
        rel = rel[len(prefix.rstrip("/")):]
    return root / rel.lstrip("/")


def _candidates(root: Path, container_id: str) -> list[Path]:
    return [root / "docker" / container_id, root / "system.slice" / f"docker-{container_id}.scope"]


def locate(
    layout: CgroupLayout, container_id: str, *, pid: int | None = None, proc: Path = Path("/proc")
) -> ContainerCgroup:
    """Find the container's cgroup directories; CgroupError when none exists or one is unsafe."""
    validate_full_id(container_id)
    triples: list[tuple[Path, Path, Path | None]] = []
    if pid:
        hit = _from_proc(pid, layout, proc)
        if hit is not None:
            triples.append(hit)
    mems: list[Path | None] = (
        list(_candidates(layout.memory_root, container_id)) if layout.memory_root is not None else [None, None])
    triples.extend(zip(_candidates(layout.cpuset_root, container_id), _candidates(layout.cpu_root, container_id),
                       mems))
    for cs, cpu, mem in triples:
        cs_r = confine(layout.cpuset_root, cs, container_id)
        cpu_r = confine(layout.cpu_root, cpu, container_id)
        if (cs_r / "cpuset.cpus").is_file() and cpu_r.is_dir():
            memory = None
            if mem is not None and layout.memory_root is not None:
                mem_r = confine(layout.memory_root, mem, container_id)
                if (mem_r / ("memory.limit_in_bytes" if layout.version == 1 else "memory.max")).is_file():
                    memory = MemoryCgroup(layout.version, mem_r)
            return ContainerCgroup(container_id, layout.version, cs_r, cpu_r, memory,
                                   _acct_dir(layout, cpu_r, container_id, pid, proc))
    raise CgroupError(
        f"no cgroup directory for container {container_id[:12]} under {layout.cpuset_root}"
        " (stopped, removed, or an unknown cgroup layout)",
        resource=str(layout.cpuset_root / "docker" / container_id),
    )


def _acct_dir(layout: CgroupLayout, cpu_dir: Path, container_id: str, pid: int | None,
              proc: Path) -> Path | None:
    """Where the container's CPU time is counted: ``cpu.stat`` in its cpu dir on v2; on v1 its
    ``cpuacct`` dir (comounted with cpu, or a hierarchy of its own). None when not found."""
    if layout.version == 2:
        return cpu_dir if (cpu_dir / "cpu.stat").is_file() else None
    if (cpu_dir / "cpuacct.usage").is_file():
        return cpu_dir
    root = layout.cpuacct_root
    if root is None:
        return None
    cands = []
    found = _proc_cgroups(pid, proc) if pid else None
    if found is not None and "cpuacct" in found:
        cands.append(_join(root, layout.cpuacct_prefix, found["cpuacct"]))
    cands.extend(_candidates(root, container_id))
    for c in cands:
        try:
            d = confine(root, c, container_id)
        except CgroupError:
            continue
        if (d / "cpuacct.usage").is_file():
            return d
    return None


def parse_cpu_max(text: str) -> tuple[int | None, int]:
    """Parse cgroup v2 ``cpu.max`` (``"max 100000"`` or ``"200000 100000"``) -> (quota|None, period)."""
    parts = text.split()
    try:
        if len(parts) != 2:
            raise ValueError(text)
        quota = None if parts[0] == "max" else int(parts[0])
        return quota, int(parts[1])
    except ValueError:
        raise CgroupError(f"unparseable cpu.max contents {text!r}") from None


def read_cpuset(path: Path) -> tuple[int, ...]:
    """Read a ``cpuset.cpus``-style file into core ids (CgroupError naming the path on failure)."""
    text = _read(path)
    try:
        return parse_cpuset(text)
    except SpecError as exc:
        raise CgroupError(f"unparseable cpuset in {path}: {text.strip()!r}", resource=str(path)) from exc


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise CgroupError(f"cannot read {path}: {exc.strerror or exc}", resource=str(path)) from exc


def _write(path: Path, value: str) -> None:
    """One ``write(2)``: cgroupfs applies each write atomically and reports errors on it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        gone = exc.errno in (errno.ENOENT, errno.ENODEV, errno.ESRCH)
        what = "vanished (container stopped or removed?)" if gone else (exc.strerror or str(exc))
        raise CgroupError(f"cannot write {value!r} to {path}: {what}", resource=str(path)) from exc


@attrs.frozen
class ContainerCgroup:
    """A located, confined pair of cgroup directories for one container."""

    container_id: str
    version: Literal[1, 2]
    cpuset_dir: Path
    cpu_dir: Path
    memory: MemoryCgroup | None = None  # None: no memory controller found for this container
    acct_dir: Path | None = None  # None: the container's CPU time is not readable here

    def cpu_usage_s(self) -> float | None:
        """CPU seconds every process of the container has used since it started (v2
        ``cpu.stat`` usage_usec, v1 ``cpuacct.usage`` in ns); None when not readable. Two reads
        around an exec say how many cores' worth the command got (``ExecResult.cpu_s``)."""
        d = self.acct_dir
        if d is None:
            return None
        try:
            if self.version == 1:
                return int(_read(d / "cpuacct.usage").strip()) / 1e9
            usec = _keyed(d / "cpu.stat", "usage_usec")
        except (CgroupError, ValueError):
            return None
        return None if usec is None else usec / 1e6

    def set_cpu(self, cpus: Sequence[int], quota_us: int | None, period_us: int) -> None:
        """Set the cpuset and the CFS bandwidth (``quota_us=None``: unlimited).

        On v1 the period is written only when it differs (it rarely changes, and writing a period
        smaller than the current quota first would be rejected)."""
        if not cpus:
            raise CgroupError("refusing to write an empty cpuset", resource=str(self.cpuset_dir))
        _write(self.cpuset_dir / "cpuset.cpus", format_cpuset(cpus))
        if self.version == 2:
            _write(self.cpu_dir / "cpu.max", f"{'max' if quota_us is None else quota_us} {period_us}")
            return
        period_file = self.cpu_dir / "cpu.cfs_period_us"
        quota_file = self.cpu_dir / "cpu.cfs_quota_us"
        if int(_read(period_file).strip() or 0) != period_us:
            _write(quota_file, "-1")
            _write(period_file, str(period_us))
        _write(quota_file, "-1" if quota_us is None else str(quota_us))

    def cpus(self) -> tuple[int, ...]:
        return read_cpuset(self.cpuset_dir / "cpuset.cpus")

    def pids(self) -> set[int]:
        """Host pids of every process in the container (``cgroup.procs``): how an exec's command
        is found and killed when the daemon cannot say which pid it is (frozen, killed)."""
        text = _read(self.cpuset_dir / "cgroup.procs")
        try:
            return {int(x) for x in text.split()}
        except ValueError:
            raise CgroupError(f"unparseable {self.cpuset_dir / 'cgroup.procs'}", resource=str(self.cpuset_dir)) from None

    def quota(self) -> tuple[int | None, int]:
        """(quota_us or None when unlimited, period_us) as the kernel holds them now."""
        if self.version == 2:
            return parse_cpu_max(_read(self.cpu_dir / "cpu.max"))
        try:
            q = int(_read(self.cpu_dir / "cpu.cfs_quota_us").strip())
            p = int(_read(self.cpu_dir / "cpu.cfs_period_us").strip())
        except ValueError as exc:
            raise CgroupError(f"unparseable CFS files in {self.cpu_dir}", resource=str(self.cpu_dir)) from exc
        return (None if q < 0 else q), p


# -- memory ------------------------------------------------------------------------------------

_V1_UNLIMITED = 1 << 62  # v1 reads "unlimited" as PAGE_COUNTER_MAX pages (9223372036854771712 on 4 KiB pages)
_CHILD_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


@attrs.frozen
class MemoryLimits:
    """A memory limit as Docker states it: ``memory`` bytes and ``memory_swap`` = memory + swap
    bytes (equal: no swap); None = unlimited."""

    memory: int | None = None
    memory_swap: int | None = None


def _num(path: Path) -> int:
    text = _read(path).strip()
    try:
        return int(text)
    except ValueError:
        raise CgroupError(f"unparseable {path}: {text!r}", resource=str(path)) from None


def _keyed(path: Path, key: str) -> int | None:
    """``key N`` from a flat-keyed file (memory.stat, memory.events, memory.oom_control)."""
    for line in _read(path).splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            try:
                return int(v)
            except ValueError:
                raise CgroupError(f"unparseable {key!r} in {path}: {line!r}", resource=str(path)) from None
    return None


class PeakWatch:
    """The highest memory use of a cgroup since :meth:`MemoryCgroup.watch_peak` was called.

    v1 resets ``memory.max_usage_in_bytes`` (one counter per cgroup); v2 keeps an open file whose
    ``reset`` applies to reads through it only (kernel >= 6.12). Where v2 cannot reset,
    ``since_reset`` is False and the value is the cgroup's lifetime peak."""

    __slots__ = ("_fd", "_path", "since_reset")

    def __init__(self, path: Path, fd: int | None, since_reset: bool) -> None:
        self._path = path
        self._fd = fd
        self.since_reset = since_reset

    def read(self) -> int | None:
        try:
            if self._fd is not None:
                return int(os.pread(self._fd, 64, 0).strip())
            return int(self._path.read_text().strip())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        self.close()


@attrs.frozen
class MemoryCgroup:
    """One cgroup's memory controller files (a container's, or a child made for ``lease.run``)."""

    version: Literal[1, 2]
    dir: Path

    # -- reading --------------------------------------------------------------------------------
    def limits(self) -> MemoryLimits:
        if self.version == 1:
            mem = _num(self.dir / "memory.limit_in_bytes")
            sw_file = self.dir / "memory.memsw.limit_in_bytes"
            sw = _num(sw_file) if sw_file.exists() else None
            return MemoryLimits(None if mem >= _V1_UNLIMITED else mem,
                                None if sw is None or sw >= _V1_UNLIMITED else sw)
        limit = _v2_value(self.dir / "memory.max")
        sw_file = self.dir / "memory.swap.max"
        swap = _v2_value(sw_file) if sw_file.exists() else None
        total = None if limit is None or swap is None else limit + swap
        return MemoryLimits(limit, total)

    def usage(self) -> int:
        return _num(self.dir / ("memory.usage_in_bytes" if self.version == 1 else "memory.current"))

    def oom_kills(self) -> int | None:
        """How many processes the OOM killer has killed in this cgroup (None: the kernel does not
        count them, v1 before 4.13)."""
        if self.version == 1:
            return _keyed(self.dir / "memory.oom_control", "oom_kill")
        return _keyed(self.dir / "memory.events", "oom_kill")

    def pinned(self) -> int:
        """Bytes the kernel cannot reclaim without swap: anonymous memory, tmpfs/shm, unevictable."""
        stat = self.dir / "memory.stat"
        keys = ("rss", "shmem", "unevictable") if self.version == 1 else ("anon", "shmem", "unevictable")
        return sum(_keyed(stat, k) or 0 for k in keys)

    def watch_peak(self) -> PeakWatch:
        """Start measuring the peak from now (see :class:`PeakWatch`)."""
        if self.version == 1:
            path = self.dir / "memory.max_usage_in_bytes"
            try:
                _write(path, "0")  # resets the counter to the current usage
                return PeakWatch(path, None, True)
            except CgroupError:
                return PeakWatch(path, None, False)
        path = self.dir / "memory.peak"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return PeakWatch(path, None, False)
        try:
            os.write(fd, b"reset\n")
        except OSError:
            os.close(fd)
            return PeakWatch(path, None, False)
        return PeakWatch(path, fd, True)

    # -- writing --------------------------------------------------------------------------------
    def set_limits(self, want: MemoryLimits) -> None:
        """Apply ``want``. v1 orders the two writes so memory <= memory+swap holds at every step
        (the kernel rejects anything else); a limit below what cannot be freed raises
        :class:`MemoryBusyError` and changes nothing."""
        mem, total = want.memory, want.memory_swap
        if mem is not None and total is not None and total < mem:
            raise CgroupError(f"memory_swap {total} < memory {mem}", resource=str(self.dir))
        if self.version == 1:
            self._set_v1(mem, total)
        else:
            self._set_v2(mem, total)

    def _busy(self, mem: int, usage: int) -> MemoryBusyError:
        return MemoryBusyError(
            f"cannot limit {self.dir} to {mem} B: it holds {usage} B that cannot be freed "
            f"(processes or tmpfs files still alive from earlier actions)",
            resource=str(self.dir), limit=mem, usage=usage)

    def _set_v1(self, mem: int | None, total: int | None) -> None:
        lim_file = self.dir / "memory.limit_in_bytes"
        sw_file = self.dir / "memory.memsw.limit_in_bytes"
        lim = "-1" if mem is None else str(mem)
        if not sw_file.exists():
            self._write_v1_limit(lim_file, lim, mem)
            return
        sw = "-1" if total is None else str(total)
        current = _num(lim_file)
        if total is None or total >= current:  # memsw first keeps memsw >= limit throughout
            old_sw = _read(sw_file).strip()
            _write(sw_file, sw)
            try:
                self._write_v1_limit(lim_file, lim, mem)
            except MemoryBusyError:
                _write(sw_file, old_sw)  # refused: leave the cgroup as it was
                raise
        else:
            self._write_v1_limit(lim_file, lim, mem)
            _write(sw_file, sw)

    def _write_v1_limit(self, path: Path, value: str, mem: int | None) -> None:
        try:
            _write(path, value)
        except CgroupError as exc:
            cause = exc.__cause__
            if mem is not None and isinstance(cause, OSError) and cause.errno == errno.EBUSY:
                try:
                    usage = self.pinned()
                except CgroupError:
                    usage = -1
                raise self._busy(mem, usage) from cause
            raise

    def _set_v2(self, mem: int | None, total: int | None) -> None:
        if mem is not None and self.usage() > mem:
            pinned = self.pinned()
            if pinned > mem:  # the kernel would OOM-kill the container's residents to get there
                raise self._busy(mem, pinned)
        _write(self.dir / "memory.max", "max" if mem is None else str(mem))
        sw_file = self.dir / "memory.swap.max"
        if sw_file.exists():
            _write(sw_file, "max" if total is None or mem is None else str(total - mem))

    # -- children (lease.run) -------------------------------------------------------------------
    def child(self, name: str) -> MemoryCgroup:
        """Create a child cgroup ``name`` (our own name, never user input) and return it."""
        if not _CHILD_NAME.fullmatch(name):
            raise CgroupError(f"bad child cgroup name {name!r}", resource=str(self.dir))
        path = self.dir / name
        if self.version == 2:
            ctl = self.dir / "cgroup.subtree_control"
            if "memory" not in _read(ctl).split():
                raise CgroupError(f"{ctl} does not delegate the memory controller to children", resource=str(ctl))
        try:
            path.mkdir()
        except OSError as exc:
            raise CgroupError(f"cannot create {path}: {exc.strerror or exc}", resource=str(path)) from exc
        return MemoryCgroup(self.version, path)

    def remove(self) -> bool:
        """rmdir (only an empty cgroup can go); False when something still lives in it."""
        try:
            self.dir.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False


def _v2_value(path: Path) -> int | None:
    text = _read(path).strip()
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        raise CgroupError(f"unparseable {path}: {text!r}", resource=str(path)) from None


def own_memory_dir(layout: CgroupLayout | None, proc: Path = Path("/proc")) -> MemoryCgroup | None:
    """This process's own memory cgroup (where ``lease.run`` creates a child per action), or None
    when there is no memory controller or the path escapes the mount."""
    if layout is None or layout.memory_root is None:
        return None
    found = _proc_cgroups("self", proc)
    if found is None:
        return None
    rel = found.get("memory" if layout.version == 1 else "")
    if rel is None:
        return None
    d = _join(layout.memory_root, layout.memory_prefix, rel)
    try:
        root_r, d_r = layout.memory_root.resolve(), d.resolve()
    except (OSError, RuntimeError):
        return None
    if d_r != root_r and root_r not in d_r.parents:
        return None
    limit_file = "memory.limit_in_bytes" if layout.version == 1 else "memory.max"
    if d_r != root_r and not (d_r / limit_file).is_file():
        return None
    return MemoryCgroup(layout.version, d_r)
