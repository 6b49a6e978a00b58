"""SpectralEnergy (paper 002-12): does a spherical forecaster keep the energy of every degree and diagonal?

On a fixed held-out batch (the first validation batch) the module gives the spherical-harmonic coefficients of its
one-step forecast and of the true next state (``modules.protocols.SphericalSpectrum``). For a real field the energy
of degree ``l`` is ``E_l = |a_l0|^2 + 2 sum_{m>0} |a_lm|^2`` (Parseval: ``sum_l E_l`` is the field's integral of
``f^2``), and of diagonal ``d = l - m`` the same sum over the coefficients with ``l - m = d``. This logs the ratio
predicted / true energy in three bands of ``l`` (``ratio_l_low`` for ``l < L/4``, ``ratio_l_mid``, ``ratio_l_high``
for ``l >= L/2``) and of ``d`` (``ratio_d_low``, ``ratio_d_mid``, ``ratio_d_high``): a forecast that blurs
small scales has ``ratio_l_high < 1``. The per-degree and per-diagonal spectra of the last measurement go to a
table and a figure. Under DDP each rank sums its shard's energies and the sums are reduced.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.protocols import SphericalSpectrum
from tracking.figures import new_figure

BANDS = ("low", "mid", "high")


def energy_per_degree_and_diagonal(a: Tensor) -> tuple[Tensor, Tensor]:
    """``(E_l (L,), E_d (L,))`` in float64, summed over every leading dimension of coefficients ``a (..., L, L)``
    (entries above the diagonal ignored; orders ``m > 0`` count twice, for ``-m``)."""
    size = a.shape[-1]
    lower = torch.tril(torch.ones(size, size, dtype=torch.float64, device=a.device))
    fold = lower * torch.where(torch.arange(size, device=a.device) == 0, 1.0, 2.0).double()[None, :]
    power = (a.abs().double() ** 2).reshape(-1, size, size).sum(0) * fold  # (l, m)
    per_degree = power.sum(1)
    ell, m = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    diag = (ell - m).clamp_min(0).reshape(-1).to(a.device)
    per_diagonal = torch.zeros(size, dtype=torch.float64, device=a.device).index_add_(0, diag, power.reshape(-1))
    return per_degree, per_diagonal


def band_ratios(pred: Tensor, true: Tensor) -> dict[str, float]:
    """Predicted / true energy in the bands ``[0, L/4)``, ``[L/4, L/2)``, ``[L/2, L)`` of an index."""
    size = pred.shape[0]
    edges = (0, max(1, size // 4), max(2, size // 2), size)
    out = {}
    for name, lo, hi in zip(BANDS, edges[:-1], edges[1:]):
        t = float(true[lo:hi].sum())
        out[name] = float(pred[lo:hi].sum()) / t if t > 0 else float("nan")
    return out


class SpectralEnergy(Diagnostic):
    """Predicted vs true energy per degree ``l`` and per diagonal ``d = l - m`` (module docstring).

    Args:
        schedule: when to measure (default: at fit start and after every validation).
        max_samples: samples of the fixed batch used.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "spectral_energy"
    requires = (SphericalSpectrum,)

    def __init__(self, schedule: Schedule = Schedule(at_fit_start=True, at_validation=True), max_samples: int = 32,
                 if_unsupported: Literal["error", "skip"] = "error", plot: bool = True,
                 max_history: int = 10_000) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if max_samples < 1:
            raise ConfigError(f"max_samples must be positive, got {max_samples}")
        self.max_samples = max_samples
        self.last: dict[str, list[float]] = {}

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        batch = self.fixed_batch(trainer, moment)
        if batch is None:
            return None
        batch = [t[: self.max_samples].to(pl_module.device) for t in batch]
        was_training = pl_module.training
        pl_module.eval()
        try:
            spectra = {src: pl_module.spectrum(batch, source=src) for src in ("prediction", "target")}
        finally:
            pl_module.train(was_training)
        out: dict[str, Any] = {}
        for src, a in spectra.items():
            if not a.is_complex() or a.dim() != 4 or a.shape[-1] != a.shape[-2]:
                raise ConfigError(f"spectrum must return complex (B, C, L, L), got {a.dtype} {tuple(a.shape)}")
            out[f"{src}_l"], out[f"{src}_d"] = (e.cpu() for e in energy_per_degree_and_diagonal(a))
        return out

    def reduction(self, key: str) -> str:
        return "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for axis in ("l", "d"):
            pred, true = (torch.as_tensor(stats[f"{s}_{axis}"]).double() for s in ("prediction", "target"))
            out.update({f"ratio_{axis}_{band}": v for band, v in band_ratios(pred, true).items()})
            self.last[f"prediction_{axis}"], self.last[f"target_{axis}"] = pred.tolist(), true.tolist()
        return out

    def extra_state(self) -> dict[str, Any]:
        return {"last": dict(self.last)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.last = dict(state.get("last", {}))

    def table(self) -> list[dict[str, Any]] | None:
        if not self.last:
            return None
        n = len(self.last["target_l"])
        return [{"index": i, **{key: values[i] for key, values in self.last.items()}} for i in range(n)]

    def figure(self) -> Any:
        if not self.last:
            return None

        fig, axes = new_figure(1, 2, figsize=(10, 3.6))
        for ax, axis, label in zip(axes, ("l", "d"), ("degree l", "diagonal d = l - m")):
            for src, style in (("target", "-"), ("prediction", "--")):
                ax.semilogy(self.last[f"{src}_{axis}"], style, marker=".", label=src)
            ax.set(xlabel=label, ylabel="energy", title=f"energy per {label}")
            ax.legend(fontsize=7)
        fig.tight_layout()
        return fig


__all__ = ["SpectralEnergy", "band_ratios", "energy_per_degree_and_diagonal"]
