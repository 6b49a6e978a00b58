"""The h/kappa clock of paper 004-18 and the baselines behind its barrier: single-node SGD, Synchronous SGD (with
an optional Rand-K uplink) and Rennala SGD whose worker cycle includes the transfers.

Every server here is a ``modules.components.worker_sim`` server whose clock advances by compute + kappa (up
+ down) per round (``CommServer.advance``), coordinates counted per link and per direction in its ``stats``.
``scalars()`` names the settings and counts a server reports (``train/server_<name>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.compression import rand_k_rows
from modules.components.compute_time import ComputeTimeModel
from modules.components.worker_sim import RennalaServer, SimulatedServer

#: stochastic gradients of some workers at their own points: ``grads(points (n, d), workers) -> (len(workers), d)``
#: (row j: worker ``workers[j]`` at ``points[workers[j]]``)
BatchGradFn = Callable[[Tensor, list[int]], Tensor]


def worker_times(n: int, h: float, h_power: float = 0.0) -> list[float]:
    """The workers' fixed computation times h_i = h (i + 1)^h_power (h_power = 0: every worker h)."""
    if not (h > 0 and math.isfinite(h)):
        raise ConfigError(f"h (seconds per stochastic gradient) must be a positive number, got {h}")
    return [h * (i + 1) ** h_power for i in range(n)]


def check_kappa(kappa: float) -> None:
    """kappa, the seconds per coordinate per link, must be a finite number >= 0."""
    if not (kappa >= 0 and math.isfinite(kappa)):
        raise ConfigError(f"kappa (seconds per coordinate) must be >= 0, got {kappa}")


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
        check_kappa(kappa)
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

    def scalars(self) -> dict[str, float]:
        """The server's own settings and counts worth a metric (``train/server_<name>``): none here."""
        return {}

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

    def scalars(self) -> dict[str, float]:
        """Rand-K's k (plain Sync SGD reports nothing)."""
        return {} if self.k is None else {"k": float(self.k)}


class RennalaCycle:
    """Rennala SGD (``worker_sim.RennalaServer``) whose worker cycle includes the two transfers: receive x
    (kappa d), compute h_i, send the gradient (kappa d, if counted)."""

    def __init__(self, n_workers: int, dim: int, taus: list[float], kappa: float, uplink_cost: bool,
                 batch: int, generator: torch.Generator | None) -> None:
        check_kappa(kappa)
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

    def scalars(self) -> dict[str, float]:
        """See ``CommServer.scalars``: none."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


#: what ``build_server`` returns
Server = CommServer | RennalaCycle
