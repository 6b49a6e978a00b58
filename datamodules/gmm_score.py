"""A Gaussian mixture carried by the OU process ``dx = -x dt + sqrt(2) dW``: samples and exact scores (paper 000-02).

``p_0 = sum_k pi_k N(mu_k, sigma_k^2 I)``. The OU transition is ``x_t | x_0 ~ N(e^{-t} x_0, (1 - e^{-2t}) I)``,
so ``p_t = sum_k pi_k N(e^{-t} mu_k, v_k(t) I)`` with ``v_k(t) = sigma_k^2 e^{-2t} + 1 - e^{-2t}``, and

    grad log p_t(x) = sum_k w_k(x, t) (e^{-t} mu_k - x) / v_k(t),   w_k = softmax_k(log pi_k + log N_k(x, t)).

Splits (all generated from ``data_seed``):

- train: ``(x_0, grad log p_0(x_0))``, ``n_samples`` draws of ``p_0`` (the task draws t and the noise);
- val / test: ``(x_0, t, z, x_t, grad log p_t(x_t))`` with ``t ~ U[t_min, t_max]``, ``z ~ N(0, I)`` fixed and
  ``x_t = e^{-t} x_0 + sqrt(1 - e^{-2t}) z``, so every evaluation sees the same points.

Mixture (``mixture_params``): K components with means evenly spaced on ``[-separation, separation]`` (1-D)
or on the circle of radius ``separation`` (2-D), weights proportional to 1, 2, ..., K and standard
deviations from ``0.75 component_std`` to ``1.25 component_std``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from datamodules.base import Split, TensorDataModule
from errors import ConfigError


def mixture_params(dim: int = 1, n_components: int = 3, separation: float = 2.0,
                   component_std: float = 0.4) -> tuple[Tensor, Tensor, Tensor]:
    """``(means (K, d), stds (K,), weights (K,))`` of the default mixture, in float64."""
    if dim not in (1, 2):
        raise ConfigError(f"the mixture is 1-D or 2-D, got dim={dim}")
    if n_components < 1 or not separation >= 0 or not component_std > 0:
        raise ConfigError(f"need n_components >= 1, separation >= 0, component_std > 0; got {n_components}, "
                          f"{separation}, {component_std}")
    k = torch.arange(n_components, dtype=torch.float64)
    if dim == 1:
        means = (torch.linspace(-separation, separation, n_components, dtype=torch.float64) if n_components > 1
                 else torch.zeros(1, dtype=torch.float64))[:, None]
    else:
        angle = 2 * math.pi * k / n_components + math.pi / 2
        means = separation * torch.stack([angle.cos(), angle.sin()], dim=1)
    spread = k / max(n_components - 1, 1)
    stds = component_std * (0.75 + 0.5 * spread)
    weights = (k + 1) / (k + 1).sum()
    return means, stds, weights


def ou_mixture_logpdf(x: Tensor, t: Tensor, means: Tensor, stds: Tensor, weights: Tensor) -> Tensor:
    """``log p_t(x)`` for ``x (N, d)``, ``t (N, 1)`` (``(N,)``); differentiable in x and t."""
    d = x.shape[1]
    decay = torch.exp(-t)  # (N, 1)
    m = decay[:, :, None] * means[None].to(x.dtype)  # (N, K, d)
    v = stds.to(x.dtype).square()[None] * decay.square() + (-torch.expm1(-2.0 * t))  # (N, K)
    sq = (x[:, None, :] - m).square().sum(-1)
    log_n = -0.5 * sq / v - 0.5 * d * torch.log(2 * math.pi * v)
    return torch.logsumexp(torch.log(weights.to(x.dtype))[None] + log_n, dim=1)


def ou_mixture_score(x: Tensor, t: Tensor, means: Tensor, stds: Tensor, weights: Tensor) -> Tensor:
    """``grad_x log p_t(x)`` in closed form, ``(N, d)``; differentiable in x and t."""
    d = x.shape[1]
    decay = torch.exp(-t)
    m = decay[:, :, None] * means[None].to(x.dtype)
    v = stds.to(x.dtype).square()[None] * decay.square() + (-torch.expm1(-2.0 * t))
    diff = m - x[:, None, :]  # (N, K, d)
    log_n = -0.5 * diff.square().sum(-1) / v - 0.5 * d * torch.log(2 * math.pi * v)
    w = torch.softmax(torch.log(weights.to(x.dtype))[None] + log_n, dim=1)  # (N, K)
    return (w[:, :, None] * diff / v[:, :, None]).sum(1)


def sample_mixture(n: int, means: Tensor, stds: Tensor, weights: Tensor, gen: torch.Generator) -> Tensor:
    """``n`` draws of ``p_0`` (float64, ``(n, d)``)."""
    comp = torch.multinomial(weights, n, replacement=True, generator=gen)
    noise = torch.randn(n, means.shape[1], generator=gen, dtype=torch.float64)
    return means[comp] + stds[comp, None] * noise


class GMMScoreDataModule(TensorDataModule):
    """Samples of a 1-D/2-D Gaussian mixture and exact OU scores (see the module docstring).

    Args:
        dim: 1 or 2.
        n_components, separation, component_std: the mixture (``mixture_params``).
        n_samples: training draws of ``p_0``.
        n_val, n_test: evaluation points ``(x_t, t)``.
        t_min, t_max: evaluation times ``t ~ U[t_min, t_max]``.
        data_seed: seed of every draw.
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    dataset_name = "gmm_score"

    def __init__(self, dim: int = 1, n_components: int = 3, separation: float = 2.0, component_std: float = 0.4,
                 n_samples: int = 20_000, n_val: int = 2_000, n_test: int = 4_000, t_min: float = 1e-3,
                 t_max: float = 1.0, data_seed: int = 0, batch_size: int = 1024, eval_batch_size: int | None = 4000,
                 seed: int = 0) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        self.means, self.stds, self.weights = mixture_params(dim, n_components, separation, component_std)
        if min(n_samples, n_val, n_test) <= 0:
            raise ConfigError(f"split sizes must be positive, got {(n_samples, n_val, n_test)}")
        if not 0 <= t_min < t_max:
            raise ConfigError(f"need 0 <= t_min < t_max, got t_min={t_min}, t_max={t_max}")
        self.dim, self.sizes, self.t_range, self.data_seed = dim, (n_samples, n_val, n_test), (t_min, t_max), data_seed

    def score(self, x: Tensor, t: Tensor) -> Tensor:
        """The exact ``grad log p_t(x)``."""
        return ou_mixture_score(x, t, self.means, self.stds, self.weights)

    def build_splits(self) -> dict[str, Split]:
        gen = torch.Generator().manual_seed(self.data_seed)
        n_train, n_val, n_test = self.sizes
        x0 = sample_mixture(n_train, self.means, self.stds, self.weights, gen)
        out: dict[str, Split] = {"train": (x0.float(), self.score(x0, torch.zeros(n_train, 1, dtype=x0.dtype)).float())}
        lo, hi = self.t_range
        for name, n in (("val", n_val), ("test", n_test)):
            x0 = sample_mixture(n, self.means, self.stds, self.weights, gen)
            t = lo + (hi - lo) * torch.rand(n, 1, generator=gen, dtype=torch.float64)
            z = torch.randn(n, self.dim, generator=gen, dtype=torch.float64)
            x_t = torch.exp(-t) * x0 + (-torch.expm1(-2.0 * t)).sqrt() * z
            out[name] = tuple(a.float() for a in (x0, t, z, x_t, self.score(x_t, t)))
        return out

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.dim,)

    @property
    def num_features(self) -> int:
        return self.dim
