"""LipschitzBound (paper 002-05): upper and lower bounds on a feedforward net's l2 Lipschitz constant during
training.

Every scheduled moment it logs ``diag/lipschitz/{flip, eclipse_fast, trivial, lower, seconds}``: the best
one-multiplier-per-layer LipSDP bound (``flip``), ECLipsE-Fast, the product of spectral norms, the largest input
Jacobian norm on a fixed batch (a lower bound; only when the module also offers ``diagnostic_forward``) and the
wall time of ``flip``. The weights are the same on every rank, so nothing is reduced but the lower bound (max).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.components.lipschitz import eclipse_fast_bound, flip_bound, jacobian_lower_bound, trivial_bound
from modules.protocols import AffineLayers, DiagnosticForward


class LipschitzBound(Diagnostic):
    """Lipschitz bounds of the module's ``affine_layers()``.

    Args:
        schedule: when to measure (default: at fit start and every 5 epochs).
        gap_tol: the certified relative gap of the ``flip`` bound on L^2.
        max_rows: rows of the fixed batch used for the lower bound.
        lower_steps: steps of the lower bound's search along top singular vectors.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "lipschitz"
    requires = (AffineLayers,)

    def __init__(
        self,
        schedule: Schedule = Schedule(at_fit_start=True, every_n_epochs=5),
        gap_tol: float = 1e-3,
        max_rows: int = 64,
        lower_steps: int = 3,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if not gap_tol > 0 or max_rows < 1 or lower_steps < 0:
            raise ConfigError(f"need gap_tol > 0, max_rows >= 1, lower_steps >= 0, got {gap_tol}, {max_rows}, {lower_steps}")
        self.gap_tol = gap_tol
        self.max_rows = max_rows
        self.lower_steps = lower_steps

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        ws = [w for w, _ in pl_module.affine_layers()]  # type: ignore[attr-defined]
        flip = flip_bound(ws, gap_tol=self.gap_tol)
        out: dict[str, Any] = {
            "flip": flip.bound,
            "eclipse_fast": eclipse_fast_bound(ws).bound,
            "trivial": trivial_bound(ws),
            "seconds": flip.seconds,
        }
        batch = self.fixed_batch(trainer, moment)
        if isinstance(pl_module, DiagnosticForward) and batch is not None:
            dtype = next(pl_module.parameters()).dtype
            x = batch[0][: self.max_rows].to(pl_module.device, dtype)
            was_training = pl_module.training
            pl_module.eval()
            try:
                # the lower bound differentiates the module's forward on single rows
                fwd = pl_module.diagnostic_forward
                out["lower"] = jacobian_lower_bound(lambda xi: fwd((xi, None)), x, n_steps=self.lower_steps)
            finally:
                pl_module.train(was_training)
        return out

    def reduction(self, key: str) -> str:
        return "max"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        return {k: float(v) for k, v in stats.items()}


__all__ = ["LipschitzBound"]
