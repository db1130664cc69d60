"""Which GPU service instances the scheduler believes are resident on which cells.

Kept as three views updated together (by key, by service, per-position count) so that placement,
which asks "is S warm on this cell?" and "how many caches would this cell disturb?" for every
candidate cell, never scans the whole table.

Two memory models (``replica``):

* **tensor-parallel** (default): a k-GPU instance is one server holding 1/k of the weights on each
  of its GPUs (vLLM/SGLang with TP; what the simulator models). ``(S, (0, 1))`` and ``(S, (0,))``
  are different instances, each using its own memory.
* **replica** (the torch GPU manager): a k-GPU grant runs data-parallel on the single-GPU copies
  ``(S, (g,))`` of its GPUs, one full copy per GPU shared by every width. A multi-GPU key is only
  a view: warm when every GPU of it holds a copy; adding it adds the missing copies; the
  manager's multi-GPU reports are not counted again (its per-GPU reports are the truth). Without
  this, a 2-GPU grant reported as ``(S, (0,))``, ``(S, (1,))`` and ``(S, (0, 1))`` would charge
  1.5 models per GPU.
"""

from __future__ import annotations

__all__ = ["Residency"]

Key = tuple[str, tuple[int, ...]]  # (service, GPU positions of its cell)


class Residency:
    __slots__ = ("last_used", "by_service", "per_pos", "at_pos", "inst_at", "use_at", "version", "replica",
                 "n")

    def __init__(self, n_gpus: int, replica: bool = False) -> None:
        self.replica = replica
        self.n = n_gpus
        self.last_used: dict[Key, float] = {}
        self.by_service: dict[str, set[tuple[int, ...]]] = {}
        self.per_pos: list[int] = [0] * n_gpus
        self.at_pos: list[dict[str, int]] = [{} for _ in range(n_gpus)]  # service -> copies there
        self.inst_at: list[set[Key]] = [set() for _ in range(n_gpus)]  # instances using each GPU
        self.use_at: list[float] = [0.0] * n_gpus  # models' worth of memory in use (TP-k: 1/k)
        self.version = 0  # bumped whenever the set of instances changes (not on a touch)

    def __contains__(self, key: Key) -> bool:
        if self.replica and len(key[1]) > 1:
            return all((key[0], (p,)) in self.last_used for p in key[1])
        return key in self.last_used

    def __len__(self) -> int:
        return len(self.last_used)

    def __bool__(self) -> bool:
        return bool(self.last_used)

    def add(self, key: Key, now: float) -> None:
        if self.replica and len(key[1]) > 1:
            for p in key[1]:
                self.add((key[0], (p,)), now)
            return
        if key not in self.last_used:
            self.version += 1
            self.by_service.setdefault(key[0], set()).add(key[1])
            for p in key[1]:
                self.per_pos[p] += 1
                at = self.at_pos[p]
                at[key[0]] = at.get(key[0], 0) + 1
                self.inst_at[p].add(key)
                self.use_at[p] += 1.0 / len(key[1])
        self.last_used[key] = now

    def touch(self, key: Key, now: float) -> None:
        if self.replica and len(key[1]) > 1:
            for p in key[1]:
                self.touch((key[0], (p,)), now)
            return
        if key in self.last_used:
            self.last_used[key] = now

    def remove(self, key: Key) -> None:
        if self.replica and len(key[1]) > 1:
            return  # a view: the per-GPU copies are reported (and removed) one by one
        if self.last_used.pop(key, None) is None:
            return
        self.version += 1
        cells = self.by_service[key[0]]
        cells.discard(key[1])
        if not cells:
            del self.by_service[key[0]]
        for p in key[1]:
            self.per_pos[p] -= 1
            self.inst_at[p].discard(key)
            self.use_at[p] -= 1.0 / len(key[1])
            at = self.at_pos[p]
            n = at[key[0]] - 1
            if n:
                at[key[0]] = n
            else:
                del at[key[0]]

    def cells_of(self, service: str | None) -> set[tuple[int, ...]]:
        if service is None:
            return set()
        return self.by_service.get(service, set())

    def warm_cells(self, service: str | None, k: int) -> set[tuple[int, ...]]:
        """The aligned ``k``-GPU cells where ``service`` is warm at that width."""
        if service is None:
            return set()
        cells = self.by_service.get(service)
        if not cells:
            return set()
        if not self.replica:
            return {pos for pos in cells if len(pos) == k}
        if k == 1:
            return set(cells)
        have = {pos[0] for pos in cells}
        return {tuple(range(o, o + k)) for o in range(0, self.n - k + 1, k)
                if all(p in have for p in range(o, o + k))}

    def services_on(self, cell: tuple[int, ...]) -> set[str]:
        """Services with a resident copy overlapping ``cell``."""
        out: set[str] = set()
        for p in cell:
            out.update(self.at_pos[p])
        return out

    def evicted_by(self, cell: tuple[int, ...], slots: float) -> set[str]:
        """Services whose copies an LRU cache would evict to fit a new instance on ``cell`` when
        each GPU holds ``slots`` models' worth (a TP-k instance uses 1/k on each of its GPUs)."""
        return {key[0] for key in self.victims(cell, slots)}

    def victims(self, cell: tuple[int, ...], slots: float, need: float | None = None,
                service: str | None = None) -> list[Key]:
        """The instances an LRU cache would evict, oldest first, to fit ``need`` models' worth per
        GPU of ``cell`` (default ``1/len(cell)``: one TP-k instance) when each GPU holds ``slots``."""
        k = len(cell)
        per = 1.0 / k if need is None else need
        if self.replica:  # a full copy on each GPU of the cell that lacks one
            per = 1.0 if need is None else need
            if service is not None:
                cell = tuple(p for p in cell if (service, (p,)) not in self.last_used)
        use_at = self.use_at
        for p in cell:
            if use_at[p] + per > slots + 1e-9:
                break
        else:
            return []  # room on every GPU of the cell: nothing is evicted
        use = {p: use_at[p] for p in cell}
        insts: set[Key] = set()
        for p in cell:
            insts.update(self.inst_at[p])
        out: list[Key] = []
        for key in sorted(insts, key=lambda key: (self.last_used[key], key)):
            out.append(key)
            for p in key[1]:
                if p in use:
                    use[p] -= 1.0 / len(key[1])
            if all(u + per <= slots + 1e-9 for u in use.values()):
                break
        return out

    def inst_at_cell(self, cell: tuple[int, ...]) -> set[Key]:
        """Every instance using a GPU of ``cell``."""
        out: set[Key] = set()
        for p in cell:
            out.update(self.inst_at[p])
        return out
