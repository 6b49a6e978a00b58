"""dirichlet_partition: an exact partition, share moments of Dir(alpha 1_n) by Monte Carlo, min_size, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from datamodules.partition import dirichlet_partition
from errors import ConfigError


def test_partition_is_exact_and_reproducible() -> None:
    labels = torch.randint(0, 7, (1000,), generator=torch.Generator().manual_seed(0))
    parts = dirichlet_partition(labels, 13, 0.3, generator=torch.Generator().manual_seed(1))
    assert len(parts) == 13 and all(p.dtype == torch.long for p in parts)
    joined = torch.cat(parts)
    assert torch.equal(joined.sort().values, torch.arange(1000))  # disjoint and complete
    again = dirichlet_partition(labels, 13, 0.3, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    other = dirichlet_partition(labels, 13, 0.3, generator=torch.Generator().manual_seed(2))
    assert not all(torch.equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("n,alpha", [(5, 0.5), (10, 0.1)])
def test_share_variance_matches_the_dirichlet_marginal(n: int, alpha: float) -> None:
    """Each client's share of a class has mean 1/n and variance (n - 1) / (n^2 (n alpha + 1))."""
    per_class, classes, draws = 4000, 10, 60
    labels = torch.arange(classes).repeat_interleave(per_class)
    gen = torch.Generator().manual_seed(n)
    dev = []  # per (draw, class): mean over clients of (p_i - 1/n)^2, independent across (draw, class)
    means = []
    for _ in range(draws):
        parts = dirichlet_partition(labels, n, alpha, generator=gen)
        counts = torch.stack([torch.bincount(labels[p], minlength=classes) for p in parts]).double()  # (n, C)
        shares = counts / per_class
        dev.append(((shares - 1 / n) ** 2).mean(0))
        means.append(shares[0])
    dev_t = torch.cat(dev)
    expected = (n - 1) / (n**2 * (n * alpha + 1))
    se = dev_t.std() / math.sqrt(dev_t.numel())
    # 4 standard errors, plus the floor rounding of the cut points (at most 1/per_class per share)
    assert abs(dev_t.mean().item() - expected) < 4 * se.item() + 2 / per_class
    m = torch.cat(means)
    assert abs(m.mean().item() - 1 / n) < 4 * m.std().item() / math.sqrt(m.numel())


def test_min_size_is_met_and_unreachable_min_size_is_an_error() -> None:
    labels = torch.arange(10).repeat_interleave(200)
    parts = dirichlet_partition(labels, 20, 0.1, min_size=10, generator=torch.Generator().manual_seed(0))
    assert min(len(p) for p in parts) >= 10
    with pytest.raises(ConfigError, match="unreachable"):
        dirichlet_partition(labels, 20, 0.1, min_size=101)
    with pytest.raises(ConfigError, match="not reached"):
        # reachable in principle (10 x 19 <= 200) but not by Dirichlet(0.1) draws
        dirichlet_partition(torch.arange(2).repeat_interleave(100), 10, 0.1, min_size=19,
                            generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), float("inf")])
def test_alpha_must_be_positive(alpha: float) -> None:
    with pytest.raises(ConfigError, match="alpha"):
        dirichlet_partition(torch.zeros(10, dtype=torch.long), 2, alpha)


def test_bad_labels_and_clients() -> None:
    with pytest.raises(ConfigError, match="integer"):
        dirichlet_partition(torch.zeros(10), 2, 1.0)
    with pytest.raises(ConfigError, match="n_clients"):
        dirichlet_partition(torch.zeros(10, dtype=torch.long), 0, 1.0)
