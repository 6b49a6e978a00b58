"""Gaussian input laws: the covariance's scale, PSD-ness and seeding."""

from __future__ import annotations

import pytest
import torch

from datamodules.gaussian_inputs import GaussianInputsDataModule, gaussian_laws
from errors import ConfigError


def test_laws_have_the_stated_scale_and_are_psd() -> None:
    mean, cov, scale = gaussian_laws(400, 6, (0.1, 1.0), torch.Generator().manual_seed(0))
    assert mean.shape == (800, 6) and cov.shape == (800, 6, 6) and scale.shape == (800,)
    assert torch.allclose(cov, cov.transpose(1, 2))
    assert torch.linalg.eigvalsh(cov).min() > -1e-12
    # E[tr(s^2 R R^T / d)] = s^2 d: the mean trace per scale, within 5 standard errors of Monte Carlo
    for s in (0.1, 1.0):
        tr = cov[scale == s].diagonal(dim1=1, dim2=2).sum(-1) / s**2
        assert abs(float(tr.mean()) - 6) < 5 * float(tr.std()) / 400**0.5


def test_splits_are_seeded_and_independent_of_each_others_sizes() -> None:
    a = GaussianInputsDataModule(dim=4, train_per_scale=3, data_seed=1)
    b = GaussianInputsDataModule(dim=4, train_per_scale=5, data_seed=1)
    c = GaussianInputsDataModule(dim=4, train_per_scale=3, data_seed=2)
    for dm in (a, b, c):
        dm.setup()
    assert torch.equal(a.splits["test"][1], b.splits["test"][1])
    assert not torch.equal(a.splits["test"][1], c.splits["test"][1])
    assert a.input_shape == (4,) and a.splits["train"][0].shape == (3 * 5, 4)


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match="scales"):
        GaussianInputsDataModule(scales=[0.1, -1.0])
    with pytest.raises(AttributeError, match="no labels"):  # hasattr() false: the CLI skips the link
        _ = GaussianInputsDataModule().num_classes
