"""datamodules/gmm_score.py: the OU-evolved mixture, its closed-form score, the splits."""

from __future__ import annotations

import math

import pytest
import torch

from datamodules.gmm_score import GMMScoreDataModule, mixture_params, ou_mixture_logpdf, ou_mixture_score
from errors import ConfigError


@pytest.mark.parametrize("dim", [1, 2])
def test_score_is_the_gradient_of_the_log_density(dim):
    means, stds, weights = mixture_params(dim)
    x = (2 * torch.randn(50, dim, dtype=torch.float64)).requires_grad_(True)
    t = torch.rand(50, 1, dtype=torch.float64)
    (g,) = torch.autograd.grad(ou_mixture_logpdf(x, t, means, stds, weights).sum(), x)
    assert torch.allclose(ou_mixture_score(x, t, means, stds, weights), g, atol=1e-12)


@pytest.mark.parametrize("dim", [1, 2])
def test_density_solves_the_ou_fokker_planck_equation(dim):
    """d_t p = div(x p) + Lap p, i.e. d_t log p = d + x . grad log p + Lap log p + |grad log p|^2."""
    means, stds, weights = mixture_params(dim)
    x = (2 * torch.randn(40, dim, dtype=torch.float64)).requires_grad_(True)
    t = (0.05 + torch.rand(40, 1, dtype=torch.float64)).requires_grad_(True)
    logp = ou_mixture_logpdf(x, t, means, stds, weights)
    (dt,) = torch.autograd.grad(logp.sum(), t, create_graph=True)
    (gx,) = torch.autograd.grad(logp.sum(), x, create_graph=True)
    lap = sum(torch.autograd.grad(gx[:, i].sum(), x, retain_graph=True)[0][:, i] for i in range(dim))
    rhs = dim + (x * gx).sum(1) + lap + gx.square().sum(1)
    assert torch.allclose(dt[:, 0], rhs, atol=1e-10)


def test_splits_follow_the_ou_process():
    dm = GMMScoreDataModule(dim=1, n_samples=20_000, n_test=4000, t_min=0.5, t_max=0.5 + 1e-9)
    dm.setup()
    x0, s0 = dm.splits["train"]
    assert x0.shape == (20_000, 1) and dm.num_features == 1
    means, stds, weights = dm.means, dm.stds, dm.weights
    mean0 = (weights * means[:, 0]).sum()
    var0 = (weights * (stds**2 + means[:, 0] ** 2)).sum() - mean0**2
    # Monte Carlo: the sample mean within 4 standard errors of the mixture's mean
    assert abs(x0.double().mean() - mean0) < 4 * math.sqrt(var0 / 20_000)
    assert torch.allclose(s0.double(), ou_mixture_score(x0.double(), torch.zeros(20_000, 1, dtype=torch.float64), means, stds, weights),
                          atol=1e-5)
    x0t, t, z, x_t, s_t = dm.splits["test"]
    assert torch.allclose(x_t, torch.exp(-t) * x0t + torch.sqrt(1 - torch.exp(-2 * t)) * z, atol=1e-6)
    # at t = 0.5 the marginal mean is e^{-t} mean0 and the variance e^{-2t} var0 + 1 - e^{-2t}
    e = math.exp(-0.5)
    var_t = e**2 * var0 + 1 - e**2
    assert abs(x_t.double().mean() - e * mean0) < 4 * math.sqrt(var_t / 4000)
    assert abs(x_t.double().var() - var_t) < 4 * var_t * math.sqrt(2 / 4000)
    # the exact score is the Tweedie denoiser: E[z | x_t] = -sigma_t s(x_t, t), so E[sigma s + z] ~ 0
    sigma = math.sqrt(1 - e**2)
    resid = sigma * s_t.double() + z.double()
    assert abs(resid.mean()) < 4 * resid.std() / math.sqrt(4000)


def test_mixture_and_bad_settings():
    means, stds, weights = mixture_params(2, 3, separation=2.0)
    assert torch.allclose(means.norm(dim=1), torch.full((3,), 2.0, dtype=torch.float64))
    assert weights.sum().item() == pytest.approx(1.0) and (stds > 0).all()
    with pytest.raises(ConfigError, match="1-D or 2-D"):
        GMMScoreDataModule(dim=3)
    with pytest.raises(ConfigError, match="t_min < t_max"):
        GMMScoreDataModule(t_min=1.0, t_max=0.1)
    with pytest.raises(ConfigError, match="positive"):
        GMMScoreDataModule(n_val=0)
