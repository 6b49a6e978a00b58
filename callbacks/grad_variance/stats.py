"""Sufficient statistics of a batch of per-sample gradients and the estimates formed from them.

For n per-sample gradients g_1..g_n of the per-sample loss l_i (a parameter block k at a time) we keep
  S_k = sum_i |g_{i,k}|^2   and   s_k = sum_i g_{i,k}  (a vector shaped like the block),
both additive over samples, so ranks holding disjoint shards of one global batch combine by summing.
From them, with gbar = s / n:
  tr(Sigma)_k     = n / (n - 1) * (S_k / n - |gbar_k|^2)     (unbiased trace of the per-sample covariance)
  |G|^2_k         = |gbar_k|^2                                (squared norm of the mean gradient)
  B_simple        = tr(Sigma) / |G|^2                          (McCandlish et al.'s simple noise scale)
Totals are sums over blocks (trace and squared norm are additive over coordinates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from errors import ConfigError


@dataclass
class GradStats:
    """``n`` samples; ``sum_sq[name]`` = S (float64 scalar), ``sum_g[name]`` = s (float64 vector)."""

    n: int
    sum_sq: dict[str, Tensor] = field(default_factory=dict)
    sum_g: dict[str, Tensor] = field(default_factory=dict)

    def add(self, name: str, sq: Tensor, g_sum: Tensor) -> None:
        sq = sq.detach().to(torch.float64)
        g_sum = g_sum.detach().reshape(-1).to(torch.float64)
        if name in self.sum_sq:
            self.sum_sq[name] = self.sum_sq[name] + sq
            self.sum_g[name] = self.sum_g[name] + g_sum
        else:
            self.sum_sq[name], self.sum_g[name] = sq, g_sum

    def add_per_sample(self, name: str, g: Tensor) -> None:
        """Add materialised per-sample gradients ``g`` of shape ``(n, *param.shape)``."""
        self.add(name, g.pow(2).sum(), g.sum(0))

    def flatten(self, names: list[str]) -> Tensor:
        """One float64 vector ``[n, S_names..., s_names...]`` for a single all-reduce."""
        ref = self.sum_sq[names[0]]
        parts = [torch.tensor([float(self.n)], dtype=torch.float64, device=ref.device)]
        parts += [self.sum_sq[k].reshape(1) for k in names]
        parts += [self.sum_g[k] for k in names]
        return torch.cat(parts)

    @classmethod
    def unflatten(cls, vec: Tensor, names: list[str], sizes: list[int]) -> GradStats:
        out = cls(n=int(round(vec[0].item())))
        sq = vec[1 : 1 + len(names)]
        gs = vec[1 + len(names) :].split(sizes)
        for i, k in enumerate(names):
            out.sum_sq[k], out.sum_g[k] = sq[i], gs[i]
        return out


def _estimates(n: int, sq: Tensor, gbar_sq: Tensor) -> dict[str, float]:
    trace = n / (n - 1) * (sq.item() / n - gbar_sq.item())
    g2 = gbar_sq.item()
    return {"trace": trace, "grad_norm_sq": g2, "noise_scale": trace / g2 if g2 > 0 else float("inf")}


def finalize(stats: GradStats, groups: dict[str, str]) -> dict:
    """Estimates from the statistics: totals plus ``groups[group] = {trace, grad_norm_sq, noise_scale}``.

    ``groups`` maps a parameter name to the name of its group (for example its module path).
    """
    n = stats.n
    if n < 2:
        raise ConfigError(f"the gradient variance needs at least 2 samples, got a batch of {n}")
    per_group: dict[str, list[Tensor]] = {}
    zero = torch.zeros((), dtype=torch.float64)
    tot_sq, tot_g2 = zero, zero
    for name, sq in stats.sum_sq.items():
        g2 = (stats.sum_g[name] / n).pow(2).sum().cpu()
        sq = sq.cpu()
        tot_sq, tot_g2 = tot_sq + sq, tot_g2 + g2
        acc = per_group.setdefault(groups.get(name, name), [zero, zero])
        acc[0], acc[1] = acc[0] + sq, acc[1] + g2
    out = {"n": n, **_estimates(n, tot_sq, tot_g2)}
    out["groups"] = {g: _estimates(n, sq, g2) for g, (sq, g2) in per_group.items()}
    return out
