"""Which GPU service instances the scheduler believes are resident on which cells.

Kept as three views updated together (by key, by service, per-position count) so that placement,
which asks "is S warm on this cell?" and "how many caches would this cell disturb?" for every
candidate cell, never scans the whole table.
"""

from __future__ import annotations

__all__ = ["Residency"]

Key = tuple[str, tuple[int, ...]]  # (service, GPU positions of its cell)


class Residency:
    __slots__ = ("last_used", "by_service", "per_pos", "at_pos", "inst_at", "use_at")

    def __init__(self, n_gpus: int) -> None:
        self.last_used: dict[Key, float] = {}
        self.by_service: dict[str, set[tuple[int, ...]]] = {}
        self.per_pos: list[int] = [0] * n_gpus
        self.at_pos: list[dict[str, int]] = [{} for _ in range(n_gpus)]  # service -> copies there
        self.inst_at: list[set[Key]] = [set() for _ in range(n_gpus)]  # instances using each GPU
        self.use_at: list[float] = [0.0] * n_gpus  # models' worth of memory in use (TP-k: 1/k)

    def __contains__(self, key: Key) -> bool:
        return key in self.last_used

    def __len__(self) -> int:
        return len(self.last_used)

    def __bool__(self) -> bool:
        return bool(self.last_used)

    def add(self, key: Key, now: float) -> None:
        if key not in self.last_used:
            self.by_service.setdefault(key[0], set()).add(key[1])
            for p in key[1]:
                self.per_pos[p] += 1
                at = self.at_pos[p]
                at[key[0]] = at.get(key[0], 0) + 1
                self.inst_at[p].add(key)
                self.use_at[p] += 1.0 / len(key[1])
        self.last_used[key] = now

    def touch(self, key: Key, now: float) -> None:
        if key in self.last_used:
            self.last_used[key] = now

    def remove(self, key: Key) -> None:
        if self.last_used.pop(key, None) is None:
            return
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

    def services_on(self, cell: tuple[int, ...]) -> set[str]:
        """Services with a resident copy overlapping ``cell``."""
        out: set[str] = set()
        for p in cell:
            out.update(self.at_pos[p])
        return out

    def evicted_by(self, cell: tuple[int, ...], slots: float) -> set[str]:
        """Services whose copies an LRU cache would evict to fit a new instance on ``cell`` when
        each GPU holds ``slots`` models' worth (a TP-k instance uses 1/k on each of its GPUs)."""
        need = 1.0 / len(cell) - 1e-9
        use_at = self.use_at
        for p in cell:
            if use_at[p] + need > slots:
                break
        else:
            return set()  # room on every GPU of the cell: nothing is evicted
        k = len(cell)
        use = {p: use_at[p] for p in cell}
        insts: set[Key] = set()
        for p in cell:
            insts.update(self.inst_at[p])
        out: set[str] = set()
        for key in sorted(insts, key=lambda key: (self.last_used[key], key)):
            out.add(key[0])
            for p in key[1]:
                if p in use:
                    use[p] -= 1.0 / len(key[1])
            if all(u + 1.0 / k <= slots + 1e-9 for u in use.values()):
                break
        return out

    def others_on(self, service: str | None, cell: tuple[int, ...]) -> int:
        """Resident instances of other services (or other cells of this one) overlapping ``cell``."""
        n = sum(self.per_pos[p] for p in cell)
        if service is not None and cell in self.cells_of(service):
            n -= len(cell)
        return n
