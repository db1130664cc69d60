"""Security boundaries (no Docker needed): hostile container ids/names never reach an URL or a path,
cgroup writes stay in the container's own directory (even with symlinked files), and no user input
is ever interpreted by a shell. Path-confinement basics are in tests/test_cpuset_cgroup.py; this
file adds the Docker-API side, file-level symlinks and the no-shell rules. What access the SDK
needs, and how to grant the least of it: docs/reliability.md#security.
"""

from __future__ import annotations

import ast
import asyncio
import os
import sys
from pathlib import Path

import pytest

from tangram_sdk import ActionSpec, Pool, Tangram
from tangram_sdk.errors import CgroupError, DockerError, SpecError

pytest.importorskip("aiodocker")

from tangram_sdk.managers import _cgroup  # noqa: E402
from tangram_sdk.managers._docker import DockerClient, validate_ref  # noqa: E402
from tangram_sdk.managers.cpu import DockerCpuManager, SandboxPool  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "tangram_sdk"
CID = "c" * 63 + "7"

HOSTILE = [
    "../containers/x", "a/../../b", "/etc/passwd", "x/update", "a?force=1", "a#frag", "a%2F..", "a b",
    "a\x00b", "a\n", "\nabc", "a\r", "é", "ｃｏｎｔａｉｎｅｒ", "\u202eabc", "a" * 129, "a" * 10_000, ".", "..", "-rf",
    "$(id)", "`id`", "a;b", "a|b", "", " ",
]


def _client_nowhere(tmp_path: Path) -> DockerClient:
    """A client whose socket does not exist: any request that got as far as I/O would raise
    DockerError, so SpecError proves validation happened first."""
    return DockerClient(f"unix://{tmp_path}/no-daemon.sock", api_timeout=2)


@pytest.mark.parametrize("ref", HOSTILE)
async def test_hostile_refs_are_refused_before_any_docker_call(ref: str, tmp_path: Path) -> None:
    client = _client_nowhere(tmp_path)
    try:
        with pytest.raises(SpecError):
            validate_ref(ref)
        with pytest.raises(SpecError):
            ActionSpec(kind="x", cpus=1, container=ref)
        for call in (client.inspect(ref), client.start(ref), client.remove(ref),
                     client.update_cpu(ref, "0", 1000, 100_000), client.exec(ref, ["true"])):
            with pytest.raises(SpecError):
                await call
        with pytest.raises(SpecError):
            await client.create("tangram-test:busybox", ["true"], name=ref)
        mgr = DockerCpuManager(backend="api")
        with pytest.raises(SpecError):
            await SandboxPool.create(mgr, image="tangram-test:busybox", count=1, name_prefix=ref)
        with pytest.raises(SpecError):
            await SandboxPool.adopt(mgr, [ref])
    finally:
        await client.close()


async def test_a_valid_ref_does_reach_the_daemon(tmp_path: Path) -> None:
    """The control: a well-formed id passes validation and fails only at I/O (DockerError)."""
    client = _client_nowhere(tmp_path)
    try:
        with pytest.raises(DockerError) as ei:
            await client.inspect("abc123")
        assert "abc123" in str(ei.value)
    finally:
        await client.close()


@pytest.mark.parametrize("image", ["busybox; rm -rf /", "x\ny", "../img", "", "a" * 300, "img name", "$(id)"])
async def test_hostile_image_refs_are_refused(image: str, tmp_path: Path) -> None:
    client = _client_nowhere(tmp_path)
    try:
        with pytest.raises(SpecError):
            await client.create(image, ["true"])
    finally:
        await client.close()


@pytest.mark.parametrize("cid", [CID + "\x00", CID[:-1] + "é", "../" + CID, CID * 2, CID.upper(), " " + CID,
                                 CID + "/../" + CID])
def test_cgroup_layer_refuses_ids_that_are_not_64_hex(cid: str, tmp_path: Path) -> None:
    layout = _cgroup.CgroupLayout(2, tmp_path, tmp_path)
    with pytest.raises(CgroupError):
        _cgroup.locate(layout, cid)
    with pytest.raises(CgroupError):
        _cgroup.confine(tmp_path, tmp_path / "docker" / cid, cid)


def _v2_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cg"
    d = root / "docker" / CID
    d.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu\n")
    (d / "cpuset.cpus").write_text("0\n")
    (d / "cpu.max").write_text("max 100000\n")
    return root, d


def test_a_symlinked_cgroup_file_is_not_followed(tmp_path: Path) -> None:
    """Someone who can write in the container's cgroup directory swaps ``cpuset.cpus`` for a link
    to a file elsewhere: the write must fail (O_NOFOLLOW), and the target must stay untouched."""
    root, d = _v2_tree(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (d / "cpuset.cpus").unlink()
    (d / "cpuset.cpus").symlink_to(victim)
    cg = _cgroup.ContainerCgroup(CID, 2, d, d)
    with pytest.raises(CgroupError) as ei:
        cg.set_cpu((0, 1), 200_000, 100_000)
    assert "cpuset.cpus" in str(ei.value)
    assert victim.read_text() == "precious\n"


def test_a_container_dir_symlinked_outside_the_root_is_refused(tmp_path: Path) -> None:
    root, d = _v2_tree(tmp_path)
    outside = tmp_path / "outside" / CID
    outside.mkdir(parents=True)
    (outside / "cpuset.cpus").write_text("0\n")
    (outside / "cpu.max").write_text("max 100000\n")
    import shutil

    shutil.rmtree(d)
    d.symlink_to(outside, target_is_directory=True)
    with pytest.raises(CgroupError, match="escapes"):
        _cgroup.locate(_cgroup.CgroupLayout(2, root, root), CID)
    assert (outside / "cpuset.cpus").read_text() == "0\n"


def test_set_cpu_writes_only_the_fixed_files_in_its_own_directory(tmp_path: Path) -> None:
    root, d = _v2_tree(tmp_path)
    sibling = root / "docker" / ("d" * 64)
    sibling.mkdir()
    (sibling / "cpuset.cpus").write_text("5\n")
    before = {p: p.read_text() for p in root.rglob("*") if p.is_file()}
    cg = _cgroup.locate(_cgroup.CgroupLayout(2, root, root), CID)
    cg.set_cpu((2, 3), 200_000, 100_000)
    after = {p: p.read_text() for p in root.rglob("*") if p.is_file()}
    changed = {p.relative_to(root).as_posix() for p in after if after[p] != before.get(p)}
    assert changed == {f"docker/{CID}/cpuset.cpus", f"docker/{CID}/cpu.max"}
    assert after[d / "cpuset.cpus"] == "2-3" and after[d / "cpu.max"] == "200000 100000"
    with pytest.raises(CgroupError, match="empty cpuset"):
        cg.set_cpu((), None, 100_000)


# ------------------------------------------------------------------------------------- no shells
@pytest.mark.parametrize("cmd", ["echo hi", b"echo hi", [], ["echo", "a\x00b"], ["echo", 1], "rm -rf /"])
async def test_lease_run_refuses_shell_strings_and_bad_argv(cmd: object) -> None:
    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            with pytest.raises(SpecError):
                await lease.run(cmd)  # type: ignore[arg-type]


@pytest.mark.parametrize("cmd", ["sh -c 'id'", b"id", [], ["sh", "a\x00"], [b"id"]])
async def test_docker_exec_takes_argv_lists_only(cmd: object, tmp_path: Path) -> None:
    client = _client_nowhere(tmp_path)
    try:
        with pytest.raises(SpecError):
            await client.exec("abc123", cmd)  # type: ignore[arg-type]
    finally:
        await client.close()


async def test_lease_run_passes_argv_verbatim_without_a_shell() -> None:
    """Metacharacters arrive as literal arguments: nothing is expanded, nothing else runs."""
    async with Tangram(Pool(cpus=1)) as t:
        async with t.acquire(ActionSpec(kind="x", cpus=1)) as lease:
            r = await lease.run([sys.executable, "-c", "import sys; print(sys.argv[1:])", "$(id)", "`id`", "a;b", "*"])
    assert r.ok and r.stdout.decode().strip() == str(["$(id)", "`id`", "a;b", "*"])


def test_no_shell_anywhere_in_the_sdk() -> None:
    """No ``shell=True``, ``create_subprocess_shell``, ``os.system``/``os.popen``, ``eval``/``exec``
    of strings in src/: user input can never meet a shell."""
    bad: list[str] = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
                if name in ("create_subprocess_shell", "getoutput", "getstatusoutput") or (
                        owner == "os" and name in ("system", "popen")) or (
                        isinstance(f, ast.Name) and name in ("eval", "exec")):
                    bad.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
                for kw in node.keywords:
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        bad.append(f"{path.relative_to(SRC)}:{node.lineno} shell=")
    assert not bad, bad


def test_the_docker_exec_path_sends_a_list() -> None:
    """Read the one exec call site: the command goes to aiodocker as the checked argv list."""
    src = (SRC / "managers" / "_docker.py").read_text()
    tree = ast.parse(src)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "exec")
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "exec"]
    assert calls and all(isinstance(c.args[0], ast.Name) and c.args[0].id == "argv" for c in calls)
    assert "argv = _check_argv(cmd)" in ast.get_source_segment(src, fn)


def test_env_and_cwd_are_not_a_shell_either(tmp_path: Path) -> None:
    from tangram_sdk.process import run_pinned

    r = asyncio.run(run_pinned([sys.executable, "-c", "import os; print(os.environ['X'])"], (),
                               env={**os.environ, "X": "$(id)"}, cwd=str(tmp_path)))
    assert r.ok and r.stdout.decode().strip() == "$(id)"
