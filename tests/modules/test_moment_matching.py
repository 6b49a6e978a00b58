"""Exact Gaussian moment matching (paper 002-06): the closed forms against independent references (scipy's bivariate
normal CDF and a 1-D quadrature, Monte Carlo with tolerances in standard errors, limits, finite differences), the
propagation methods, the VB net's moments against full weight sampling, the study's summaries and the diagnostic."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.stats import multivariate_normal, norm

from callbacks.moment_propagation_error import MomentPropagationError
from errors import ConfigError
from modules.components.gaussian import MomentAccumulator, gaussian_kl, kl_floor
from modules.moment_matching import (
    ACTIVATIONS,
    DeterministicVBNN,
    MomentPropagationStudy,
    ResidualNet,
    activation_moments,
    bvn_cdf,
    mc_moments,
    propagate,
    residual_layer_moments,
)
from modules.moment_matching.functional import activation_fn
from modules.protocols import PredictiveMoments

D = torch.float64


def _law(n: int, seed: int, scale: float = 1.0, rows: int = 2, rho: float = 0.98) -> tuple[torch.Tensor, torch.Tensor]:
    """Random means and covariances ``R R^T / n + 0.05 I`` with unit 1 mixed into unit 0 until their correlation is
    ``rho`` (the hard regime of the issue: correlations up to 0.98)."""
    gen = torch.Generator().manual_seed(seed)
    mean = torch.randn(rows, n, generator=gen, dtype=D)
    r = torch.randn(rows, n, n, generator=gen, dtype=D)
    cov = r @ r.transpose(1, 2) / n + 0.05 * torch.eye(n, dtype=D)
    a, b, c = cov[:, 0, 0], cov[:, 1, 1], cov[:, 0, 1]
    # x1 <- x1 + lam x0 with corr(x0, x1) = rho: lam^2 a^2 (1 - rho^2) + 2 lam a c (1 - rho^2) + c^2 - rho^2 a b = 0
    qa, qb, qc = a * a * (1 - rho**2), 2 * a * c * (1 - rho**2), c * c - rho**2 * a * b
    lam = (-qb + (qb * qb - 4 * qa * qc).sqrt()) / (2 * qa)
    t = torch.eye(n, dtype=D).repeat(rows, 1, 1)
    t[:, 1, 0] = lam
    return mean, scale**2 * t @ cov @ t.transpose(1, 2)


# --- Phi_2 ---------------------------------------------------------------------------------------------------------
def _quad_bvn(h: float, k: float, r: float) -> float:
    f = lambda x: norm.pdf(x) * norm.cdf((k - r * x) / math.sqrt(1 - r * r))  # noqa: E731
    return integrate.quad(f, -np.inf, h, epsabs=1e-14, epsrel=1e-13, limit=400)[0]


def _check_bvn(n: int, n_quad: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, k, r = rng.uniform(-8, 8, n), rng.uniform(-8, 8, n), rng.uniform(-0.999, 0.999, n)
    # the hard corner: near-equal limits at correlations close to +-1
    hard = n // 3
    h[:hard] = rng.uniform(-1, 1, hard)
    k[:hard] = h[:hard] + rng.normal(0, 0.01, hard)
    r[:hard] = rng.choice([0.999, -0.999, 0.99, -0.93, 0.926, 0.924], hard)
    got = bvn_cdf(torch.tensor(h), torch.tensor(k), torch.tensor(r)).numpy()
    # scipy's own (Genz's Fortran) at a tight tolerance
    ref = np.array([multivariate_normal.cdf([a, b], cov=[[1, c], [c, 1]], abseps=1e-12, releps=1e-12)
                    for a, b, c in zip(h, k, r, strict=True)])
    assert np.abs(got - ref).max() < 1e-10
    # an independent route on some of the hard ones: P(X <= h, Y <= k) = int_{-inf}^h pdf(x) Phi((k - r x) / sqrt(1 - r^2))
    quad = np.array([_quad_bvn(a, b, c) for a, b, c in zip(h[:n_quad], k[:n_quad], r[:n_quad], strict=True)])
    assert np.abs(got[:n_quad] - quad).max() < 1e-12


def test_bvn_cdf_matches_scipy_and_quadrature_on_the_issue_range() -> None:
    _check_bvn(30, 2, seed=0)  # 10 of them in the hard corner; the slow tier checks 600


@pytest.mark.slow
def test_bvn_cdf_matches_scipy_and_quadrature_on_many_points() -> None:
    _check_bvn(600, 60, seed=1)


def test_bvn_cdf_limits_and_gradients() -> None:
    h, k = torch.tensor([0.3, -1.0, 2.0], dtype=D), torch.tensor([-0.2, -1.0, 0.5], dtype=D)
    one = bvn_cdf(h, k, torch.ones(3, dtype=D))
    assert torch.allclose(one, torch.special.ndtr(torch.minimum(h, k)), atol=1e-15)
    minus = bvn_cdf(h, k, -torch.ones(3, dtype=D))
    assert torch.allclose(minus, (torch.special.ndtr(h) + torch.special.ndtr(k) - 1).clamp_min(0), atol=1e-15)
    zero = bvn_cdf(h, k, torch.zeros(3, dtype=D))
    assert torch.allclose(zero, torch.special.ndtr(h) * torch.special.ndtr(k), atol=1e-15)
    args = (torch.tensor([0.3, -1.2, 1.5], dtype=D, requires_grad=True),
            torch.tensor([-0.4, 0.7, 1.4], dtype=D, requires_grad=True),
            torch.tensor([0.5, -0.95, 0.97], dtype=D, requires_grad=True))
    assert torch.autograd.gradcheck(bvn_cdf, args)


# --- activation moments against Monte Carlo --------------------------------------------------------------------------
def _mc_check(activation: str, samples: int, seed: int, z_max: float) -> None:
    mean, cov = _law(4, seed)
    mu, c = activation_moments(mean, cov, activation)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(seed + 1)
    z = mean[:, None] + torch.randn(2, samples, 4, generator=gen, dtype=D) @ torch.linalg.cholesky(cov).transpose(1, 2)
    f = activation_fn(z, activation)
    mc_mean = f.mean(1)
    dev = f - mc_mean[:, None]
    mc_cov = dev.transpose(1, 2) @ dev / (samples - 1)
    se_mean = (torch.diagonal(mc_cov, dim1=1, dim2=2) / samples).sqrt()
    se_cov = (dev[..., :, None] * dev[..., None, :]).std(1) / samples**0.5
    assert float(((mu - mc_mean) / se_mean).abs().max()) < z_max, activation
    assert float(((c - mc_cov) / se_cov).abs().max()) < z_max, activation


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_moments_match_monte_carlo_2e4(activation: str) -> None:
    # 2 laws x (4 + 16) entries: 5 standard errors leave a false alarm at about 1e-4 at any sample size; the 1e6
    # draws of the slow tier resolve 7x smaller errors
    _mc_check(activation, 20_000, seed=3, z_max=5.0)


@pytest.mark.slow
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_moments_match_monte_carlo_1e6(activation: str) -> None:
    _mc_check(activation, 1_000_000, seed=11, z_max=5.0)


def test_heaviside_and_relu_are_limits_of_probit_and_gelu() -> None:
    mean, cov = _law(3, 5)
    h_mu, h_cov = activation_moments(mean, cov, "heaviside")
    r_mu, r_cov = activation_moments(mean, cov, "relu")
    errs = []
    for k in (1e2, 1e3, 1e4):
        p_mu, p_cov = activation_moments(k * mean, k * k * cov, "probit")  # Phi(k z)
        g_mu, g_cov = activation_moments(k * mean, k * k * cov, "gelu")  # k z Phi(k z) = k * (z Phi(k z))
        errs.append(max(float((p_mu - h_mu).abs().max()), float((p_cov - h_cov).abs().max()),
                        float((g_mu / k - r_mu).abs().max()), float((g_cov / k**2 - r_cov).abs().max())))
    assert errs[-1] < 1e-4 and errs[0] > errs[1] > errs[2]


def _psd_and_gradcheck(activation: str, n: int) -> None:
    mean, cov = _law(n, 7, rows=1)
    _, c = activation_moments(mean, cov, activation)  # type: ignore[arg-type]
    assert float(torch.linalg.eigvalsh(c).min()) > -1e-12
    base = torch.linalg.cholesky(cov)[0]

    def f(m: torch.Tensor, lower: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        low = torch.tril(lower)
        return activation_moments(m, (low @ low.T)[None], activation)  # type: ignore[arg-type]

    args = (mean.clone().requires_grad_(), base.clone().requires_grad_())
    assert torch.autograd.gradcheck(f, args, atol=1e-6)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_moments_are_psd_and_differentiable(activation: str) -> None:
    # two units hold every kind of entry (a variance and a covariance: the 1-D and the bivariate closed forms);
    # gradcheck's cost grows as n^4, so the slow tier checks three
    _psd_and_gradcheck(activation, 2)


@pytest.mark.slow
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_moments_are_psd_and_differentiable_three_units(activation: str) -> None:
    _psd_and_gradcheck(activation, 3)


def _residual_check(s: int) -> None:
    gen = torch.Generator().manual_seed(0)
    n, h, p = 3, 4, 2
    mean, cov = _law(n, 9, scale=0.7)
    a, b = torch.randn(p, n, generator=gen, dtype=D), torch.randn(p, h, generator=gen, dtype=D)
    c, d = torch.randn(h, n, generator=gen, dtype=D), torch.randn(h, generator=gen, dtype=D)
    for act in ("gelu", "heaviside", "sine"):
        mu, cv = residual_layer_moments(mean, cov, a, b, c, d, act)  # type: ignore[arg-type]
        x = mean[:, None] + torch.randn(2, s, n, generator=gen, dtype=D) @ torch.linalg.cholesky(cov).transpose(1, 2)
        y = x @ a.T + activation_fn(x @ c.T + d, act) @ b.T
        ym = y.mean(1)
        dev = y - ym[:, None]
        yc = dev.transpose(1, 2) @ dev / (s - 1)
        se_c = (dev[..., :, None] * dev[..., None, :]).std(1) / s**0.5
        assert float(((mu - ym) / (torch.diagonal(yc, dim1=1, dim2=2) / s).sqrt()).abs().max()) < 5, act
        assert float(((cv - yc) / se_c).abs().max()) < 5, act
        # A = None is the plain layer B phi(Cx + d): B Cov(phi) B^T
        pm, pc = residual_layer_moments(mean, cov, None, b, c, d, act)  # type: ignore[arg-type]
        am, ac = activation_moments(mean @ c.T + d, c @ cov @ c.T, act)  # type: ignore[arg-type]
        assert torch.allclose(pm, am @ b.T, atol=1e-13) and torch.allclose(pc, b @ ac @ b.T, atol=1e-12)


def test_residual_layer_matches_monte_carlo_and_the_plain_layer() -> None:
    _residual_check(20_000)  # tolerances in standard errors: fewer draws only widen them


@pytest.mark.slow
def test_residual_layer_matches_monte_carlo_at_2e5() -> None:
    _residual_check(200_000)


def test_bad_input_is_one_config_error() -> None:
    mean, cov = _law(3, 1)
    with pytest.raises(ConfigError, match="symmetric"):
        activation_moments(mean, cov + torch.triu(torch.ones(3, 3, dtype=D), 1), "gelu")
    with pytest.raises(ConfigError, match="positive semi-definite"):
        activation_moments(mean, cov - 10 * torch.eye(3, dtype=D), "gelu")
    with pytest.raises(ConfigError, match="expected mean"):
        activation_moments(mean[:, :2], cov, "gelu")
    with pytest.raises(ConfigError, match="unknown activation"):
        activation_moments(mean, cov, "swish")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="positive variance"):
        activation_moments(mean, torch.zeros_like(cov), "heaviside")
    with pytest.raises(ConfigError, match="B must be"):
        residual_layer_moments(mean, cov, None, torch.ones(2, 5, dtype=D), torch.ones(4, 3, dtype=D),
                               torch.zeros(4, dtype=D), "gelu")
    with pytest.raises(ConfigError, match="A must be"):
        residual_layer_moments(mean, cov, torch.eye(2, dtype=D), torch.ones(3, 4, dtype=D), torch.ones(4, 3, dtype=D),
                               torch.zeros(4, dtype=D), "gelu")


# --- Gaussians ---------------------------------------------------------------------------------------------------
def test_gaussian_kl_and_its_floor() -> None:
    mean_p, cov_p = _law(3, 2)
    mean_q, cov_q = _law(3, 4)
    ref = torch.distributions.kl_divergence(torch.distributions.MultivariateNormal(mean_p, cov_p),
                                            torch.distributions.MultivariateNormal(mean_q, cov_q))
    assert torch.allclose(gaussian_kl(mean_p, cov_p, mean_q, cov_q), ref, rtol=1e-10)
    assert torch.isinf(gaussian_kl(mean_p, cov_p, mean_q, torch.zeros_like(cov_q))).all()
    # the floor: the KL of Gaussians fitted to n draws from N(0, I), averaged over repeats
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4000, 200, 3, generator=gen, dtype=D)
    acc = MomentAccumulator(torch.zeros(4000, 3, dtype=D))
    acc.update(x)
    m, c = acc.moments()
    assert torch.allclose(c[0], torch.cov(x[0].T), atol=1e-13)
    kl = gaussian_kl(m, c, torch.zeros(3, dtype=D), torch.eye(3, dtype=D))
    assert abs(float(kl.mean()) / kl_floor(3, 200) - 1) < 0.1


# --- propagation through nets ------------------------------------------------------------------------------------
def test_propagation_methods_on_a_residual_net() -> None:
    mean, cov = _law(4, 6, scale=0.3)
    # one block: exact moment matching is exact, so its KL to Monte Carlo is the sampling floor
    one = ResidualNet(4, 1, activation="gelu", seed=0)
    mc = mc_moments(one, mean, cov, 100_000, torch.Generator().manual_seed(1))
    assert float(gaussian_kl(*mc, *propagate(one, mean, cov, "exact")).max()) < 5 * kl_floor(4, 100_000)
    net = ResidualNet(4, 2, activation="gelu", seed=0)
    outs = {m: propagate(net, mean, cov, m) for m in ("exact", "linearize", "diag", "unscented")}
    mc = mc_moments(net, mean, cov, 100_000, torch.Generator().manual_seed(1), shift=outs["exact"][0])
    kl = {m: gaussian_kl(*mc, *o) for m, o in outs.items()}
    assert bool((kl["linearize"] > 10 * kl["exact"]).all()) and bool((kl["diag"] > 10 * kl["exact"]).all())
    diag_cov = outs["diag"][1]
    assert torch.equal(diag_cov, torch.diag_embed(torch.diagonal(diag_cov, dim1=1, dim2=2)))
    # linearisation is the net's Jacobian at the mean
    jac = torch.func.vmap(torch.func.jacrev(lambda v: net(v[None])[0]))(mean)
    assert torch.allclose(outs["linearize"][1], jac @ cov @ jac.transpose(1, 2), atol=1e-12)
    assert torch.allclose(outs["linearize"][0], net(mean), atol=1e-14)


def test_study_summaries() -> None:
    study = MomentPropagationStudy(n_nets=1, depth=1, mc_samples=1000, input_shape=(2,))
    recs = [{"scale": s, "net": 0, "exact": s**4, "linearize": 100 * s**2, "diag": 10.0, "unscented": s**3}
            for s in (0.01, 0.1, 1.0)]
    out = study.summarise(recs, "test")
    assert abs(out["test/kl_slope/linearize"] - 2) < 1e-9
    assert out["test/kl_slope_points/exact"] == 1  # only s = 1 is 10x above the floor 2.5e-3
    assert out["test/kl_ratio/linearize/s_0.1"] == pytest.approx(1e4) and out["test/kl/diag/s_0.01"] == pytest.approx(10)
    assert abs(out["test/kl_floor"] - kl_floor(2, 1000)) < 1e-15


# --- the VB net --------------------------------------------------------------------------------------------------
def _small_vbnn(activation: str = "relu", hidden: tuple[int, ...] = (4,)) -> DeterministicVBNN:
    """One hidden layer by default: its moments are exact (the pre-activations are Gaussian given the input)."""
    torch.manual_seed(0)
    net = DeterministicVBNN(hidden=hidden, activation=activation, init_std=1.0, mc_samples=200_000,  # type: ignore[arg-type]
                            input_shape=(3,), num_classes=2)
    with torch.no_grad():
        for p in net.b_mean:
            p.normal_(0, 0.3)
    return net


def test_vbnn_exact_predictive_matches_full_weight_sampling() -> None:
    net = _small_vbnn()
    x = torch.randn(2, 3, dtype=D)
    mean, cov = net.predictive(x, "exact")
    gen = torch.Generator().manual_seed(5)
    s = 20_000  # tolerances in standard errors
    h = x[:, None].expand(-1, s, -1)
    layers = net.layers()
    for i, (m, s2, bm, bs2) in enumerate(layers):
        # one weight matrix per draw, shared by both inputs: an independent route from the local reparameterisation
        w = m + s2.sqrt() * torch.randn(s, *m.shape, generator=gen, dtype=D)
        b = bm + bs2.sqrt() * torch.randn(s, *bm.shape, generator=gen, dtype=D)
        z = torch.einsum("nsi,soi->nso", h, w) + b
        h = z if i == len(layers) - 1 else torch.relu(z)
    ym = h.mean(1)
    dev = h - ym[:, None]
    yc = dev.transpose(1, 2) @ dev / (s - 1)
    se_c = (dev[..., :, None] * dev[..., None, :]).std(1) / s**0.5
    mean, cov = mean.detach(), cov.detach()
    assert float(((mean - ym) / (torch.diagonal(yc, dim1=1, dim2=2) / s).sqrt()).abs().max()) < 5
    assert float(((cov - yc) / se_c).abs().max()) < 5
    mc = net.mc_predictive(x, torch.Generator().manual_seed(6))
    assert float(gaussian_kl(*mc, mean, cov).max()) < 5 * kl_floor(2, net.mc_samples)
    assert float(gaussian_kl(*mc, *net.predictive(x, "diag")).min()) > 20 * kl_floor(2, net.mc_samples)


def test_vbnn_kl_and_expected_nll() -> None:
    net = _small_vbnn()
    ref = sum(torch.distributions.kl_divergence(torch.distributions.Normal(mu, v.sqrt()),
                                                torch.distributions.Normal(0.0, net.prior_std)).sum()
              for m, v, bm, bv in net.layers() for mu, v in ((m, v), (bm, bv)))
    assert torch.allclose(net.kl_divergence(), ref, rtol=1e-12)
    # the second-order softmax term against a 60 x 60 Gauss-Hermite quadrature, at a small covariance
    mean = torch.tensor([[0.3, -0.5]], dtype=D)
    cov = 1e-2 * torch.tensor([[[1.0, 0.3], [0.3, 0.5]]], dtype=D)
    x, w = np.polynomial.hermite_e.hermegauss(60)
    grid = torch.tensor(np.stack(np.meshgrid(x, x, indexing="ij"), -1).reshape(-1, 2))
    weights = torch.tensor(np.outer(w, w).reshape(-1)) / (2 * math.pi)
    f = mean + grid @ torch.linalg.cholesky(cov[0]).T
    ref_nll = -(weights * torch.log_softmax(f, -1)[:, 1]).sum()
    # the neglected fourth-order term is O(|cov|^2) = 1e-4
    assert abs(float(net.expected_nll(mean, cov, torch.tensor([1]))) - float(ref_nll)) < 1e-4


def test_protocol_and_diagnostic() -> None:
    net = _small_vbnn()
    net.mc_samples = 20_000
    assert isinstance(net, PredictiveMoments)
    assert isinstance(MomentPropagationStudy(n_nets=1, mc_samples=10, input_shape=(2,)), PredictiveMoments)
    diag = MomentPropagationError(methods=["exact", "diag"], max_rows=4)
    batch = (torch.randn(6, 3, dtype=D), torch.zeros(6, dtype=torch.long))
    trainer = SimpleNamespace(val_dataloaders=[batch])
    stats = diag.measure(trainer, net, None)  # type: ignore[arg-type]
    assert stats is not None and stats["rows"] == 4
    out = diag.finalize(stats)
    x = batch[0][:4]
    mc = net.predictive_moments((x,), "mc")
    ref = gaussian_kl(*mc, *net.predictive(x, "diag")).mean()
    assert abs(out["kl_diag"] - float(ref)) < 1e-12 and out["kl_exact"] < out["kl_diag"]
    with pytest.raises(ConfigError, match="methods"):
        MomentPropagationError(methods=["mc"])
