"""Sufficient statistics of a batch of per-sample gradients and the estimates formed from them.

For n per-sample gradients g_1..g_n of the per-sample loss l_i (a parameter block k at a time) we keep
  S_k = sum_i |g_{i,k}|^2   and   s_k = sum_i g_{i,k}  (a vector shaped like the block),
both additive over samples, so ranks holding disjoint shards of one global batch combine by summing.
From them, with gbar = s / n (the batch-mean gradient) and G = E[g_i] (the true gradient):
  tr(Sigma)_k            = n / (n - 1) * (S_k / n - |gbar_k|^2)   unbiased trace of the per-sample covariance
  grad_norm_sq_k         = |gbar_k|^2                             squared norm of the batch gradient; a biased
                                                                  estimate of |G|^2: E|gbar|^2 = |G|^2 + tr(Sigma)/n
  grad_norm_sq_unbiased  = |gbar|^2 - tr(Sigma) / n               unbiased estimate of |G|^2 (may come out <= 0
                                                                  when the noise hides the signal)
  noise_scale            = tr(Sigma) / grad_norm_sq_unbiased      McCandlish et al.'s simple noise scale B_simple
                                                                  (NaN, undefined, when the unbiased |G|^2 <= 0)
  noise_scale_plugin     = tr(Sigma) / |gbar|^2                   the plug-in ratio; it estimates B / (1 + B / n),
                                                                  so it can never exceed about n
Single-batch ratios are noisy (the denominator most of all): over a run, average ``trace`` and
``grad_norm_sq_unbiased`` separately and divide (McCandlish et al.'s advice; ``python main.py compare
--metric .../trace --divide-by .../grad_norm_sq_unbiased --agg mean``). Every ratio is invariant to a rescaling of the loss (numerator and denominator scale alike), unlike
tr(Sigma) itself. Totals are sums over blocks (trace and squared norms are additive over coordinates).
"""

from __future__ import annotations

import math
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

    def __contains__(self, name: str) -> bool:
        return name in self.sum_sq


@dataclass
class PerSampleGrads:
    """Materialised per-sample gradients: ``grads[name]`` of shape ``(n, numel)``, float64.

    The same interface as ``GradStats`` for the paths that build per-sample gradients, for callers that
    need more than the sums (inner products of each g_i with a fixed direction, say).
    """

    n: int
    grads: dict[str, Tensor] = field(default_factory=dict)

    def add_per_sample(self, name: str, g: Tensor) -> None:
        g = g.detach().reshape(self.n, -1).to(torch.float64)
        self.grads[name] = self.grads[name] + g if name in self.grads else g

    def add(self, name: str, sq: Tensor, g_sum: Tensor) -> None:
        """Only for a parameter the loss does not use: its zero gradient (sums cannot be un-summed)."""
        if float(sq) != 0.0:
            raise ConfigError("PerSampleGrads needs materialised per-sample gradients (use ghost='never')")
        self.add_per_sample(name, torch.zeros(self.n, g_sum.numel(), device=g_sum.device))

    def __contains__(self, name: str) -> bool:
        return name in self.grads

    def matrix(self, names: list[str]) -> Tensor:
        """``(n, P)``: the per-sample gradients of the parameters ``names``, flattened and concatenated."""
        return torch.cat([self.grads[k] for k in names], 1)

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


def estimates(n: int, sum_sq: float, gbar_sq: float) -> dict[str, float]:
    """tr(Sigma), |gbar|^2, the unbiased |G|^2 and both noise scales from S = sum_i |g_i|^2 and |gbar|^2."""
    trace = n / (n - 1) * (sum_sq / n - gbar_sq)
    g2 = gbar_sq - trace / n
    return {
        "trace": trace,
        "grad_norm_sq": gbar_sq,
        "grad_norm_sq_unbiased": g2,
        "noise_scale": trace / g2 if g2 > 0 else math.nan,
        "noise_scale_plugin": trace / gbar_sq if gbar_sq > 0 else math.nan,
    }


def finalize(stats: GradStats, groups: dict[str, str]) -> dict:
    """Estimates from the statistics: totals plus ``groups[group]``, the same per group (see ``estimates``).

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
    out = {"n": n, **estimates(n, tot_sq.item(), tot_g2.item())}
    out["groups"] = {g: estimates(n, sq.item(), g2.item()) for g, (sq, g2) in per_group.items()}
    return out
