"""The error predictors of paper 000-13 as functions: the contraction factor, ``predict_errors`` from the fits
of one signal at rising levels, and the scores of local error maps (Spearman's rank correlation, a Gaussian
blur) and RMS errors.

With d_k = RMS(f_k - f_{k+1}) and the contraction ||f_{k+1} - f*|| <= rho ||f_k - f*||, rho < 1:

    ||f_k - f*|| <= d_k / (1 - rho)            (triangle inequality),
    ||f_k - f*|| <= d_k / sqrt(1 - rho^2)      (nested least squares: f_k - f_{k+1} orthogonal to f_{k+1} - f*).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from errors import ConfigError, PaperlabError


class ContractionError(PaperlabError, ValueError):
    """The fits' differences do not contract (estimated rho >= 1): the signal-specific prediction is undefined."""



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


def predict_errors(fits: Sequence[Tensor] | Tensor, rho: float | None = None,
                   orthogonal: bool | Sequence[bool] = False, *, levels: Sequence[int] | None = None) -> dict[str, Any]:
    """Error predictions for the fits f_0 .. f_n of one signal at rising compression levels.

    d_k = RMS(f_k - f_{k+1}), k = 0 .. n - 1. Returns
      ``"bound"`` (n,): d_k / (1 - rho), or d_k / sqrt(1 - rho^2) with ``orthogonal`` (nested least squares);
      ``"local"`` (n, *shape): |f_k - f_{k+1}| times the same factor;
      ``"rho"``: ``rho`` if given, else the median of d_{k+1} / d_k (needs >= 3 fits);
      ``"d"`` (n,) and ``"factor"`` (n,), the factor of each level.
    If ||f_{k+1} - f*|| <= rho ||f_k - f*|| then ||f_k - f*|| <= bound_k.

    Args:
        fits: a sequence of same-shape tensors, or one tensor ``(n + 1, *shape)``.
        rho: the contraction factor in [0, 1) (e.g. calibrated on held-out signals), or None to estimate it.
        orthogonal: use the nested least-squares factor, at every level or per level k (n bools: the level
            pair (k, k + 1) whose finer fit passed a convergence check).
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
    orth = [bool(orthogonal)] * (n_fits - 1) if isinstance(orthogonal, bool) else [bool(o) for o in orthogonal]
    if len(orth) != n_fits - 1:
        raise ConfigError(f"orthogonal needs one flag per level pair ({n_fits - 1}), got {len(orth)}")
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
    factor = torch.tensor([contraction_factor(rho, o) for o in orth], dtype=torch.float64)
    return {
        "bound": (d * factor).to(f.dtype),
        "local": (diff.abs() * factor.view(-1, *([1] * (diff.dim() - 1)))).to(f.dtype),
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
