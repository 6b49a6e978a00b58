"""RandomGaussianDataModule: shapes, determinism, labels independent of inputs, bad input."""

from __future__ import annotations

import pytest
import torch

from datamodules.random_gaussian import RandomGaussianDataModule


def test_shapes_and_determinism():
    dm = RandomGaussianDataModule(in_dim=16, n_classes=4, train_size=500, val_size=100, test_size=50)
    dm.setup()
    x, y = dm.splits["train"]
    assert x.shape == (500, 16) and y.shape == (500,) and dm.splits["test"][0].shape == (50, 16)
    assert y.min() >= 0 and y.max() == 3 and dm.num_classes == 4 and dm.num_features == 16
    again = RandomGaussianDataModule(in_dim=16, n_classes=4, train_size=500, val_size=100, test_size=50)
    again.setup()
    assert torch.equal(again.splits["val"][0], dm.splits["val"][0])
    other = RandomGaussianDataModule(
        in_dim=16, n_classes=4, train_size=500, val_size=100, test_size=50, data_seed=1
    )
    other.setup()
    assert not torch.equal(other.splits["train"][0], x)


def test_statistics_and_independence():
    dm = RandomGaussianDataModule(train_size=8192)
    dm.setup()
    x, y = dm.splits["train"]
    assert abs(x.mean().item()) < 0.01 and abs(x.std().item() - 1) < 0.01
    counts = torch.bincount(y, minlength=10).double()
    assert (counts / counts.sum() - 0.1).abs().max() < 0.02
    # no linear signal: per-class input means are within sampling noise of 0 (sd ~ 1/sqrt(800))
    means = torch.stack([x[y == c].mean(0) for c in range(10)])
    assert means.abs().max() < 6 / 800**0.5


def test_image_shape_and_bad_input():
    dm = RandomGaussianDataModule(image_shape=True, train_size=10, val_size=10, test_size=10)
    dm.setup()
    assert dm.splits["train"][0].shape == (10, 1, 8, 8)
    with pytest.raises(ValueError, match="square"):
        RandomGaussianDataModule(in_dim=10, image_shape=True)
    with pytest.raises(ValueError, match="n_classes"):
        RandomGaussianDataModule(n_classes=1)
