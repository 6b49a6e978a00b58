"""TimescaleUsage (paper 004-05): which memory timescales does a network of ELM neurons use?

The module reports, on a batch, every memory unit's time constant tau_m and its mean |m| over samples and steps
(``modules.protocols.MemoryUsage``: each ``(N, d_m)``). This logs, per band of tau (one decade each, from the
smallest tau up), the mean |m| of the units in it (``diag/timescale_usage/abs_m_tau<lo>_<hi>``), the |m|-weighted
mean of log10 tau (``weighted_log10_tau``: where the network's memory sits) and the plain mean of log10 tau
(``mean_log10_tau``: moves only when tau is learned). Every measurement sees the first validation batch.
Under DDP the per-band sums are added across ranks (the time constants are the same on every rank), so the
logged means are over all ranks' samples.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
from torch import Tensor

from callbacks.diagnostic import Diagnostic, Moment, Reduction, Schedule
from errors import ConfigError
from modules.protocols import MemoryUsage
from tracking.figures import new_figure


def decade_bands(tau: Tensor) -> list[tuple[float, float]]:
    """Decades ``[10^k, 10^(k+1))`` covering the time constants, from the one holding the smallest tau; the last is
    closed on the right, so that tau_max = 1000 falls in [100, 1000] and not in a band of its own."""
    lo = math.floor(math.log10(float(tau.min())) + 1e-6)  # tolerances: logspace ends a hair off its powers of 10
    hi = max(lo + 1, math.ceil(math.log10(float(tau.max())) - 1e-6))
    return [(10.0**k, 10.0 ** (k + 1)) for k in range(lo, hi)]


def band_label(lo: float, hi: float) -> str:
    return f"tau{lo:g}_{hi:g}"


def usage_sums(tau: Tensor, abs_m: Tensor) -> dict[str, float]:
    """Per decade band the sum of mean |m| and the number of units; the sums of |m| log10 tau and |m|, and of
    log10 tau (float64)."""
    tau, abs_m = tau.double().flatten(), abs_m.double().flatten()
    out: dict[str, float] = {}
    bands = decade_bands(tau)
    for j, (lo, hi) in enumerate(bands):
        # the outer bands take what rounding leaves a hair outside them
        inside = ((tau >= lo) | (j == 0)) & ((tau < hi) | (j == len(bands) - 1))
        out[f"sum_{band_label(lo, hi)}"] = float(abs_m[inside].sum())
        out[f"n_{band_label(lo, hi)}"] = float(inside.sum())
    log_tau = tau.log10()
    out["sum_m_log_tau"] = float((abs_m * log_tau).sum())
    out["sum_m"] = float(abs_m.sum())
    out["sum_log_tau"] = float(log_tau.sum())
    out["n_units"] = float(tau.numel())
    return out


class TimescaleUsage(Diagnostic):
    """Mean |m| per decade of tau_m and the |m|-weighted mean log10 tau (module docstring).

    Args:
        schedule: when to measure (default: at fit start and after every validation).
        max_samples: samples of the batch the memories are averaged over.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "timescale_usage"
    requires = (MemoryUsage,)

    def __init__(
        self,
        schedule: Schedule = Schedule(at_fit_start=True, at_validation=True),
        max_samples: int = 64,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if max_samples < 1:
            raise ConfigError(f"max_samples must be >= 1, got {max_samples}")
        self.max_samples = max_samples
        self.last: dict[str, Any] = {}

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, float] | None:
        batch = self.fixed_batch(trainer, moment)
        if batch is None:
            return None
        tau, abs_m = pl_module.memory_usage([t[: self.max_samples] for t in batch])
        self.last = {"step": moment.step, "tau": tau.flatten().tolist(), "abs_m": abs_m.flatten().tolist()}
        return usage_sums(tau.cpu(), abs_m.cpu())

    def reduction(self, key: str) -> Reduction | None:
        return "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, total in stats.items():
            if key.startswith("sum_tau"):
                n = float(stats[f"n_{key[4:]}"])
                out[f"abs_m_{key[4:]}"] = float(total) / n if n else math.nan
        out["weighted_log10_tau"] = float(stats["sum_m_log_tau"]) / max(float(stats["sum_m"]), 1e-300)
        out["mean_log10_tau"] = float(stats["sum_log_tau"]) / float(stats["n_units"])
        return out

    def extra_state(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.last = dict(state.get("last", {}))

    def figure(self) -> Any:
        if not self.last:
            return None

        fig, ax = new_figure(figsize=(6, 4))
        ax.scatter(self.last["tau"], self.last["abs_m"], s=8, alpha=0.6)
        ax.set_xscale("log")
        ax.set(xlabel="tau_m", ylabel="mean |m|", title=f"memory use per timescale (step {self.last['step']})")
        fig.tight_layout()
        return fig
