"""Compression-level error prediction (paper 000-13): bound a fit's error without the ground truth, from the
difference between fits at two compression levels.

Setting. A family of signal parameterisations indexed by a compression level k (grid resolution, number of
Fourier features, hash-table size, tensor rank; ``modules.components.signal_fits``), f_k the fit at level
k (to the samples, or a reconstruction from measurements y = A f* in an inverse problem), f* the unknown
signal. Contraction (our reading of the paper's "natural properties"): ||f_{k+1} - f*|| <= rho ||f_k - f*||
with rho < 1. With d_k = ||f_k - f_{k+1}|| (RMS over pixels) the triangle inequality gives

    ||f_k - f*|| <= d_k + ||f_{k+1} - f*|| <= d_k + rho ||f_k - f*||   =>   ||f_k - f*|| <= d_k / (1 - rho),

and when the fits are least squares over nested subspaces (grids r = 2^j + 1, linear Fourier features,
single-channel CP = truncated SVD) f_k - f_{k+1} is orthogonal to f_{k+1} - f*, so
||f_k - f*||^2 = d_k^2 + ||f_{k+1} - f*||^2 <= d_k^2 + rho^2 ||f_k - f*||^2 and
||f_k - f*|| <= d_k / sqrt(1 - rho^2) (equality when the contraction is exactly rho).

Predictors (``predict_errors``): the worst-case bound with rho calibrated on held-out signals (the largest
ratio ||f_{k+1} - f*|| / ||f_k - f*|| seen there), the signal-specific prediction with rho estimated from
the signal's own ladder (the median of d_{k+1} / d_k), and local error maps |f_k - f_{k+1}| times the same
factor.

Modules: ``SignalFit`` (one level) and ``CompressionLadder`` (all levels in one ``fit``, one level per
epoch, each warm-started from the previous one; the test step scores the bound and the predictions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError, PaperlabError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.measurements import Task, make_operator, support_disc
from modules.components.metrics import psnr_from_mse
from modules.components.signal_fits import (
    FAMILIES,
    Family,
    SignalField,
    check_level,
    is_nested_least_squares,
    make_field,
    solve_cp,
    solve_fourier,
    solve_grid,
)

DEFAULT_LEVELS: dict[str, list[int]] = {
    "grid": [5, 9, 17, 33, 65],
    "fourier": [16, 64, 256, 1024, 4096],
    "hash": [6, 8, 10, 12, 14],
    "cp": [2, 4, 8, 16, 32],
}


class ContractionError(PaperlabError, ValueError):
    """The fits' differences do not contract (estimated rho >= 1): the signal-specific prediction is undefined."""


# --- the functional API -----------------------------------------------------------------------------------
def fit_level(signal: Tensor, family: Family, level: int, seed: int = 0, *, steps: int = 1500, lr: float = 1e-2,
              **options: Any) -> Tensor:
    """The fit of ``signal`` ``(H, W)`` or ``(H, W, C)`` at compression ``level`` of ``family`` (minimal
    pixel MSE); the same shape and dtype.

    ``grid`` (r x r nodes per channel, ``F.interpolate(G, (H, W), mode="bilinear", align_corners=True)``),
    linear ``fourier`` and single-channel ``cp`` are solved directly (least squares: the separable solve
    G = A_H^+ F (A_W^+)^T, the truncated Fourier series or ``lstsq`` on Gaussian features, the truncated
    SVD); ``hash``, Fourier with an MLP readout and multi-channel CP by ``steps`` full-batch Adam steps at
    ``lr`` with a cosine decay, from the seeded initialisation. ``options`` go to the family (see
    ``modules.components.signal_fits``), e.g. ``n_levels`` for hash or ``frequencies`` for fourier.
    """
    if not isinstance(signal, Tensor) or signal.dim() not in (2, 3):
        raise ConfigError(f"signal must be a tensor (H, W) or (H, W, C), got "
                          f"{tuple(signal.shape) if isinstance(signal, Tensor) else type(signal).__name__}")
    if not torch.isfinite(signal).all():
        raise ConfigError("signal contains NaN or inf values")
    squeeze = signal.dim() == 2
    x = signal[..., None] if squeeze else signal
    h, w, c = x.shape
    check_level(family, level, h, w)
    dtype = signal.dtype if signal.is_floating_point() else torch.float32
    xf = x.to(dtype)
    if family == "grid":
        out = solve_grid(xf, level)
    elif family == "fourier" and not options.get("hidden"):
        out = solve_fourier(xf, level, options.get("frequencies", "lattice"), options.get("scale", 16.0), seed)
    elif family == "cp" and c == 1:
        out = solve_cp(xf, level)
    else:
        field = make_field(family, level, 1, h, w, c, seed=seed, **options)
        out = train_field(field, xf[None].float(), steps=steps, lr=lr)[0].to(dtype)
    return out[..., 0] if squeeze else out


def train_field(field: SignalField, target: Tensor, steps: int = 1500, lr: float = 1e-2,
                operator: nn.Module | None = None) -> Tensor:
    """Fit ``field`` to ``target (S, H, W, C)`` (through ``operator``: minimise |A f - A f*|^2) by full-batch
    Adam with a cosine decay of the rate to 1 %; return the fit ``(S, H, W, C)`` (no grad)."""
    if steps < 1:
        raise ConfigError(f"steps must be positive, got {steps}")
    op = operator if operator is not None else nn.Identity()
    with torch.no_grad():
        y = op(target)
    opt = torch.optim.Adam(field.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=lr * 0.01)
    for _ in range(steps):
        loss = (op(field()) - y).pow(2).flatten(1).mean(1).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        return field()


def _stack_fits(fits: Sequence[Tensor] | Tensor) -> Tensor:
    if isinstance(fits, Tensor):
        if fits.dim() < 2:
            raise ConfigError(f"fits as one tensor must be (n + 1, *shape), got {tuple(fits.shape)}")
        return fits
    fits = list(fits)
    if not fits or not all(isinstance(f, Tensor) for f in fits):
        raise ConfigError("fits must be a sequence of tensors f_0 .. f_n, one per level")
    shapes = {tuple(f.shape) for f in fits}
    if len(shapes) > 1:
        raise ConfigError(f"all fits must have the same shape (one signal at several levels), got {sorted(shapes)}")
    return torch.stack(fits)


def contraction_factor(rho: float, orthogonal: bool = False) -> float:
    """1 / (1 - rho), or 1 / sqrt(1 - rho^2) for nested least-squares fits."""
    if isinstance(rho, bool) or not isinstance(rho, int | float) or not 0.0 <= rho < 1.0:
        raise ConfigError(f"rho must be a number in [0, 1), got {rho!r}")
    return 1.0 / math.sqrt(1.0 - rho**2) if orthogonal else 1.0 / (1.0 - rho)


def predict_errors(fits: Sequence[Tensor] | Tensor, rho: float | None = None, orthogonal: bool = False, *,
                   levels: Sequence[int] | None = None) -> dict[str, Any]:
    """Error predictions for the fits f_0 .. f_n of one signal at rising compression levels.

    d_k = RMS(f_k - f_{k+1}), k = 0 .. n - 1. Returns
      ``"bound"`` (n,): d_k / (1 - rho), or d_k / sqrt(1 - rho^2) with ``orthogonal`` (nested least squares);
      ``"local"`` (n, *shape): |f_k - f_{k+1}| times the same factor;
      ``"rho"``: ``rho`` if given, else the median of d_{k+1} / d_k (needs >= 3 fits);
      ``"d"`` (n,) and ``"factor"``.
    If ||f_{k+1} - f*|| <= rho ||f_k - f*|| then ||f_k - f*|| <= bound_k.

    Args:
        fits: a sequence of same-shape tensors, or one tensor ``(n + 1, *shape)``.
        rho: the contraction factor in [0, 1) (e.g. calibrated on held-out signals), or None to estimate it.
        orthogonal: use the nested least-squares factor.
        levels: the compression levels of the fits, checked to be strictly rising (optional).
    Raises:
        ConfigError on bad input; ContractionError when the estimated rho is not in [0, 1).
    """
    f = _stack_fits(fits)
    n_fits = f.shape[0]
    if n_fits < 2:
        raise ConfigError(f"need at least 2 fits (got {n_fits}): the prediction is a difference between levels")
    if levels is not None:
        levels = list(levels)
        if len(levels) != n_fits:
            raise ConfigError(f"{len(levels)} levels for {n_fits} fits")
        if any(b <= a for a, b in zip(levels, levels[1:])):
            raise ConfigError(f"levels must be strictly rising (coarse to fine), got {levels}")
    if rho is not None:
        contraction_factor(rho)  # checks rho before anything is computed
    if not torch.isfinite(f).all():
        raise ConfigError("fits contain NaN or inf values")
    f64 = f.double()
    diff = f64[:-1] - f64[1:]
    d = diff.pow(2).flatten(1).mean(1).sqrt()
    if rho is None:
        if n_fits < 3:
            raise ConfigError(f"estimating rho needs at least 3 fits (got {n_fits}); pass rho= (e.g. calibrated "
                              "on held-out signals)")
        ratios = d[1:] / d[:-1]
        rho_hat = float(np.median(ratios.numpy())) if torch.isfinite(ratios).all() else math.nan
        if not 0.0 <= rho_hat < 1.0:
            raise ContractionError(
                f"the differences between levels do not contract (median d_(k+1)/d_k = {rho_hat:.3g}): the "
                "levels are under-fitted, not nested, or past the signal's resolution; pass a calibrated rho"
            )
        rho = rho_hat
    factor = contraction_factor(rho, orthogonal)
    return {
        "bound": (d * factor).to(f.dtype),
        "local": (diff.abs() * factor).to(f.dtype),
        "rho": float(rho),
        "d": d.to(f.dtype),
        "factor": factor,
    }


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman's rank correlation of two same-size tensors (average ranks for ties); 0 for a constant."""
    from scipy.stats import spearmanr

    x, y = a.detach().double().reshape(-1).cpu().numpy(), b.detach().double().reshape(-1).cpu().numpy()
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(spearmanr(x, y).statistic)


def gaussian_blur(img: Tensor, sigma: float) -> Tensor:
    """``img (H, W)`` blurred by a separable Gaussian of std ``sigma`` pixels (reflect padding)."""
    if sigma <= 0:
        return img
    radius = max(1, int(math.ceil(3 * sigma)))
    t = torch.arange(-radius, radius + 1, dtype=img.dtype, device=img.device)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    k = k / k.sum()
    x = nn.functional.pad(img[None, None], (radius, radius, radius, radius), mode="reflect")
    x = nn.functional.conv2d(x, k.view(1, 1, 1, -1))
    return nn.functional.conv2d(x, k.view(1, 1, -1, 1))[0, 0]


def rms(x: Tensor) -> Tensor:
    """Root mean square over all but the first dimension (float64)."""
    return x.double().pow(2).flatten(1).mean(1).sqrt()


# --- Lightning modules --------------------------------------------------------------------------------------
class _SignalTask(PaperTask, abstract=True):
    """What SignalFit and CompressionLadder share: the family's options, the measurement operator, the
    data-fit loss and the per-epoch cosine decay of the rate."""

    def _setup_common(self, family: str, task: str, input_shape: Sequence[int], options: dict[str, Any],
                      mri_fraction: float, ct_angles: int, noise_std: float, lr_schedule: str,
                      lr_scheduler: Any, ct_support: bool = True) -> None:
        if family not in FAMILIES:
            raise ConfigError(f"family must be one of {list(FAMILIES)}, got {family!r}")
        shape = tuple(int(s) for s in input_shape)
        if len(shape) != 4:
            raise ConfigError(f"input_shape must be (S, H, W, C) (signals of a SignalLadderDataModule), got {shape}")
        if noise_std < 0:
            raise ConfigError(f"noise_std must be >= 0, got {noise_std}")
        if lr_schedule == "cosine" and lr_scheduler is not None:
            raise ConfigError("lr_schedule: cosine already decays the rate within each level; set lr_schedule: "
                              "constant to use model.lr_scheduler")
        self.S, self.H, self.W, self.C = shape
        self.family, self.task, self.options = family, task, options
        self.noise_std, self.lr_schedule = noise_std, lr_schedule
        self.operator = make_operator(task, self.H, self.W, mri_fraction, ct_angles, seed=options.get("seed", 0))
        support = support_disc(self.H, self.W) if task == "ct" and ct_support else torch.ones(self.H, self.W)
        self.register_buffer("support", support[None, :, :, None], persistent=False)

    def render(self, field: SignalField) -> Tensor:
        """The field's signal ``(S, H, W, C)``, restricted to the CT field of view (a disc) for ``ct``."""
        return field() * self.support if self.task == "ct" else field()

    def _check_batch(self, batch: Any) -> tuple[Tensor, Tensor]:
        signals, calib = batch[0], batch[1]
        if signals.dim() == 5:  # (1, S, H, W, C) from the loader
            signals, calib = signals[0], calib[0]
        if tuple(signals.shape) != (self.S, self.H, self.W, self.C):
            raise ConfigError(f"the batch holds signals {tuple(signals.shape)} but the model was built for "
                              f"{(self.S, self.H, self.W, self.C)} (model.init_args.input_shape)")
        return signals, calib.bool()

    def measurements(self, signals: Tensor) -> Tensor:
        """y = A f* (+ fixed seeded noise of std ``noise_std`` relative to the RMS of y)."""
        with torch.no_grad():
            y = self.operator(signals)
            if self.noise_std > 0:
                gen = torch.Generator().manual_seed(12345 + int(self.options.get("seed", 0)))
                noise = torch.randn(y.shape, generator=gen).to(y)
                y = y + self.noise_std * rms(y).to(y)[(...,) + (None,) * (y.dim() - 1)] * noise
        return y

    def data_loss(self, fit: Tensor, y: Tensor) -> Tensor:
        """The sum over signals of the mean squared measurement residual |A f - y|^2."""
        return (self.operator(fit) - y).pow(2).flatten(1).mean(1).sum()

    def _apply_lr_schedule(self, batch_idx: int) -> None:
        """``lr_schedule: cosine``: the rate falls from the optimizer's to 1 % of it over every epoch."""
        if self.lr_schedule != "cosine" or self._trainer is None:
            return
        total = max(1, int(self.trainer.num_training_batches))
        scale = 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * min(batch_idx, total - 1) / total))
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                group.setdefault("base_lr", group["lr"])
                group["lr"] = group["base_lr"] * scale


def _options(fourier_frequencies: str, fourier_scale: float, fourier_hidden: Sequence[int], hash_levels: int,
             hash_features: int, hash_base_resolution: int, hash_finest_resolution: int | None, hash_hidden: int,
             init_seed: int, family: str, size: int) -> dict[str, Any]:
    if family == "fourier":
        return {"frequencies": fourier_frequencies, "scale": fourier_scale, "hidden": list(fourier_hidden),
                "seed": init_seed}
    if family == "hash":
        return {"n_levels": hash_levels, "n_features": hash_features, "base_resolution": hash_base_resolution,
                "finest_resolution": hash_finest_resolution if hash_finest_resolution is not None else size,
                "hidden": hash_hidden, "seed": init_seed}
    return {"seed": init_seed}


class SignalFit(_SignalTask):
    """One compression level: fit every signal of the batch by ``family`` at ``level``.

    ``task="fit"`` minimises the pixel MSE |f - f*|^2; ``mri`` and ``ct`` the measurement residual
    |A f - A f*|^2 (masked FFT with ``mri_fraction`` of k-space; ``ct_angles`` parallel-beam projections).
    Logged: ``<stage>/rmse`` and ``<stage>/psnr`` of the fit against the true signals (all signals).

    Args:
        family: ``grid``, ``fourier``, ``hash`` or ``cp``.
        level: the compression level (grid nodes per side r, Fourier frequencies m, log2 hash-table size,
            CP rank R).
        task: ``fit``, ``mri`` or ``ct``.
        input_shape: ``(S, H, W, C)`` of the signal set (linked from the DataModule).
        fourier_frequencies, fourier_scale, fourier_hidden: the Fourier family (lattice or Gaussian
            frequencies; pool scale; MLP readout widths, empty: linear).
        hash_levels, hash_features, hash_base_resolution, hash_finest_resolution (default: the signal
            size), hash_hidden: the hash encoding and decoder.
        init_seed: seed of the initialisation (hash tables, CP factors, Gaussian frequencies).
        mri_fraction, ct_angles, noise_std: the inverse problems (noise relative to the RMS of y).
        ct_support: restrict CT reconstructions to the scanner's field of view (the inscribed disc, where
            every angle sees the object); outside it the grid nodes are barely measured and least squares
            puts arbitrary values there.
        lr_schedule: ``cosine``: the rate decays from the optimizer's to 1 % over each epoch; ``constant``.
        optimizer, lr_scheduler: Adam at 1e-2 by default.
    """

    paper_id = "000-13"
    monitor = "val/rmse"
    monitor_mode = "min"

    def __init__(
        self,
        family: Family = "grid",
        level: int = 17,
        task: Task = "fit",
        input_shape: tuple[int, ...] = (6, 128, 128, 1),
        fourier_frequencies: Literal["lattice", "gaussian"] = "lattice",
        fourier_scale: float = 16.0,
        fourier_hidden: list[int] = [],  # noqa: B006 - jsonargparse reads the default; never mutated
        hash_levels: int = 8,
        hash_features: int = 2,
        hash_base_resolution: int = 4,
        hash_finest_resolution: int | None = None,
        hash_hidden: int = 16,
        init_seed: int = 0,
        mri_fraction: float = 0.25,
        ct_angles: int = 45,
        ct_support: bool = True,
        noise_std: float = 0.0,
        lr_schedule: Literal["cosine", "constant"] = "cosine",
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-2),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"rmse": WeightedMean(), "psnr": WeightedMean()})
        opts = _options(fourier_frequencies, fourier_scale, fourier_hidden, hash_levels, hash_features,
                        hash_base_resolution, hash_finest_resolution, hash_hidden, init_seed, family, input_shape[1])
        self._setup_common(family, task, input_shape, opts, mri_fraction, ct_angles, noise_std, lr_schedule,
                           lr_scheduler, ct_support)
        self.field = make_field(family, level, self.S, self.H, self.W, self.C, **opts)

    def forward(self) -> Tensor:
        return self.render(self.field)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._apply_lr_schedule(batch_idx)

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        signals, _ = self._check_batch(batch)
        fit = self.render(self.field)
        loss = self.data_loss(fit, self.measurements(signals))
        err = rms(fit.detach() - signals)
        psnr = psnr_from_mse(err.square(), min_mse=1e-24).mean()
        return StepOutput(loss, n=1, inputs={"rmse": (err.mean(), 1), "psnr": (psnr, 1)})


SUMMARY_KEYS = ("bound_coverage", "bound_coverage_triangle", "bound_ratio", "tightness", "tightness_calib",
                "spearman_local", "spearman_local_blur", "rho_calib", "rho_self")


class CompressionLadder(_SignalTask):
    """All compression levels of one family in one ``fit``: epoch e fits level e, warm-started from level
    e - 1's fit; the test step scores the error predictions without ground truth.

    The batch (``SignalLadderDataModule``) holds calibration signals (their truth calibrates rho: the
    largest ratio ||f_{k+1} - f*|| / ||f_k - f*|| over their levels, or its ``rho_quantile``) and test
    signals (their truth only scores the predictions). On the test signals:

    - ``bound_coverage``: fraction of (signal, level) pairs with d_k factor(rho_calib) >= ||f_k - f*||
      (``bound_coverage_triangle``: with the triangle factor 1 / (1 - rho) whatever the family);
      ``bound_ratio``: the median bound / true;
    - ``tightness``: the median over pairs of |log(pred / true)| for the signal-specific prediction (rho from
      the signal's own ladder, ``predict_errors(fits)``; a signal whose ladder does not contract counts as
      a miss); ``tightness_calib`` for pred = c d_k with c the median ||f_k - f*|| / d_k of the calibration
      pairs;
    - ``spearman_local``: the mean over pairs of Spearman(|f_k - f_{k+1}|, |f_k - f*|) over pixels
      (``spearman_local_blur``: both maps blurred by a Gaussian of 2 pixels first);
    - ``err_true_<k>``, ``err_bound_<k>``, ``err_pred_<k>``: the mean over test signals per level.

    RMS errors are over pixels (values in [0, 1]). Levels not yet fitted (a shortened run) are left out; a
    ladder needs two fitted levels for the bound and three for the signal-specific prediction.

    Args:
        family, task, input_shape, fourier_*, hash_*, init_seed, mri_fraction, ct_angles, ct_support,
        noise_std, lr_schedule, optimizer, lr_scheduler: see ``SignalFit``.
        levels: strictly rising compression levels (default: the family's five for 128 x 128 signals).
        orthogonal: use the nested least-squares factor 1 / sqrt(1 - rho^2); None: when the family's fits are
            nested least squares in signal space (grid, linear Fourier, single-channel CP, with ``task=fit``).
        rho_quantile: the quantile of the calibration ratios taken as rho (1.0: the largest).
    """

    paper_id = "000-13"
    # The ladder's best state is the complete one: levels_done rises by one per epoch (one level), so the
    # best checkpoint is the last; test --ckpt_path best scores the whole ladder.
    monitor = "val/levels_done"
    monitor_mode = "max"

    def __init__(
        self,
        family: Family = "grid",
        levels: list[int] | None = None,
        task: Task = "fit",
        input_shape: tuple[int, ...] = (6, 128, 128, 1),
        orthogonal: bool | None = None,
        rho_quantile: float = 1.0,
        fourier_frequencies: Literal["lattice", "gaussian"] = "lattice",
        fourier_scale: float = 16.0,
        fourier_hidden: list[int] = [],  # noqa: B006 - jsonargparse reads the default; never mutated
        hash_levels: int = 8,
        hash_features: int = 2,
        hash_base_resolution: int = 4,
        hash_finest_resolution: int | None = None,
        hash_hidden: int = 16,
        init_seed: int = 0,
        mri_fraction: float = 0.25,
        ct_angles: int = 45,
        ct_support: bool = True,
        noise_std: float = 0.0,
        lr_schedule: Literal["cosine", "constant"] = "cosine",
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-2),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        levels = list(DEFAULT_LEVELS.get(family, [])) if levels is None else list(levels)
        if len(levels) < 2:
            raise ConfigError(f"a ladder needs at least 2 levels, got {levels}")
        if any(b <= a for a, b in zip(levels, levels[1:])):
            raise ConfigError(f"levels must be strictly rising (coarse to fine), got {levels}")
        if not 0.0 < rho_quantile <= 1.0:
            raise ConfigError(f"rho_quantile must be in (0, 1], got {rho_quantile}")
        metrics: dict[str, Any] = {name: WeightedMean() for name in ("rmse", "psnr", "levels_done", *SUMMARY_KEYS)}
        for k in range(len(levels)):
            metrics.update({f"err_true_{k}": WeightedMean(), f"err_bound_{k}": WeightedMean(),
                            f"err_pred_{k}": WeightedMean()})
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        opts = _options(fourier_frequencies, fourier_scale, fourier_hidden, hash_levels, hash_features,
                        hash_base_resolution, hash_finest_resolution, hash_hidden, init_seed, family, input_shape[1])
        self._setup_common(family, task, input_shape, opts, mri_fraction, ct_angles, noise_std, lr_schedule,
                           lr_scheduler, ct_support)
        self.levels, self.rho_quantile = levels, rho_quantile
        self.fields = nn.ModuleList([make_field(family, lv, self.S, self.H, self.W, self.C, **opts) for lv in levels])
        self.orthogonal = (task == "fit" and is_nested_least_squares(self.fields[0])) if orthogonal is None else orthogonal
        self.register_buffer("current", torch.tensor(-1))  # the level trained last (-1: none yet)

    # --- training: one level per epoch ----------------------------------------------------------------------
    @property
    def active(self) -> int:
        return min(self.trainer.current_epoch, len(self.levels) - 1)

    @property
    def levels_done(self) -> int:
        """Levels trained so far (the last one possibly for part of its epoch)."""
        return int(self.current) + 1

    def on_fit_start(self) -> None:
        epochs = self.trainer.max_epochs
        if epochs is None or epochs < 0 or epochs > len(self.levels):
            raise ConfigError(f"a ladder trains one level per epoch: set trainer.max_epochs to the number of levels "
                              f"({len(self.levels)}) or fewer, got {epochs}")

    def _activate(self, k: int) -> None:
        """Train level k only; at its first epoch start it from level k - 1's fit."""
        if int(self.current) != k:
            if k > 0:
                self.fields[k].warm_start(self.fields[k - 1])
            self.current.fill_(k)
        for j, f in enumerate(self.fields):
            f.requires_grad_(j == k)

    def on_train_epoch_start(self) -> None:
        self._activate(self.active)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._apply_lr_schedule(batch_idx)

    def fits(self) -> list[Tensor]:
        """The fitted levels' renderings ``[(S, H, W, C)]`` (no grad)."""
        with torch.no_grad():
            return [self.render(f) for f in self.fields[: max(1, self.levels_done)]]

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        signals, calib = self._check_batch(batch)
        if stage == "train":
            return StepOutput(self.data_loss(self.render(self.fields[self.active]), self.measurements(signals)), n=1)
        k = max(0, self.levels_done - 1)
        with torch.no_grad():
            fit = self.render(self.fields[k])
            loss = self.data_loss(fit, self.measurements(signals))
        err = rms(fit - signals)[~calib]
        inputs: dict[str, Any] = {
            "rmse": (err.mean(), 1),
            "psnr": (psnr_from_mse(err.square(), min_mse=1e-24).mean(), 1),
            "levels_done": (torch.tensor(float(self.levels_done), dtype=torch.float64), 1),
        }
        if stage == "test":
            ladder = self.error_ladder((signals, calib))
            for key in SUMMARY_KEYS:
                if key in ladder["summary"]:
                    inputs[key] = (torch.tensor(ladder["summary"][key], dtype=torch.float64), 1)
            for j, row in enumerate(ladder["per_level"]):
                for name in ("true", "bound", "pred"):
                    if math.isfinite(row[name]):
                        inputs[f"err_{name}_{j}"] = (torch.tensor(row[name], dtype=torch.float64), 1)
        return StepOutput(loss, n=1, inputs=inputs)

    # --- the error analysis ---------------------------------------------------------------------------------
    @torch.no_grad()
    def error_ladder(self, batch: Any) -> dict[str, Any]:
        """The ladder's true errors, bounds and predictions on ``batch`` (the ``ProvidesErrorLadder`` protocol).

        Returns ``{"levels", "true" (S, n), "calib" (S,), "d" (S, n - 1), "bound", "pred_self", "pred_calib"
        (S, n - 1), "rho_calib", "summary" {metric: value}, "per_level" [{"true", "bound", "pred"}],
        "maps": {"true", "pred"} (n - 1, H, W) of the first test signal}``; NaN where undefined.
        """
        signals, calib = self._check_batch(batch)
        fits = torch.stack(self.fits())  # (n, S, H, W, C)
        n = fits.shape[0]
        true = torch.stack([rms(f - signals) for f in fits], 1)  # (S, n)
        summary: dict[str, float] = {}
        per_level = [{"true": float(true[~calib, k].mean()), "bound": math.nan, "pred": math.nan} for k in range(n)]
        out: dict[str, Any] = {"levels": self.levels[:n], "true": true, "calib": calib, "orthogonal": self.orthogonal,
                               "per_level": per_level, "summary": summary}
        if n < 2:
            return out
        d = torch.stack([rms(fits[k] - fits[k + 1]) for k in range(n - 1)], 1)  # (S, n - 1)
        out["d"] = d
        test = (~calib).nonzero().squeeze(1).tolist()
        e = true[:, : n - 1]
        # rho from the held-out (calibration) signals, whose ground truth is known
        rho_cal = math.nan
        if calib.any():
            ratios = (true[calib, 1:] / true[calib, :-1]).reshape(-1)
            ratios = ratios[torch.isfinite(ratios)]
            if len(ratios):
                rho_cal = float(torch.quantile(ratios, self.rho_quantile))
        out["rho_calib"] = summary["rho_calib"] = rho_cal
        bound = torch.full_like(d, math.nan)
        if 0 <= rho_cal < 1:
            bound = d * contraction_factor(rho_cal, self.orthogonal)
            tri = d * contraction_factor(rho_cal, False)
            summary["bound_coverage"] = float((bound[test] >= e[test]).double().mean())
            summary["bound_coverage_triangle"] = float((tri[test] >= e[test]).double().mean())
            summary["bound_ratio"] = float((bound[test] / e[test]).median())
        out["bound"] = bound
        # signal-specific: rho from each signal's own ladder
        pred = torch.full_like(d, math.nan)
        rho_self = []
        if n >= 3:
            for s in range(self.S):
                try:
                    p = predict_errors(fits[:, s], orthogonal=self.orthogonal)
                except ContractionError:
                    continue
                pred[s] = p["bound"]
                if s in test:
                    rho_self.append(p["rho"])
            logr = (pred[test] / e[test]).log().abs()
            logr = torch.where(torch.isnan(logr), torch.full_like(logr, math.inf), logr)  # undefined = a miss
            summary["tightness"] = float(logr.reshape(-1).median())
            if rho_self:
                summary["rho_self"] = float(np.median(rho_self))
        out["pred_self"] = pred
        # calibrated constant: pred = c d_k, c the median true / d over the calibration pairs
        pred_c = torch.full_like(d, math.nan)
        if calib.any():
            c = (e[calib] / d[calib]).reshape(-1)
            c = c[torch.isfinite(c)]
            if len(c):
                pred_c = d * float(c.median())
                summary["tightness_calib"] = float((pred_c[test] / e[test]).log().abs().reshape(-1).median())
        out["pred_calib"] = pred_c
        # local maps: |f_k - f_{k+1}| against |f_k - f*|, raw and both blurred by a 2-pixel Gaussian
        rhos, rhos_blur = [], []
        for s in test:
            for k in range(n - 1):
                pred_map = (fits[k, s] - fits[k + 1, s]).abs().mean(-1)
                true_map = (fits[k, s] - signals[s]).abs().mean(-1)
                rhos.append(spearman(pred_map, true_map))
                rhos_blur.append(spearman(gaussian_blur(pred_map, 2.0), gaussian_blur(true_map, 2.0)))
        summary["spearman_local"] = float(np.mean(rhos))
        summary["spearman_local_blur"] = float(np.mean(rhos_blur))
        s0 = test[0]
        out["maps"] = {"true": (fits[:-1, s0] - signals[s0]).abs().mean(-1),
                       "pred": (fits[:-1, s0] - fits[1:, s0]).abs().mean(-1)}
        for k in range(n - 1):  # means over the test signals where defined
            per_level[k]["bound"] = float(bound[test, k].nanmean())
            per_level[k]["pred"] = float(pred[test, k].nanmean())
        return out
