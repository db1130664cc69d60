"""The ledger of free units: concrete cores per NUMA node, GPU positions as a bitmask, free units per
counted kind (``counted_free``: memory bytes and the pool's declared resources, by name), quota
concurrency and token buckets (requests under the quota's name, weighted tokens under
``"#" + name``, a key no quota name can take). Only the core mutates it, and only through take/give, so the
invariant "free + granted = pool" has exactly two places to break."""

from __future__ import annotations

from ..pool import Pool
from .decisions import Grant

__all__ = ["Ledger"]


class Ledger:
    __slots__ = ("pool", "node_free", "node_count", "node_of", "node_size", "gpu_ids", "gpu_pos", "gpu_free",
                 "counted_free", "q_conc", "q_rate", "q_bucket", "q_used", "tokens", "refilled_at")

    def __init__(self, pool: Pool, now: float = 0.0) -> None:
        self.pool = pool
        nodes = pool.numa_nodes
        self.node_free: list[set[int]] = [set(n) for n in nodes]
        # free cores per node, kept in step with node_free: a round copies it instead of counting
        self.node_count: list[int] = [len(n) for n in nodes]
        self.node_size: list[int] = [len(n) for n in nodes]
        self.node_of: dict[int, int] = {c: i for i, n in enumerate(nodes) for c in n}
        self.gpu_ids: tuple[int, ...] = pool.gpus
        self.gpu_pos: dict[int, int] = {g: i for i, g in enumerate(pool.gpus)}
        self.gpu_free: int = (1 << len(pool.gpus)) - 1
        self.counted_free: dict[str, int] = pool.counted
        self.q_conc: dict[str, int | None] = {}
        self.q_rate: dict[str, float | None] = {}
        self.q_bucket: dict[str, int | None] = {}
        self.q_used: dict[str, int] = {}
        self.tokens: dict[str, float] = {}
        for name, q in pool.quotas:
            self.q_conc[name] = q.concurrency
            self.q_rate[name] = q.rate
            self.q_bucket[name] = q.bucket
            self.q_used[name] = 0
            if q.bucket is not None:
                self.tokens[name] = float(q.bucket)
            tb = q.token_bucket
            if tb is not None:  # the weighted bucket, kept beside the request bucket as "#name"
                key = "#" + name
                self.q_rate[key] = q.tokens_per_s
                self.q_bucket[key] = tb
                self.tokens[key] = float(tb)
        self.refilled_at = now

    def usage(self) -> str:
        """Units in use over each total (``cpu 3/4 gpu 1/2 slots 2/2 search 3/64``; a quota without
        a concurrency limit shows its count): what ``repr`` of a Tangram or a Scheduler shows."""
        parts = []
        pool = self.pool
        if pool.cpus:
            parts.append(f"cpu {len(pool.cpus) - self.free_cpus}/{len(pool.cpus)}")
        if pool.gpus:
            parts.append(f"gpu {len(pool.gpus) - self.free_gpus}/{len(pool.gpus)}")
        for n, cap in pool.counted.items():
            parts.append(f"{n} {cap - self.counted_free[n]}/{cap}")
        for n, used in self.q_used.items():
            c = self.q_conc[n]
            parts.append(f"{n} {used}/{c}" if c is not None else f"{n} {used}")
        return " ".join(parts)

    # -- time ------------------------------------------------------------------------------------
    def tokens_used(self, name: str, delta: float, now: float) -> None:
        """The ``TokensUsed`` event: the buckets refilled to ``now``, then ``name``'s corrected."""
        if "#" + name not in self.tokens:
            raise KeyError(f"tokens used of unknown weighted quota {name!r}")
        self.refill(now)
        self.correct_tokens(name, delta)

    def correct_tokens(self, name: str, delta: float) -> None:
        """An action used ``delta`` more tokens of quota ``name`` than it stated (fewer when
        negative): the bucket pays for the truth, and may go below zero (an overdraft the next
        grants wait out)."""
        key = "#" + name
        cap = self.q_bucket[key]
        assert cap is not None
        self.tokens[key] = min(float(cap), self.tokens[key] - delta)

    def refill(self, now: float) -> None:
        dt = now - self.refilled_at
        if dt <= 0:
            return
        self.refilled_at = now
        for name, tok in self.tokens.items():
            rate = self.q_rate[name]
            cap = self.q_bucket[name]
            assert rate is not None and cap is not None
            self.tokens[name] = min(float(cap), tok + rate * dt)

    # -- accounting ------------------------------------------------------------------------------
    @property
    def free_cpus(self) -> int:
        return sum(self.node_count)

    @property
    def free_gpus(self) -> int:
        return self.gpu_free.bit_count()

    @property
    def mem_free(self) -> int | None:
        """Free bytes of the built-in counted kind (None: the pool does not count memory)."""
        return self.counted_free.get("memory")

    def take(self, g: Grant) -> None:
        for c in g.cpus:
            n = self.node_of[c]
            self.node_free[n].remove(c)  # KeyError here means a double grant: loud
            self.node_count[n] -= 1
        for gid in g.gpus:
            bit = 1 << self.gpu_pos[gid]
            if not self.gpu_free & bit:
                raise AssertionError(f"GPU {gid} granted twice")
            self.gpu_free &= ~bit
        if g.counted:
            free = self.counted_free
            for name, n in g.counted:
                free[name] -= n
        for name, q in g.quotas:
            self.q_used[name] += q
            if name in self.tokens:
                self.tokens[name] -= q
        for name, n in g.tokens:
            self.tokens["#" + name] -= n

    def give(self, g: Grant) -> None:
        for c in g.cpus:
            n = self.node_of[c]
            s = self.node_free[n]
            if c in s:
                raise AssertionError(f"core {c} released twice")
            s.add(c)
            self.node_count[n] += 1
        for gid in g.gpus:
            self.gpu_free |= 1 << self.gpu_pos[gid]
        if g.counted:
            free = self.counted_free
            for name, n in g.counted:
                free[name] += n
        for name, q in g.quotas:
            self.q_used[name] -= q  # tokens are spent, not returned
