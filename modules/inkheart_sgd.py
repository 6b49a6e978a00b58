"""Bidirectionally compressed distributed SGD in the h/kappa time model (paper 004-18, Inkheart SGD and M4).

"Scalable Distributed Stochastic Optimization via Bidirectional Compression: Beyond Pessimistic Limits"
(arXiv 2605.07795). Only the abstract is known. Problem: min f(x) = (1/n) sum_i f_i(x) with n workers and a
server; f L-smooth, stochastic gradients unbiased with variance <= sigma^2, Delta = f(x^0) - f*. Time model:
a worker needs h seconds per stochastic gradient, sending one coordinate over a link takes kappa seconds, the
n worker-server links work in parallel, and the two directions are counted apart (a broadcast of x costs
kappa d, a different d/n-coordinate message to every worker kappa d/n). The known lower bound,
Omega~(min{kappa d L Delta/eps + h L Delta/eps + h sigma^2 L Delta/(n eps^2), h sigma^2 L Delta/eps^2 +
h L Delta/eps}), is matched by single-node SGD or Synchronous SGD: the d-term and the sigma^2-term cannot both
fall with n. The paper's methods break this under an extra structural assumption (read here as the
functional (L_A, L_B) inequality of MARINA-P; see ``datamodules.dist_problems``).

Simulated methods (``method``; one Lightning training step = one server round; real gradients, simulated
seconds), every round costs (compute) + kappa (up-coordinates per link, if ``uplink_cost``) + kappa
(down-coordinates per link):

- ``sgd``: one node holding f, x+ = x - gamma g(x) with g the stochastic gradient of a uniformly random
  f_i; h per step, nothing sent.
- ``sync_sgd``: broadcast x (kappa d), every worker one stochastic gradient (h), sent uncompressed (kappa d).
- ``rennala``: Rennala SGD (Tyurin & Richtarik 2023) with batch B; a worker's cycle is receive x (kappa d),
  compute (h_i), send (kappa d, if counted): ``modules.components.worker_sim.RennalaServer`` on that cycle.
- ``randk_sync``: Sync SGD whose uplink is Rand-K (k coordinates, independent per worker, unbiased); full
  broadcast down.
- ``marina_p`` (Gruntkowska, Tyurin & Richtarik 2024): x+ = x - gamma g; with probability p the server
  broadcasts x+ (w_i = x+, kappa d), else worker i adds its part Q_i(x+ - x) of a Perm-K (or independent
  Rand-K) compression (w_i += Q_i(x+ - x), kappa max_i |block_i| per link); g = (1/n) sum_i g_i(w_i), the
  stochastic gradients at the workers' own points, sent uncompressed. Perm-K keeps mean_i w_i = x.
- ``m4_inferred`` (a RECONSTRUCTION, not the paper's algorithm): MARINA-P's Perm-K downlink; the uplink
  sends, MARINA-style, only the change of each worker's momentum estimate z_i <- (1 - beta) z_i + beta
  g_i(w_i) (M3's momentum, Gruntkowska, Tyurin & Richtarik 2024) restricted to the worker's own block of the
  last downlink permutation, unscaled (after a broadcast round z_i is sent whole); the server keeps
  g = mean_i z_i. The m fastest workers take part, m minimising (h_(m) + kappa E[up + down]) (1 + sigma^2 /
  (m eps)) (ties to the largest m).
- ``inkheart_inferred`` (a RECONSTRUCTION): the same round; in a round of compute time t worker i averages
  b_i = floor(t / h_i) stochastic gradients at w_i (z_i = that mean, no momentum); t fixed once by a
  Shadowheart-style equilibrium rule (Tyurin, Pozzi, Ilin & Richtarik 2024): the t in {j h_i} minimising
  (t + kappa E[up + down]) (1 + sigma^2 / (B(t) eps)), B(t) = sum_i b_i(t).

For a separable (diagonal) homogeneous quadratic with exact gradients and beta = 1, grad f(w_i) changes only
on worker i's downlink block, so the block uplink is exact and both reconstructions are gradient descent in
iterates (tested); with beta < 1 or noise the dropped off-block changes are an error that a broadcast resets.

``CompressedDDPClassifier`` is the real path's task: a classifier trained under
``modules.components.ddp_hooks.CompressedDDPStrategy`` (compressed gradient buckets all-reduced on
``torch.distributed``; the downlink stays simulated).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.components.compression import perm_k_blocks, rand_k_rows
from modules.components.compute_time import ComputeTimeModel
from modules.components.mlp import MLP
from modules.components.simulated_task import SimulatedServerTask
from modules.components.supervised import NetFactory, SupervisedTask
from modules.components.worker_sim import RennalaServer, SimulatedServer

__all__ = ["METHODS", "CompressedDDPClassifier", "CompressedDistributedSGD", "CommServer", "build_server",
           "worker_times"]

Method = Literal["sgd", "sync_sgd", "rennala", "randk_sync", "marina_p", "m4_inferred", "inkheart_inferred"]
METHODS = ("sgd", "sync_sgd", "rennala", "randk_sync", "marina_p", "m4_inferred", "inkheart_inferred")
#: stochastic gradients of some workers at their own points: ``grads(points (n, d), workers) -> (len(workers), d)``
#: (row j: worker ``workers[j]`` at ``points[workers[j]]``)
BatchGradFn = Callable[[Tensor, list[int]], Tensor]


def worker_times(n: int, h: float, h_power: float = 0.0) -> list[float]:
    """The workers' fixed computation times h_i = h (i + 1)^h_power (h_power = 0: every worker h)."""
    if not (h > 0 and math.isfinite(h)):
        raise ConfigError(f"h (seconds per stochastic gradient) must be a positive number, got {h}")
    return [h * (i + 1) ** h_power for i in range(n)]


def _clone(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.clone()


class CommServer(SimulatedServer):
    """A simulated server in the h/kappa model: the clock advances by compute + kappa (up + down) per round.

    Args:
        n_workers, dim: n and d.
        taus: the fixed computation times h_i (``worker_times``).
        kappa: seconds per coordinate per link.
        uplink_cost: count the worker -> server time (False: only the downlink costs, coordinates still counted).
        generator: the method's randomness (compressors, coins, the sgd worker draw).
    """

    def __init__(self, n_workers: int, dim: int, taus: list[float], kappa: float, uplink_cost: bool = True,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(n_workers, ComputeTimeModel("fixed", taus=taus), generator)
        if not (kappa >= 0 and math.isfinite(kappa)):
            raise ConfigError(f"kappa (seconds per coordinate) must be >= 0, got {kappa}")
        self.dim, self.kappa, self.uplink_cost = dim, float(kappa), bool(uplink_cost)
        self.taus = torch.tensor(taus, dtype=torch.float64)

    def advance(self, compute: float, up: float, down: float) -> None:
        """One round: ``compute`` seconds, ``up`` / ``down`` coordinates on the busiest link of each direction."""
        self.clock += compute + self.kappa * (up if self.uplink_cost else 0.0) + self.kappa * down
        self.stats.coords_up += up
        self.stats.coords_down += down
        self.stats.updates += 1

    def comm_per_round(self, up: float, down: float) -> float:
        return self.kappa * ((up if self.uplink_cost else 0.0) + down)

    def step(self, x: Tensor, lr: float, grad_fn: BatchGradFn) -> tuple[Tensor, None]:  # type: ignore[override]
        raise NotImplementedError


class SGDServer(CommServer):
    """Single-node SGD on f = (1/n) sum_i f_i: the gradient of a uniformly random f_i, h_1 per step."""

    def step(self, x, lr, grad_fn):
        i = int(torch.randint(self.n, (1,), generator=self.generator))
        g = grad_fn(x.expand(self.n, -1), [i])[0]
        self.advance(float(self.taus[0]), 0.0, 0.0)
        self.stats.computed += 1
        self.stats.used += 1
        return x - lr * g, None


class SyncServer(CommServer):
    """Synchronous SGD (``k=None``) or Sync SGD with an independent Rand-K uplink (``k`` coordinates)."""

    def __init__(self, *args: Any, k: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.k = k

    def step(self, x, lr, grad_fn):
        workers = list(range(self.n))
        g = grad_fn(x.expand(self.n, -1), workers)
        if self.k is not None:
            g = rand_k_rows(g, self.k, self.generator)
        up = self.dim if self.k is None else self.k
        self.advance(float(self.taus.max()), up, self.dim)
        self.stats.computed += self.n
        self.stats.used += self.n
        return x - lr * g.mean(0), None


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
    the momentum (1 - beta) z_i + beta g_i(w_i); m by a time-aware rule (see the module docstring)."""

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
    Shadowheart-style equilibrium rule (see the module docstring)."""

    def __init__(self, *args: Any, sigma2_over_eps: float, round_time: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.t = float(round_time) if round_time is not None else self.equilibrium(sigma2_over_eps)
        self.b = torch.floor(self.t / self.taus + 1e-9).long()
        active = [i for i in range(self.n) if int(self.b[i]) > 0]
        if not active:
            raise ConfigError(f"round_time {self.t} is shorter than every worker's computation time")
        self.set_active(active)

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


class RennalaCycle:
    """Rennala SGD (``worker_sim.RennalaServer``) whose worker cycle includes the two transfers: receive x
    (kappa d), compute h_i, send the gradient (kappa d, if counted)."""

    def __init__(self, n_workers: int, dim: int, taus: list[float], kappa: float, uplink_cost: bool,
                 batch: int, generator: torch.Generator | None) -> None:
        if not (kappa >= 0 and math.isfinite(kappa)):
            raise ConfigError(f"kappa (seconds per coordinate) must be >= 0, got {kappa}")
        self.dim = dim
        comm = kappa * dim * (2 if uplink_cost else 1)
        self.inner = RennalaServer(n_workers, batch, ComputeTimeModel("fixed", taus=[t + comm for t in taus]),
                                   generator)
        self.n = n_workers

    @property
    def clock(self) -> float:
        return self.inner.clock

    @property
    def stats(self) -> Any:
        s = self.inner.stats
        # every used or dropped gradient was sent up, and every worker restart received a point
        s.coords_up = float(s.computed * self.dim)
        s.coords_down = float(s.computed * self.dim)
        return s

    def step(self, x: Tensor, lr: float, grad_fn: BatchGradFn) -> tuple[Tensor, None]:
        def one(z: Tensor, i: int) -> Tensor:
            pts = z.expand(self.n, -1)
            return grad_fn(pts, [i])[0]

        x_new, _ = self.inner.step(x, lr, one)
        return x_new, None

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


def build_server(
    method: str,
    n_workers: int,
    dim: int,
    h: float = 1.0,
    kappa: float = 0.1,
    uplink_cost: bool = True,
    h_power: float = 0.0,
    k: int | None = None,
    p: float | None = None,
    downlink: Literal["permk", "randk"] = "permk",
    momentum: float = 1.0,
    m: int | None = None,
    batch: int | None = None,
    round_time: float | None = None,
    sigma2_over_eps: float = 0.0,
    generator: torch.Generator | None = None,
) -> Any:
    """The simulated server of ``method`` (``METHODS``); see the module docstring for each one."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if n_workers < 1:
        raise ConfigError(f"n_workers must be >= 1, got {n_workers}")
    if k is not None and not 1 <= k <= dim:
        raise ConfigError(f"k must be in [1, d] = [1, {dim}], got {k}")
    taus = worker_times(n_workers, h, h_power)
    common = dict(kappa=kappa, uplink_cost=uplink_cost, generator=generator)
    k_default = k if k is not None else math.ceil(dim / n_workers)
    if method == "sgd":
        return SGDServer(n_workers, dim, taus, **common)
    if method == "sync_sgd":
        return SyncServer(n_workers, dim, taus, **common)
    if method == "randk_sync":
        return SyncServer(n_workers, dim, taus, k=k_default, **common)
    if method == "rennala":
        b = batch if batch is not None else n_workers
        return RennalaCycle(n_workers, dim, taus, kappa, uplink_cost, b, generator)
    down = dict(p=p, downlink=downlink, down_k=k)
    if method == "marina_p":
        return MarinaPServer(n_workers, dim, taus, **down, **common)
    if method == "m4_inferred":
        return M4Server(n_workers, dim, taus, momentum=momentum, sigma2_over_eps=sigma2_over_eps, m=m, **down,
                        **common)
    return InkheartServer(n_workers, dim, taus, sigma2_over_eps=sigma2_over_eps, round_time=round_time, **down,
                          **common)


class CompressedDistributedSGD(SimulatedServerTask):
    """n simulated workers in the h/kappa time model; one training step = one server round.

    Args:
        method: ``sgd``, ``sync_sgd``, ``rennala``, ``randk_sync``, ``marina_p``, ``m4_inferred``,
            ``inkheart_inferred`` (the last two are reconstructions; see the module docstring).
        n_workers: n.
        h: seconds per stochastic gradient (worker i: h (i + 1)^h_power).
        h_power: 0: every worker takes h; > 0: fixed heterogeneous times.
        kappa: seconds per coordinate per link (links parallel; a broadcast costs kappa d).
        uplink_cost: count the worker -> server time (False: only the downlink costs).
        k: coordinates of randk_sync's Rand-K uplink message and of MARINA-P's Rand-K downlink (``downlink:
            randk``); None: ceil(d / n). (The reconstructions send Perm-K blocks.)
        p: MARINA-P's broadcast probability; None: 1/n.
        downlink: the MARINA-P downlink compressor: ``permk`` (correlated) or ``randk`` (independent).
        momentum: m4_inferred's beta (1: no momentum; the claim sweeps use 1, see the docs page).
        m: m4_inferred's workers awaited per round; None: its time-aware rule.
        batch: Rennala's batch B; None: n.
        round_time: inkheart_inferred's compute time per round; None (with k None): its equilibrium rule.
        lr: the step size gamma.
        epsilon: the target |grad f(x)|^2 <= epsilon, read by ``callbacks.simulated_clock.SimulatedClock``.
        divergence_bound: stop (``train/diverged`` = 1) once |x|_inf exceeds this times (1 + |x0|_inf).
        seed: seed of the gradient noise and of the method's randomness (streams 2 seed and 2 seed + 1);
            None: the run's ``seed_everything``.
    """

    paper_id = "004-18"

    def __init__(
        self,
        method: Method = "marina_p",
        n_workers: int = 16,
        h: float = 1.0,
        h_power: float = 0.0,
        kappa: float = 0.1,
        uplink_cost: bool = False,
        k: int | None = None,
        p: float | None = None,
        downlink: Literal["permk", "randk"] = "permk",
        momentum: float = 1.0,
        m: int | None = None,
        batch: int | None = None,
        round_time: float | None = None,
        lr: float = 1.0,
        epsilon: float = 0.01,
        divergence_bound: float = 1e6,
        seed: int | None = None,
    ) -> None:
        super().__init__(lr, epsilon, divergence_bound, seed)
        if n_workers < 1:
            raise ConfigError(f"n_workers must be >= 1, got {n_workers}")
        worker_times(n_workers, h, h_power)
        if not (kappa >= 0 and math.isfinite(kappa)):
            raise ConfigError(f"kappa (seconds per coordinate) must be >= 0, got {kappa}")
        if k is not None and k < 1:
            raise ConfigError(f"k must be in [1, d], got {k}")
        self.method, self.n_workers = method, n_workers
        self.server_args = dict(h=h, kappa=kappa, uplink_cost=uplink_cost, h_power=h_power, k=k, p=p,
                                downlink=downlink, momentum=momentum, m=m, batch=batch, round_time=round_time)
        self.method_gen = torch.Generator().manual_seed(2 * self.seed + 1)

    # --- the server, once the problem is known --------------------------------------------------------------
    def on_problem(self) -> None:
        sigma2 = self.problem.sigma2 if self.problem.sigma2 is not None else 0.0
        self.server = build_server(self.method, self.n_workers, self.problem.dim, generator=self.method_gen,
                                   sigma2_over_eps=sigma2 / self.epsilon, **self.server_args)

    @property
    def grad_fn(self) -> Callable[[Tensor, list[int]], Tensor]:
        return self.grads

    def grads(self, points: Tensor, workers: list[int]) -> Tensor:
        """Stochastic gradients of ``workers`` at their rows of ``points`` (n, d)."""
        problem = self.problem
        if hasattr(problem, "worker_grads"):  # quadratics: every worker at once
            exact = problem.worker_grads(points)[workers]
            return exact + problem.noise(tuple(exact.shape), self.noise_gen)
        return torch.stack([problem.stochastic_grad(points[i], i, self.noise_gen) for i in workers])

    def clock_extras(self) -> dict[str, float]:
        stats = self.server.stats
        return {"coords_up": float(stats.coords_up), "coords_down": float(stats.coords_down)}

    def epoch_extras(self) -> dict[str, float]:
        out = self.clock_extras()
        L, f_star = self.problem.L, self.problem.f_star
        if L is not None and f_star is not None:  # the barrier's d-term kappa d L Delta / epsilon
            delta = self.problem.loss(self.problem.x0()) - f_star
            out["kappa_d_term"] = self.server_args["kappa"] * self.problem.dim * L * delta / self.epsilon
        for name in ("m", "k", "t", "broadcasts"):
            if hasattr(self.server, name) and isinstance(getattr(self.server, name), (int, float)):
                out[f"server_{name}"] = float(getattr(self.server, name))
        return out


class CompressedDDPClassifier(SupervisedTask):
    """The real path: a classifier trained with data-parallel SGD under ``CompressedDDPStrategy`` (each rank a
    worker; gradient buckets compressed before the all-reduce). Arguments as ``SupervisedTask``; SGD by default."""

    paper_id = "004-18"
    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(
        self,
        net: NetFactory = lambda shape, n: MLP(shape, n, hidden=[64], activation="relu"),
        loss: Literal["ce", "mse"] = "ce",
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 10,
        optimizer: OptimizerCallable = lambda p: torch.optim.SGD(p, lr=0.1),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, loss, input_shape, num_classes, optimizer, lr_scheduler)
