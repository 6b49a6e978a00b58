"""The simulated clock of distributed training: seconds, coordinates sent, and the time to reach a target.

Simulated distributed methods count time in simulated seconds, not optimiser steps; this diagnostic puts
that axis into MLflow. It reads ``sim_clock()`` (``modules.protocols.SimulatedClockSource``) from the
module, or else from the trainer's strategy (a DDP strategy that simulates who would have answered first),
and logs

- ``diag/sim_clock/<key>`` on its schedule: ``seconds`` and whatever else the source reports
  (``coords_up`` / ``coords_down``: coordinates sent per link worker->server / server->worker so far,
  ``grad_norm_sq``, ...);
- ``train/time_to_target``: the simulated seconds at the first checked step where the source's
  ``target_key`` (default ``grad_norm_sq``) is <= ``target`` (default: the source's own ``target``), and
  ``train/time_to_target_best`` (the project's ``<metric>_best`` convention: the same first hitting time,
  kept across a resume), with ``train/target_reached`` = 1; with ``stop_at_target`` training stops there.
  A run that never reaches the target logs ``train/target_reached`` = 0 and no time: a comparison over runs
  (``python main.py compare --metric train/time_to_target``) then counts only the runs that reached it, and
  its ``n`` column shows how many did. (MLflow stores an infinite value as 1.8e308, which would poison a
  mean, so none is logged.)

The check runs every ``check_every_n_steps`` optimiser steps (1: the hitting time is exact to one server
update). Every rank holds the same clock (the module simulates it, or the strategy draws the same times on
every rank), so nothing is reduced.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.protocols import SimulatedClockSource
from tracking.figures import new_figure


def clock_source(trainer: L.Trainer, pl_module: L.LightningModule) -> SimulatedClockSource | None:
    """The module if it simulates a clock, else the strategy if it does, else None."""
    if isinstance(pl_module, SimulatedClockSource):
        return pl_module
    strategy = getattr(trainer, "strategy", None)
    if isinstance(strategy, SimulatedClockSource):
        return strategy
    return None


class SimulatedClock(Diagnostic):
    """Log the simulated clock and the time to a target (see the module docstring).

    Args:
        schedule: when ``diag/sim_clock/*`` is logged (default: at fit start and every 50 steps).
        target: the threshold on ``target_key`` (epsilon); None: the source's ``target``, or no target.
        target_key: the reported quantity compared with the target (``grad_norm_sq``: |grad f(x)|^2).
        check_every_n_steps: steps between target checks.
        stop_at_target: stop training once the target is reached.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "sim_clock"
    default_schedule = Schedule(every_n_steps=50)

    def __init__(
        self,
        schedule: Schedule | None = None,
        target: float | None = None,
        target_key: str = "grad_norm_sq",
        check_every_n_steps: int = 1,
        stop_at_target: bool = True,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if target is not None and not (target > 0 and math.isfinite(target)):
            raise ConfigError(f"target must be a positive number, got {target}")
        if check_every_n_steps < 1:
            raise ConfigError(f"check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.target = target
        self.target_key = target_key
        self.check_every_n_steps = check_every_n_steps
        self.stop_at_target = stop_at_target
        self.reached_at: float | None = None
        self.reached_step: int | None = None
        self._source: SimulatedClockSource | None = None

    def unsupported_reason(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        self._source = clock_source(trainer, pl_module)
        if self._source is None:
            return (f"SimulatedClock needs {type(pl_module).__name__}.sim_clock() or a strategy with sim_clock() "
                    "(a simulated distributed method or an m-sync / compressed DDP strategy)")
        return None

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        assert self._source is not None
        return {k: float(v) for k, v in self._source.sim_clock().items() if k != "target"}

    def _target(self, state: dict[str, float]) -> float | None:
        if self.target is not None:
            return self.target
        value = state.get("target")
        return float(value) if value is not None else None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not self.active or self._source is None or self.reached_at is not None:
            return
        if trainer.global_step % self.check_every_n_steps:
            return
        state = self._source.sim_clock()
        target = self._target(state)
        value = state.get(self.target_key)
        if target is None or value is None or not float(value) <= target:
            return
        self.reached_at = float(state["seconds"])
        self.reached_step = trainer.global_step
        # the run's result under the names sweeps compare (train/...), not a diag/sim_clock/ measurement
        self.emit(trainer, {"time_to_target": self.reached_at, "time_to_target_best": self.reached_at,
                            "target_reached": 1.0, "steps_to_target": float(self.reached_step)},
                  trainer.global_step, namespace="train/")
        if self.stop_at_target:
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active and self._source is not None and self.reached_at is None:
            if self._target(self._source.sim_clock()) is not None:
                self.emit(trainer, {"target_reached": 0.0}, trainer.global_step, namespace="train/")

    def extra_state(self) -> dict[str, Any]:
        return {"reached_at": self.reached_at, "reached_step": self.reached_step}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.reached_at = state.get("reached_at")
        self.reached_step = state.get("reached_step")

    def figure(self) -> Any | None:
        rows = [h for h in self.history if "seconds" in h]
        if len(rows) < 2:
            return None

        keys = [k for k in ("grad_norm_sq", "loss_gap", "coords_up", "coords_down") if k in rows[0]]
        fig, axes = new_figure(1, max(1, len(keys)), figsize=(4.2 * max(1, len(keys)), 3.2), squeeze=False)
        t = [h["seconds"] for h in rows]
        for ax, key in zip(axes[0], keys or ["seconds"]):
            ax.plot(t, [h.get(key, float("nan")) for h in rows])
            if key in ("grad_norm_sq", "loss_gap"):
                ax.set_yscale("log")
            ax.set_xlabel("simulated seconds")
            ax.set_title(key, fontsize=9)
        if self.reached_at is not None:
            axes[0][0].axvline(self.reached_at, color="k", lw=0.8, ls="--")
        fig.tight_layout()
        return fig
