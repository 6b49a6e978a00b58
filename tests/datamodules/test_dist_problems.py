"""The quadratic of ``datamodules.dist_problems`` in a random orthonormal basis (``rotate``): the same problem,
checked against dense matrices built independently (A = Q diag(lambda) Q^T, its eigenvalues, its minimiser by a
linear solve), and no longer coordinate-separable."""

from __future__ import annotations

import pytest
import torch

from datamodules.dist_problems import DistProblemDataModule, QuadraticProblem, make_quadratic, random_basis
from errors import ConfigError


def _hessian(problem: QuadraticProblem) -> torch.Tensor:
    """The Hessian of f from gradient differences (exact for a quadratic): column j = grad f(e_j) - grad f(0)."""
    d = problem.dim
    g0 = problem.grad(torch.zeros(d, dtype=torch.float64))
    return torch.stack([problem.grad(torch.eye(d, dtype=torch.float64)[j]) - g0 for j in range(d)], dim=1)


def test_random_basis_is_orthogonal_seeded_and_changes_with_the_seed() -> None:
    q = random_basis(30, 3)
    assert torch.allclose(q.T @ q, torch.eye(30, dtype=torch.float64), atol=1e-12)
    assert torch.equal(q, random_basis(30, 3))
    assert not torch.allclose(q, random_basis(30, 4))


@pytest.mark.parametrize("heterogeneity", [0.0, 0.7])
def test_rotation_keeps_spectrum_optimum_and_start_and_rotates_the_gradient(heterogeneity: float) -> None:
    """The rotated problem is f_rot(x) = f_diag(Q^T x) with x0_rot = Q x0_diag: its Hessian (by gradient
    differences) has the diagonal problem's eigenvalues (dense eigvalsh) but is not diagonal; its minimiser (a
    dense linear solve) is Q x*_diag with the same f*; f(x0), |grad f(x0)| and the functional constants are
    unchanged; and every worker's gradient is the closed form Q (a_i * Q^T x - b_i) = Q grad f_i^diag(Q^T x)."""
    n, d, seed = 4, 40, 5
    kw = dict(dim=d, sigma=0.0, heterogeneity=heterogeneity, seed=seed)
    diag, rot = make_quadratic(n, **kw), make_quadratic(n, rotate=True, **kw)
    q = random_basis(d, seed)

    hess = _hessian(rot)
    assert torch.allclose(hess, hess.T, atol=1e-12)
    assert torch.allclose(torch.linalg.eigvalsh(hess), diag.abar.sort().values, atol=1e-10)
    dense = q @ torch.diag(diag.abar) @ q.T
    assert torch.allclose(hess, dense, atol=1e-12)
    off = hess - torch.diag(torch.diagonal(hess))
    assert float(off.abs().max()) > 1e-2  # coupled coordinates: no longer separable

    b_dense = q @ diag.bbar
    x_star = torch.linalg.solve(dense, b_dense)
    assert torch.allclose(rot.x_star, x_star, atol=1e-10)
    assert rot.f_star == pytest.approx(diag.f_star, abs=1e-12)
    assert rot.loss(x_star) == pytest.approx(rot.f_star, abs=1e-10)
    assert float(rot.grad(rot.x_star).abs().max()) < 1e-10
    assert rot.loss(rot.x0()) == pytest.approx(diag.loss(diag.x0()), rel=1e-12)
    assert float(rot.grad(rot.x0()).norm()) == pytest.approx(float(diag.grad(diag.x0()).norm()), rel=1e-12)
    assert rot.functional_constants() == pytest.approx(diag.functional_constants())
    assert torch.allclose(rot.x0(), q @ diag.x0(), atol=1e-12)

    gen = torch.Generator().manual_seed(0)
    ys = torch.randn(n, d, generator=gen, dtype=torch.float64)
    xs = ys @ q.T  # rows x_i = Q y_i
    a = diag.a.expand(n, d)
    b = diag.b.expand(n, d)
    by_hand = torch.stack([q @ (a[i] * (q.T @ xs[i]) - b[i]) for i in range(n)])
    assert torch.allclose(rot.worker_grads(xs), by_hand, atol=1e-12)
    assert torch.allclose(rot.worker_grads(xs), diag.worker_grads(ys) @ q.T, atol=1e-12)
    assert torch.allclose(rot.worker_grads(xs[[2, 0]], [2, 0]), by_hand[[2, 0]], atol=1e-12)
    for i in range(n):
        assert torch.allclose(rot.worker_grad(xs[i], i), by_hand[i], atol=1e-12)
    assert torch.allclose(rot.grad(xs[0]), dense @ xs[0] - b_dense, atol=1e-12)
    assert rot.loss(xs[0]) == pytest.approx(float(0.5 * xs[0] @ dense @ xs[0] - b_dense @ xs[0]), rel=1e-12)


def test_the_low_rank_product_of_the_default_spectrum_equals_the_dense_one() -> None:
    """d = 200 with 10 % slow eigenvalues: the homogeneous rotated problem multiplies through the 20 directions
    off the common value L; the result is the dense Q diag(lambda) Q^T x."""
    rot = make_quadratic(3, dim=200, sigma=0.0, rotate=True, seed=1)
    assert rot._split is not None and rot._split[1].shape == (200, 19)  # the 20th slow value is L itself
    q = random_basis(200, 1)
    dense = q @ torch.diag(rot.abar) @ q.T
    xs = torch.randn(3, 200, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert torch.allclose(rot.worker_grads(xs), xs @ dense.T, atol=1e-12)


def test_the_heterogeneity_draws_do_not_move_with_rotate() -> None:
    diag = make_quadratic(3, dim=20, heterogeneity=0.5, seed=2)
    rot = make_quadratic(3, dim=20, heterogeneity=0.5, seed=2, rotate=True)
    assert torch.equal(diag.a, rot.a) and torch.equal(diag.b, rot.b)


def test_rotate_through_the_datamodule_and_on_digits_is_an_error() -> None:
    problem = DistProblemDataModule(dim=12, rotate=True, problem_seed=4).build_problem(2)
    assert isinstance(problem, QuadraticProblem) and problem.basis is not None
    assert torch.equal(problem.basis, random_basis(12, 4))
    with pytest.raises(ConfigError, match="rotate applies to problem: quadratic"):
        DistProblemDataModule(problem="digits", rotate=True)
