"""m-Synchronous SGD (paper 002-11): Synchronous SGD that waits only for the first m of n workers.

Begunov & Tyurin, "Do We Need Asynchronous SGD? On the Near-Optimality of Synchronous Methods" (arXiv
2602.03802). Problem: min f(x), f L-smooth, n workers each computing unbiased stochastic gradients with
variance <= sigma^2 in random time; goal |grad f(x)|^2 <= epsilon in as little wall-clock time as possible.

m-Synchronous SGD, round k: the server broadcasts x_k, the workers compute stochastic gradients at x_k,
and at the m-th arrival the server steps

    x_{k+1} = x_k - gamma (1/m) sum_{i in S_k} g_i(x_k),    S_k = the first m workers to finish,

discarding the other n - m jobs (backup workers); m = n is Synchronous SGD. The paper proves that these
synchronous methods reach the lower bound of asynchronous optimisation (Rennala SGD's T_opt) up to
logarithmic factors under random and partially adversarial computation times. Under fixed times the module
logs both: m-Sync's own time shape tau_(m) (1 + sigma^2 / (m epsilon)) (``train/msync_time_shape``) and the
lower bound's term ((1/m) sum_{i<=m} 1/tau_(i))^(-1) (1 + sigma^2 / (m epsilon)) with its minimum and argmin
over m (``train/rennala_bound_at_m``, ``train/rennala_bound``, ``train/rennala_bound_argmin``).

Two paths:

- ``SimulatedDistributedSGD``: an in-process simulation with real gradients and a simulated clock
  (``modules.components.worker_sim``): methods ``msync``, ``sync`` (m = all available workers),
  ``rennala`` (Rennala SGD with batch B = m) and ``async`` (Asynchronous SGD, delay-adaptive step size);
  one Lightning step = one server update. The problem (a noisy quadratic with known L, sigma, f*, or
  digits split over the workers) comes from ``datamodules.dist_problems.DistProblemDataModule``.
- ``MSyncClassifier`` + ``modules.components.ddp_hooks.MSyncDDPStrategy``: real data-parallel training on
  ``torch.distributed`` in which every rank draws the same n computation times from (seed, step), the
  ranks outside the m fastest send zeros and the all-reduced sum is divided by m. The blocking all-reduce
  reproduces m-Sync SGD's *update*, not its time saving (every rank still waits for the collective).

``from modules.m_sync_sgd import msync_sgd`` is the functional form of the simulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from torch import Tensor

from errors import ConfigError
from modules.components.compute_time import ComputeTimeModel, rennala_lower_bound, rennala_time_shape
from modules.components.simulated_task import SimulatedServerTask
from modules.components.supervised import SupervisedTask
from modules.components.worker_sim import (
    AsyncServer,
    MSyncServer,
    RennalaServer,
    ServerStepCounter,
    SimulatedServer,
    async_sgd,
    msync_sgd,
    rennala_sgd,
)

__all__ = ["MSyncClassifier", "ServerStepCounter", "SimulatedDistributedSGD", "async_sgd", "msync_sgd", "rennala_sgd"]

Method = Literal["msync", "sync", "async", "rennala"]


class SimulatedDistributedSGD(SimulatedServerTask):
    """n simulated workers, real gradients, simulated seconds; one training step = one server update.

    Args:
        n_workers: n.
        m: ``msync``: gradients awaited per round (1 <= m <= n minus the silent workers); ``rennala``: the
            batch size B; ignored by ``sync`` (m = all available workers) and ``async``.
        method: ``msync``, ``sync``, ``rennala`` or ``async`` (see ``modules.components.worker_sim``).
        time_model: the workers' computation times (default Exp(1), i.i.d.).
        cancel_stragglers: m-Sync: cancel the unfinished jobs at the m-th arrival (True: every worker
            restarts on x_{k+1}) or let them finish and drop their stale gradients (False).
        silent_fraction: synchronous methods: share of workers that compute nothing in a round (a fresh
            random set each round; adversarial partial participation, here random).
        lr: the step size gamma (Async: the base of its delay-adaptive rule).
        async_stepsize: ``delay_adaptive`` (gamma_k = gamma min(1, n / delta_k)) or ``constant``.
        epsilon: the target |grad f(x)|^2 <= epsilon, read by ``callbacks.simulated_clock.SimulatedClock``.
        divergence_bound: stop (and log ``train/diverged`` = 1) once |x|_inf exceeds this times (1 + |x0|_inf).
        seed: seed of the computation times and of the gradient noise (two streams: 2 seed + 1 and 2 seed);
            None: the run's ``seed_everything`` (so a sweep's seeds vary the simulation).
    """

    paper_id = "002-11"
    vectorizable = False  # --run.seeds: it optimises manually (automatic_optimization = False)
    summary_metrics = ("train/time_to_target", "train/target_reached", "train/steps_to_target", "train/diverged")

    def __init__(
        self,
        n_workers: int = 32,
        m: int = 8,
        method: Method = "msync",
        time_model: ComputeTimeModel | None = None,
        cancel_stragglers: bool = True,
        silent_fraction: float = 0.0,
        lr: float = 0.5,
        async_stepsize: Literal["constant", "delay_adaptive"] = "delay_adaptive",
        epsilon: float = 0.01,
        divergence_bound: float = 1e6,
        seed: int | None = None,
    ) -> None:
        super().__init__(lr, epsilon, divergence_bound, seed)
        if method in ("async", "rennala") and silent_fraction > 0:
            raise ConfigError(f"silent_fraction applies to the synchronous methods (msync, sync), not {method!r}")
        self.n_workers, self.method = n_workers, method
        self.time_model = time_model if time_model is not None else ComputeTimeModel()
        time_gen = self.method_gen  # seeded 2 seed + 1 at setup
        if method == "msync" or method == "sync":
            silent = round(silent_fraction * n_workers)
            m_eff = max(n_workers - silent, 1) if method == "sync" else m
            self.server: SimulatedServer = MSyncServer(n_workers, m_eff, self.time_model, time_gen,
                                                       cancel_stragglers, silent_fraction)
            self.m = m_eff
        elif method == "rennala":
            self.server = RennalaServer(n_workers, m, self.time_model, time_gen)
            self.m = m
        else:
            self.server = AsyncServer(n_workers, self.time_model, time_gen, async_stepsize)
            self.m = 1
        self.silent_fraction = silent_fraction

    def clock_extras(self) -> dict[str, float]:
        stats = self.server.stats
        return {"grads_used": float(stats.used), "grads_dropped": float(stats.dropped)}

    def _sigma2_over_eps(self) -> float | None:
        if self.method not in ("msync", "sync") or self.problem is None or self.problem.sigma2 is None:
            return None
        return self.problem.sigma2 / self.epsilon

    def msync_time_shape(self) -> float | None:
        """E[tau_(m:n_available)] (1 + sigma^2 / (m epsilon)): m-Sync SGD's own round time times its rounds (per
        L Delta / epsilon) for a homogeneous problem with known sigma^2; None for the others. Not a lower bound:
        see ``rennala_bound``."""
        s = self._sigma2_over_eps()
        if s is None:
            return None
        if self.time_model.kind == "fixed":
            if self.silent_fraction > 0:
                return None  # the available set is random: no closed form
            tau = self.time_model.expected_order_statistic(self.n_workers, self.m)
        else:
            available = self.n_workers - round(self.silent_fraction * self.n_workers)
            tau = self.time_model.expected_order_statistic(available, self.m)
        return tau * (1 + s / self.m)

    def rennala_bound(self) -> dict[str, float]:
        """Under fixed times with every worker available, Rennala SGD's lower bound (per L Delta / epsilon,
        ``modules.components.compute_time.rennala_lower_bound``): its term at this run's m
        (``rennala_bound_at_m``), its minimum over m (``rennala_bound``) and the argmin (``rennala_bound_argmin``);
        empty otherwise (the random-time bounds have other forms)."""
        s = self._sigma2_over_eps()
        if s is None or self.time_model.kind != "fixed" or self.silent_fraction > 0:
            return {}
        taus = list(self.time_model.taus or [])
        value, argmin = rennala_lower_bound(taus, s)
        return {"rennala_bound_at_m": rennala_time_shape(taus, self.m, s), "rennala_bound": value,
                "rennala_bound_argmin": float(argmin)}

    # --- the steps -----------------------------------------------------------------------------------------
    @property
    def grad_fn(self) -> Callable[[Tensor, int], Tensor]:
        return self._grad

    def _grad(self, x: Tensor, worker: int) -> Tensor:
        return self.problem.stochastic_grad(x, worker, self.noise_gen)

    def epoch_extras(self) -> dict[str, float]:
        stats = self.server.stats
        out = {"dropped_share": stats.dropped / max(stats.computed, 1)}
        if stats.updates:
            out["round_time_mean"] = self.server.clock / stats.updates
        shape = self.msync_time_shape()
        if shape is not None and math.isfinite(shape):
            out["msync_time_shape"] = shape
        out.update(self.rennala_bound())
        return out


class MSyncClassifier(SupervisedTask):
    """The real path: a classifier trained with data-parallel SGD under ``MSyncDDPStrategy`` (m-Sync SGD's
    update on ``torch.distributed``; each rank is one worker). Everything is ``SupervisedTask``'s: the network
    and the SGD optimizer come from the config (``configs/m_sync_sgd/ddp_msync.yaml``)."""

    paper_id = "002-11"
    monitor = "val/acc"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet
