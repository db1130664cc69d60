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
    assert layout == CgroupLayout(1, Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup/cpu,cpuacct"))


def test_detect_layout_v2(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    info = f"30 23 0:26 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw\n"
    assert detect_layout(info) == CgroupLayout(2, tmp_path, tmp_path)
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
