"""The Lightning tasks of compression-level error prediction (paper 000-13): ``SignalFit`` (one level) and
``CompressionLadder`` (all levels in one ``fit``, one level per epoch, each warm-started from the previous
one; the test step scores the bound and the predictions through ``score_ladder``), over ``_SignalTask``
(what both share: the family's options, the measurement operator y = A f*, the data-fit loss
|A f - y|^2 and the per-epoch cosine decay of the rate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.metrics import psnr_from_mse
from modules.compression_error.analysis import SUMMARY_KEYS, score_ladder
from modules.compression_error.functional import rms
from modules.compression_error.measurements import Task, make_operator, support_disc
from modules.compression_error.signal_fits import FAMILIES, Family, SignalField, is_nested_least_squares, make_field

DEFAULT_LEVELS: dict[str, list[int]] = {
    "grid": [5, 9, 17, 33, 65],
    "fourier": [16, 64, 256, 1024, 4096],
    "hash": [6, 8, 10, 12, 14],
    "cp": [2, 4, 8, 16, 32],
}


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
        trainer = self.attached_trainer()
        if self.lr_schedule != "cosine" or trainer is None:
            return
        total = max(1, int(trainer.num_training_batches))
        scale = 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * min(batch_idx, total - 1) / total))
        for opt in trainer.optimizers:
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
    vectorizable = False  # --run.seeds: it draws random numbers during training

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
    - ``err_true_<k>``, ``err_bound_<k>``, ``err_pred_<k>``: the mean over test signals per level;
    - ``rel_grad_<k>``: level k's convergence check, the largest over test signals of the relative gradient
      norm |grad L(theta_end)| / |grad L(theta_start)| of the level's training loss with respect to the
      signal's parameters of that level (start: the warm start, before the first step);
      ``orthogonal_<k>``: the share of test signals whose bound at level k used 1 / sqrt(1 - rho^2).

    The tighter factor 1 / sqrt(1 - rho^2) needs f_k - f_{k+1} orthogonal to f_{k+1} - f*, which holds when
    the fits are least squares over nested linear subspaces (grid, linear Fourier, single-channel CP with
    ``task=fit``: a precondition of the family) *and* the finer fit f_{k+1} has reached its optimum. The
    second part is checked per signal and level: with ``orthogonal: null`` the factor is on for the pair
    (k, k + 1) of a signal when level k + 1's relative gradient norm is at most ``converged_tol``. For a
    linear least-squares fit the gradient is A^T (f - f*), so a relative gradient norm g leaves a cross term
    2 <f_k - f_{k+1}, f_{k+1} - f*> of the order of 2 g d_k^2 (up to the conditioning of A): 0.05 keeps it
    near 10 % of d_k^2.
    RMS errors are over pixels (values in [0, 1]). Levels not yet fitted (a shortened run) are left out; a
    ladder needs two fitted levels for the bound and three for the signal-specific prediction.

    Args:
        family, task, input_shape, fourier_*, hash_*, init_seed, mri_fraction, ct_angles, ct_support,
        noise_std, lr_schedule, optimizer, lr_scheduler: see ``SignalFit``.
        levels: strictly rising compression levels (default: the family's five for 128 x 128 signals).
        orthogonal: use the nested least-squares factor 1 / sqrt(1 - rho^2) at every level (True), never
            (False), or None: per signal and level pair, when the family's fits are nested least squares in
            signal space (grid, linear Fourier, single-channel CP, with ``task=fit``) and the finer level's
            fit passed the convergence check (relative gradient norm <= ``converged_tol``).
        converged_tol: the convergence check's threshold on the relative gradient norm.
        rho_quantile: the quantile of the calibration ratios taken as rho (1.0: the largest).
    """

    paper_id = "000-13"
    # The ladder's best state is the complete one: levels_done rises by one per epoch (one level), so the
    # best checkpoint is the last; test --ckpt_path best scores the whole ladder.
    monitor = "val/levels_done"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: it draws random numbers during training

    def __init__(
        self,
        family: Family = "grid",
        levels: list[int] | None = None,
        task: Task = "fit",
        input_shape: tuple[int, ...] = (6, 128, 128, 1),
        orthogonal: bool | None = None,
        converged_tol: float = 0.05,
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
        if not converged_tol > 0:
            raise ConfigError(f"converged_tol must be positive, got {converged_tol}")
        metrics: dict[str, Any] = {name: WeightedMean() for name in ("rmse", "psnr", "levels_done", *SUMMARY_KEYS)}
        for k in range(len(levels)):
            metrics.update({f"err_true_{k}": WeightedMean(), f"err_bound_{k}": WeightedMean(),
                            f"err_pred_{k}": WeightedMean(), f"rel_grad_{k}": WeightedMean(),
                            f"orthogonal_{k}": WeightedMean()})
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        opts = _options(fourier_frequencies, fourier_scale, fourier_hidden, hash_levels, hash_features,
                        hash_base_resolution, hash_finest_resolution, hash_hidden, init_seed, family, input_shape[1])
        self._setup_common(family, task, input_shape, opts, mri_fraction, ct_angles, noise_std, lr_schedule,
                           lr_scheduler, ct_support)
        self.levels, self.rho_quantile = levels, rho_quantile
        self.fields = nn.ModuleList([make_field(family, lv, self.S, self.H, self.W, self.C, **opts) for lv in levels])
        self.orthogonal, self.converged_tol = orthogonal, converged_tol
        self.nested_least_squares = task == "fit" and is_nested_least_squares(self.fields[0])
        self.register_buffer("current", torch.tensor(-1))  # the level trained last (-1: none yet)
        # the convergence check per level and signal, kept in checkpoints: ``test`` reads it from one
        self.register_buffer("rel_grad", torch.full((len(levels), self.S), math.nan, dtype=torch.float64))
        self._grad_start: Tensor | None = None
        self._train_signals: Tensor | None = None

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
        if batch_idx == 0:  # the level's start (its warm start), before its first step
            self._train_signals, _ = self._check_batch(batch)
            self._grad_start = self.grad_norms(self.active, self._train_signals)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # after the level's last step, before any epoch-end hook (the ErrorLadder diagnostic reads the check)
        if batch_idx + 1 == self.trainer.num_training_batches:
            self._finish_check()
        super().on_train_batch_end(outputs, batch, batch_idx)

    def on_train_epoch_end(self) -> None:
        self._finish_check()  # a level stopped early (no last batch): check where it stopped
        super().on_train_epoch_end()

    def _finish_check(self) -> None:
        if self._train_signals is not None and self._grad_start is not None:
            k = self.active
            end = self.grad_norms(k, self._train_signals)
            start = self._grad_start
            # a fit that starts at its optimum (zero gradient) has converged
            self.rel_grad[k] = torch.where(start > 0, end / start.clamp(min=1e-300), torch.zeros_like(end))
            self._grad_start = None

    def grad_norms(self, k: int, signals: Tensor) -> Tensor:
        """``(S,)``: the norm of the gradient of the training loss |A f - y|^2 with respect to each signal's
        parameters of level k (every parameter's first axis is the signal)."""
        params = list(self.fields[k].parameters())
        with torch.enable_grad():
            fit = self.render(self.fields[k])
            loss = self.data_loss(fit, self.measurements(signals))
            grads = torch.autograd.grad(loss, params, allow_unused=True)
        sq = torch.zeros(self.S, dtype=torch.float64, device=signals.device)
        for g in grads:
            if g is not None:
                sq = sq + g.detach().double().pow(2).flatten(1).sum(1)
        return sq.sqrt()

    def orthogonal_flags(self) -> Tensor:
        """``(S, n_levels - 1)`` bool: where the bound at level k uses 1 / sqrt(1 - rho^2) (see the class)."""
        shape = (self.S, len(self.levels) - 1)
        if self.orthogonal is not None:
            return torch.full(shape, bool(self.orthogonal))
        if not self.nested_least_squares:
            return torch.zeros(shape, dtype=torch.bool)
        finer = self.rel_grad[1:].T.cpu()  # (S, n - 1): level k + 1's check; NaN (not trained) fails
        return finer <= self.converged_tol

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
                if math.isfinite(row["orthogonal"]):
                    inputs[f"orthogonal_{j}"] = (torch.tensor(row["orthogonal"], dtype=torch.float64), 1)
                rel = self.rel_grad[j][~calib.to(self.rel_grad.device)]
                if j < self.levels_done and bool(torch.isfinite(rel).all()):
                    inputs[f"rel_grad_{j}"] = (rel.max(), 1)
        return StepOutput(loss, n=1, inputs=inputs)

    # --- the error analysis ---------------------------------------------------------------------------------
    @torch.no_grad()
    def error_ladder(self, batch: Any) -> dict[str, Any]:
        """The ladder's true errors, bounds and predictions on ``batch`` (the ``ProvidesErrorLadder`` protocol):
        ``score_ladder`` of the fitted levels' renderings.

        Returns ``{"levels", "true" (S, n), "calib" (S,), "d" (S, n - 1), "bound", "pred_self", "pred_calib"
        (S, n - 1), "rho_calib", "summary" {metric: value}, "per_level" [{"true", "bound", "pred"}],
        "maps": {"true", "pred"} (n - 1, H, W) of the first test signal}``; NaN where undefined.
        """
        signals, calib = self._check_batch(batch)
        fits = torch.stack(self.fits())  # (n, S, H, W, C)
        out = score_ladder(fits, signals, calib, self.levels, self.orthogonal_flags(), self.rho_quantile)
        out["rel_grad"] = self.rel_grad[: fits.shape[0]].T.cpu()  # (S, n)
        return out
