"""``CompressedDistributedSGD``: n simulated workers of paper 004-18 in the h/kappa time model, one Lightning training
step per server round (the servers: ``modules.inkheart_sgd.build``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.simulated_task import SimulatedServerTask
from modules.inkheart_sgd.build import Method, build_server
from modules.inkheart_sgd.servers import check_kappa, worker_times


@runtime_checkable
class ProvidesWorkerGrads(Protocol):
    """Problems whose workers' exact gradients come in one call (``datamodules.dist_problems.QuadraticProblem``):
    grad f_i(x_i) for the listed workers, one row of ``xs`` each, and the additive gradient noise of a given shape."""

    def worker_grads(self, xs: Tensor, workers: list[int] | None = None) -> Tensor: ...

    def noise(self, shape: tuple[int, ...], generator: torch.Generator) -> Tensor: ...


class CompressedDistributedSGD(SimulatedServerTask):
    """n simulated workers in the h/kappa time model; one training step = one server round.

    Args:
        method: ``sgd``, ``sync_sgd``, ``rennala``, ``randk_sync``, ``marina_p``, ``m4_inferred``,
            ``inkheart_inferred`` (the last two are reconstructions; see the package docstring,
            ``modules.inkheart_sgd``).
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
    vectorizable = False  # --run.seeds: it optimises manually (automatic_optimization = False)

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
        check_kappa(kappa)
        if k is not None and k < 1:
            raise ConfigError(f"k must be in [1, d], got {k}")
        self.method, self.n_workers = method, n_workers
        self.server_args = dict(h=h, kappa=kappa, uplink_cost=uplink_cost, h_power=h_power, k=k, p=p,
                                downlink=downlink, momentum=momentum, m=m, batch=batch, round_time=round_time)
        self.batched_grads = False  # set with the problem: whether it gives every worker's gradient at once

    # --- the server, once the problem is known --------------------------------------------------------------
    def on_problem(self) -> None:
        self.batched_grads = isinstance(self.problem, ProvidesWorkerGrads)
        sigma2 = self.problem.sigma2 if self.problem.sigma2 is not None else 0.0
        self.server = build_server(self.method, self.n_workers, self.problem.dim, generator=self.method_gen,
                                   sigma2_over_eps=sigma2 / self.epsilon, **self.server_args)

    @property
    def grad_fn(self) -> Callable[[Tensor, list[int]], Tensor]:
        return self.grads

    def grads(self, points: Tensor, workers: list[int]) -> Tensor:
        """Stochastic gradients of ``workers`` at their rows of ``points`` (n, d)."""
        problem = self.problem
        if self.batched_grads:  # quadratics: every worker at once
            exact = problem.worker_grads(points[workers], workers)
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
        out.update({f"server_{name}": value for name, value in self.server.scalars().items()})
        return out

