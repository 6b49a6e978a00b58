"""The task base of the simulated distributed-optimisation methods (002-11 m-Sync SGD, 004-18 Inkheart SGD).

A simulated method moves one point ``x`` (a frozen parameter, so checkpoints and DDP see it) with a
simulated server (``modules.components.worker_sim``): one Lightning training step is one server round,
the gradients are real (the problem's), the clock is simulated. What every such method shares lives here:

- the problem from the DataModule (``modules.protocols.ProvidesProblem``: ``build_problem(n_workers)``,
  ``datamodules.dist_problems``), built at ``setup``; ``on_problem`` lets a method build what needs the
  problem (its server);
- the two random streams, seeded at ``setup`` from ``seed`` or the run's seed: ``noise_gen`` (the gradient
  noise, ``2 seed``) and ``method_gen`` (``2 seed + 1``: the method's computation times or its coins);
- the round: ``server.step(x, lr, grad_fn)``, a divergence stop (``train/diverged``), the optimizer that only
  counts server steps (``ServerStepCounter``, so ``max_steps`` counts rounds);
- the measurements f(x), |grad f(x)|^2, f(x) - f* (cached per round), validation/test metrics, the
  ``SimulatedClockSource`` protocol (``callbacks.simulated_clock``) and the epoch metrics;
- the simulator's state in checkpoints (server, noise generator, divergence flag), restored exactly, also
  when ``test --ckpt_path`` loads the checkpoint before ``setup`` has built the server.

A method subclasses it, builds ``self.server`` (in ``__init__`` or ``on_problem``, drawing from ``method_gen``),
gives ``grad_fn`` and adds its own clock and epoch metrics with ``clock_extras`` / ``epoch_extras``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.worker_sim import ServerStepCounter
from modules.protocols import ProvidesProblem

METRICS = ("grad_norm_sq", "loss_gap", "acc", "sim_seconds")


class SimulatedServerTask(PaperTask, abstract=True):
    """Base of a simulated distributed method (module docstring).

    Args:
        lr: the step size gamma.
        epsilon: the target |grad f(x)|^2 <= epsilon, read by ``callbacks.simulated_clock.SimulatedClock``.
        divergence_bound: stop (and log ``train/diverged`` = 1) once |x|_inf exceeds this times (1 + |x0|_inf).
        seed: the simulation's seed; the gradient noise uses ``2 seed`` (``noise_gen``), the method ``2 seed + 1``
            (``method_gen``: its computation times or its own randomness). None: the run's ``seed_everything``.
    """

    monitor = "val/grad_norm_sq"
    monitor_mode = "min"
    #: n, set by the method in ``__init__`` (the problem is built for it)
    n_workers: int

    def __init__(self, lr: float, epsilon: float, divergence_bound: float, seed: int | None) -> None:
        super().__init__(metrics={k: WeightedMean() for k in METRICS})
        self.automatic_optimization = False
        if not (lr > 0 and math.isfinite(lr)):
            raise ConfigError(f"lr must be a positive number, got {lr}")
        if not epsilon > 0:
            raise ConfigError(f"epsilon must be > 0, got {epsilon}")
        self.lr, self.epsilon, self.divergence_bound = lr, epsilon, divergence_bound
        self.seed_arg = seed
        # seeded at setup, once the run's seed is known (the CLI sets run_seed after __init__); a server built in
        # __init__ keeps a reference to method_gen, so reseeding it in place reaches the server too
        self.noise_gen = torch.Generator()
        self.method_gen = torch.Generator()
        self.problem: Any = None
        self.server: Any = None
        self.diverged = False
        self._cache: tuple[int, dict[str, float]] | None = None
        self._pending_simulator: dict[str, Any] | None = None

    @property
    def seed(self) -> int:
        """The simulation's seed: the ``seed`` argument, else the run's seed (read it from ``setup`` on)."""
        return self.seed_or_run(self.seed_arg)

    # --- what a method provides ----------------------------------------------------------------------------
    @property
    def grad_fn(self) -> Callable[..., Tensor]:
        """The stochastic-gradient oracle the server calls (its signature is the server's)."""
        raise NotImplementedError

    def on_problem(self) -> None:
        """Called once the problem is built (``self.problem``), before the point and a pending restore."""

    def clock_extras(self) -> dict[str, float]:
        """Method-specific entries of ``sim_clock``."""
        return {}

    def epoch_extras(self) -> dict[str, float]:
        """Method-specific training epoch metrics (``train/<name>``)."""
        return {}

    # --- the problem, from the DataModule ------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.problem is not None:
            return
        dm = getattr(self.trainer, "datamodule", None)
        if not isinstance(dm, ProvidesProblem):
            raise ConfigError(f"{type(self).__name__} needs a problem DataModule: "
                              "data.class_path: datamodules.dist_problems.DistProblemDataModule")
        self.noise_gen.manual_seed(2 * self.seed)
        self.method_gen.manual_seed(2 * self.seed + 1)
        self.problem = dm.build_problem(self.n_workers)
        self.on_problem()
        x0 = self.problem.x0()
        self.x = nn.Parameter(x0, requires_grad=False)
        self.x0_scale = float(x0.abs().max())
        if self._pending_simulator is not None:
            self._restore(self._pending_simulator)
            self._pending_simulator = None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return ServerStepCounter([self.x])

    # --- measurements --------------------------------------------------------------------------------------
    def measures(self) -> dict[str, float]:
        """f(x), |grad f(x)|^2 and f(x) - f* at the current point (cached per round)."""
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
        """``modules.protocols.SimulatedClockSource``: the simulated seconds and the target's quantities."""
        if self.server is None:
            return {"seconds": 0.0, "target": self.epsilon}
        out = {"seconds": float(self.server.clock), "updates": float(self.server.stats.updates),
               **self.clock_extras(), "target": self.epsilon}
        if self.problem is not None:
            meas = self.measures()
            out["grad_norm_sq"] = meas["grad_norm_sq"]
            if "loss_gap" in meas:
                out["loss_gap"] = meas["loss_gap"]
        return out

    # --- the steps -----------------------------------------------------------------------------------------
    def step(self, batch: Any, stage: Stage) -> StepOutput:
        one = torch.ones((), dtype=torch.float64)
        if stage == "train":
            if not self.diverged:
                x_new, _ = self.server.step(self.x.detach(), self.lr, self.grad_fn)
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
        out = {"sim_seconds": float(self.server.clock), "updates": float(self.server.stats.updates),
               **self.epoch_extras(), "diverged": float(self.diverged)}
        return {f"train/{k}": torch.tensor(v) for k, v in out.items()}

    # --- checkpoints keep the simulator ---------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"simulator": {"server": self.server.state_dict(), "noise": self.noise_gen.get_state(),
                              "diverged": self.diverged}}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        state = state.get("simulator")
        if state is None:
            return
        if self.server is None:  # test --ckpt_path: the problem (and a server built from it) comes at setup
            self._pending_simulator = state
            return
        self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state["server"])
        self.noise_gen.set_state(state["noise"])
        self.diverged = bool(state["diverged"])
        self._cache = None


__all__ = ["SimulatedServerTask"]
