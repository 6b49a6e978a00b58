"""``Diagnostic``: the base of every diagnostic callback (Cockpit's "quantity": one class per measured thing).

A subclass declares a ``name`` (its metrics are ``diag/<name>/<key>``) and the capabilities it needs
(``requires``, protocols from ``modules.protocols``), and implements ``measure``: the local statistics of
one measurement. The base does everything else, the same way for every diagnostic:

- when: one ``Schedule`` (at fit start, every N optimiser steps, every N epochs, log-spaced steps, at every
  validation). A step-``s`` measurement sees the model after ``s`` optimiser steps: right after step ``s``
  (``moment = "after_step"``, the default) or right before step ``s + 1`` with the batch that step trains
  on (``moment = "before_step"``, for gradients). The fit-start measurement is step 0 of a fresh run, taken
  before the first optimiser step with the first batch;
- DDP: ``reduction(key)`` says how a statistic combines across ranks (``"sum"`` for additive statistics,
  ``"max"``, ``"min"``, or None when every rank holds the same value); the base reduces, then
  ``finalize`` turns the global statistics into the logged values;
- emit: one path, rank 0, to every logger (``diag/<name>/<key>`` at the global step) and to
  ``trainer.callback_metrics`` (so a checkpoint or early stop can monitor a diagnostic);
- history: the last ``max_history`` measurements, for figures; ``figure()`` draws them and ``table()`` lists
  rows, both emitted at fit end by the base through ``tracking/`` (``figures/<name>.png``,
  ``tables/<name>.csv``): a diagnostic never looks at loggers;
- state: history and ``extra_state()`` go into checkpoints under a ``state_key`` that includes the
  diagnostic's arguments, so two instances of one diagnostic never overwrite each other's state;
- capabilities: checked at ``setup``; a module without them fails with one line naming the method to
  implement, or, with ``if_unsupported: skip`` (the presets in ``configs/diagnostics/``), the diagnostic
  says so once and stays out of the way.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from errors import ConfigError
from modules.protocols import method_of
from tracking.figures import log_figure
from tracking.tables import log_table

Reduction = Literal["sum", "max", "min"]
MomentKind = Literal["fit_start", "step", "epoch", "validation"]


@dataclass(frozen=True)
class Schedule:
    """When a diagnostic measures.

    Args:
        at_fit_start: measure the initial model (step 0 of a fresh run; a resumed run does not re-measure it).
        every_n_steps: measure after every n-th optimiser step (0: never).
        every_n_epochs: measure after every n-th training epoch (0: never).
        log_spaced: measure at about this many log-spaced steps per decade (1, 2, ..., 10, 13, 16, 20, ...
            for 10; 0: never), to resolve the first steps without paying for the later ones.
        at_validation: measure at the end of every validation run (the sanity check included).
    """

    at_fit_start: bool = True
    every_n_steps: int = 0
    every_n_epochs: int = 0
    log_spaced: int = 0
    at_validation: bool = False

    def __post_init__(self) -> None:
        for name in ("every_n_steps", "every_n_epochs", "log_spaced"):
            if getattr(self, name) < 0:
                raise ConfigError(f"Schedule.{name} must be >= 0, got {getattr(self, name)}")

    def due_step(self, step: int) -> bool:
        """Whether the model after ``step >= 1`` optimiser steps is measured (step 0 is ``at_fit_start``)."""
        if step < 1:
            return False
        if self.every_n_steps and step % self.every_n_steps == 0:
            return True
        if self.log_spaced:
            k = round(self.log_spaced * math.log10(step))
            return any(round(10 ** (j / self.log_spaced)) == step for j in (k - 1, k, k + 1))
        return False

    @property
    def ever(self) -> bool:
        """Whether this schedule measures at all."""
        return self.at_fit_start or self.at_validation or bool(self.every_n_steps or self.every_n_epochs or self.log_spaced)

    def due_epoch(self, epochs_done: int) -> bool:
        return bool(self.every_n_epochs) and epochs_done >= 1 and epochs_done % self.every_n_epochs == 0

    def steps(self, last: int) -> list[int]:
        """Every measured step in ``0..last``."""
        return [s for s in range(last + 1) if (s == 0 and self.at_fit_start) or self.due_step(s)]


@dataclass
class Moment:
    """The occasion of one measurement."""

    kind: MomentKind
    step: int
    epoch: int
    batch: Any = field(default=None, repr=False)


class Diagnostic(Callback):
    """Base of every diagnostic (see the module docstring).

    Args:
        schedule: when to measure.
        if_unsupported: ``error`` (default) when the model lacks what the diagnostic needs, or ``skip``:
            say so once and do nothing (for presets stacked on any experiment).
        plot: log the diagnostic's figure at the end of fit (None: the class's ``default_plot``).
        max_history: measurements kept for the figure (and in checkpoints).
    """

    #: metrics are logged as ``diag/<name>/<key>``
    name: ClassVar[str]
    #: protocols (``modules.protocols``) the module must implement
    requires: ClassVar[tuple[type, ...]] = ()
    #: measure right after optimiser step s, or right before step s + 1 with its batch
    moment: ClassVar[Literal["after_step", "before_step"]] = "after_step"
    #: the schedule when ``schedule`` is None: a subclass sets this instead of restating ``__init__``
    default_schedule: ClassVar[Schedule] = Schedule()
    #: whether to log the figure when ``plot`` is None (a subclass without a useful figure sets False)
    default_plot: ClassVar[bool] = True

    def __init__(
        self,
        schedule: Schedule | None = None,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool | None = None,
        max_history: int = 10_000,
    ) -> None:
        super().__init__()
        if max_history < 1:
            raise ConfigError(f"max_history must be positive, got {max_history}")
        self.schedule = schedule if schedule is not None else self.default_schedule
        if not self.schedule.ever:
            raise ConfigError(f"{type(self).__name__} would never measure: its schedule has no occasion {self.schedule}")
        self.if_unsupported = if_unsupported
        self.plot = plot if plot is not None else self.default_plot
        self.max_history = max_history
        self.history: list[dict[str, float]] = []
        self.active = True
        self._state_key: str | None = None
        self._batch: Any = None
        self._fixed_batch: Any = None
        self._last_step = -1

    # --- what a subclass writes ---------------------------------------------------------------------------
    def unsupported_reason(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        """Why this diagnostic cannot measure ``pl_module`` (None: it can). Default: the ``requires`` check."""
        for protocol in self.requires:
            if not isinstance(pl_module, protocol):
                return (
                    f"{type(self).__name__} needs {type(pl_module).__name__}.{method_of(protocol)} "
                    f"({(protocol.__doc__ or '').strip().splitlines()[0]}): implement it in the module"
                )
        return None

    def attach(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Called at fit start, before any measurement: take reference state (initial weights, ...)."""

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        """This rank's statistics at ``moment`` (None: nothing to report)."""
        raise NotImplementedError

    def reduction(self, key: str) -> Reduction | None:
        """How statistic ``key`` combines across DDP ranks (None: every rank holds the same value)."""
        return None

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        """The logged values from the (reduced) statistics. Default: the statistics as floats."""
        return {k: float(v) for k, v in stats.items()}

    def figure(self) -> Any | None:
        """A matplotlib figure of ``self.history`` (None: no figure)."""
        return None

    def table(self) -> list[dict[str, Any]] | None:
        """Rows (one mapping each, the same keys) logged as ``tables/<name>.csv`` at fit end (None: no table)."""
        return None

    def extra_state(self) -> dict[str, Any]:
        """More state for checkpoints (reference weights, ...)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what ``extra_state`` returned."""

    # --- identity and state ---------------------------------------------------------------------------------
    def state_args(self) -> dict[str, Any]:
        """The arguments that identify this instance: every ``__init__`` argument stored under its own name."""
        params = inspect.signature(type(self).__init__).parameters
        # an argument a subclass does not keep under its own name does not identify the instance
        return {k: getattr(self, k) for k in params if k != "self" and hasattr(self, k)}

    @property
    def state_key(self) -> str:
        # read by Lightning on every hook call: built once
        if self._state_key is None:
            self._state_key = self._generate_state_key(**self.state_args())
        return self._state_key

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history), **self.extra_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))[-self.max_history :]
        self.load_extra_state(state_dict)

    # --- measuring and emitting -----------------------------------------------------------------------------
    def run(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, float] | None:
        """Measure, reduce across ranks, finalize, record and emit; return the logged values."""
        stats = self.measure(trainer, pl_module, moment)
        if stats is None:
            return None
        if trainer.world_size > 1:
            stats = self.reduce(trainer, stats)
        values = self.finalize(stats)
        self.record(trainer, values, moment.step)
        return values

    def reduce(self, trainer: L.Trainer, stats: dict[str, Any]) -> dict[str, Any]:
        """One all-reduce per reduction op over all statistics that need one."""
        out = dict(stats)
        device = trainer.strategy.root_device
        by_op: dict[str, list[str]] = {}
        for key in stats:
            op = self.reduction(key)
            if op is not None:
                by_op.setdefault(op, []).append(key)
        for op, keys in by_op.items():
            parts = [torch.as_tensor(stats[k], dtype=torch.float64, device=device) for k in keys]
            flat = trainer.strategy.reduce(torch.cat([p.reshape(-1) for p in parts]), reduce_op=op)
            offset = 0
            for key, part in zip(keys, parts):
                out[key] = flat[offset : offset + part.numel()].reshape(part.shape)
                offset += part.numel()
        return out

    def record(self, trainer: L.Trainer, values: dict[str, float], step: int) -> None:
        """Keep ``values`` in the history and emit them."""
        if self.history and self.history[-1].get("step") == step:
            self.history[-1] = {**self.history[-1], **values}
        else:
            self.history.append({"step": float(step), **values})
            if len(self.history) > self.max_history:
                del self.history[: len(self.history) - self.max_history]
        self.emit(trainer, values, step)

    def emit(self, trainer: L.Trainer, values: dict[str, float], step: int, namespace: str | None = None) -> None:
        """``<namespace><key>`` to every logger (rank 0) and into ``trainer.callback_metrics`` (all ranks).

        ``namespace`` defaults to ``diag/<name>/``; a diagnostic whose values are the run's own results under an
        established name (``SimulatedClock``'s ``train/time_to_target``) gives it, e.g. ``train/``.
        """
        prefix = f"diag/{self.name}/" if namespace is None else namespace
        full = {f"{prefix}{k}": float(v) for k, v in values.items()}
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(full, step=step)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in full.items()})

    def log_figure(self, trainer: L.Trainer, fig: Any, artifact: str) -> bool:
        """Log ``fig`` as ``artifact`` (for example ``figures/<name>.png``) through the one figure helper."""
        return log_figure(trainer, fig, artifact)

    def fixed_batch(self, trainer: L.Trainer, moment: Moment) -> Any:
        """The first validation batch, drawn once and kept, so that every measurement of a run sees the same
        inputs; without a validation loader, the moment's batch (else the last training batch)."""
        if self._fixed_batch is None:
            loaders = getattr(trainer, "val_dataloaders", None)
            try:
                self._fixed_batch = next(iter(loaders)) if loaders is not None else None
            except (TypeError, StopIteration):
                self._fixed_batch = None
        if self._fixed_batch is not None:
            return self._fixed_batch
        return moment.batch if moment.batch is not None else self._batch

    # --- Lightning hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        reason = self.unsupported_reason(trainer, pl_module)
        self.active = reason is None
        if reason is None:
            return
        if self.if_unsupported == "error":
            raise ConfigError(f"{reason} (or set if_unsupported: skip on the diagnostic)")
        rank_zero_info(f"{type(self).__name__} is off for this run: {reason}")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active:
            self.attach(trainer, pl_module)
            self._last_step = -1

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._batch = batch  # the fit-start and before-step measurements see the batch being trained on

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if not self.active:
            return
        s = trainer.global_step
        fresh_start = s == 0 and self.schedule.at_fit_start
        if s == self._last_step or not (fresh_start or (self.moment == "before_step" and self.schedule.due_step(s))):
            return
        self._last_step = s
        kind: MomentKind = "fit_start" if s == 0 else "step"
        self.run(trainer, pl_module, Moment(kind, s, trainer.current_epoch, self._batch))

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.active or self.moment != "after_step":
            return
        s = trainer.global_step
        if s != self._last_step and self.schedule.due_step(s):
            self._last_step = s
            self.run(trainer, pl_module, Moment("step", s, trainer.current_epoch, batch))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active and self.schedule.due_epoch(trainer.current_epoch + 1):
            self.run(trainer, pl_module, Moment("epoch", trainer.global_step, trainer.current_epoch))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active and self.schedule.at_validation:
            self.run(trainer, pl_module, Moment("validation", trainer.global_step, trainer.current_epoch))

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self.active and trainer.is_global_zero and trainer.loggers):
            return
        if self.plot and self.history:
            fig = self.figure()
            if fig is not None:
                self.log_figure(trainer, fig, f"figures/{self.name}.png")
        rows = self.table()
        if rows:
            log_table(trainer, rows, f"tables/{self.name}.csv")

