"""gamma-canonical Laplace (paper 004-10): canonical invariance, the special cases of gamma, the evidence against the
exact Bayesian linear-regression marginal likelihood, the GGN against a per-sample autograd loop, delta* against a
fine grid, the predictive against an explicit inverse, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import multivariate_normal

from datamodules.gap_regression import GapRegressionDataModule
from errors import ConfigError
from modules.canonical_laplace import (
    LaplaceFit,
    ReLUMLPClassifier,
    ReLUMLPRegressor,
    gamma_canonicalize,
    laplace_log_evidence,
)
from modules.canonical_laplace.functional import flat_parameters, jacobians
from modules.components.mlp import MLP
from modules.components.mlp_analysis import affine_layers, random_mlp, rescale_hidden
from modules.protocols import LaplaceEvidenceSource

DT = torch.float64


def random_log_alpha(net: MLP, seed: int, a: float = 2.0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    widths = [w.shape[0] for w, _ in affine_layers(net)[:-1]]
    return [(torch.rand(n, generator=gen, dtype=DT) * 2 - 1) * a for n in widths]


def test_rescaled_copies_have_the_same_canonical_parameters_and_function() -> None:
    net = random_mlp([5, 7, 6, 4, 3], seed=0, bias_scale=0.5)
    x = torch.randn(20, 5, dtype=DT)
    copies = [rescale_hidden(net, random_log_alpha(net, s)) for s in range(3)]
    for gamma in (0.0, 0.3, 0.5, 1.0):
        ref, ref_scale = gamma_canonicalize(net, gamma)
        assert torch.allclose(torch.exp(ref_scale) * flat_parameters(net), flat_parameters(ref), rtol=1e-13, atol=0)
        assert (ref(x) - net(x)).abs().max() < 1e-12
        for other in copies:
            can, scale = gamma_canonicalize(other, gamma)
            assert (flat_parameters(can) - flat_parameters(ref)).abs().max() < 1e-10
            assert torch.allclose(torch.exp(scale) * flat_parameters(other), flat_parameters(can), rtol=1e-13, atol=0)


def test_dead_neurons_stay_finite_and_invariant() -> None:
    net = random_mlp([4, 5, 5, 2], seed=1, bias_scale=0.5)
    with torch.no_grad():
        for lin, j in ((net.layers[0], 2), (net.layers[2], 0)):
            lin.weight[j].zero_()
            lin.bias[j].zero_()
    for gamma in (0.0, 0.5, 1.0):
        ref, _ = gamma_canonicalize(net, gamma)
        other, _ = gamma_canonicalize(rescale_hidden(net, random_log_alpha(net, 7)), gamma)
        assert torch.isfinite(flat_parameters(ref)).all()
        assert (flat_parameters(other) - flat_parameters(ref)).abs().max() < 1e-10


def test_gamma_zero_gives_unit_incoming_norms() -> None:
    net = random_mlp([5, 7, 6, 4, 3], seed=2, bias_scale=0.5)
    can, _ = gamma_canonicalize(rescale_hidden(net, random_log_alpha(net, 3)), 0.0)
    for w, b in affine_layers(can)[:-1]:
        norms = torch.cat([w.detach(), b.detach()[:, None]], 1).norm(dim=1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-13)


def test_one_hidden_layer_gamma_one_is_unit_outgoing_and_half_is_balanced() -> None:
    net = random_mlp([4, 9, 3], seed=3, bias_scale=0.5)
    (_, _), (w_out, _) = affine_layers(gamma_canonicalize(net, 1.0)[0])
    assert torch.allclose(w_out.detach().norm(dim=0), torch.ones(9, dtype=DT), atol=1e-13)
    (w_in, b_in), (w_out, _) = affine_layers(gamma_canonicalize(net, 0.5)[0])
    incoming = torch.cat([w_in.detach(), b_in.detach()[:, None]], 1).norm(dim=1)
    assert torch.allclose(incoming, w_out.detach().norm(dim=0), rtol=1e-12)


def test_evidence_without_hidden_layers_is_the_exact_bayesian_linear_regression_marginal_likelihood() -> None:
    gen = torch.Generator().manual_seed(4)
    n, d, delta, sigma = 30, 3, 0.7, 0.4
    x = torch.randn(n, d, generator=gen, dtype=DT)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=DT) + 0.3 + sigma * torch.randn(n, generator=gen, dtype=DT)
    phi = torch.cat([x, torch.ones(n, 1, dtype=DT)], 1)  # parameters() order: W (1, d), then b
    theta = torch.linalg.solve(phi.T @ phi / sigma**2 + delta * torch.eye(d + 1, dtype=DT), phi.T @ y / sigma**2)
    net = MLP(d, 1, hidden=[]).double()
    with torch.no_grad():
        net.layers[0].weight.copy_(theta[:d][None])
        net.layers[0].bias.copy_(theta[d:])
    exact = multivariate_normal(mean=torch.zeros(n).numpy(),
                                cov=(sigma**2 * torch.eye(n, dtype=DT) + phi @ phi.T / delta).numpy()).logpdf(y.numpy())
    got = laplace_log_evidence(net, x, y, "gaussian", delta=delta, sigma_noise=sigma)
    assert abs(float(got) - exact) < 1e-9
    fit = LaplaceFit.at(net, x, y[:, None], "gaussian", sigma)
    assert abs(fit.log_evidence(delta) - exact) < 1e-9  # the Gram-spectrum path, P = 4 < N = 30: the primal branch


def _per_sample_ggn(net: MLP, x: torch.Tensor, y: torch.Tensor, likelihood: str, sigma: float) -> torch.Tensor:
    """sum_n J_n^T Lambda_n J_n with J_n from autograd one sample at a time and Lambda_n the autograd Hessian of the
    sample's NLL in its outputs."""
    names = [k for k, _ in net.named_parameters()]
    shapes = [p.shape for p in net.parameters()]
    sizes = [p.numel() for p in net.parameters()]
    theta = flat_parameters(net)
    total = torch.zeros(len(theta), len(theta), dtype=DT)
    for i in range(len(x)):
        def f(flat: torch.Tensor, xi: torch.Tensor = x[i : i + 1]) -> torch.Tensor:
            parts = torch.split(flat, sizes)
            params = {k: t.reshape(s) for k, t, s in zip(names, parts, shapes, strict=True)}
            return torch.func.functional_call(net, params, (xi,))[0]

        jac = torch.autograd.functional.jacobian(f, theta)
        out = f(theta).detach()

        def nll(o: torch.Tensor, yi: torch.Tensor = y[i]) -> torch.Tensor:
            if likelihood == "gaussian":
                return 0.5 * ((o - yi) ** 2).sum() / sigma**2
            return -torch.log_softmax(o, -1)[yi]

        lam = torch.autograd.functional.hessian(nll, out)
        total += jac.T @ lam @ jac
    return total


@pytest.mark.parametrize("likelihood", ["gaussian", "categorical"])
def test_ggn_matches_a_per_sample_autograd_loop(likelihood: str) -> None:
    gen = torch.Generator().manual_seed(5)
    k = 1 if likelihood == "gaussian" else 3
    net = random_mlp([3, 6, 5, k], seed=5, bias_scale=0.5)
    x = torch.randn(12, 3, generator=gen, dtype=DT)
    y = torch.randn(12, 1, generator=gen, dtype=DT) if k == 1 else torch.randint(0, 3, (12,), generator=gen)
    fit = LaplaceFit.at(net, x, y, likelihood, 0.3)
    ref = _per_sample_ggn(net, x, y, likelihood, 0.3)
    assert (fit.hessian - ref).abs().max() < 1e-10 * ref.abs().max()
    # the Gram spectrum (N K < P here) against the dense eigenvalues
    dense = torch.linalg.eigvalsh(ref)
    top = dense[-len(fit.spectrum):]
    assert torch.allclose(fit.spectrum.sort().values, top, rtol=1e-8, atol=1e-10 * float(dense[-1]))


def test_optimal_delta_is_the_maximum_of_a_fine_grid_and_both_evidence_paths_agree() -> None:
    gen = torch.Generator().manual_seed(6)
    net = random_mlp([3, 8, 8, 1], seed=6, bias_scale=0.5)
    x = torch.randn(40, 3, generator=gen, dtype=DT)
    y = net(x).detach() + 0.2 * torch.randn(40, 1, generator=gen, dtype=DT)
    fit = LaplaceFit.at(net, x, y, "gaussian", 0.2)
    best = fit.optimal_delta()
    grid = torch.logspace(-4, 4, 321, dtype=DT)  # steps of 0.025 decades
    values = torch.stack([fit.log_evidence_direct(float(d)) for d in grid])
    assert abs(math.log(float(grid[values.argmax()])) - math.log(best)) <= math.log(10) * 0.025 + 1e-12
    assert fit.log_evidence(best) >= float(values.max()) - 1e-9
    for d in (1e-3, best, 10.0):
        assert abs(fit.log_evidence(d) - float(fit.log_evidence_direct(d))) < 1e-8


def test_predictive_variance_equals_the_explicit_inverse() -> None:
    gen = torch.Generator().manual_seed(7)
    net = random_mlp([2, 10, 10, 2], seed=7, bias_scale=0.5)
    x = torch.randn(15, 2, generator=gen, dtype=DT)
    y = torch.randint(0, 2, (15,), generator=gen)
    fit = LaplaceFit.at(net, x, y, "categorical", 1.0)
    xs = torch.randn(6, 2, generator=gen, dtype=DT)
    _, var = fit.predictive_variance(xs, 0.5)
    _, jac = jacobians(net, xs)
    sigma = torch.linalg.inv(fit.hessian + 0.5 * torch.eye(fit.n_params, dtype=DT))
    ref = torch.einsum("mkp,pq,mkq->mk", jac, sigma, jac)
    assert torch.allclose(var, ref, rtol=1e-9)


def test_canonical_evidence_equals_the_original_coordinates_formula() -> None:
    gen = torch.Generator().manual_seed(8)
    net = random_mlp([3, 6, 5, 1], seed=8, bias_scale=0.5)
    x = torch.randn(25, 3, generator=gen, dtype=DT)
    y = net(x).detach() + 0.1 * torch.randn(25, 1, generator=gen, dtype=DT)
    delta, sigma, gamma = 0.8, 0.3, 0.5
    _, log_scale = gamma_canonicalize(net, gamma)
    d = torch.exp(log_scale)
    fit = LaplaceFit.at(net, x, y, "gaussian", sigma)
    theta = flat_parameters(net)
    expected = (fit.log_lik - 0.5 * delta * float((d * theta).square().sum()) + 0.5 * len(theta) * math.log(delta)
                + float(log_scale.sum()) - 0.5 * float(torch.logdet(fit.hessian + delta * torch.diag(d**2))))
    got = laplace_log_evidence(net, x, y, "gaussian", delta=delta, gamma=gamma, sigma_noise=sigma)
    assert abs(float(got) - expected) < 1e-8


def test_the_rescaling_study_collapses_the_canonical_spread() -> None:
    gen = torch.Generator().manual_seed(9)
    task = ReLUMLPRegressor(hidden=[6, 6], input_shape=(3,), num_classes=1, n_rescalings=3, gamma_grid=[0.0, 1.0])
    assert isinstance(task, LaplaceEvidenceSource)
    x, xt = torch.randn(30, 3, generator=gen, dtype=DT), torch.randn(10, 3, generator=gen, dtype=DT)
    y, yt = torch.randn(30, 1, generator=gen, dtype=DT), torch.randn(10, 1, generator=gen, dtype=DT)
    out = task.rescaling_study(x, y, xt, yt)
    assert out["max_abs_pred_diff"] < 1e-12
    for q in ("log_evidence", "delta", "pred_std"):
        assert out[f"canonical/max_rel_spread_{q}"] < 1e-9
    assert out["standard/log_evidence_spread"] > 1e-3  # the rescalings move standard EB
    assert out["selected/gamma"] in (0.0, 1.0)
    clf = ReLUMLPClassifier(hidden=[4], input_shape=(3,), num_classes=2, n_rescalings=2, gamma_grid=[0.5])
    labels = torch.randint(0, 2, (30,), generator=gen)
    out = clf.rescaling_study(x, labels, xt, labels[:10])
    assert out["canonical/max_rel_spread_delta"] < 1e-9
    assert set(clf.laplace_evidence((x, labels))) == {"standard/log_evidence", "standard/log_delta",
                                                     "g0.5/log_evidence", "g0.5/log_delta"}


def test_gap_regression_inputs_leave_the_gap_empty() -> None:
    dm = GapRegressionDataModule(n_train=100, n_val=10, n_test=50)
    x, y = dm._split("train")
    assert x.shape == (100, 1) and y.shape == (100, 1) and dm.num_classes == 1
    assert ((x.abs() >= 1) & (x.abs() <= 3)).all() and (x < 0).any() and (x > 0).any()
    xt, _ = dm._split("test")
    assert (xt.abs() < 1).any() and (xt.abs() <= 4).all()


def test_bad_input_is_one_line() -> None:
    net = random_mlp([3, 4, 1], seed=0)
    x, y = torch.randn(5, 3, dtype=DT), torch.randn(5, 1, dtype=DT)
    with pytest.raises(ConfigError, match=r"gamma must lie in \[0, 1\]"):
        gamma_canonicalize(net, 1.5)
    with pytest.raises(ConfigError, match="needs a ReLU MLP"):
        gamma_canonicalize(random_mlp([3, 4, 1], activation="gelu"), 0.5)
    with pytest.raises(ConfigError, match="delta must be > 0"):
        laplace_log_evidence(net, x, y, delta=0.0)
    with pytest.raises(ConfigError, match="float targets of shape"):
        laplace_log_evidence(net, x, torch.randn(5, 2, dtype=DT))
    with pytest.raises(ConfigError, match="integer labels"):
        laplace_log_evidence(random_mlp([3, 4, 2]), x, torch.randn(5, dtype=DT), "categorical")
    with pytest.raises(ConfigError, match="beyond 5000"):
        laplace_log_evidence(random_mlp([3, 100, 60, 1]), x, y)
    with pytest.raises(ConfigError, match="narrower model.hidden"):
        ReLUMLPRegressor(hidden=[100, 60], input_shape=(3,))
    with pytest.raises(ConfigError, match="gamma_grid"):
        ReLUMLPRegressor(gamma_grid=[-0.1])
