"""The Max-Monotone Network of MonoBarrier (package docstring): axis branches and K learned monotone branches."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError


class MaxMonotoneNet(nn.Module):
    """B(x) = max(axis branches, K learned monotone branches), float64, nondecreasing in every coordinate.

    Args:
        state_dim: n.
        n_branches: K learned branches.
        hidden: units per ``pos_mlp`` branch, affine maps per ``minmax`` group.
        branch: ``pos_mlp`` or ``minmax`` (module docstring).
        axis: include the n axis branches s_i (z_i - t_i).
    """

    def __init__(self, state_dim: int, n_branches: int = 8, hidden: int = 32,
                 branch: Literal["pos_mlp", "minmax"] = "pos_mlp", axis: bool = True, seed: int = 0) -> None:
        super().__init__()
        if state_dim < 1 or n_branches < 0 or hidden < 1:
            raise ConfigError(f"need state_dim >= 1, n_branches >= 0, hidden >= 1; got {state_dim}, {n_branches}, {hidden}")
        if n_branches == 0 and not axis:
            raise ConfigError("a MaxMonotoneNet needs a branch: n_branches >= 1 or axis: true")
        self.state_dim, self.n_branches, self.hidden, self.branch, self.axis = state_dim, n_branches, hidden, branch, axis
        gen = torch.Generator().manual_seed(seed)
        dd = dict(dtype=torch.float64)
        self.register_buffer("lo", torch.zeros(state_dim, **dd))
        self.register_buffer("width", torch.ones(state_dim, **dd))
        k, h, n = n_branches, hidden, state_dim
        # raw weights through softplus: nonnegative whatever the optimiser does; the 1/n keeps pre-activations
        # O(1). Each unit (affine map) starts leaning on one random coordinate (softplus(2) against softplus(-4)):
        # a min of such maps is a corner, the shape a staircase is made of; a dense start sits in a smooth
        # diagonal optimum (measured: 95 % on the staircase test against 100 %)
        w = torch.full((k, h, n), -4.0, **dd)
        w.scatter_(2, torch.randint(n, (k, h, 1), generator=gen), 2.0)
        self.w_raw = nn.Parameter(w)
        self.c = nn.Parameter(-torch.rand(k, h, generator=gen, **dd) * F.softplus(torch.tensor(2.0)).item() / n)
        self.v_raw = nn.Parameter(torch.zeros(k, h, **dd))
        self.d = nn.Parameter(torch.full((k,), -2.0, **dd))  # learned branches start below the axis branches
        self.axis_scale_raw = nn.Parameter(torch.full((n,), math.log(math.e - 1), **dd))  # softplus -> 1
        self.axis_t = nn.Parameter(torch.full((n,), 0.5, **dd))

    def set_box(self, lo: Tensor, hi: Tensor) -> None:
        """Normalise inputs to the state box X (a positive affine map: monotonicity is kept)."""
        self.lo.copy_(lo.to(torch.float64))
        self.width.copy_((hi - lo).to(torch.float64))

    def set_axis_thresholds(self, t: Tensor) -> None:
        """Axis thresholds t (n,) in normalised coordinates (where each axis branch crosses 0)."""
        with torch.no_grad():
            self.axis_t.copy_(t.to(torch.float64))

    def branches(self, x: Tensor) -> Tensor:
        """(N, n + K) every branch's value (axis branches first when present)."""
        z = (x.to(torch.float64) - self.lo) / self.width
        parts = []
        if self.axis:
            parts.append(F.softplus(self.axis_scale_raw) * (z - self.axis_t))
        if self.n_branches:
            w = F.softplus(self.w_raw) / self.state_dim
            pre = torch.einsum("khn,bn->bkh", w, z) + self.c
            if self.branch == "pos_mlp":
                # a bounded activation: with ReLU every branch would be convex, the max of them too, and its
                # sublevel set convex, which no staircase is
                v = F.softplus(self.v_raw)
                parts.append((torch.tanh(8.0 * pre) * v).sum(-1) + self.d)
            else:
                parts.append(pre.min(-1).values + self.d)
        return torch.cat(parts, 1)

    def forward(self, x: Tensor) -> Tensor:
        """B(x): (N, n) -> (N,)."""
        return self.branches(x).max(1).values


__all__ = ["MaxMonotoneNet"]
