"""The cgroup fast path without Docker: id validation, path confinement (traversal attempts),
layout detection, and reading/writing cgroup files in a fake cgroupfs tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram_sdk.errors import CgroupError
from tangram_sdk.managers._cgroup import (
    CgroupLayout,
    ContainerCgroup,
    confine,
    detect_layout,
    locate,
    parse_cpu_max,
    read_cpuset,
    validate_full_id,
)

CID = "a" * 63 + "1"
OTHER = "b" * 64


def _v1(tmp: Path, cid: str = CID, style: str = "cgroupfs") -> CgroupLayout:
    rel = Path("docker", cid) if style == "cgroupfs" else Path("system.slice", f"docker-{cid}.scope")
    for ctrl, files in (("cpuset", {"cpuset.cpus": "0-1\n"}),
                        ("cpu", {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"})):
        (tmp / ctrl).mkdir(exist_ok=True)
        (tmp / ctrl / "cpuset.cpus").write_text("0-63\n")
        (tmp / ctrl / "cpu.cfs_quota_us").write_text("-1\n")
        d = tmp / ctrl / rel
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_text(text)
    return CgroupLayout(1, tmp / "cpuset", tmp / "cpu")


@pytest.mark.parametrize("bad", ["../" + CID[3:], "a/b", CID[:12], CID.upper(), CID + "\n", "", "." * 64,
                                 "/" + CID[1:], CID[:-1] + "/"])
def test_only_full_hex_ids_reach_a_path(bad: str) -> None:
    with pytest.raises(CgroupError):
        validate_full_id(bad)


def test_validate_accepts_full_id() -> None:
    assert validate_full_id(CID) == CID


def test_locate_cgroupfs_and_systemd_layouts(tmp_path: Path) -> None:
    cg = locate(_v1(tmp_path), CID)
    assert cg.cpuset_dir == (tmp_path / "cpuset" / "docker" / CID).resolve()
    other = tmp_path / "sd"
    other.mkdir()
    cg2 = locate(_v1(other, style="systemd"), CID)
    assert cg2.cpu_dir.name == f"docker-{CID}.scope"


def test_locate_missing_container_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="no cgroup directory") as ei:
        locate(_v1(tmp_path), OTHER)
    assert OTHER in (ei.value.resource or "")


def test_confine_rejects_traversal(tmp_path: Path) -> None:
    layout = _v1(tmp_path)
    root = layout.cpuset_root
    with pytest.raises(CgroupError, match="escapes"):
        confine(root, root / "docker" / ".." / ".." / ".." / "etc", CID)
    with pytest.raises(CgroupError, match="escapes"):
        confine(root, root, CID)
    with pytest.raises(CgroupError, match="own directory"):
        confine(root, root / "docker", CID)
    with pytest.raises(CgroupError, match="own directory"):
        confine(root, root / "docker" / CID / ".." / OTHER, CID)  # resolves to a sibling


def test_confine_rejects_symlink_escape(tmp_path: Path) -> None:
    layout = _v1(tmp_path)
    outside = tmp_path / "outside" / CID
    outside.mkdir(parents=True)
    (outside / "cpuset.cpus").write_text("0\n")
    link_parent = layout.cpuset_root / "evil"
    link_parent.symlink_to(tmp_path / "outside")
    with pytest.raises(CgroupError, match="escapes"):
        confine(layout.cpuset_root, link_parent / CID, CID)


def test_locate_from_proc_handles_custom_parent_and_rejects_traversal(tmp_path: Path) -> None:
    layout = _v1(tmp_path)
    custom = tmp_path / "cpuset" / "rollouts" / CID
    custom.mkdir(parents=True)
    (custom / "cpuset.cpus").write_text("3\n")
    (tmp_path / "cpu" / "rollouts" / CID).mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(f"4:cpu,cpuacct:/rollouts/{CID}\n3:cpuset:/rollouts/{CID}\n0::/\n")
    cg = locate(layout, CID, pid=42, proc=proc)
    assert cg.cpuset_dir == custom.resolve() and cg.cpus() == (3,)
    # a hostile /proc entry pointing elsewhere is refused, not followed
    (proc / "43").mkdir()
    (proc / "43" / "cgroup").write_text("4:cpu:/../../../etc\n3:cpuset:/../../../etc\n")
    with pytest.raises(CgroupError, match="escapes"):
        locate(layout, CID, pid=43, proc=proc)


def test_set_cpu_v1_writes_files(tmp_path: Path) -> None:
    cg = locate(_v1(tmp_path), CID)
    cg.set_cpu([0, 1, 2, 5], 400_000, 100_000)
    assert (cg.cpuset_dir / "cpuset.cpus").read_text() == "0-2,5"
    assert cg.quota() == (400_000, 100_000)
    cg.set_cpu([7], 1000, 50_000)  # a new period is written too
    assert cg.cpus() == (7,) and cg.quota() == (1000, 50_000)
    cg.set_cpu([7], None, 50_000)
    assert cg.quota() == (None, 50_000)
    with pytest.raises(CgroupError, match="empty"):
        cg.set_cpu([], 1000, 100_000)


def test_set_cpu_v2_writes_cpu_max(tmp_path: Path) -> None:
    d = tmp_path / "system.slice" / f"docker-{CID}.scope"
    d.mkdir(parents=True)
    (d / "cpuset.cpus").write_text("")
    (d / "cpu.max").write_text("max 100000\n")
    cg = locate(CgroupLayout(2, tmp_path, tmp_path), CID)
    assert cg.quota() == (None, 100_000) and cg.cpus() == ()
    cg.set_cpu([2, 3], 200_000, 100_000)
    assert (d / "cpu.max").read_text() == "200000 100000"
    assert cg.cpus() == (2, 3)


def test_cpu_time_is_read_from_either_layout(tmp_path: Path) -> None:
    """What an exec's ``cpu_s`` is made of: v2 ``cpu.stat`` usage_usec in the container's dir, v1
    ``cpuacct.usage`` (ns) in a cpuacct hierarchy of its own or comounted with cpu; None (never a
    made-up 0) when the container's counter is not there."""
    v2 = tmp_path / "v2" / "docker" / CID
    v2.mkdir(parents=True)
    (v2 / "cpuset.cpus").write_text("0-1\n")
    (v2 / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    assert locate(CgroupLayout(2, tmp_path / "v2", tmp_path / "v2"), CID).cpu_usage_s() == 2.5
    (tmp_path / "v1").mkdir()
    layout = _v1(tmp_path / "v1")
    assert locate(layout, CID).cpu_usage_s() is None  # no cpuacct controller found
    acct = tmp_path / "v1" / "cpuacct" / "docker" / CID
    acct.mkdir(parents=True)
    (acct / "cpuacct.usage").write_text("1250000000\n")
    sep = CgroupLayout(1, layout.cpuset_root, layout.cpu_root, cpuacct_root=tmp_path / "v1" / "cpuacct")
    assert locate(sep, CID).cpu_usage_s() == 1.25
    (layout.cpu_root / "docker" / CID / "cpuacct.usage").write_text("3000000000\n")  # cpu,cpuacct
    assert locate(layout, CID).cpu_usage_s() == 3.0
    (layout.cpu_root / "docker" / CID / "cpuacct.usage").write_text("garbage\n")
    assert locate(layout, CID).cpu_usage_s() is None


def test_write_to_vanished_dir_names_the_path(tmp_path: Path) -> None:
    cg = ContainerCgroup(CID, 1, tmp_path / "gone", tmp_path / "gone")
    with pytest.raises(CgroupError, match="vanished") as ei:
        cg.set_cpu([0], 1000, 100_000)
    assert ei.value.resource == str(tmp_path / "gone" / "cpuset.cpus")


@pytest.mark.parametrize("text,expected", [("0-3,8\n", (0, 1, 2, 3, 8)), ("\n", ()), ("5", (5,)),
                                           ("0-1,1-2", (0, 1, 2))])
def test_read_cpuset(tmp_path: Path, text: str, expected: tuple[int, ...]) -> None:
    f = tmp_path / "cpuset.cpus"
    f.write_text(text)
    assert read_cpuset(f) == expected


@pytest.mark.parametrize("text", ["3-1", "a", "0-", "1,,x", "-1", "99999999"])
def test_read_cpuset_garbage_names_the_path(tmp_path: Path, text: str) -> None:
    f = tmp_path / "cpuset.cpus"
    f.write_text(text)
    with pytest.raises(CgroupError) as ei:
        read_cpuset(f)
    assert ei.value.resource == str(f)


def test_parse_cpu_max() -> None:
    assert parse_cpu_max("max 100000\n") == (None, 100_000)
    assert parse_cpu_max("150000 100000") == (150_000, 100_000)
    for bad in ["", "max", "1 2 3", "x 100"]:
        with pytest.raises(CgroupError):
            parse_cpu_max(bad)


V1_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
41 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_detect_layout_v1() -> None:
    layout = detect_layout(V1_MOUNTINFO)
    assert layout == CgroupLayout(1, Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup/cpu,cpuacct"),
                                  cpuacct_root=Path("/sys/fs/cgroup/cpu,cpuacct"))


def test_detect_layout_v2(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    info = f"30 23 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw\n"
    assert detect_layout(info) == CgroupLayout(2, tmp_path, tmp_path, memory_root=tmp_path)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io pids\n")  # no memory controller
    assert detect_layout(info) == CgroupLayout(2, tmp_path, tmp_path, memory_root=None)
    (tmp_path / "cgroup.controllers").write_text("io memory\n")  # cpu controllers not delegated
    assert detect_layout(info) is None
    assert detect_layout("garbage\n\n") is None


def test_detect_layout_on_this_host_is_consistent() -> None:
    layout = detect_layout()
    if layout is not None:
        assert layout.cpuset_root.is_dir() and layout.cpu_root.is_dir()
        assert isinstance(layout.writable(), bool)


def test_writable_false_for_read_only_files(tmp_path: Path) -> None:
    layout = _v1(tmp_path)
    assert layout.writable() is True  # our own files in tmp_path
    (layout.cpuset_root / "cpuset.cpus").unlink()
    assert layout.writable() is False


# -- memory: v1 and v2 file arithmetic in a fake cgroupfs (the host runs one of them for real) --------

V1_UNLIMITED = "9223372036854771712\n"


def _mem_v1(tmp: Path, cid: str = CID) -> Path:
    d = tmp / "memory" / "docker" / cid
    d.mkdir(parents=True)
    for name, text in {"memory.limit_in_bytes": V1_UNLIMITED, "memory.memsw.limit_in_bytes": V1_UNLIMITED,
                       "memory.usage_in_bytes": "1048576\n", "memory.max_usage_in_bytes": "99999999\n",
                       "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
                       "memory.stat": "cache 4096\nrss 50331648\nshmem 0\nunevictable 0\n"}.items():
        (d / name).write_text(text)
    return d


def _mem_v2(tmp: Path, cid: str = CID) -> Path:
    d = tmp / "system.slice" / f"docker-{cid}.scope"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in {"cpuset.cpus": "", "cpu.max": "max 100000\n", "memory.max": "max\n",
                       "memory.swap.max": "max\n", "memory.current": "1048576\n", "memory.peak": "7340032\n",
                       "memory.events": "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n",
                       "memory.stat": "anon 50331648\nfile 4096\nshmem 0\nunevictable 0\n"}.items():
        (d / name).write_text(text)
    return d


def _record_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    import tangram_sdk.managers._cgroup as cg

    seen: list[tuple[str, str]] = []
    real = cg._write

    def write(path: Path, value: str) -> None:
        seen.append((path.name, value))
        real(path, value)

    monkeypatch.setattr(cg, "_write", write)
    return seen


def test_locate_finds_the_memory_cgroup_v1_and_v2(tmp_path: Path) -> None:
    layout = _v1(tmp_path)
    d = _mem_v1(tmp_path)
    cg = locate(CgroupLayout(1, layout.cpuset_root, layout.cpu_root, memory_root=tmp_path / "memory"), CID)
    assert cg.memory is not None and cg.memory.dir == d.resolve() and cg.memory.version == 1
    assert locate(layout, CID).memory is None  # no memory controller mounted: limits go through the API
    v2 = tmp_path / "v2"
    d2 = _mem_v2(v2)
    cg2 = locate(CgroupLayout(2, v2, v2, memory_root=v2), CID)
    assert cg2.memory is not None and cg2.memory.dir == d2.resolve() and cg2.memory.version == 2


def test_memory_v1_limits_and_write_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tangram_sdk.managers._cgroup import MemoryCgroup, MemoryLimits

    mem = MemoryCgroup(1, _mem_v1(tmp_path))
    assert mem.limits() == MemoryLimits(None, None)  # the kernel's "unlimited" reads as None
    seen = _record_writes(monkeypatch)
    mem.set_limits(MemoryLimits(64 << 20, 64 << 20))  # lowering from unlimited: the limit goes first
    assert seen == [("memory.limit_in_bytes", str(64 << 20)), ("memory.memsw.limit_in_bytes", str(64 << 20))]
    assert mem.limits() == MemoryLimits(64 << 20, 64 << 20)
    seen.clear()
    mem.set_limits(MemoryLimits(128 << 20, 256 << 20))  # raising: memory+swap first (memsw >= limit always)
    assert seen == [("memory.memsw.limit_in_bytes", str(256 << 20)), ("memory.limit_in_bytes", str(128 << 20))]
    seen.clear()
    mem.set_limits(MemoryLimits(None, None))  # back to unlimited
    assert seen == [("memory.memsw.limit_in_bytes", "-1"), ("memory.limit_in_bytes", "-1")]
    with pytest.raises(CgroupError, match="memory_swap"):
        mem.set_limits(MemoryLimits(64 << 20, 32 << 20))
    assert mem.oom_kills() == 3 and mem.usage() == 1 << 20 and mem.pinned() == 50331648
    watch = mem.watch_peak()  # v1 resets the peak by writing 0
    assert (mem.dir / "memory.max_usage_in_bytes").read_text() == "0" and watch.since_reset
    (mem.dir / "memory.max_usage_in_bytes").write_text("12345678\n")
    assert watch.read() == 12345678


def test_memory_v1_without_swap_accounting_writes_only_the_limit(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from tangram_sdk.managers._cgroup import MemoryCgroup, MemoryLimits

    d = _mem_v1(tmp_path)
    (d / "memory.memsw.limit_in_bytes").unlink()  # swapaccount=0
    (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # kernel < 4.13
    mem = MemoryCgroup(1, d)
    seen = _record_writes(monkeypatch)
    mem.set_limits(MemoryLimits(64 << 20, 64 << 20))
    assert seen == [("memory.limit_in_bytes", str(64 << 20))]
    assert mem.limits() == MemoryLimits(64 << 20, None) and mem.oom_kills() is None


def test_memory_v1_busy_limit_is_refused_and_memsw_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno as _errno

    import tangram_sdk.managers._cgroup as cg
    from tangram_sdk.managers._cgroup import MemoryBusyError, MemoryCgroup, MemoryLimits

    d = _mem_v1(tmp_path)
    (d / "memory.limit_in_bytes").write_text(str(16 << 20))
    (d / "memory.memsw.limit_in_bytes").write_text(str(16 << 20))
    mem = MemoryCgroup(1, d)
    real = cg._write

    def write(path: Path, value: str) -> None:
        if path.name == "memory.limit_in_bytes":  # what the kernel answers when usage cannot fit
            try:
                raise OSError(_errno.EBUSY, "Device or resource busy")
            except OSError as exc:
                raise CgroupError(f"cannot write {value!r} to {path}: busy", resource=str(path)) from exc
        real(path, value)

    monkeypatch.setattr(cg, "_write", write)
    with pytest.raises(MemoryBusyError) as ei:
        mem.set_limits(MemoryLimits(32 << 20, 32 << 20))  # raising, so memsw was written first...
    assert ei.value.limit == 32 << 20 and ei.value.usage == 50331648
    assert (d / "memory.memsw.limit_in_bytes").read_text() == str(16 << 20)  # ...and put back


def test_memory_v2_limits_swap_and_counters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tangram_sdk.managers._cgroup import MemoryCgroup, MemoryLimits

    mem = MemoryCgroup(2, _mem_v2(tmp_path))
    assert mem.limits() == MemoryLimits(None, None)
    seen = _record_writes(monkeypatch)
    mem.set_limits(MemoryLimits(64 << 20, 64 << 20))  # v2 states swap alone: 0
    assert seen == [("memory.max", str(64 << 20)), ("memory.swap.max", "0")]
    assert mem.limits() == MemoryLimits(64 << 20, 64 << 20)
    seen.clear()
    mem.set_limits(MemoryLimits(64 << 20, 96 << 20))
    assert seen[-1] == ("memory.swap.max", str(32 << 20))
    seen.clear()
    mem.set_limits(MemoryLimits(None, None))
    assert seen == [("memory.max", "max"), ("memory.swap.max", "max")]
    assert mem.oom_kills() == 1 and mem.usage() == 1 << 20 and mem.pinned() == 50331648


def test_memory_v2_refuses_a_limit_that_would_oom_kill_the_residents(tmp_path: Path) -> None:
    from tangram_sdk.managers._cgroup import MemoryBusyError, MemoryCgroup, MemoryLimits

    d = _mem_v2(tmp_path)
    (d / "memory.current").write_text(str(60 << 20))
    mem = MemoryCgroup(2, d)
    with pytest.raises(MemoryBusyError) as ei:  # 48 MiB anon cannot go below 32 MiB without killing
        mem.set_limits(MemoryLimits(32 << 20, 32 << 20))
    assert ei.value.usage == 50331648
    assert (d / "memory.max").read_text() == "max\n"  # nothing written
    mem.set_limits(MemoryLimits(56 << 20, 56 << 20))  # above the anon part: page cache is reclaimable
    assert (d / "memory.max").read_text() == str(56 << 20)


def test_memory_v2_peak_reads_through_its_own_file(tmp_path: Path) -> None:
    from tangram_sdk.managers._cgroup import MemoryCgroup

    d = _mem_v2(tmp_path)
    watch = MemoryCgroup(2, d).watch_peak()
    assert watch.since_reset  # the "reset" write was accepted (a real 6.12+ kernel scopes it to this fd)
    (d / "memory.peak").write_text("9437184\n")
    assert watch.read() == 9437184
    watch.close()
    (d / "memory.peak").unlink()
    fallback = MemoryCgroup(2, d).watch_peak()
    assert not fallback.since_reset and fallback.read() is None


def test_v2_child_needs_the_memory_controller_delegated(tmp_path: Path) -> None:
    from tangram_sdk.managers._cgroup import MemoryCgroup

    parent = MemoryCgroup(2, tmp_path)
    (tmp_path / "cgroup.subtree_control").write_text("cpu io\n")
    with pytest.raises(CgroupError, match="delegate"):
        parent.child("tangram-1-0")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")
    child = parent.child("tangram-1-0")
    assert child.dir == tmp_path / "tangram-1-0" and child.dir.is_dir()
    with pytest.raises(CgroupError, match="bad child"):
        parent.child("../escape")
    assert child.remove() and not child.dir.exists()


def test_own_memory_dir_from_proc_self(tmp_path: Path) -> None:
    from tangram_sdk.managers._cgroup import own_memory_dir

    mem_root = tmp_path / "memory"
    (mem_root / "user" / "job").mkdir(parents=True)
    (mem_root / "user" / "job" / "memory.limit_in_bytes").write_text(V1_UNLIMITED)
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "cgroup").write_text("4:memory:/user/job\n3:cpuset:/\n")
    layout = CgroupLayout(1, tmp_path / "cpuset", tmp_path / "cpu", memory_root=mem_root)
    got = own_memory_dir(layout, proc)
    assert got is not None and got.dir == (mem_root / "user" / "job").resolve()
    (proc / "self" / "cgroup").write_text("4:memory:/../../etc\n")
    assert own_memory_dir(layout, proc) is None  # escapes the mount: not used
    assert own_memory_dir(CgroupLayout(1, tmp_path, tmp_path), proc) is None  # no memory controller


def test_detect_layout_v1_finds_memory() -> None:
    info = V1_MOUNTINFO + "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    layout = detect_layout(info)
    assert layout is not None and layout.memory_root == Path("/sys/fs/cgroup/memory")
