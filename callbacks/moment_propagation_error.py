"""MomentPropagationError (paper 002-06): how far a module's propagated Gaussian is from its Monte Carlo law.

On a fixed batch (the first validation batch), asks the module for its output law by each of ``methods`` and by
Monte Carlo (``predictive_moments(batch, "mc")``) and logs, per method, the mean over the batch of
``KL(N_MC || N_method)`` (``diag/moment_propagation_error/kl_<method>``), the relative error of the mean
(``|mu - mu_MC| / |mu_MC|``, ``rel_mean_<method>``) and of the covariance in the Frobenius norm
(``rel_cov_<method>``). Any module with protocol ``PredictiveMoments`` qualifies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import lightning as L
import torch

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules import protocols
from modules.components.gaussian import gaussian_kl


class MomentPropagationError(Diagnostic):
    """KL and relative moment errors of propagated Gaussians against Monte Carlo on a fixed batch.

    Args:
        schedule: when to measure (default: after every validation).
        methods: the module's propagation methods to check.
        max_rows: rows of the batch used (Monte Carlo costs per row).
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "moment_propagation_error"
    requires = (protocols.PredictiveMoments,)

    def __init__(
        self,
        schedule: Schedule = Schedule(at_validation=True),
        methods: Sequence[str] = ("exact", "diag"),
        max_rows: int = 16,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if not methods or "mc" in methods or max_rows < 1:
            raise ConfigError(f"methods must name propagation methods (not 'mc') and max_rows >= 1; got "
                              f"{list(methods)}, {max_rows}")
        self.methods = list(methods)
        self.max_rows = max_rows

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = self.fixed_batch(trainer, moment)
        if batch is None:
            return None
        batch = tuple(t[: self.max_rows].to(pl_module.device) if isinstance(t, torch.Tensor) else t for t in batch)
        with torch.no_grad():
            mc_mean, mc_cov = pl_module.predictive_moments(batch, "mc")
            out: dict[str, Any] = {"rows": float(mc_mean.shape[0])}
            for method in self.methods:
                mean, cov = pl_module.predictive_moments(batch, method)
                out[f"kl_{method}"] = float(gaussian_kl(mc_mean, mc_cov, mean, cov).sum())
                out[f"rel_mean_{method}"] = float(
                    ((mean - mc_mean).norm(dim=-1) / mc_mean.norm(dim=-1).clamp_min(1e-300)).sum())
                out[f"rel_cov_{method}"] = float(
                    ((cov - mc_cov).flatten(1).norm(dim=-1) / mc_cov.flatten(1).norm(dim=-1).clamp_min(1e-300)).sum())
        return out

    def reduction(self, key: str) -> str:
        return "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        rows = float(stats["rows"])
        return {k: float(v) / rows for k, v in stats.items() if k != "rows"}


__all__ = ["MomentPropagationError"]
