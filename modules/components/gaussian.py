"""Multivariate Gaussians given by moments: the KL divergence between two of them, and moments from samples.

Shared by the moment-propagation methods (paper 002-06) and the diagnostic that checks them against Monte Carlo
(``callbacks/moment_propagation_error.py``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def gaussian_kl(mean_p: Tensor, cov_p: Tensor, mean_q: Tensor, cov_q: Tensor) -> Tensor:
    """``KL(N(mean_p, cov_p) || N(mean_q, cov_q))`` per batch row: means ``(..., d)``, covariances ``(..., d, d)``.

    ``inf`` where ``cov_q`` is not positive definite (a prediction that puts no mass where the reference has
    some); ``cov_p`` must be positive definite.
    """
    d = mean_p.shape[-1]
    lq, info_q = torch.linalg.cholesky_ex(cov_q)
    lp, info_p = torch.linalg.cholesky_ex(cov_p)
    if bool((info_p != 0).any()):
        raise ValueError("gaussian_kl: the reference covariance cov_p is not positive definite")
    # tr(Q^-1 P) = |Lq^-1 Lp|_F^2; the Mahalanobis term through one triangular solve
    m = torch.linalg.solve_triangular(lq, lp, upper=False)
    delta = torch.linalg.solve_triangular(lq, (mean_q - mean_p).unsqueeze(-1), upper=False).squeeze(-1)
    logdet_q = 2 * torch.log(torch.diagonal(lq, dim1=-2, dim2=-1)).sum(-1)
    logdet_p = 2 * torch.log(torch.diagonal(lp, dim1=-2, dim2=-1)).sum(-1)
    kl = 0.5 * (m.square().sum((-2, -1)) + delta.square().sum(-1) - d + logdet_q - logdet_p)
    return torch.where(info_q == 0, kl, torch.full_like(kl, float("inf")))


def kl_floor(dim: int, n_samples: int) -> float:
    """The expected ``KL(fitted || true)`` of a Gaussian fitted to ``n_samples`` draws of a true Gaussian in
    ``dim`` dimensions, to first order: ``dim (dim + 3) / (4 n)`` (d mean and d(d+1)/2 covariance parameters,
    each adding 1/(2n)). A Monte Carlo KL below it does not resolve the prediction's error."""
    return dim * (dim + 3) / (4 * n_samples)


class MomentAccumulator:
    """Mean and covariance of samples that arrive in chunks, accumulated about a fixed shift (the predicted mean)
    so that the covariance of a tight law keeps its digits: ``update(x (..., n, d))``, ``moments()``."""

    def __init__(self, shift: Tensor) -> None:
        self.shift = shift.detach()
        self.n = 0
        self.s1: Tensor | None = None
        self.s2: Tensor | None = None

    def update(self, x: Tensor) -> None:
        y = x.detach() - self.shift.unsqueeze(-2)
        s1, s2 = y.sum(-2), y.transpose(-1, -2) @ y
        self.s1 = s1 if self.s1 is None else self.s1 + s1
        self.s2 = s2 if self.s2 is None else self.s2 + s2
        self.n += x.shape[-2]

    def moments(self) -> tuple[Tensor, Tensor]:
        if self.s1 is None or self.s2 is None or self.n < 2:
            raise ValueError("MomentAccumulator needs at least two samples")
        mean_y = self.s1 / self.n
        cov = (self.s2 - self.n * mean_y.unsqueeze(-1) * mean_y.unsqueeze(-2)) / (self.n - 1)
        return mean_y + self.shift, 0.5 * (cov + cov.transpose(-1, -2))


__all__ = ["MomentAccumulator", "gaussian_kl", "kl_floor"]
