"""FunctionPreservationCheck (paper 004-03): do the learned weight transforms leave the network's function alone?

A transform of the weights that aligns two networks (a rotation of the residual stream, permutations of heads
and units, head-internal maps) must be exactly function-preserving once its relaxed permutations are
hardened: ``max |f_T(theta)(x) - f_theta(x)|`` over the logits of a fixed batch (the first validation batch,
else the batch being trained on) is rounding error. This logs it as ``diag/function_preservation/max_abs_diff``
and ``passed`` (1 when it is below ``tolerance``); under DDP the maximum over ranks.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules import protocols


class FunctionPreservationCheck(Diagnostic):
    """Max logit difference between the transformed and the original networks on a fixed batch.

    Args:
        schedule: when to measure (default: at fit start and after every validation).
        tolerance: the largest difference that passes (the paper's check: 1e-4).
        max_rows: rows of the batch used.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "function_preservation"
    requires = (protocols.FunctionPreservation,)

    def __init__(
        self,
        schedule: Schedule = Schedule(at_fit_start=True, at_validation=True),
        tolerance: float = 1e-4,
        max_rows: int = 16,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = False,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if not tolerance > 0 or max_rows < 1:
            raise ConfigError(f"tolerance must be > 0 and max_rows >= 1, got {tolerance}, {max_rows}")
        self.tolerance = tolerance
        self.max_rows = max_rows

    def _eval_batch(self, trainer: L.Trainer, moment: Moment) -> Any:
        batch = self.fixed_batch(trainer, moment)
        if batch is None:
            return None
        return tuple(t[: self.max_rows] if isinstance(t, torch.Tensor) else t for t in batch)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = self._eval_batch(trainer, moment)
        if batch is None:
            return None
        batch = tuple(t.to(pl_module.device) if isinstance(t, torch.Tensor) else t for t in batch)
        was_training = pl_module.training
        pl_module.eval()
        try:
            diff = float(pl_module.function_preservation(batch))
        finally:
            pl_module.train(was_training)
        return {"max_abs_diff": diff}

    def reduction(self, key: str) -> str:
        return "max"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        diff = float(stats["max_abs_diff"])
        return {"max_abs_diff": diff, "passed": float(diff < self.tolerance)}


__all__ = ["FunctionPreservationCheck"]
