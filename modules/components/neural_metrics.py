"""Measures of neural-population models shared by the spike-tokenizer benchmark and BeeMO.

- ``bits_per_spike``: the Neural Latents Benchmark's co-smoothing score, the Poisson log-likelihood gain over each
  neuron's mean rate, in bits per observed spike.
- ``decoding_r2``: one R^2 over all bins and dimensions, each dimension centred on its own mean (scikit-learn's
  ``r2_score(..., multioutput="variance_weighted")``).
- ``linear_cka``: linear centred kernel alignment of two representations of the same samples.
- ``ridge_fit`` / ``ridge_predict``: closed-form ridge regression with an unpenalised intercept, the linear probe on
  frozen tokens and the Wiener filter on lagged counts (``lagged_counts``).

All of them work in the inputs' dtype; float64 inputs give float64 results.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from errors import ConfigError


def _check_same_shape(a: Tensor, b: Tensor, names: tuple[str, str]) -> None:
    if a.shape != b.shape:
        raise ConfigError(f"{names[0]} {tuple(a.shape)} and {names[1]} {tuple(b.shape)} must have the same shape")


def _poisson_log_likelihood(rates: Tensor, counts: Tensor) -> Tensor:
    return (counts * torch.log(rates) - rates - torch.lgamma(counts + 1)).sum()


def bits_per_spike(rates: Tensor, counts: Tensor) -> Tensor:
    """``(LL(rates) - LL(null)) / (n_spikes ln 2)``; rates are expected counts per bin, (..., N) like ``counts``.

    The null model predicts each neuron's (last axis) mean count over every other axis, as the NLB does.
    """
    _check_same_shape(rates, counts, ("rates", "counts"))
    if not torch.isfinite(rates).all() or (rates <= 0).any():
        raise ConfigError("rates must be finite and > 0 (expected counts per bin); clamp them, e.g. rates.clamp_min(1e-9)")
    if (counts < 0).any() or not torch.isfinite(counts).all():
        raise ConfigError("counts must be finite and >= 0")
    n_spikes = counts.sum()
    if n_spikes <= 0:
        raise ConfigError("counts hold no spike: bits per spike is undefined")
    flat_counts = counts.reshape(-1, counts.shape[-1])
    null_rates = flat_counts.mean(dim=0).clamp_min(torch.finfo(counts.dtype).tiny).expand_as(flat_counts)
    gain = _poisson_log_likelihood(rates.reshape_as(flat_counts), flat_counts) - _poisson_log_likelihood(
        null_rates, flat_counts)
    return gain / (n_spikes * math.log(2))


def decoding_r2(pred: Tensor, target: Tensor) -> Tensor:
    """``1 - sum (pred - target)^2 / sum (target - mean)^2`` over all bins and dims; per-dim means over (..., D)."""
    _check_same_shape(pred, target, ("pred", "target"))
    flat_target = target.reshape(-1, target.shape[-1])
    if flat_target.shape[0] < 2:
        raise ConfigError("decoding_r2 needs at least 2 samples")
    residual = (pred.reshape_as(flat_target) - flat_target).square().sum()
    total = (flat_target - flat_target.mean(dim=0)).square().sum()
    return 1 - residual / total


def linear_cka(x: Tensor, y: Tensor) -> Tensor:
    """Linear CKA of (n, p) and (n, q): ``||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)``, columns centred."""
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ConfigError(f"linear_cka needs (n, p) and (n, q) with the same n, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[0] < 2:
        raise ConfigError("linear_cka needs at least 2 samples")
    xc = x - x.mean(dim=0)
    yc = y - y.mean(dim=0)
    cross = torch.linalg.matrix_norm(yc.T @ xc).square()
    return cross / (torch.linalg.matrix_norm(xc.T @ xc) * torch.linalg.matrix_norm(yc.T @ yc))


def lagged_counts(counts: Tensor, lags: int) -> Tensor:
    """``(n, T, U * lags)``: at bin t the counts of bins t, t - 1, ..., t - lags + 1 (zeros before a trial's start),
    lag-major: feature ``k * U + u`` is unit u at bin t - k. The Wiener filter's inputs."""
    if lags < 1:
        raise ConfigError(f"the Wiener filter needs lags >= 1, got {lags}")
    return torch.cat([torch.nn.functional.pad(counts, (0, 0, k, 0))[:, : counts.shape[1]] for k in range(lags)], dim=-1)


def ridge_fit(features: Tensor, targets: Tensor, alpha: float = 1.0) -> tuple[Tensor, Tensor]:
    """Ridge weights (p, d) and intercept (d,) minimising ``||X W + b - Y||^2 + alpha ||W||^2`` (b unpenalised)."""
    if features.ndim != 2 or targets.ndim != 2 or features.shape[0] != targets.shape[0]:
        raise ConfigError(
            f"ridge_fit needs features (n, p) and targets (n, d) with the same n, got {tuple(features.shape)} "
            f"and {tuple(targets.shape)}")
    if alpha < 0:
        raise ConfigError(f"ridge alpha must be >= 0, got {alpha}")
    x_mean, y_mean = features.mean(dim=0), targets.mean(dim=0)
    xc, yc = features - x_mean, targets - y_mean
    gram = xc.T @ xc + alpha * torch.eye(features.shape[1], dtype=features.dtype, device=features.device)
    weights = torch.linalg.lstsq(gram, xc.T @ yc).solution
    return weights, y_mean - x_mean @ weights


def ridge_predict(features: Tensor, weights: Tensor, intercept: Tensor) -> Tensor:
    """``features @ weights + intercept``."""
    return features @ weights + intercept
