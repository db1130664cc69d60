"""The process backend: run an argv as a local subprocess pinned to the lease's cores, and the
:class:`ExecResult` every command run (here or in a container) returns.

For users without Docker. Not a manager (nothing is applied or released): ``lease.run`` calls it,
and code outside a lease may call :func:`run_pinned` directly (``tangram_sdk.managers.process``,
its old home, re-exports it for one release). Pinning happens in a tiny Python shim *before*
``exec``, so the command never runs one instruction outside its cores (``sched_setaffinity``
after spawn would race).

Memory (``memory=`` bytes, the lease's grant): where this process may create a child of its own
memory cgroup (root on cgroup v1, or a v2 cgroup that delegates ``memory``), the shim joins a
per-action child cgroup limited to ``memory`` (no swap) before ``exec``; a command the kernel
kills there raises :class:`~tangram_sdk.errors.ActionOOMError` with the limit and the peak.
Elsewhere the shim sets ``RLIMIT_AS`` (address space, not resident memory: an allocation past it
fails inside the program, as MemoryError or ENOMEM, and nothing is reported by us); see
:func:`memory_enforcement`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import attrs

from ._cpuset import format_cpuset
from ._deadline import check_timeout
from .errors import ActionOOMError, CgroupError, ManagerError, SpecError
from .managers import _cgroup

__all__ = ["ExecResult", "MemoryScope", "PinnedGroups", "check_argv", "memory_enforcement", "repin_group",
           "run_pinned"]

log = logging.getLogger(__name__)


@attrs.frozen
class ExecResult:
    """The outcome of ``lease.run``/``lease.exec``: output is bounded; ``truncated`` says if cut."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    truncated: bool = False
    timed_out: bool = False
    cpu_s: float | None = None
    """CPU seconds the command (and the descendants it waited for) used: ``lease.run`` measures it
    with ``wait4``, ``lease.exec`` from the container's cgroup counter around the exec (``None``
    when that is not readable from here, the container is shared by several grants, or the command
    was killed); ``cpu_s / duration_s`` is the cores' worth the command really got, which the
    scheduler learns efficiency from."""

    @property
    def parallelism(self) -> float | None:
        """Cores' worth of work the command got while it ran (``cpu_s / duration_s``)."""
        if self.cpu_s is None or not self.duration_s > 0:
            return None
        return self.cpu_s / self.duration_s

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

# argv: cores ("0,1", or "@<fd>": the parent pins the shim itself and writes one byte to that fd
# once it has, so a resize can never be overtaken by the shim's own pin), memory ("cg:<cgroup.procs
# path>" | "as:<bytes>" | "-"), CPU-time fd, then the command. The shim makes itself the child
# subreaper (Linux) and forks: the child joins the memory cgroup (so the limit holds the command,
# not the shim's interpreter) and execs; the shim waits with wait4, then kills what the command
# left behind: every descendant, also one that started its own session (``setsid``, a daemon's
# double fork), which a process-group kill misses, since as subreaper the shim inherits the orphans.
# SIGUSR1 (the parent's timeout or cancel) SIGKILLs the command and does the same. While the command
# runs the shim reaps the orphans it inherits (else they would pile up as zombies and use up pids);
# the sweep kills the direct children first (a process that keeps forking to a new pid becomes one
# at each hop) and zombie leaders too (a live thread may remain), until no child is left. The
# command gets SIGPIPE and SIGXFSZ back at their defaults (Python ignores them). Then the shim writes
# the command's CPU seconds (its own and its reaped descendants') to the fd and exits as it did.
_SHIM = (
    "import os,sys,signal,time\n"
    "p=0;u=[0]\n"
    "def K(n,f):\n"
    " u[0]=1\n"
    " if p:\n"
    "  try:os.kill(p,9)\n"
    "  except OSError:pass\n"
    "signal.signal(signal.SIGUSR1,K)\n"
    "try:import ctypes;ctypes.CDLL(None,use_errno=True).prctl(36,1,0,0,0)\n"
    "except Exception:pass\n"
    "c=sys.argv[1]\n"
    "if c[:1]=='@':\n"
    " g=int(c[1:]);os.read(g,1);os.close(g)\n"
    "else:\n"
    " c=[int(x) for x in c.split(',') if x]\n"
    " c and hasattr(os,'sched_setaffinity') and os.sched_setaffinity(0,c)\n"
    "m=sys.argv[2];w=int(sys.argv[3]);a=sys.argv[4:]\n"
    "p=os.fork()\n"
    "if p==0:\n"
    " os.close(w)\n"
    " for g in (signal.SIGUSR1,signal.SIGPIPE,signal.SIGXFSZ):signal.signal(g,signal.SIG_DFL)\n"
    " if m[:3]=='cg:':\n"
    "  f=os.open(m[3:],os.O_WRONLY);os.write(f,str(os.getpid()).encode());os.close(f)\n"
    " elif m[:3]=='as:':\n"
    "  import resource;n=int(m[3:]);resource.setrlimit(resource.RLIMIT_AS,(n,n))\n"
    " try:os.execvp(a[0],a)\n"
    " except OSError as e:os.write(2,(a[0]+': '+e.strerror+'\\n').encode());os._exit(127 if isinstance(e,FileNotFoundError) else 126)\n"
    "u[0] and K(0,0)\n"
    "for g in (signal.SIGINT,signal.SIGTERM,signal.SIGHUP):signal.signal(g,lambda n,f:p and os.kill(p,n))\n"
    "while 1:\n"
    " try:\n"
    "  q,st,ru=os.wait4(-1,0)\n"
    "  if q==p:p=0;break\n"
    " except InterruptedError:pass\n"
    "def T():\n"
    " d={}\n"
    " for x in os.listdir('/proc'):\n"
    "  if x.isdigit():\n"
    "   try:b=open('/proc/'+x+'/stat','rb').read();f=b[b.rindex(b')')+2:].split()\n"
    "   except (OSError,ValueError):continue\n"
    "   d.setdefault(int(f[1]),[]).append(int(x))\n"
    " t=[os.getpid()];r=[]\n"
    " while t:\n"
    "  for k in d.get(t.pop(),()):r.append(k);t.append(k)\n"
    " return r\n"
    "for i in range(400):\n"
    " try:\n"
    "  while os.waitpid(-1,os.WNOHANG)[0]:pass\n"
    " except ChildProcessError:break\n"
    " try:r=[int(x) for x in open('/proc/self/task/%d/children'%os.getpid()).read().split()]\n"
    " except OSError:r=[]\n"
    " for k in r+T():\n"
    "  try:os.kill(k,9)\n"
    "  except OSError:pass\n"
    " time.sleep(0.005)\n"
    "try:os.write(w,repr(ru.ru_utime+ru.ru_stime).encode())\n"
    "except OSError:pass\n"
    "if os.WIFSIGNALED(st):\n"
    " g=os.WTERMSIG(st)\n"
    " if g!=signal.SIGKILL:signal.signal(g,signal.SIG_DFL)\n"
    " os.kill(os.getpid(),g)\n"
    "os._exit(os.WEXITSTATUS(st))\n"
)

Enforcement = Literal["cgroup", "rlimit", "none"]
_mode: Enforcement | None = None
_names = itertools.count()


def memory_enforcement(refresh: bool = False) -> Enforcement:
    """How ``lease.run`` enforces ``memory`` on this host: "cgroup" (a child memory cgroup per
    action: a kill is reported as ActionOOMError), "rlimit" (RLIMIT_AS: the program's own
    allocations fail past it, nothing is reported), or "none" (no RLIMIT_AS on this platform).
    Probed once (a child cgroup is created and removed)."""
    global _mode
    if _mode is None or refresh:
        _mode = _probe()
    return _mode


def _probe() -> Enforcement:
    own = _cgroup.own_memory_dir(_cgroup.detect_layout())
    if own is not None:
        try:
            child = own.child(f"tangram-probe-{os.getpid()}-{next(_names)}")
        except CgroupError:
            pass
        else:
            try:
                ok = os.access(child.dir / "cgroup.procs", os.W_OK)
                child.set_limits(_cgroup.MemoryLimits(1 << 30, 1 << 30))
            except CgroupError:
                ok = False
            child.remove()
            if ok:
                return "cgroup"
    try:
        import resource

        resource.getrlimit(resource.RLIMIT_AS)
        return "rlimit" if sys.platform.startswith("linux") else "none"
    except (ImportError, AttributeError, OSError):
        return "none"


class MemoryScope:
    """One action's memory limit for ``lease.run``: a child cgroup made at the first run, shared
    by runs that overlap (they share the limit, as commands in one container do) and removed
    when the last one ends; or RLIMIT_AS per command where no cgroup can be made."""

    def __init__(self, limit: int, mode: Enforcement | None = None) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise SpecError(f"memory must be an int of bytes >= 1, got {limit!r}")
        self.limit = limit
        self.mode: Enforcement = memory_enforcement() if mode is None else mode
        self._cg: _cgroup.MemoryCgroup | None = None  # while runs are live
        self._peak: _cgroup.PeakWatch | None = None
        self._users = 0

    def enter(self) -> str:
        """The shim's memory argument for one run (call :meth:`exit` after it)."""
        if self.mode == "cgroup" and self._users == 0:
            own = _cgroup.own_memory_dir(_cgroup.detect_layout())
            try:
                if own is None:
                    raise CgroupError("no memory cgroup of our own")
                cg = own.child(f"tangram-{os.getpid()}-{next(_names)}")
                try:
                    cg.set_limits(_cgroup.MemoryLimits(self.limit, self.limit))
                except BaseException:
                    cg.remove()
                    raise
                self._cg, self._peak = cg, cg.watch_peak()
            except CgroupError as exc:
                log.warning("lease.run: no memory cgroup (%s); enforcing memory with RLIMIT_AS instead", exc)
                self.mode = "rlimit"
        self._users += 1
        if self.mode == "cgroup" and self._cg is not None:
            return "cg:" + str(self._cg.dir / "cgroup.procs")
        if self.mode == "rlimit":
            return f"as:{self.limit}"
        return "-"

    def oom_kills(self) -> int | None:
        cg = self._cg
        if cg is None:
            return None
        try:
            return cg.oom_kills()
        except CgroupError:
            return None

    def peak(self) -> int | None:
        return None if self._peak is None else self._peak.read()

    @property
    def where(self) -> str | None:
        return None if self._cg is None else str(self._cg.dir)

    def exit(self) -> None:
        self._users -= 1
        if self._users == 0 and self._cg is not None:
            cg, self._cg = self._cg, None
            if self._peak is not None:
                self._peak.close()
                self._peak = None
            if not cg.remove():
                log.warning("lease.run: %s still holds processes (detached from the command?); left in place",
                            cg.dir)


def check_argv(cmd: Sequence[str]) -> list[str]:
    """Refuse shell strings and NUL bytes: commands are argv lists, here and in containers."""
    if isinstance(cmd, (str, bytes)) or not cmd:
        raise SpecError("cmd must be a non-empty argv list such as ['sh', '-c', '...'], not a shell string")
    argv = list(cmd)
    for a in argv:
        if not isinstance(a, str) or "\x00" in a:
            raise SpecError(f"argv elements must be strings without NUL bytes, got {a!r}")
    return argv


def check_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    """An environment: str names (non-empty, no ``=`` or NUL) to str values (no NUL). The same
    rule for lease.run and lease.exec: Docker took ``{"A=B": "c"}`` as ``A=B=c`` and ``None``
    as the text "None", where a local subprocess raised TypeError."""
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise SpecError(f"env must be a mapping of names to values, got {type(env).__name__}")
    out = dict(env)
    for k, v in out.items():
        if not isinstance(k, str) or not k or "=" in k or "\x00" in k:
            raise SpecError(f"env names must be non-empty strings without '=' or NUL, got {k!r}")
        if not isinstance(v, str) or "\x00" in v:
            raise SpecError(f"env[{k!r}] must be a string without NUL bytes, got {v!r}")
    return out


def check_stdin(stdin: bytes | bytearray | memoryview | str | None) -> bytes | None:
    """A command's standard input as bytes (a str is sent as UTF-8), or None for none (the
    command reads end of file at once)."""
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    if isinstance(stdin, str):
        return stdin.encode()
    if isinstance(stdin, (bytearray, memoryview)):
        return bytes(stdin)
    raise SpecError(f"stdin must be bytes or str (or None), got {type(stdin).__name__}")


def check_max_output(max_output: object) -> int:
    """Bytes kept per output stream: an int >= 0, checked before anything runs."""
    if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 0:
        raise SpecError(f"max_output must be an int >= 0 (bytes kept per stream), got {max_output!r}")
    return max_output


_REPIN_PASSES = 3  # a thread or child started while a pass runs inherits the old mask: look again


def _group_pids(pgid: int) -> list[int]:
    """Live pids of a command's tree: those in process group ``pgid`` (the shim's pid) and every
    descendant of the shim, also one in a session of its own (``setsid``; the shim is the child
    subreaper, so its orphans stay in its tree). One pass over ``/proc``: bounded, no waits."""
    out = []
    kids: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return [pgid]
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # exited meanwhile (or not ours to read)
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 3:
            continue
        if fields[2] == str(pgid).encode():
            out.append(int(name))
        else:
            kids.setdefault(int(fields[1]), []).append(int(name))
    todo = [pgid, *out]
    while todo:  # what left the group, found through its parents
        for k in kids.pop(todo.pop(), ()):
            out.append(k)
            todo.append(k)
    return out


def _affinity(tid: int) -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(tid))
    except OSError:
        return None


def repin_group(pgid: int, cpus: Iterable[int]) -> int:
    """Pin every live process of process group ``pgid``, and each of its threads, to ``cpus``:
    what a running ``lease.run`` command gets when its malleable lease is resized. Processes or
    threads that exit meanwhile are skipped; a few passes over ``/proc`` (no waits) catch those
    started while it runs. Returns how many threads were changed."""
    want = frozenset(cpus)
    if not want or not hasattr(os, "sched_setaffinity"):
        return 0
    changed = 0
    for _ in range(_REPIN_PASSES):
        moved = 0
        for pid in _group_pids(pgid):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except (OSError, ValueError):
                tids = [pid]
            for tid in tids:
                if _affinity(tid) == want:
                    continue
                try:
                    os.sched_setaffinity(tid, want)
                    moved += 1
                except OSError:  # exited meanwhile (ESRCH), or no longer ours (EPERM)
                    pass
        changed += moved
        if not moved:
            break
    return changed


class PinnedGroups:
    """The process groups of one lease's running ``lease.run`` commands, so a resize of a
    malleable lease can re-pin them (:func:`repin_group`). ``target``: the cores they should run
    on now. The shim of a followed command waits, before it runs the command, until it is
    registered here and pinned to the target (see ``_SHIM``): no resize can be missed."""

    __slots__ = ("live", "target")

    def __init__(self, cpus: Sequence[int]) -> None:
        self.target: tuple[int, ...] = tuple(cpus)
        self.live: dict[int, tuple[int, ...]] = {}  # pgid -> the cores it was last pinned to

    def add(self, pgid: int) -> None:
        """A shim just spawned (not yet running the command): pin it to the target and follow it."""
        self.live[pgid] = self.target
        if self.target and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(pgid, self.target)
            except OSError:  # died already: its exit status says why
                pass

    def discard(self, pgid: int) -> None:
        self.live.pop(pgid, None)

    def repin(self, cpus: Sequence[int]) -> int:
        """Move every live group to ``cpus``; returns the threads changed."""
        self.target = tuple(cpus)
        changed = 0
        for pgid in list(self.live):
            self.live[pgid] = self.target
            changed += repin_group(pgid, self.target)
        return changed


_DRAIN_S = 5.0  # after a kill: how long the output may take to end (a detached grandchild may hold it)
_SWEEP_S = 2.0  # after a timeout or cancel: how long the shim may take to kill what the command started


async def _read_bounded(stream: asyncio.StreamReader | None, limit: int, kept: bytearray) -> bool:
    """Read everything into ``kept``, keeping at most ``limit`` bytes (a chatty command cannot
    exhaust memory); return whether output was cut. ``kept`` holds what came even if cancelled."""
    if stream is None:
        return False
    truncated = False
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return truncated
        room = limit - len(kept)
        if room > 0:
            kept += chunk[:room]
        if len(chunk) > room:
            truncated = True


def _check_usable(cpus: Sequence[int]) -> None:
    """A pool may name cores this process cannot run on (``Pool(cpus=4)`` on a 2-core container):
    say so, rather than let the pin fail inside the shim as the command's own exit 1."""
    if not cpus or not hasattr(os, "sched_getaffinity"):
        return
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise SpecError(f"the lease's cores {missing} are not available to this process (it may run on "
                        f"{format_cpuset(sorted(allowed))}): build the Pool from the cores you have, "
                        "e.g. Pool(cpus=sorted(os.sched_getaffinity(0)))")


async def run_pinned(
    cmd: Sequence[str],
    cpus: Sequence[int],
    *,
    timeout: float | None = None,
    max_output: int = 1 << 20,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin: bytes | str | None = None,
    memory: int | MemoryScope | None = None,
    groups: PinnedGroups | None = None,
) -> ExecResult:
    """Run ``cmd`` pinned to ``cpus`` (all cores when empty); kill its process group on timeout or
    cancellation; keep at most ``max_output`` bytes of each of stdout/stderr. ``memory``: bytes
    (or a shared :class:`MemoryScope`) to hold the command to (see the module docstring); a
    command killed for memory raises ActionOOMError. ``groups``: the command's process group is
    registered there while it runs (a malleable lease re-pins it when resized)."""
    argv = check_argv(cmd)
    limit = check_timeout(timeout)
    feed = check_stdin(stdin)
    check_max_output(max_output)
    env = check_env(env)
    _check_usable(cpus)
    scope = MemoryScope(memory) if isinstance(memory, int) and not isinstance(memory, bool) else memory
    if scope is not None and not isinstance(scope, MemoryScope):
        raise SpecError(f"memory must be None, bytes or a MemoryScope, got {memory!r}")
    mem_arg = "-" if scope is None else scope.enter()
    try:
        before = None if scope is None else scope.oom_kills()
        result = await _run(argv, cpus, mem_arg, limit, max_output, env, cwd, feed, groups)
        if scope is not None and before is not None and result.exit_code != 0 and not result.timed_out:
            after = scope.oom_kills()
            if after is not None and after > before:
                peak = scope.peak()
                raise ActionOOMError(
                    f"{argv[:3]} was killed for memory in {scope.where} (limit {scope.limit / 2**20:.1f} MiB, "
                    f"peak {'unknown' if peak is None else f'{peak / 2**20:.1f} MiB'})",
                    resource=scope.where, limit=scope.limit, peak=peak, killed=True, result=result)
        return result
    finally:
        if scope is not None:
            scope.exit()


async def _run(argv: list[str], cpus: Sequence[int], mem_arg: str, limit: float | None, max_output: int,
               env: Mapping[str, str] | None, cwd: str | None, stdin: bytes | None,
               groups: PinnedGroups | None = None) -> ExecResult:
    started = time.monotonic()
    r_fd, w_fd = os.pipe()
    go_r = go_w = -1
    if groups is not None:
        go_r, go_w = os.pipe()
    cores_arg = f"@{go_r}" if groups is not None else ",".join(str(c) for c in cpus)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", _SHIM, cores_arg, mem_arg, str(w_fd), *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,
            pass_fds=(w_fd,) if groups is None else (w_fd, go_r),
        )
    except BaseException:
        os.close(r_fd)
        if go_w >= 0:
            os.close(go_w)
        raise
    finally:
        os.close(w_fd)
        if go_r >= 0:
            os.close(go_r)
    timed_out = False
    out, err = bytearray(), bytearray()
    truncated = False
    try:
        if groups is not None:  # start_new_session: the shim's pid is the command's process group
            groups.add(proc.pid)  # pinned to the lease's cores as they are now, on this thread
            os.write(go_w, b"g")  # one byte into an empty pipe: never blocks
            os.close(go_w)
            go_w = -1
        if stdin is not None and proc.stdin is not None:
            proc.stdin.write(stdin)
            proc.stdin.close()
        readers = asyncio.gather(_read_bounded(proc.stdout, max_output, out),
                                 _read_bounded(proc.stderr, max_output, err))
        ended = _shim_end(r_fd)
        try:
            # the command's end (the shim's exit closes r_fd's other end), not its output's: a
            # background child it left in its group would hold the pipes, and the lease, for as
            # long as it runs (and proc.wait() waits for the pipes too).
            # asyncio.wait, not wait_for: it never returns a result in place of a cancel
            exited, _ = await asyncio.wait([ended], timeout=limit)
            timed_out = not exited
            if timed_out:  # the shim kills the command and everything it started, then exits
                _ask_shim_to_stop(proc)
                await asyncio.wait([ended], timeout=_SWEEP_S)
            _kill_group(proc)  # belt and braces: what is left of its process group ends with it
            drained, _ = await asyncio.wait([readers], timeout=_DRAIN_S)
            if drained:
                t1, t2 = readers.result()
                truncated = t1 or t2
            else:  # a detached grandchild (its own session) still holds the pipes: keep what came
                truncated = True
                transport = getattr(proc, "_transport", None)
                if transport is not None:
                    transport.close()  # our ends of its pipes: proc.wait() would wait for them
            code = await _exit_code(proc, argv)
            # killed: the shim reports what the command used until then, but a cut run's cores'
            # worth is not its parallelism (documented: None when the command was killed)
            cpu_s = None if timed_out else _parse_cpu(ended.result() if ended.done() and not ended.cancelled() else b"")
        finally:
            asyncio.get_running_loop().remove_reader(r_fd)
            for fut in (readers, ended):
                if not fut.done():
                    fut.cancel()
            await asyncio.gather(readers, ended, return_exceptions=True)  # retrieved: no stray warning
    except BaseException:
        # cancelled (or failed): the shim kills the command and all it started (also what left
        # the group; a group kill now would kill the shim before its sweep), and the cancel goes
        # on once it has been reaped (~10 ms; at most _SWEEP_S, or at once on a second cancel),
        # then the group kill if it has not: nothing of it outlives the call or its event loop
        _ask_shim_to_stop(proc)
        await _reaped(proc, _SWEEP_S)
        _kill_group_if_alive(proc)
        raise
    finally:
        os.close(r_fd)
        if go_w >= 0:
            os.close(go_w)  # the shim reads EOF and goes on; it was killed above anyway
        if groups is not None:
            groups.discard(proc.pid)
    return ExecResult(
        exit_code=code, stdout=bytes(out), stderr=bytes(err), duration_s=time.monotonic() - started,
        truncated=truncated, timed_out=timed_out, cpu_s=cpu_s,
    )


def _shim_end(fd: int) -> asyncio.Future[bytes]:
    """Resolves with what the shim wrote (its command's CPU seconds) once it has exited: it is the
    only writer of ``fd``'s pipe and never closes it itself, so EOF is its exit, after which a
    group kill cannot change its status."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[bytes] = loop.create_future()
    got = bytearray()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            chunk = os.read(fd, 64)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            got.extend(chunk)
            return
        loop.remove_reader(fd)
        if not fut.done():
            fut.set_result(bytes(got))

    loop.add_reader(fd, readable)
    return fut


async def _exit_code(proc: asyncio.subprocess.Process, argv: Sequence[str]) -> int:
    """The shim's exit status: it has exited (or was SIGKILLed), the child watcher reaps it at once."""
    for _ in range(int(_DRAIN_S / 0.005)):
        if proc.returncode is not None:
            return proc.returncode
        await asyncio.sleep(0.005)
    raise ManagerError(f"{list(argv[:3])}: its process {proc.pid} was not reaped {_DRAIN_S:g} s after it "
                       f"exited or was killed (stuck in the kernel?)", resource=f"pid {proc.pid}")


def _parse_cpu(raw: bytes) -> float | None:
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


def _ask_shim_to_stop(proc: asyncio.subprocess.Process) -> None:
    """SIGUSR1 to the shim: it SIGKILLs the command, then every descendant left (see ``_SHIM``)."""
    if proc.returncode is None:
        try:
            os.kill(proc.pid, signal.SIGUSR1)
        except (ProcessLookupError, PermissionError):
            pass


async def _reaped(proc: asyncio.subprocess.Process, limit: float) -> None:
    """Wait (bounded) until the child watcher has reaped the shim. A second cancel ends the wait
    at once; the caller then re-raises the first."""
    try:
        for _ in range(int(limit / 0.005)):
            if proc.returncode is not None:
                return
            await asyncio.sleep(0.005)
    except asyncio.CancelledError:
        pass


def _kill_group_if_alive(proc: asyncio.subprocess.Process) -> None:
    """The fallback of a cancel: the group kill, while the shim has not been reaped (its pid, the
    group's id, cannot have been reused)."""
    if proc.returncode is None:
        _kill_group(proc)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group, also after its leader (the shim) has exited: children
    left in the group would otherwise run on, on cores the lease is about to give back. (The group's
    id cannot be reused while any member lives.)"""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
