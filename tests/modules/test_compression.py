"""Compressors (modules/components/compression.py): exact supports and Monte Carlo moments against closed forms.

Monte Carlo tolerances: 4 standard errors of the sample mean, the standard error estimated from the same
draws (a false failure has probability ~6e-5 per check).
"""

from __future__ import annotations

import math

import pytest
import torch

from errors import ConfigError
from modules.components.compression import (
    compress,
    natural_compression,
    natural_dithering,
    perm_k,
    perm_k_blocks,
    rand_k,
    rand_k_rows,
    top_k,
)


def _within_se(samples: torch.Tensor, expected: float | torch.Tensor, z: float = 4.0) -> None:
    """Every coordinate of the sample mean within z standard errors of ``expected``."""
    mean = samples.mean(0)
    se = samples.std(0) / math.sqrt(samples.shape[0])
    err = (mean - expected).abs()
    assert bool((err <= z * se + 1e-12).all()), (float((err / (se + 1e-300)).max()), mean, expected)


X = torch.tensor([3.0, -1.0, 0.5, 2.0, 0.0, -4.0, 1.5, 0.25, -0.75, 1.0], dtype=torch.float64)
Y = torch.where(X == 0, torch.full_like(X, 0.3), X)  # no zero entry: supports are countable


def test_rand_k_keeps_k_coordinates_scaled_by_d_over_k() -> None:
    gen = torch.Generator().manual_seed(0)
    d, k = 1000, 37
    x = torch.randn(d, generator=gen, dtype=torch.float64)
    c = rand_k(x, k, gen)
    kept = c != 0
    assert int(kept.sum()) == k
    assert torch.allclose(c[kept], x[kept] * d / k)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_rand_k_is_unbiased_with_variance_d_over_k_minus_1(k: int) -> None:
    gen = torch.Generator().manual_seed(1)
    d, draws = X.numel(), 4_000
    samples = torch.stack([rand_k(X, k, gen) for _ in range(draws)])
    _within_se(samples, X)
    sq_err = (samples - X).pow(2).sum(1)  # |C(x) - x|^2 per draw
    _within_se(sq_err[:, None], (d / k - 1) * float(X.pow(2).sum()))


def test_rand_k_rows_has_the_same_law_per_row() -> None:
    gen = torch.Generator().manual_seed(2)
    d, k, draws = Y.numel(), 4, 40_000
    samples = rand_k_rows(Y.expand(draws, -1), k, gen)  # every row an independent draw
    assert bool(((samples != 0).sum(-1) == k).all())
    _within_se(samples, Y)
    _within_se((samples - Y).pow(2).sum(1)[:, None], (d / k - 1) * float(Y.pow(2).sum()))


@pytest.mark.parametrize("n,d", [(4, 12), (4, 10), (3, 10), (16, 10)])
def test_perm_k_blocks_are_disjoint_cover_d_and_at_most_ceil_d_over_n(n: int, d: int) -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(50):
        owner = perm_k_blocks(n, d, gen)
        assert owner.shape == (d,) and int(owner.min()) >= 0 and int(owner.max()) < n
        counts = torch.bincount(owner, minlength=n)
        assert int(counts.sum()) == d and int(counts.max()) <= math.ceil(d / n)
        if d % n == 0:
            assert bool((counts == d // n).all())


@pytest.mark.parametrize("n", [2, 3, 4, 16])
def test_perm_k_mean_over_workers_of_a_shared_input_is_exact(n: int) -> None:
    gen = torch.Generator().manual_seed(4)
    for _ in range(20):
        out = perm_k(X.expand(n, -1), gen)
        assert torch.allclose(out.mean(0), X, atol=1e-14)
        # every coordinate sits with exactly one worker, times n
        nonzero = (out != 0).sum(0)
        assert bool((nonzero[X != 0] == 1).all())


@pytest.mark.parametrize("n", [3, 4])
def test_perm_k_each_worker_unbiased_with_variance_n_minus_1(n: int) -> None:
    """Distinct rows x_i (d = 10 is not a multiple of 3 or 4: the padded slots): E C_i(x_i) = x_i and
    E|C_i(x_i) - x_i|^2 = (n - 1)|x_i|^2 for every worker i."""
    gen = torch.Generator().manual_seed(5)
    rows = torch.stack([X * (i + 1) - i for i in range(n)])
    draws = 4_000
    samples = torch.stack([perm_k(rows, gen) for _ in range(draws)])  # (draws, n, d)
    for i in range(n):
        _within_se(samples[:, i], rows[i])
        sq = (samples[:, i] - rows[i]).pow(2).sum(1)
        _within_se(sq[:, None], (n - 1) * float(rows[i].pow(2).sum()))


def test_top_k_keeps_the_largest_magnitudes_unscaled() -> None:
    out = top_k(X, 3)
    assert torch.equal(out.nonzero().flatten(), torch.tensor([0, 3, 5]))
    assert torch.equal(out[[0, 3, 5]], X[[0, 3, 5]])
    assert float((top_k(X, 3) - X).pow(2).sum()) <= (1 - 3 / X.numel()) * float(X.pow(2).sum())


def test_natural_compression_rounds_to_neighbouring_powers_of_two_without_bias() -> None:
    gen = torch.Generator().manual_seed(6)
    draws = 40_000
    samples = natural_compression(X.expand(draws, -1), gen)  # elementwise: every row an independent draw
    nz = X != 0
    mags = samples[:, nz].abs()
    low = torch.exp2(torch.floor(torch.log2(X[nz].abs())))
    assert bool(((mags == low) | (mags == 2 * low)).all())
    assert bool((torch.sign(samples[:, nz]) == torch.sign(X[nz])).all())
    assert bool((samples[:, ~nz] == 0).all())
    _within_se(samples, X)
    # exact powers of two are kept as they are; omega = 1/8 bounds the variance
    powers = torch.tensor([1.0, -0.5, 4.0, 2.0**-10], dtype=torch.float64)
    assert torch.equal(natural_compression(powers, gen), powers)
    var = (samples - X).pow(2).sum(1).mean()
    assert float(var) <= 1 / 8 * float(X.pow(2).sum()) * 1.02


@pytest.mark.parametrize("s", [1, 3])
def test_natural_dithering_levels_and_unbiasedness(s: int) -> None:
    gen = torch.Generator().manual_seed(7)
    norm = float(torch.linalg.vector_norm(X))
    levels = torch.tensor([0.0] + [2.0 ** (e - s) for e in range(1, s + 1)], dtype=torch.float64)
    draws = 1_200
    samples = torch.stack([natural_dithering(X, s, gen) for _ in range(draws)])
    level = samples.abs() / norm
    assert bool(torch.isclose(level[..., None], levels, atol=1e-12).any(-1).all())
    assert bool((torch.sign(samples[samples != 0]) == torch.sign(X.expand_as(samples)[samples != 0])).all())
    _within_se(samples, X)
    # the levels around u: u = |x_j| / |x| in [lo, hi] of consecutive levels
    u = X.abs() / norm
    for j in range(X.numel()):
        lo = float(levels[levels <= u[j] + 1e-15].max())
        hi = float(levels[levels >= u[j] - 1e-15].min())
        vals = torch.unique(torch.round(level[:, j], decimals=12))
        assert all(abs(v - lo) < 1e-9 or abs(v - hi) < 1e-9 for v in vals.tolist()), (j, vals, lo, hi)
    assert torch.equal(natural_dithering(torch.zeros(5), s, gen), torch.zeros(5))


def test_shared_generator_state_gives_the_same_coordinates() -> None:
    a = rand_k(X, 3, torch.Generator().manual_seed(11))
    b = rand_k(X, 3, torch.Generator().manual_seed(11))
    assert torch.equal(a, b)
    assert torch.equal(perm_k_blocks(4, 10, torch.Generator().manual_seed(3)),
                       perm_k_blocks(4, 10, torch.Generator().manual_seed(3)))


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: rand_k(X, 0), r"k must be an integer in \[1, d\] = \[1, 10\]"),
        (lambda: rand_k(X, 11), r"k must be an integer in \[1, d\]"),
        (lambda: top_k(X, 0), r"k must be an integer in \[1, d\]"),
        (lambda: top_k(X, 11), r"k must be an integer in \[1, d\]"),
        (lambda: rand_k_rows(X.expand(2, -1), 11), r"k must be an integer in \[1, d\]"),
        (lambda: natural_dithering(X, 0), "s >= 1"),
        (lambda: natural_dithering(X, -2), "s >= 1"),
        (lambda: compress("qsgd", X), "unknown compressor 'qsgd'"),
        (lambda: perm_k(X), r"shape \(n, d\)"),
        (lambda: rand_k(X.expand(2, -1), 2), r"shape \(d,\)"),
    ],
)
def test_bad_input_is_a_clear_error(build, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build()
