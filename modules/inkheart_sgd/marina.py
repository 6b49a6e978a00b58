"""MARINA-P's compressed downlink (Gruntkowska, Tyurin & Richtarik 2024) and the two reconstructions built on it,
``m4_inferred`` and ``inkheart_inferred`` (RECONSTRUCTIONS from the abstract, not the paper's algorithms; see
``modules.inkheart_sgd``).

The workers hold their own points w_i; with probability p the server broadcasts x+, else worker i adds its
part Q_i(x+ - x) of a Perm-K (or independent Rand-K) compression. The reconstructions share one round
(``_BlockUplink``): the uplink sends only the change of each worker's estimate z_i on its own block of the
last downlink permutation.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.compression import perm_k_blocks, rand_k_rows
from modules.inkheart_sgd.servers import BatchGradFn, CommServer


def _clone(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clone()


class _MarinaDownlink(CommServer):
    """The workers' points w_i and MARINA-P's downlink: broadcast with probability p, else Perm-K (or Rand-K)
    over the active workers (``self.active``; all n unless a subclass narrows it)."""

    def __init__(self, *args: Any, p: float | None = None, downlink: Literal["permk", "randk"] = "permk",
                 down_k: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if downlink not in ("permk", "randk"):
            raise ConfigError(f"downlink compressor must be 'permk' or 'randk', got {downlink!r}")
        self.downlink = downlink
        self.p_arg, self.down_k_arg = p, down_k
        self.w: Tensor | None = None
        self.last_owner: Tensor | None = None  # the Perm-K blocks of the last downlink (None: a broadcast)
        self.broadcasts = 0
        self.set_active(list(range(self.n)))

    def set_active(self, active: list[int]) -> None:
        self.active = list(active)
        na = len(self.active)
        self.p = 1.0 / na if self.p_arg is None else float(self.p_arg)
        if not 0.0 < self.p <= 1.0:
            raise ConfigError(f"MARINA-P's broadcast probability p must be in (0, 1], got {self.p}")
        self.down_k = self.down_k_arg if self.down_k_arg is not None else math.ceil(self.dim / na)

    def scalars(self) -> dict[str, float]:
        """The broadcast rounds so far."""
        return {"broadcasts": float(self.broadcasts)}

    def expected_down(self) -> float:
        """E[down-coordinates per link per round] (Perm-K: the bound ceil(d/n) on a block)."""
        part = math.ceil(self.dim / len(self.active)) if self.downlink == "permk" else self.down_k
        return self.p * self.dim + (1 - self.p) * part

    def init_points(self, x: Tensor) -> None:
        if self.w is None:
            self.w = x.expand(self.n, -1).clone()  # x^0 is known to every worker

    def send_down(self, x: Tensor, x_new: Tensor) -> float:
        """Move every active w_i from x to x+; returns the coordinates on the busiest link."""
        assert self.w is not None
        act = self.active
        if float(torch.rand((), generator=self.generator, dtype=torch.float64)) < self.p:
            self.w[act] = x_new.expand(len(act), -1)
            self.broadcasts += 1
            self.last_owner = None
            return float(self.dim)
        delta = x_new - x
        na = len(act)
        if self.downlink == "permk":
            owner = perm_k_blocks(na, self.dim, self.generator)
            mask = owner[None, :] == torch.arange(na)[:, None]
            self.w[act] = self.w[act] + torch.where(mask, delta * na, torch.zeros(na, self.dim, dtype=x.dtype))
            self.last_owner = owner
            return float(torch.bincount(owner, minlength=na).max())
        self.w[act] = self.w[act] + rand_k_rows(delta.expand(na, -1), self.down_k, self.generator)
        self.last_owner = None
        return float(self.down_k)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "w": None if self.w is None else self.w.clone(), "broadcasts": self.broadcasts,
                "last_owner": _clone(self.last_owner)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.w = None if state["w"] is None else state["w"].clone()
        self.broadcasts = int(state["broadcasts"])
        self.last_owner = _clone(state["last_owner"])


class MarinaPServer(_MarinaDownlink):
    """MARINA-P: g = (1/n) sum_i g_i(w_i) sent uncompressed; x+ = x - gamma g; compressed downlink."""

    def step(self, x, lr, grad_fn):
        self.init_points(x)
        workers = list(range(self.n))
        g = grad_fn(self.w, workers).mean(0)
        x_new = x - lr * g
        down = self.send_down(x, x_new)
        self.advance(float(self.taus.max()), self.dim, down)
        self.stats.computed += self.n
        self.stats.used += self.n
        return x_new, None


class _BlockUplink(_MarinaDownlink):
    """The reconstructions' shared round: MARINA-P's Perm-K downlink, and an uplink that sends, MARINA-style,
    only the change of each worker's estimate z_i, restricted to its own block of the last downlink
    permutation (where, for a separable problem, w_i and so grad f_i(w_i) moved), unscaled; after a
    broadcast round the z_i are sent whole. The server keeps g ~ mean_{active} z_i.
    Subclasses give ``estimate(x, grad_fn) -> (new z rows of the active workers, compute seconds)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.downlink != "permk":
            raise ConfigError("the reconstructions (m4_inferred, inkheart_inferred) use the Perm-K downlink")
        self.z: Tensor | None = None
        self.g: Tensor | None = None

    def estimate(self, x: Tensor, grad_fn: BatchGradFn) -> tuple[Tensor, float, int]:
        raise NotImplementedError

    def step(self, x, lr, grad_fn):
        self.init_points(x)
        act = self.active
        z_new, compute, computed = self.estimate(x, grad_fn)
        if self.g is None or self.last_owner is None:  # first round, or after a broadcast: send z_i whole
            up = float(self.dim)
            self.g = z_new.mean(0)
        else:
            assert self.z is not None
            mask = self.last_owner[None, :] == torch.arange(len(act))[:, None]
            diff = torch.where(mask, z_new - self.z[act], torch.zeros_like(z_new))
            self.g = self.g + diff.mean(0)
            up = float(torch.bincount(self.last_owner, minlength=len(act)).max())
        if self.z is None:
            self.z = torch.zeros(self.n, self.dim, dtype=x.dtype)
        self.z[act] = z_new
        x_new = x - lr * self.g
        down = self.send_down(x, x_new)
        self.advance(compute, up, down)
        self.stats.computed += computed
        self.stats.used += computed
        return x_new, None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "z": _clone(self.z), "g": _clone(self.g)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.z, self.g = _clone(state["z"]), _clone(state["g"])


class M4Server(_BlockUplink):
    """``m4_inferred`` (a reconstruction): the shared round of ``_BlockUplink`` on the m fastest workers, z_i
    the momentum (1 - beta) z_i + beta g_i(w_i); m by a time-aware rule (see the package docstring,
    ``modules.inkheart_sgd``)."""

    def __init__(self, *args: Any, momentum: float, sigma2_over_eps: float, m: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not 0.0 < momentum <= 1.0:
            raise ConfigError(f"momentum beta must be in (0, 1], got {momentum}")
        self.beta = float(momentum)
        self.m = m if m is not None else self.choose_m(sigma2_over_eps)
        if not 1 <= self.m <= self.n:
            raise ConfigError(f"m must be in [1, n_workers] = [1, {self.n}], got {self.m}")
        self.set_active(sorted(torch.sort(self.taus, stable=True).indices[: self.m].tolist()))

    def scalars(self) -> dict[str, float]:
        """m, and the broadcasts."""
        return {"m": float(self.m), **super().scalars()}

    def choose_m(self, sigma2_over_eps: float) -> int:
        """argmin_m (h_(m) + kappa E[up + down | m]) (1 + sigma^2 / (m eps)); ties to the largest m."""
        sorted_h = self.taus.sort().values
        costs = []
        for m in range(1, self.n + 1):
            per_link = (1 / m) * self.dim + (1 - 1 / m) * math.ceil(self.dim / m)  # p = 1/m, both directions
            costs.append((float(sorted_h[m - 1]) + self.comm_per_round(per_link, per_link)) * (1 + sigma2_over_eps / m))
        best = min(costs)
        return max(m for m in range(1, self.n + 1) if costs[m - 1] <= best * (1 + 1e-12))

    def estimate(self, x, grad_fn):
        grads = grad_fn(self.w, self.active)
        if self.z is None:
            return grads, float(self.taus[self.active].max()), len(self.active)
        z_old = self.z[self.active]
        return (1 - self.beta) * z_old + self.beta * grads, float(self.taus[self.active].max()), len(self.active)


class InkheartServer(_BlockUplink):
    """``inkheart_inferred`` (a reconstruction): the shared round of ``_BlockUplink``; in a round of compute
    time t worker i averages b_i = floor(t / h_i) stochastic gradients at w_i (z_i = that mean); t by a
    Shadowheart-style equilibrium rule (see the package docstring, ``modules.inkheart_sgd``)."""

    def __init__(self, *args: Any, sigma2_over_eps: float, round_time: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.t = float(round_time) if round_time is not None else self.equilibrium(sigma2_over_eps)
        self.b = torch.floor(self.t / self.taus + 1e-9).long()
        active = [i for i in range(self.n) if int(self.b[i]) > 0]
        if not active:
            raise ConfigError(f"round_time {self.t} is shorter than every worker's computation time")
        self.set_active(active)

    def scalars(self) -> dict[str, float]:
        """The round's compute time t, and the broadcasts."""
        return {"t": self.t, **super().scalars()}

    def _cost(self, t: float, sigma2_over_eps: float) -> float:
        b = torch.floor(t / self.taus + 1e-9)
        na, total = int((b > 0).sum()), float(b.sum())
        if na == 0:
            return math.inf
        per_link = (1 / na) * self.dim + (1 - 1 / na) * math.ceil(self.dim / na)
        return (t + self.comm_per_round(per_link, per_link)) * (1 + sigma2_over_eps / total)

    def equilibrium(self, sigma2_over_eps: float) -> float:
        """t minimising (t + kappa E[up + down]) (1 + sigma^2 / (B(t) eps)), B(t) = sum_i floor(t / h_i), over
        t in {j h_i : j <= 256}."""
        ts = sorted({float(j * h) for h in self.taus.tolist() for j in range(1, 257)})
        costs = [self._cost(t, sigma2_over_eps) for t in ts]
        return ts[min(range(len(ts)), key=lambda i: (costs[i], ts[i]))]

    def estimate(self, x, grad_fn):
        act = self.active
        b = self.b[act]
        total = torch.zeros(len(act), self.dim, dtype=x.dtype)
        for r in range(int(b.max())):  # the r-th gradient of every worker with b_i > r
            rows = [j for j in range(len(act)) if int(b[j]) > r]
            total[rows] += grad_fn(self.w, [act[j] for j in rows])
        return total / b.to(x.dtype)[:, None], self.t, int(b.sum())


