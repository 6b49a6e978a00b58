"""The benchmark's measures on frozen tokens: ridge probes with a validated penalty, the Wiener-filter baseline,
per-unit PCA of single-neuron tokens, firing statistics and the perturbations of the robustness axis.

Every probe is the same closed-form ridge (``modules.components.neural_metrics.ridge_fit``) on z-scored features,
its penalty chosen from one grid on the last fifth of the training trials and refitted on all of them, so that
tokenizers are compared under equal regularisation (the spec's warning: probes equally regularised). The grid is
scored through one eigendecomposition of the Gram matrix (``W(a) = V (L + a)^-1 V^T X^T Y``, the same solution
as ``ridge_fit`` at each penalty, for the cost of one fit); the chosen penalty is refitted with ``ridge_fit``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.neural_metrics import decoding_r2, ridge_fit, ridge_predict


class RidgeProbe:
    """A ridge probe ``(n_trials, T, F) -> (n_trials, T, D)`` fitted on z-scored features (see the module docstring).

    Args:
        alphas: the penalty grid.
        holdout: the fraction of training trials (the last ones) that chooses the penalty.
    """

    def __init__(self, alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1000.0), holdout: float = 0.2) -> None:
        if not alphas:
            raise ConfigError("the probe needs at least one ridge penalty")
        self.alphas, self.holdout = alphas, holdout
        self.alpha = alphas[0]

    def _fit(self, x: Tensor, y: Tensor, alpha: float) -> None:
        flat = x.reshape(-1, x.shape[-1])
        self.mean = flat.mean(0)
        self.std = flat.std(0).clamp_min(1e-6)  # a constant feature (a padded slot) stays 0 after scaling
        self.weights, self.intercept = ridge_fit((flat - self.mean) / self.std, y.reshape(-1, y.shape[-1]), alpha)

    def fit(self, x: Tensor, y: Tensor) -> RidgeProbe:
        """Choose the penalty on held-back trials, then refit on all of ``x (n, T, F)``, ``y (n, T, D)``."""
        n_val = int(round(self.holdout * x.shape[0]))
        if len(self.alphas) > 1 and 1 <= n_val < x.shape[0] - 1:
            scores = self.grid_scores(x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:])
            self.alpha = self.alphas[max(range(len(scores)), key=scores.__getitem__)]
        self._fit(x, y, self.alpha)
        return self

    def grid_scores(self, x: Tensor, y: Tensor, x_val: Tensor, y_val: Tensor) -> list[float]:
        """``decoding_r2`` on ``(x_val, y_val)`` of the ridge fitted on ``(x, y)`` (z-scored by ``x``) at each
        penalty of the grid."""
        flat, target = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        mean, std = flat.mean(0), flat.std(0).clamp_min(1e-6)
        z = (flat - mean) / std
        z_mean, y_mean = z.mean(0), target.mean(0)
        evals, vecs = torch.linalg.eigh((z - z_mean).T @ (z - z_mean))
        proj = vecs.T @ ((z - z_mean).T @ (target - y_mean))
        z_val = (x_val.reshape(-1, x.shape[-1]) - mean) / std
        scores = []
        for alpha in self.alphas:
            weights = vecs @ (proj / (evals.clamp_min(0) + alpha)[:, None])
            pred = (z_val - z_mean) @ weights + y_mean
            scores.append(float(decoding_r2(pred, y_val.reshape(-1, y.shape[-1]))))
        return scores

    def predict(self, x: Tensor) -> Tensor:
        flat = (x.reshape(-1, x.shape[-1]) - self.mean) / self.std
        return ridge_predict(flat, self.weights, self.intercept).reshape(*x.shape[:-1], -1)


def pca_basis(cov: Tensor, k: int) -> Tensor:
    """The ``k`` leading eigenvectors ``(D, k)`` of a covariance ``(D, D)``, largest first."""
    _, vecs = torch.linalg.eigh(cov)
    return vecs.flip(-1)[:, :k]


def fano_factors(counts: Tensor) -> Tensor:
    """Each unit's variance / mean of its counts over all bins of ``counts (..., U)`` (0 for a silent unit)."""
    flat = counts.reshape(-1, counts.shape[-1])
    mean = flat.mean(0)
    return torch.where(mean > 0, flat.var(0) / mean.clamp_min(1e-12), torch.zeros_like(mean))


def pairwise_correlations(counts: Tensor) -> Tensor:
    """The off-diagonal Pearson correlations of the units of ``counts (..., U)`` over bins (upper triangle)."""
    flat = counts.reshape(-1, counts.shape[-1]).double()
    centred = flat - flat.mean(0)
    std = centred.pow(2).sum(0).sqrt().clamp_min(1e-12)
    corr = (centred.T @ centred) / (std[:, None] * std[None, :])
    rows, cols = torch.triu_indices(corr.shape[0], corr.shape[1], offset=1)
    return corr[rows, cols]


def drop_units(counts: Tensor, mask: Tensor, frac: float, generator: torch.Generator) -> Tensor:
    """``counts (n, T, U)`` with a random ``frac`` of each trial's valid units silenced."""
    drop = (torch.rand(mask.shape, generator=generator) < frac) & mask
    return counts * (~drop)[:, None, :].to(counts.dtype)


def jitter_spikes(counts: Tensor, generator: torch.Generator) -> Tensor:
    """``counts (n, T, U)`` with each (trial, unit)'s train shifted by -1, 0 or +1 bin (edges repeated)."""
    n, t, u = counts.shape
    shift = torch.randint(-1, 2, (n, 1, u), generator=generator)
    idx = (torch.arange(t)[None, :, None] - shift).clamp(0, t - 1)
    return counts.gather(1, idx.expand(n, t, u))


__all__ = ["RidgeProbe", "drop_units", "fano_factors", "jitter_spikes", "pairwise_correlations", "pca_basis"]
