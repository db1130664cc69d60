"""A small seeded torch module shared by the GPU manager tests (CPU path and CUDA-marked ones).
Import it after ``pytest.importorskip("torch")``."""

from __future__ import annotations

import torch


class Scorer(torch.nn.Module):
    """Two linear layers with weights drawn from ``seed``: two Scorers of one seed score alike,
    so a restored copy can be checked against a fresh one."""

    def __init__(self, seed: int, d: int = 32) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1 = torch.nn.Linear(d, 64)
        self.l2 = torch.nn.Linear(64, 1)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.tanh(self.l1(x))).squeeze(-1)
