"""Light torchmetrics for the per-step hot path of small models.

``torchmetrics.classification.MulticlassAccuracy(average="micro")`` computes the whole stat-score table on
every update (about 0.1 ms on CPU, a tenth of a tiny model's step). ``Accuracy`` keeps two counters;
torchmetrics still does the accumulation, the reset and the DDP reduction.

Also plain measures several methods report: ``psnr_from_mse``, ``count_parameters``, and the spread of
per-group accuracies corrected for test-set noise (``between_group_variance``, ``noise_corrected_spread``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torchmetrics import Metric


class Accuracy(Metric):
    """The fraction of ``preds == target`` over all updates (micro accuracy; any shapes, compared element-wise)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self) -> None:
        super().__init__()
        self.add_state("correct", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        self.correct += (preds == target).sum()
        self.total += target.numel()

    def compute(self) -> Tensor:
        return self.correct.float() / self.total


def psnr_from_mse(mse: Tensor, min_mse: float = 1e-10) -> Tensor:
    """PSNR in dB of signals with peak 1: ``-10 log10(MSE)``, the MSE floored at ``min_mse`` (a perfect fit)."""
    return -10 * torch.log10(mse.clamp_min(min_mse))


def count_parameters(module: nn.Module) -> int:
    """Trainable parameters of ``module``."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def between_group_variance(correct: Tensor, total: Tensor) -> Tensor:
    """The between-group variance of true accuracies, with the binomial test-set noise taken out (float64).

    Group ``i`` answered ``correct[i]`` of ``total[i]`` independent test samples right, ``p_i`` its observed
    accuracy. The observed variance of the ``p_i`` is the variance of the true accuracies plus the mean
    sampling variance ``p_i (1 - p_i) / n_i``; the estimate is their difference,

        s^2(p, ddof=1) - mean_i p_i (1 - p_i) / (n_i - 1),

    which is exactly unbiased for the sample variance (ddof 1) of the true accuracies when every count is
    binomial (the ``n_i - 1`` and ``ddof=1`` make it exact; ``n_i`` and ``ddof=0`` would be off by
    ``O(1/n)`` and ``O(1/k)``). It is not clipped: with nearly equal true accuracies it is negative about half
    of the time, and an average over runs stays unbiased only unclipped.

    Args:
        correct: ``(..., k)`` correct answers per group (leading dimensions: independent sets of groups).
        total: ``(..., k)`` test samples per group, each at least 2 (groups with fewer must be left out).

    Returns:
        ``(...)``: one estimate per set of groups.
    """
    correct, total = correct.double(), total.double()
    if correct.shape != total.shape or correct.dim() < 1 or correct.shape[-1] < 2:
        raise ValueError(f"correct and total must be (..., k) with k >= 2, got {tuple(correct.shape)}, {tuple(total.shape)}")
    if (total < 2).any():
        raise ValueError("every group needs at least 2 test samples for the noise correction")
    p = correct / total
    return p.var(dim=-1, correction=1) - (p * (1 - p) / (total - 1)).mean(dim=-1)


def noise_corrected_spread(
    correct: Tensor, total: Tensor, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """The between-group std of true accuracies ``sqrt(max(0, between_group_variance))`` and its interval.

    The interval is the percentile bootstrap over groups: ``n_boot`` resamples of the ``k`` groups with
    replacement (a generator seeded by ``seed``, so the same counts give the same interval), each giving
    the clipped, square-rooted estimate; ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles. It covers the
    uncertainty from which groups were drawn and from their test sets, not the training run's.

    Returns:
        ``(spread, lo, hi)`` as float64 scalars, for ``(k,)`` counts.
    """
    var = between_group_variance(correct, total)
    gen = torch.Generator().manual_seed(seed)
    k = correct.shape[-1]
    idx = torch.randint(0, k, (n_boot, k), generator=gen)
    spreads = between_group_variance(correct[idx], total[idx]).clamp_min(0).sqrt()
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(spreads, q)
    return var.clamp_min(0).sqrt(), lo, hi
