"""modules.components.lipschitz against independent references: eigvalsh of the dense LipSDP matrix, brute force
over activation patterns, a fine grid over the multipliers, bisection on rho, cvxpy's SDP (where installed), and
the block-tridiagonal barrier's derivatives against the dense ones (closed form and autograd)."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys

import pytest
import torch

from errors import ConfigError
from modules.components.lipschitz import (
    _Barrier,
    _eclipse_c,
    bound_from_multipliers,
    eclipse_fast_bound,
    flip_bound,
    jacobian_lower_bound,
    lipsdp_bound,
    lipsdp_matrix,
    net_weights,
    schur_bound_squared,
    trivial_bound,
)
from modules.components.mlp_analysis import random_mlp

HAS_CVXPY = importlib.util.find_spec("cvxpy") is not None and importlib.util.find_spec("scs") is not None


def weights(widths: list[int], seed: int = 0) -> list[torch.Tensor]:
    return net_weights(random_mlp(widths, "relu", seed=seed))


def min_eig_rel(ws: list[torch.Tensor], rho: float, mult: list[torch.Tensor]) -> float:
    m = lipsdp_matrix(ws, rho, mult)
    return float(torch.linalg.eigvalsh(m)[0]) / float(m.abs().max())


def brute_force_patterns(ws: list[torch.Tensor]) -> float:
    """max over 0/1 diagonal patterns D_i of ||W_l D_l ... D_1 W_0||_2 (every pattern a slope-[0, 1] activation
    can realise, so every LipSDP bound is at least this)."""
    hidden = [w.shape[0] for w in ws[:-1]]
    best = 0.0
    for bits in itertools.product([0.0, 1.0], repeat=sum(hidden)):
        d, k, prod = torch.tensor(bits, dtype=torch.float64), 0, ws[0]
        for i, n in enumerate(hidden):
            prod = ws[i + 1] @ (d[k : k + n, None] * prod)
            k += n
        best = max(best, float(torch.linalg.matrix_norm(prod, ord=2)))
    return best


class DenseBarrier:
    """The barrier ``phi(z) = s + mu log det N(z)`` on the dense ``N = M_1(c) - s E`` (the solver's first version,
    kept as the reference): gradient ``[k = s] + mu tr(N^{-1} A_k)`` and Hessian ``-mu tr(N^{-1} A_j N^{-1} A_k)``
    from the full inverse, each ``A_k`` kept as its nonzero block rows and columns."""

    def __init__(self, ws: list[torch.Tensor]) -> None:
        sizes = [ws[0].shape[1]] + [w.shape[0] for w in ws[:-1]]
        offs = [0]
        for n in sizes:
            offs.append(offs[-1] + n)
        self.base = torch.zeros(offs[-1], offs[-1], dtype=torch.float64)
        self.base[: sizes[0], : sizes[0]] = torch.eye(sizes[0], dtype=torch.float64)
        self.parts: list[tuple[slice, torch.Tensor]] = []
        for i in range(1, len(ws)):
            a, b, p = offs[i], offs[i + 1], offs[i - 1]
            blk = torch.zeros(b - p, b - p, dtype=torch.float64)
            blk[a - p :, a - p :] = 2 * torch.eye(b - a, dtype=torch.float64)
            blk[a - p :, : a - p] = -ws[i - 1]
            blk[: a - p, a - p :] = -ws[i - 1].T
            self.parts.append((slice(p, b), blk))
        self.parts.append((slice(offs[-2], offs[-1]), -(ws[-1].T @ ws[-1])))

    def matrix(self, z: torch.Tensor) -> torch.Tensor:
        n = self.base.clone()
        for zk, (sl, blk) in zip(z, self.parts):
            n[sl, sl] = n[sl, sl] + zk * blk
        return n

    def value(self, z: torch.Tensor, mu: float) -> float:
        chol, info = torch.linalg.cholesky_ex(self.matrix(z))
        if int(info) != 0 or not bool((z[:-1] > 0).all()):
            return -math.inf
        return float(z[-1]) + mu * 2 * float(torch.log(torch.diagonal(chol)).sum())

    def derivatives(self, z: torch.Tensor, mu: float) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cholesky_inverse(torch.linalg.cholesky(self.matrix(z)))
        k = len(self.parts)
        g = torch.zeros(k, dtype=torch.float64)
        h = torch.zeros(k, k, dtype=torch.float64)
        for i, (si, bi) in enumerate(self.parts):
            g[i] = mu * (x[si, si] * bi).sum()
            for j in range(i, k):
                sj, bj = self.parts[j]
                h[i, j] = h[j, i] = -mu * ((bi @ x[si, sj]) * (x[si, sj] @ bj)).sum()
        g[-1] += 1.0
        return g, h


def interior_point(ws: list[torch.Tensor], seed: int) -> torch.Tensor:
    """A strictly feasible ``z = (c, s)``: ECLipsE-Fast's ``c`` scaled layer by layer by random factors in
    [0.6, 1.4] (redrawn until every Schur block stays positive definite), ``s`` a random fraction of ``1 / F(c)``."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(100):
        c = _eclipse_c(ws) * (0.6 + 0.8 * torch.rand(len(ws) - 1, generator=gen, dtype=torch.float64))
        f = float(schur_bound_squared(ws, c))
        if math.isfinite(f):
            return torch.cat([c, (0.2 + 0.7 * torch.rand(1, generator=gen, dtype=torch.float64)) / f])
    raise AssertionError("no feasible multipliers drawn")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize(
    "widths", [[3, 5, 1], [3, 4, 4, 2], [5, 6, 3, 7, 4, 2], [2, 4, 4, 4, 4, 4, 3], [6, 2, 5, 3, 4]]
)
def test_block_barrier_matches_the_dense_reference(widths: list[int]) -> None:
    """Value, gradient and Hessian of the block-tridiagonal barrier equal the dense ones to 1e-8 at interior points
    of nets with 1-5 hidden layers, uneven widths and several outputs; both leave the domain together."""
    ws = weights(widths, seed=len(widths))
    block, dense = _Barrier(ws), DenseBarrier(ws)
    for seed, mu in [(0, 1.0), (1, 1e-2), (2, 1e-5)]:
        z = interior_point(ws, seed)
        val, g, h = block.derivatives(z, mu)
        g_ref, h_ref = dense.derivatives(z, mu)
        assert val == pytest.approx(dense.value(z, mu), rel=1e-10, abs=1e-12)
        assert block.value(z, mu) == pytest.approx(val, rel=1e-10, abs=1e-12)
        assert rel_err(g, g_ref) <= 1e-8
        assert rel_err(h, h_ref) <= 1e-8
        assert torch.equal(h, h.T)
    outside = interior_point(ws, 3)
    outside[-1] = 2 / float(schur_bound_squared(ws, outside[:-1]))  # s beyond 1 / F(c): N is indefinite
    assert block.value(outside, 1.0) == dense.value(outside, 1.0) == -math.inf


def test_dense_reference_matches_autograd() -> None:
    """The reference's closed forms against autograd's Hessian of ``s + mu log det N(z)`` on one small net."""
    ws = weights([3, 4, 3, 2], seed=5)
    dense, z, mu = DenseBarrier(ws), interior_point(ws, 4), 0.3
    g_ref, h_ref = dense.derivatives(z, mu)

    def phi(v: torch.Tensor) -> torch.Tensor:
        return v[-1] + mu * torch.logdet(dense.matrix(v))

    grad = torch.autograd.functional.jacobian(phi, z)
    hess = torch.autograd.functional.hessian(phi, z)
    assert rel_err(g_ref, grad) <= 1e-10
    assert rel_err(h_ref, hess) <= 1e-10


@pytest.mark.parametrize("widths,seed", [([3, 4, 4, 2], 0), ([4, 5, 3, 3], 1), ([2, 6, 1], 2)])
def test_flip_is_certified_by_its_multipliers_and_dominates_every_pattern(widths: list[int], seed: int) -> None:
    ws = weights(widths, seed)
    cert = flip_bound(ws)
    assert min_eig_rel(ws, cert.bound**2, cert.multipliers) >= -1e-10
    # a slightly smaller rho with the same multipliers is not PSD: the bound is the multipliers' own optimum
    assert min_eig_rel(ws, cert.bound**2 * (1 - 1e-6), cert.multipliers) < 0
    brute = brute_force_patterns(ws)
    ecl = eclipse_fast_bound(ws)
    assert brute <= cert.bound * (1 + 1e-9)
    assert cert.bound <= ecl.bound * (1 + 1e-9) <= trivial_bound(ws) * (1 + 2e-9)
    assert min_eig_rel(ws, ecl.bound**2, ecl.multipliers) >= -1e-10


def test_flip_reaches_the_scalar_optimum_on_a_fine_grid() -> None:
    """Two hidden layers: a log-grid of c from ECLipsE-Fast's choice (21 x 21 over a factor e^2 either way, then
    21 x 21 around the best point, 10x finer) never goes below FLIP's bound and comes within 0.1 % of it."""
    ws = weights([4, 6, 5, 2], seed=3)
    cert = flip_bound(ws, gap_tol=1e-6)
    ecl = eclipse_fast_bound(ws)
    centre = torch.tensor([float(m[0]) for m in ecl.multipliers], dtype=torch.float64) / ecl.bound**2
    best, span = math.inf, 2.0
    for _ in range(2):
        grid = torch.linspace(-span, span, 21, dtype=torch.float64)
        for a, b in itertools.product(grid, repeat=2):
            c = centre * torch.exp(torch.stack([a, b]))
            f = float(schur_bound_squared(ws, c))
            if f < best:
                best, arg = f, c
        centre, span = arg, span / 10
    assert best >= cert.bound**2 * (1 - 1e-8)
    assert best <= cert.bound**2 * (1 + 1e-3)
    assert cert.gap <= 1e-6


def test_flip_gap_and_tightness_against_eclipse_fast() -> None:
    ws = weights([16, 16, 16, 16, 1], seed=0)
    cert, ecl = flip_bound(ws), eclipse_fast_bound(ws)
    assert cert.gap <= 1e-4
    assert cert.bound < 0.95 * ecl.bound  # the lead's probe: the optimum is 0.53-0.74x ECLipsE-Fast on deep nets
    assert min_eig_rel(ws, cert.bound**2, cert.multipliers) >= -1e-10


def test_bound_from_multipliers_matches_bisection_on_rho() -> None:
    ws = weights([3, 4, 5, 2], seed=4)
    gen = torch.Generator().manual_seed(0)
    mult = [torch.rand(w.shape[0], generator=gen, dtype=torch.float64) * 4 + 1 for w in ws[:-1]]
    b = bound_from_multipliers(ws, mult)
    lo, hi = 0.0, 1e6
    if not math.isfinite(b):
        assert min_eig_rel(ws, hi, mult) < 0
        return
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if float(torch.linalg.eigvalsh(lipsdp_matrix(ws, mid, mult))[0]) >= 0 else (mid, hi)
    assert b**2 == pytest.approx(hi, rel=1e-7)


def test_one_layer_is_the_spectral_norm_and_trivial_is_the_product() -> None:
    w = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert flip_bound([w]).bound == pytest.approx(float(torch.linalg.svdvals(w)[0]), rel=1e-12)
    ws = weights([3, 4, 2])
    expected = math.prod(float(torch.linalg.svdvals(x)[0]) for x in ws)
    assert trivial_bound(ws) == pytest.approx(expected, rel=1e-12)


def test_lower_bound_is_exact_for_a_linear_net_and_below_flip_for_relu() -> None:
    lin = random_mlp([4, 5, 3], "identity", seed=1)
    ws = net_weights(lin)
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert jacobian_lower_bound(lin, x) == pytest.approx(float(torch.linalg.svdvals(ws[1] @ ws[0])[0]), rel=1e-10)
    net = random_mlp([4, 6, 6, 2], "relu", seed=2)
    low = jacobian_lower_bound(net, x, n_steps=2)
    assert 0 < low <= flip_bound(net_weights(net)).bound


@pytest.mark.slow  # importing cvxpy alone takes seconds
@pytest.mark.skipif(not HAS_CVXPY, reason="cvxpy + SCS not installed (pip install -e '.[sdp]')")
@pytest.mark.parametrize("seed", [0, 1])
def test_flip_within_its_gap_of_cvxpy_scalar_sdp_and_the_full_ordering(seed: int) -> None:
    ws = weights([4, 5, 5, 2], seed)
    cert = flip_bound(ws)
    layer = lipsdp_bound(ws, multipliers="layer")
    neuron = lipsdp_bound(ws)
    # both re-checked exactly from their multipliers, so both are valid bounds
    assert cert.bound == pytest.approx(layer.bound, rel=1e-4)
    net = random_mlp([4, 5, 5, 2], "relu", seed=seed)
    low = jacobian_lower_bound(net, torch.randn(64, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    chain = [low, brute_force_patterns(ws), neuron.bound, cert.bound, eclipse_fast_bound(ws).bound, trivial_bound(ws)]
    assert all(a <= b * (1 + 1e-6) for a, b in zip(chain, chain[1:])), chain


def test_bad_input() -> None:
    with pytest.raises(ConfigError, match=r"weights\[0\] \(4, 3\) and weights\[1\] \(2, 5\) do not chain"):
        flip_bound([torch.zeros(4, 3), torch.zeros(2, 5)])
    with pytest.raises(ConfigError, match="non-finite"):
        eclipse_fast_bound([torch.full((2, 2), math.nan)])
    with pytest.raises(ConfigError, match="matrix"):
        trivial_bound([torch.zeros(3)])
    with pytest.raises(ConfigError, match="slope bounds"):
        net_weights(random_mlp([3, 4, 2], "gelu"))
    with pytest.raises(ConfigError, match="slope bounds"):
        net_weights(random_mlp([3, 4, 2], "silu"))


def test_lipsdp_without_cvxpy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cvxpy", None)  # import cvxpy now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[sdp\]'"):
        lipsdp_bound(weights([2, 3, 1]))
