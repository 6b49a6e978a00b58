"""modules/components/pde.py: sampler, derivatives, residual losses, problems and metrics against closed forms."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch
import torch.nn.functional as F

from datamodules.collocation import CollocationSampler, uniform_grid
from errors import ConfigError
from modules.components.pde import (
    AllenCahn,
    Burgers,
    MaxAbsError,
    Poisson,
    RelativeL2Error,
    derivative,
    divergence,
    make_problem,
    residual_loss,
    residual_penalty,
)

X = sp.Symbol("x")


def test_sampler_draws_fresh_points_in_the_box_and_replays_a_stream():
    s = CollocationSampler(n=2048, low=-1.0, high=1.0, seed=3)
    a, b = s(), s()
    assert a.shape == (2048, 1) and not torch.equal(a, b)
    assert a.min() >= -1 and a.max() <= 1
    # uniform: mean 0 +- 4 standard errors (1/sqrt(3 n)), variance 1/3
    assert abs(a.mean().item()) < 4 / math.sqrt(3 * 2048)
    assert abs(a.var().item() - 1 / 3) < 0.03
    s.reseed(5)
    c = s()
    s.reseed(5)
    assert torch.equal(c, s())
    box = CollocationSampler(n=100, low=2.0, high=3.0, dim=2, dtype=torch.float64)()
    assert box.shape == (100, 2) and box.dtype == torch.float64 and (box >= 2).all() and (box <= 3).all()


def test_sampler_and_grid_reject_bad_domains():
    with pytest.raises(ConfigError, match="low < high"):
        CollocationSampler(low=1.0, high=1.0)
    with pytest.raises(ConfigError, match="n > 0"):
        CollocationSampler(n=0)
    with pytest.raises(ConfigError, match="at least 2"):
        uniform_grid(1)
    g = uniform_grid(4096)
    assert g.shape == (4096, 1) and g[0, 0] == -1 and g[-1, 0] == 1


def test_derivatives_match_sympy():
    expr = sp.sin(3 * X) * sp.exp(X / 2) + X**4
    x = torch.linspace(-1, 1, 33, dtype=torch.float64)[:, None].requires_grad_(True)
    u = torch.sin(3 * x) * torch.exp(x / 2) + x**4
    for order in (1, 2, 3):
        f = sp.lambdify(X, sp.diff(expr, X, order), "math")
        expected = torch.tensor([[f(float(v))] for v in x.detach()[:, 0]], dtype=torch.float64)
        assert torch.allclose(derivative(u, x, order), expected, atol=1e-11)
    # a vector field: div (x1^2 x2, sin x2) = 2 x1 x2 + cos x2
    p = torch.randn(10, 2, dtype=torch.float64, requires_grad=True)
    v = torch.stack([p[:, 0] ** 2 * p[:, 1], torch.sin(p[:, 1])], dim=1)
    assert torch.allclose(divergence(v, p), 2 * p[:, 0] * p[:, 1] + torch.cos(p[:, 1]))


def test_residual_losses_match_their_closed_forms():
    r = torch.tensor([-5.0, -1.0, -0.3, 0.0, 0.2, 0.9, 4.0], dtype=torch.float64)
    c = 0.5
    assert residual_loss(r, "l2").item() == pytest.approx((r**2).mean().item())
    assert residual_loss(r, "l1").item() == pytest.approx(r.abs().mean().item())
    assert torch.allclose(residual_penalty(r, "huber", c), F.huber_loss(r, torch.zeros_like(r), reduction="none", delta=c))
    cauchy = [c**2 / 2 * math.log(1 + (v / c) ** 2) for v in r.tolist()]
    assert torch.allclose(residual_penalty(r, "cauchy", c), torch.tensor(cauchy, dtype=torch.float64))
    small = torch.tensor([1e-4], dtype=torch.float64)  # both robust losses are r^2 / 2 near zero
    assert residual_penalty(small, "cauchy", 1.0).item() == pytest.approx(0.5e-8, rel=1e-6)
    assert residual_penalty(small, "huber", 1.0).item() == pytest.approx(0.5e-8, rel=1e-12)
    # robust: the Cauchy penalty grows like log |r|, Huber linearly
    big = torch.tensor([1e3, 1e6], dtype=torch.float64)
    ratio = residual_penalty(big, "cauchy", 1.0)
    assert ratio[1] / ratio[0] == pytest.approx(math.log(1e12) / math.log(1e6), rel=1e-3)
    with pytest.raises(ConfigError, match="unknown residual loss"):
        residual_loss(r, "l3")
    with pytest.raises(ConfigError, match="positive"):
        residual_loss(r, "cauchy", 0.0)


@pytest.mark.parametrize("problem", [AllenCahn(1.0), AllenCahn(0.05), Poisson(), Burgers(0.1), Burgers(0.02)],
                         ids=["ac1", "ac0.05", "poisson", "burgers0.1", "burgers0.02"])
def test_exact_solutions_solve_their_problems(problem):
    x = torch.linspace(-1, 1, 257, dtype=torch.float64)[:, None]
    r = problem.residual(problem.exact, x)
    assert r.shape == (257,) and r.abs().max() < 1e-9
    xb, gb = problem.boundary(torch.float64)
    assert torch.allclose(gb, problem.exact(xb))


def test_problem_residuals_match_sympy_for_a_non_solution():
    u = sp.cos(2 * X) + X**3 / 3
    x = torch.linspace(-1, 1, 21, dtype=torch.float64)[:, None]

    def u_t(z):
        return torch.cos(2 * z) + z**3 / 3

    f_sym = -(sp.pi**2) * sp.sin(sp.pi * X) - sp.Rational(1, 4) * 16 * sp.pi**2 * sp.sin(4 * sp.pi * X)
    cases = [
        (AllenCahn(0.2), sp.Rational(1, 25) * sp.diff(u, X, 2) + u - u**3),
        (Poisson(), sp.diff(u, X, 2) - f_sym),
        (Burgers(0.1), sp.Rational(1, 10) * sp.diff(u, X, 2) - u * sp.diff(u, X)),
    ]
    for problem, expr in cases:
        f = sp.lambdify(X, expr, "math")
        expected = torch.tensor([f(float(v)) for v in x[:, 0]], dtype=torch.float64)
        assert torch.allclose(problem.residual(u_t, x), expected, atol=1e-10), problem.name
    # the manufactured Poisson solution has u'' = f
    f_exact = sp.lambdify(X, sp.diff(sp.sin(sp.pi * X) + sp.sin(4 * sp.pi * X) / 4, X, 2) - f_sym, "math")
    assert max(abs(f_exact(float(v))) for v in x[:, 0]) < 1e-10


def test_make_problem_names_the_choices():
    assert make_problem("burgers", 0.3).nu == 0.3
    with pytest.raises(ConfigError, match="unknown pde 'heat'"):
        make_problem("heat", 1.0)
    with pytest.raises(ConfigError, match="eps > 0"):
        make_problem("allen_cahn", 0.0)


def test_error_metrics_accumulate_over_batches():
    u = torch.randn(100, dtype=torch.float64)
    v = u + 0.1 * torch.randn(100, dtype=torch.float64)
    rel, mx = RelativeL2Error(), MaxAbsError()
    for a, b in zip(u.split(30), v.split(30)):
        rel.update(b, a)
        mx.update(b, a)
    assert rel.compute().item() == pytest.approx(((v - u).norm() / u.norm()).item(), rel=1e-12)
    assert mx.compute().item() == pytest.approx((v - u).abs().max().item())
