"""KernelShape (paper 002-02): is a layer's realised memory kernel a power law or an exponential?

For every layer the module reports the log of each channel's memory kernel ``K_c(t)`` at lags ``t``
(``modules.protocols.MemoryKernels``: what the state keeps of an impulse after ``t`` steps of real inputs).
On ``n_points`` log-spaced lags in ``[t_min, t_max]`` this fits, per channel,

- ``log K = a + slope * log t`` (log-log): its slope and R^2 (a power law ``t^(alpha - 1)`` is a straight
  line of slope ``alpha - 1``);
- ``log K = a + b t`` (semilog): its R^2 (an exponential is a straight line);

and logs the medians over channels per layer (``diag/kernel_shape/layer<i>/{loglog_slope, loglog_r2,
semilog_r2}``) and over all channels of all layers (``loglog_slope``, ``loglog_r2``, ``semilog_r2``), the
fraction of channels with log-log R^2 > ``r2_threshold`` (``powerlaw_fraction``) and the decades the
window spans (``decades``). Each rank measures its own batch; the values are logged from rank 0.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.protocols import MemoryKernels
from tracking.figures import new_figure


def fit_lines(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Least-squares lines ``y[c] ~ a + b x`` for every row of ``y (C, P)``: ``(slope (C,), R^2 (C,))`` in
    float64; R^2 is NaN for a row without variance."""
    x = x.double()
    y = y.double()
    xc = x - x.mean()
    yc = y - y.mean(-1, keepdim=True)
    slope = (yc * xc).sum(-1) / (xc * xc).sum()
    ss_res = ((yc - slope[:, None] * xc) ** 2).sum(-1)
    ss_tot = (yc * yc).sum(-1)
    r2 = torch.where(ss_tot > 0, 1.0 - ss_res / ss_tot.clamp_min(1e-300), torch.full_like(ss_tot, float("nan")))
    return slope, r2


def log_spaced_lags(t_min: int, t_max: int, n_points: int) -> Tensor:
    """Distinct integer lags, about ``n_points`` of them log-spaced in ``[t_min, t_max]``."""
    return torch.unique(torch.logspace(math.log10(t_min), math.log10(t_max), n_points).round().long())


def shape_stats(log_kernel: Tensor, lags: Tensor) -> dict[str, Tensor]:
    """Per channel of ``log_kernel (C, T)`` (lags ``1..T``): log-log slope and R^2, semilog R^2 at ``lags``."""
    y = log_kernel[:, lags - 1]
    slope, r2_ll = fit_lines(lags.double().log(), y)
    _, r2_sl = fit_lines(lags.double(), y)
    return {"loglog_slope": slope, "loglog_r2": r2_ll, "semilog_r2": r2_sl}


class KernelShape(Diagnostic):
    """Log-log and semilog straightness of every layer's realised memory kernel (module docstring).

    Args:
        schedule: when to measure (default: at fit start and after every validation).
        t_min, t_max: the fitted lag window (clipped to the batch's sequence length; at least 2 decades
            are needed for the paper's claim).
        n_points: log-spaced lags in the window.
        max_sequences: sequences of the batch the kernels are averaged over.
        r2_threshold: log-log R^2 above which a channel counts as a power law.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "kernel_shape"
    requires = (MemoryKernels,)

    def __init__(
        self,
        schedule: Schedule = Schedule(at_fit_start=True, at_validation=True),
        t_min: int = 4,
        t_max: int = 1024,
        n_points: int = 32,
        max_sequences: int = 8,
        r2_threshold: float = 0.95,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if not 1 <= t_min < t_max:
            raise ConfigError(f"need 1 <= t_min < t_max, got t_min={t_min}, t_max={t_max}")
        if n_points < 3 or max_sequences < 1:
            raise ConfigError(f"n_points must be >= 3 and max_sequences >= 1, got {n_points}, {max_sequences}")
        self.t_min, self.t_max, self.n_points = t_min, t_max, n_points
        self.max_sequences, self.r2_threshold = max_sequences, r2_threshold
        self.curves: dict[str, Any] = {}

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, float] | None:
        batch = moment.batch if moment.batch is not None else self._batch
        if batch is None:
            return None
        batch = [t[: self.max_sequences] for t in batch]
        kernels = pl_module.memory_kernels(batch)
        t_max = min(self.t_max, kernels[0].shape[1])
        if t_max <= self.t_min:
            raise ConfigError(f"KernelShape: sequences of {kernels[0].shape[1] + 1} steps leave no lags in "
                              f"[t_min={self.t_min}, t_max={self.t_max}]; lower t_min")
        lags = log_spaced_lags(self.t_min, t_max, self.n_points)
        out: dict[str, float] = {"decades": math.log10(t_max / self.t_min)}
        pooled: dict[str, list[Tensor]] = {"loglog_slope": [], "loglog_r2": [], "semilog_r2": []}
        curves = []
        for i, lk in enumerate(kernels):
            stats = shape_stats(lk.cpu(), lags)
            for key, v in stats.items():
                out[f"layer{i}/{key}"] = float(v.nanmedian())
                pooled[key].append(v)
            curves.append(lk.cpu().double().median(0).values[lags - 1])
        for key, parts in pooled.items():
            out[key] = float(torch.cat(parts).nanmedian())
        r2 = torch.cat(pooled["loglog_r2"])
        out["powerlaw_fraction"] = float((r2 > self.r2_threshold).double().mean())
        self.curves = {"step": moment.step, "lags": lags.tolist(), "log_kernel": [c.tolist() for c in curves]}
        return out

    def extra_state(self) -> dict[str, Any]:
        return {"curves": self.curves}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.curves = dict(state.get("curves", {}))

    def figure(self) -> Any:
        if not self.curves:
            return None
        return kernel_figure(self.curves)


def kernel_figure(curves: dict[str, Any]) -> Any:
    """Each layer's median-channel kernel on log-log and semilog axes, at the last measurement."""
    lags = torch.tensor(curves["lags"], dtype=torch.float64)
    fig, axes = new_figure(1, 2, figsize=(11, 4))
    for i, lk in enumerate(curves["log_kernel"]):
        y = torch.tensor(lk) / math.log(10)
        for ax in axes:
            ax.plot(lags, y, marker=".", label=f"layer {i}")
    axes[0].set_xscale("log")
    axes[0].set(xlabel="lag t", ylabel="log10 K(t)", title=f"memory kernel, log-log (step {curves['step']})")
    axes[1].set(xlabel="lag t", ylabel="log10 K(t)", title="memory kernel, semilog")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


__all__ = ["KernelShape", "fit_lines", "shape_stats", "log_spaced_lags", "kernel_figure"]
