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
from ..errors import CgroupError, SpecError

__all__ = [
    "CgroupLayout",
    "ContainerCgroup",
    "detect_layout",
    "locate",
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
                if opt in ("cpuset", "cpu") and opt not in v1:
                    v1[opt] = (Path(mountpoint), root)
        elif fstype == "cgroup2" and v2 is None:
            v2 = (Path(mountpoint), root)
    if "cpuset" in v1 and "cpu" in v1:
        return CgroupLayout(1, v1["cpuset"][0], v1["cpu"][0], v1["cpuset"][1], v1["cpu"][1])
    if v2 is not None and (v2[0] / "cgroup.controllers").exists():
        ctrls = (v2[0] / "cgroup.controllers").read_text().split()
        if "cpuset" in ctrls and "cpu" in ctrls:
            return CgroupLayout(2, v2[0], v2[0], v2[1], v2[1])
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


def _from_proc(pid: int, layout: CgroupLayout, proc: Path) -> tuple[Path, Path] | None:
    """The container's cgroup dirs as its init process sees them (handles --cgroup-parent)."""
    try:
        text = (proc / str(int(pid)) / "cgroup").read_text()
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
    if layout.version == 2:
        if "" not in found:
            return None
        d = _join(layout.cpuset_root, layout.cpuset_prefix, found[""])
        return d, d
    if "cpuset" not in found or "cpu" not in found:
        return None
    return (
        _join(layout.cpuset_root, layout.cpuset_prefix, found["cpuset"]),
        _join(layout.cpu_root, layout.cpu_prefix, found["cpu"]),
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
    pairs: list[tuple[Path, Path]] = []
    if pid:
        hit = _from_proc(pid, layout, proc)
        if hit is not None:
            pairs.append(hit)
    pairs.extend(zip(_candidates(layout.cpuset_root, container_id), _candidates(layout.cpu_root, container_id)))
    for cs, cpu in pairs:
        cs_r = confine(layout.cpuset_root, cs, container_id)
        cpu_r = confine(layout.cpu_root, cpu, container_id)
        if (cs_r / "cpuset.cpus").is_file() and cpu_r.is_dir():
            return ContainerCgroup(container_id, layout.version, cs_r, cpu_r)
    raise CgroupError(
        f"no cgroup directory for container {container_id[:12]} under {layout.cpuset_root}"
        " (stopped, removed, or an unknown cgroup layout)",
        resource=str(layout.cpuset_root / "docker" / container_id),
    )


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
