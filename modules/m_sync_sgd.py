"""m-Synchronous SGD (paper 002-11): Synchronous SGD that waits only for the first m of n workers.

Begunov & Tyurin, "Do We Need Asynchronous SGD? On the Near-Optimality of Synchronous Methods" (arXiv
2602.03802). Problem: min f(x), f L-smooth, n workers each computing unbiased stochastic gradients with
variance <= sigma^2 in random time; goal |grad f(x)|^2 <= epsilon in as little wall-clock time as possible.

m-Synchronous SGD, round k: the server broadcasts x_k, the workers compute stochastic gradients at x_k,
and at the m-th arrival the server steps

    x_{k+1} = x_k - gamma (1/m) sum_{i in S_k} g_i(x_k),    S_k = the first m workers to finish,

discarding the other n - m jobs (backup workers); m = n is Synchronous SGD. The paper proves that these
synchronous methods reach the lower bound of asynchronous optimisation (Rennala SGD's T_opt) up to
logarithmic factors under random and partially adversarial computation times.

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
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.compute_time import ComputeTimeModel
from modules.components.mlp import MLP
from modules.components.supervised import NetFactory, SupervisedTask
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


class SimulatedDistributedSGD(PaperTask):
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
    monitor = "val/grad_norm_sq"
    monitor_mode = "min"

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
        metrics = {k: WeightedMean() for k in ("grad_norm_sq", "loss_gap", "acc", "sim_seconds")}
        super().__init__(metrics=metrics)
        self.automatic_optimization = False
        if not (lr > 0 and math.isfinite(lr)):
            raise ConfigError(f"lr must be a positive number, got {lr}")
        if not epsilon > 0:
            raise ConfigError(f"epsilon must be > 0, got {epsilon}")
        if method in ("async", "rennala") and silent_fraction > 0:
            raise ConfigError(f"silent_fraction applies to the synchronous methods (msync, sync), not {method!r}")
        self.n_workers, self.method, self.lr, self.epsilon = n_workers, method, lr, epsilon
        self.time_model = time_model if time_model is not None else ComputeTimeModel()
        self.divergence_bound = divergence_bound
        # torch.initial_seed() may be any 64-bit value (no seed_everything): fold it so 2 seed + 1 fits
        self.seed = seed = int(seed) if seed is not None else int(torch.initial_seed()) % 2**62
        time_gen = torch.Generator().manual_seed(seed * 2 + 1)
        self.noise_gen = torch.Generator().manual_seed(seed * 2)
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
        self.problem: Any = None
        self.diverged = False
        self._cache: tuple[int, dict[str, float]] | None = None

    # --- the problem, from the DataModule ------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.problem is not None:
            return
        dm = getattr(self.trainer, "datamodule", None)
        if dm is None or not hasattr(dm, "build_problem"):
            raise ConfigError("SimulatedDistributedSGD needs a problem DataModule: "
                              "data.class_path: datamodules.dist_problems.DistProblemDataModule")
        self.problem = dm.build_problem(self.n_workers)
        x0 = self.problem.x0()
        self.x = nn.Parameter(x0, requires_grad=False)
        self.x0_scale = float(x0.abs().max())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return ServerStepCounter([self.x])

    # --- measurements --------------------------------------------------------------------------------------
    def measures(self) -> dict[str, float]:
        """f(x), |grad f(x)|^2 and f(x) - f* at the current point (cached per step)."""
        step = self.server.stats.updates
        if self._cache is not None and self._cache[0] == step:
            return self._cache[1]
        x = self.x.detach()
        out = {"loss": self.problem.loss(x), "grad_norm_sq": float(self.problem.grad(x).pow(2).sum())}
        if self.problem.f_star is not None:
            out["loss_gap"] = out["loss"] - self.problem.f_star
        self._cache = (step, out)
        return out

    def sim_clock(self) -> dict[str, float]:
        """``callbacks.protocols.SimulatedClockSource``: the simulated seconds and the target's quantities."""
        stats = self.server.stats
        out = {"seconds": self.server.clock, "updates": float(stats.updates), "grads_used": float(stats.used),
               "grads_dropped": float(stats.dropped), "target": self.epsilon}
        if self.problem is not None:
            meas = self.measures()
            out["grad_norm_sq"] = meas["grad_norm_sq"]
            if "loss_gap" in meas:
                out["loss_gap"] = meas["loss_gap"]
        return out

    def theory_time(self) -> float | None:
        """E[tau_(m:n_available)] (1 + sigma^2 / (m epsilon)): the shape of m-Sync SGD's time to epsilon
        (per L Delta / epsilon) for a homogeneous problem with known sigma^2; None for the others."""
        if self.method not in ("msync", "sync") or self.problem is None or self.problem.sigma2 is None:
            return None
        if self.time_model.kind == "fixed":
            if self.silent_fraction > 0:
                return None  # the available set is random: no closed form
            tau = self.time_model.expected_order_statistic(self.n_workers, self.m)
        else:
            available = self.n_workers - round(self.silent_fraction * self.n_workers)
            tau = self.time_model.expected_order_statistic(available, self.m)
        return tau * (1 + self.problem.sigma2 / (self.m * self.epsilon))

    # --- the steps -----------------------------------------------------------------------------------------
    def _grad(self, x: Tensor, worker: int) -> Tensor:
        return self.problem.stochastic_grad(x, worker, self.noise_gen)

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        one = torch.ones((), dtype=torch.float64)
        if stage == "train":
            if not self.diverged:
                x_new, _ = self.server.step(self.x.detach(), self.lr, self._grad)
                bound = self.divergence_bound * (1.0 + self.x0_scale)
                if not bool(torch.isfinite(x_new).all()) or float(x_new.abs().max()) > bound:
                    self.diverged = True
                    self.trainer.should_stop = True
                else:
                    self.x.data.copy_(x_new)
            self.optimizers().step()
            meas = self.measures()
            return StepOutput(torch.tensor(meas["loss"]), n=1, inputs={k: None for k in self.stage_metrics["train_"]})
        meas = self.measures()
        inputs: dict[str, Any] = {
            "grad_norm_sq": (one * meas["grad_norm_sq"], 1),
            "loss_gap": (one * meas["loss_gap"], 1) if "loss_gap" in meas else None,
            "sim_seconds": (one * self.server.clock, 1),
            "acc": None,
        }
        extra = self.problem.evaluate(self.x.detach(), stage)
        if "acc" in extra:
            inputs["acc"] = (one * extra["acc"], 1)
        return StepOutput(torch.tensor(meas["loss"]), n=1, inputs=inputs)

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage != "train":
            return {}
        stats = self.server.stats
        out = {
            "train/sim_seconds": torch.tensor(self.server.clock),
            "train/updates": torch.tensor(float(stats.updates)),
            "train/dropped_share": torch.tensor(stats.dropped / max(stats.computed, 1)),
            "train/diverged": torch.tensor(float(self.diverged)),
        }
        if stats.updates:
            out["train/round_time_mean"] = torch.tensor(self.server.clock / stats.updates)
        theory = self.theory_time()
        if theory is not None and math.isfinite(theory):
            out["train/theory_time"] = torch.tensor(theory)
        return out

    # --- checkpoints keep the simulator ---------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["simulator"] = {"server": self.server.state_dict(), "noise": self.noise_gen.get_state(),
                                   "diverged": self.diverged}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("simulator")
        if state is not None:
            self.server.load_state_dict(state["server"])
            self.noise_gen.set_state(state["noise"])
            self.diverged = bool(state["diverged"])
            self._cache = None


class MSyncClassifier(SupervisedTask):
    """The real path: a classifier trained with data-parallel SGD under ``MSyncDDPStrategy`` (m-Sync SGD's
    update on ``torch.distributed``; each rank is one worker). Arguments as ``SupervisedTask``; SGD by default."""

    paper_id = "002-11"
    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(
        self,
        net: NetFactory = lambda shape, n: MLP(shape, n, hidden=[64, 64], activation="relu"),
        loss: Literal["ce", "mse"] = "ce",
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 10,
        optimizer: OptimizerCallable = lambda p: torch.optim.SGD(p, lr=0.1),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, loss, input_shape, num_classes, optimizer, lr_scheduler)
