"""neural_metrics against independent references: scipy's Poisson pmf, scikit-learn's R^2 and Ridge, the HSIC form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import poisson
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from errors import ConfigError
from modules.components.neural_metrics import bits_per_spike, decoding_r2, linear_cka, ridge_fit, ridge_predict


def _counts_and_rates(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rates = torch.rand(7, 20, 5, generator=g, dtype=torch.float64) * 3 + 0.05
    return torch.poisson(rates, generator=g), rates


def test_bits_per_spike_matches_scipy_poisson() -> None:
    counts, rates = _counts_and_rates()
    c, r = counts.numpy().reshape(-1, 5), rates.numpy().reshape(-1, 5)
    null = np.broadcast_to(c.mean(axis=0), c.shape)
    expected = (poisson.logpmf(c, r).sum() - poisson.logpmf(c, null).sum()) / (c.sum() * math.log(2))
    assert bits_per_spike(rates, counts).item() == pytest.approx(expected, rel=1e-12)


def test_bits_per_spike_of_the_null_model_is_zero_and_of_the_truth_positive() -> None:
    counts, rates = _counts_and_rates(1)
    null = counts.reshape(-1, 5).mean(0).expand_as(counts)
    assert bits_per_spike(null, counts).item() == pytest.approx(0.0, abs=1e-12)
    assert bits_per_spike(rates, counts).item() > 0


@pytest.mark.parametrize("rates_fill, counts_fill, match", [
    (0.0, 1.0, "> 0"), (float("nan"), 1.0, "finite"), (1.0, -1.0, ">= 0"), (1.0, 0.0, "no spike")])
def test_bits_per_spike_rejects_bad_input(rates_fill: float, counts_fill: float, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        bits_per_spike(torch.full((4, 3), rates_fill), torch.full((4, 3), counts_fill))
    with pytest.raises(ConfigError, match="same shape"):
        bits_per_spike(torch.ones(4, 3), torch.ones(4, 2))


def test_decoding_r2_matches_scikit_learn_variance_weighted() -> None:
    g = torch.Generator().manual_seed(2)
    target = torch.randn(6, 30, 2, generator=g, dtype=torch.float64) * torch.tensor([1.0, 5.0], dtype=torch.float64)
    pred = target + torch.randn(6, 30, 2, generator=g, dtype=torch.float64)
    expected = r2_score(target.reshape(-1, 2).numpy(), pred.reshape(-1, 2).numpy(), multioutput="variance_weighted")
    assert decoding_r2(pred, target).item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ConfigError, match="at least 2"):
        decoding_r2(torch.ones(1, 2), torch.ones(1, 2))


def test_linear_cka_matches_the_hsic_gram_form() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 6, generator=g, dtype=torch.float64)
    y = x @ torch.randn(6, 4, generator=g, dtype=torch.float64) + 0.5 * torch.randn(40, 4, generator=g, dtype=torch.float64)
    h = torch.eye(40, dtype=torch.float64) - 1 / 40
    kx, ky = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    hsic = lambda a, b: (a * b).sum()  # noqa: E731
    expected = hsic(kx, ky) / torch.sqrt(hsic(kx, kx) * hsic(ky, ky))
    assert linear_cka(x, y).item() == pytest.approx(expected.item(), rel=1e-10)
    rotation = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64)).Q
    assert linear_cka(x, 3 * x @ rotation + 1).item() == pytest.approx(1.0, rel=1e-10)


def test_ridge_matches_scikit_learn() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50, 8, generator=g, dtype=torch.float64)
    y = x @ torch.randn(8, 3, generator=g, dtype=torch.float64) + 2 + torch.randn(50, 3, generator=g, dtype=torch.float64)
    weights, intercept = ridge_fit(x, y, alpha=3.0)
    reference = Ridge(alpha=3.0).fit(x.numpy(), y.numpy())
    np.testing.assert_allclose(weights.numpy(), reference.coef_.T, rtol=1e-10)
    np.testing.assert_allclose(intercept.numpy(), reference.intercept_, rtol=1e-10)
    np.testing.assert_allclose(ridge_predict(x, weights, intercept).numpy(), reference.predict(x.numpy()), rtol=1e-10)
    with pytest.raises(ConfigError, match="same n"):
        ridge_fit(x, y[:-1])
