"""RolloutPSNR (paper 004-01): does an iterative hypernetwork's rollout behave like optimisation?

After each rollout step k the hypernetwork's weights ``theta_k`` render the image; an optimiser's steps
should not make the fit worse. On a fixed held-out batch (the first validation batch, else the batch being
trained on) this logs the mean per-image PSNR after every step, ``diag/rollout_psnr/k<k>`` (``k0``: the
weights before any step, for models that have them), the gain ``gain = PSNR_K - PSNR_1``, the smallest
step-to-step change over k = 1..K (``min_increment``; negative: some step made the fit worse) and
``monotone`` (1 when PSNR never decreases over k = 1..K). Under DDP each rank measures its shard and the
sums are reduced.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules import protocols
from tracking.figures import new_figure


def rollout_summary(mean_psnr: Tensor) -> dict[str, float]:
    """The logged values from the mean PSNR per step ``(K + 1,)`` (entry 0: step 0, NaN when absent)."""
    out = {f"k{k}": float(v) for k, v in enumerate(mean_psnr.tolist()) if math.isfinite(v)}
    steps = mean_psnr[1:]
    out["gain"] = float(steps[-1] - steps[0])
    inc = steps.diff()
    out["min_increment"] = float(inc.min()) if inc.numel() else 0.0
    out["monotone"] = float(bool((inc >= 0).all()))
    return out


class RolloutPSNR(Diagnostic):
    """Mean PSNR after each rollout step on a fixed batch (module docstring).

    Args:
        schedule: when to measure (default: at fit start and after every validation).
        max_images: images of the batch used.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "rollout_psnr"
    requires = (protocols.HasRolloutPSNR,)

    def __init__(self, schedule: Schedule = Schedule(at_fit_start=True, at_validation=True), max_images: int = 64,
                 if_unsupported: Literal["error", "skip"] = "error", plot: bool = True, max_history: int = 10_000) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if max_images < 1:
            raise ConfigError(f"max_images must be positive, got {max_images}")
        self.max_images = max_images
        self.curves: list[dict[str, Any]] = []

    def _eval_batch(self, trainer: L.Trainer, moment: Moment) -> Any:
        batch = self.fixed_batch(trainer, moment)
        if batch is None:
            return None
        images = batch[0] if isinstance(batch, list | tuple) else batch
        return (images[: self.max_images],)

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = self._eval_batch(trainer, moment)
        if batch is None:
            return None
        batch = (batch[0].to(pl_module.device),)
        was_training = pl_module.training
        pl_module.eval()
        try:
            values = pl_module.rollout_psnr(batch).detach().double()  # (B, K + 1)
        finally:
            pl_module.train(was_training)
        if values.dim() != 2 or values.shape[1] < 2:
            raise ConfigError(f"rollout_psnr must return (B, K + 1) with K >= 1, got {tuple(values.shape)}")
        return {"sum": values.sum(0).cpu(), "n": torch.tensor(float(values.shape[0]))}

    def reduction(self, key: str) -> str:
        return "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        mean = torch.as_tensor(stats["sum"]).double() / float(stats["n"])
        self.curves.append(mean.tolist())
        del self.curves[: max(0, len(self.curves) - self.max_history)]
        return rollout_summary(mean)

    def extra_state(self) -> dict[str, Any]:
        return {"curves": list(self.curves)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.curves = list(state.get("curves", []))

    def figure(self) -> Any:
        if not self.curves:
            return None

        fig, ax = new_figure(figsize=(5, 3.5))
        shown = self.curves[-6:]
        for i, (curve, rec) in enumerate(zip(shown, self.history[-len(shown):])):
            ks = [k for k, v in enumerate(curve) if math.isfinite(v)]
            ax.plot(ks, [curve[k] for k in ks], marker="o", alpha=0.4 + 0.6 * (i + 1) / len(shown),
                    label=f"step {int(rec.get('step', 0))}")
        ax.set(xlabel="rollout step k", ylabel="PSNR (dB)", title="PSNR after each rollout step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


__all__ = ["RolloutPSNR", "rollout_summary"]
