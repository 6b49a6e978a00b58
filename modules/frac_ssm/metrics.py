"""Recall accuracy by lag bucket (paper 002-02): how far back a model retrieves what it was shown."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

#: lag buckets of the recall metrics: ``acc_lag<lo>_<hi>`` counts answers with ``lo <= lag < hi``
LAG_BUCKETS = ((1, 32), (32, 256), (256, 1024))


class LagAccuracy(Metric):
    """Accuracy over the answers whose lag lies in ``[lo, hi)`` (``hi = None``: no upper bound; the top
    bucket of ``LAG_BUCKETS`` is open too, so that no lag is dropped)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, lo: int = 0, hi: int | None = None) -> None:
        super().__init__()
        self.lo, self.hi = lo, hi
        self.add_state("correct", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, lags: Tensor) -> None:
        keep = lags >= self.lo
        if self.hi is not None:
            keep &= lags < self.hi
        self.correct += (preds[keep] == target[keep]).sum()
        self.total += keep.sum()

    def compute(self) -> Tensor:
        return self.correct.float() / self.total.clamp_min(1)
