"""Physics-informed building blocks: autograd derivatives, residual losses, PDE problems (collocation points are
data: ``datamodules.collocation``).

- ``grad``, ``derivative``, ``divergence``: derivatives of network outputs with respect to their inputs by
  autograd, with the graph kept (``create_graph=True``) so a loss built on them trains the network;
- ``residual_loss(r, kind, scale)``: the robust penalties of a residual ``r``

  ==========  ==========================================================
  ``l2``      mean r^2
  ``l1``      mean |r|
  ``huber``   mean h_c(r), h_c(r) = r^2/2 for |r| <= c, c(|r| - c/2) else
  ``cauchy``  mean rho_c(r), rho_c(r) = (c^2/2) log(1 + (r/c)^2)
  ==========  ==========================================================

  (``c = scale``; for small residuals Huber and Cauchy are r^2/2, half of ``l2``);
- 1-D boundary-value problems with closed-form solutions (``AllenCahn``, ``Poisson``, ``Burgers``): the
  residual, the Dirichlet data and the exact solution ``u*`` of each;
- ``RelativeL2Error``, ``MaxAbsError``: torchmetrics accumulating in float64 over an evaluation grid.

Derivatives are taken of ``u.sum()`` with respect to the batch of inputs, which is the per-point derivative
only for networks that treat points independently (no batch normalisation across points).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor
from torchmetrics import Metric

from errors import ConfigError

LossKind = Literal["l2", "l1", "huber", "cauchy"]
LOSS_KINDS: tuple[str, ...] = ("l2", "l1", "huber", "cauchy")
PDE_NAMES: tuple[str, ...] = ("allen_cahn", "poisson", "burgers")


# --- derivatives --------------------------------------------------------------------------------------------
def as_input(x: Tensor) -> Tensor:
    """``x`` ready for differentiation: itself if it already takes part in a graph, else a leaf copy."""
    return x if x.requires_grad else x.detach().clone().requires_grad_(True)


def grad(y: Tensor, x: Tensor) -> Tensor:
    """``d(sum y)/dx`` with the graph kept, so the result can be differentiated again and trained on.

    Zero (not an error) where ``y`` does not depend on ``x``.
    """
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def derivative(y: Tensor, x: Tensor, order: int = 1) -> Tensor:
    """The ``order``-th derivative of a scalar field ``y (N,)`` or ``(N, 1)`` w.r.t. 1-D points ``x (N, 1)``.

    Returns ``(N, 1)``.
    """
    if order < 1:
        raise ConfigError(f"derivative order must be >= 1, got {order}")
    out = y.reshape(-1, 1)
    for _ in range(order):
        out = grad(out, x)
    return out


def divergence(v: Tensor, x: Tensor) -> Tensor:
    """``div v = sum_i dv_i/dx_i`` of a vector field ``v (N, d)`` at ``x (N, d)``; returns ``(N,)``."""
    return sum(grad(v[:, i], x)[:, i] for i in range(v.shape[1]))


def check_points(x: Tensor, name: str = "x", dim: int | None = None) -> None:
    """``x`` is a finite ``(N, dim)`` floating tensor with N >= 1, or a ``ConfigError`` says what is wrong."""
    if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[0] == 0 or (dim is not None and x.shape[1] != dim):
        want = f"(N, {dim})" if dim is not None else "(N, d)"
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ConfigError(f"{name} must be a tensor of shape {want} with N >= 1 points, got {got}")
    if not x.is_floating_point():
        raise ConfigError(f"{name} must be a floating-point tensor (float32 or float64), got {x.dtype}")
    if not torch.isfinite(x).all():
        raise ConfigError(f"{name} contains NaN or infinite points: pass finite collocation points")


# --- residual losses ----------------------------------------------------------------------------------------
def residual_penalty(r: Tensor, kind: str = "l2", scale: float = 1.0) -> Tensor:
    """The pointwise penalty of residuals ``r`` (same shape): r^2, |r|, Huber h_c(r) or Cauchy rho_c(r)."""
    if kind not in LOSS_KINDS:
        raise ConfigError(f"unknown residual loss {kind!r}; choose one of {list(LOSS_KINDS)}")
    if not scale > 0:
        raise ConfigError(f"the residual loss scale c must be positive, got {scale}")
    if kind == "l2":
        return r.square()
    if kind == "l1":
        return r.abs()
    if kind == "huber":
        a = r.abs()
        return torch.where(a <= scale, 0.5 * r.square(), scale * (a - 0.5 * scale))
    return 0.5 * scale**2 * torch.log1p((r / scale).square())


def residual_loss(r: Tensor, kind: str = "l2", scale: float = 1.0) -> Tensor:
    """Mean of ``residual_penalty(r, kind, scale)`` over all entries."""
    return residual_penalty(r, kind, scale).mean()


# --- problems -----------------------------------------------------------------------------------------------
Field = Callable[[Tensor], Tensor]


class BoundaryValueProblem:
    """A 1-D Dirichlet problem on ``[low, high]``: a residual operator, boundary data and the exact solution.

    ``residual(u, x)`` takes the network ``u: (N, 1) -> (N, 1) or (N,)`` and points ``x (N, 1)`` and returns
    ``(N,)``; ``exact(x)`` is ``u*(x)`` as ``(N,)``; the boundary values are ``exact`` at the two ends.
    """

    name: str = "problem"
    low: float = -1.0
    high: float = 1.0

    def residual(self, u: Field, x: Tensor) -> Tensor:
        raise NotImplementedError

    def exact(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def boundary(self, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
        """``(x_b (2, 1), u*(x_b) (2,))`` at the two ends of the interval."""
        xb = torch.tensor([[self.low], [self.high]], dtype=dtype)
        return xb, self.exact(xb)


def _eval(u: Field, x: Tensor) -> Tensor:
    out = u(x)
    if out.shape not in ((x.shape[0],), (x.shape[0], 1)):
        raise ConfigError(f"u must map (N, 1) points to (N, 1) or (N,) values, got {tuple(out.shape)} for N={x.shape[0]}")
    return out.reshape(-1)


class AllenCahn(BoundaryValueProblem):
    """Stationary Allen-Cahn ``eps^2 u'' + u - u^3 = 0`` on [-1, 1], ``u(+-1) = tanh(+-1/(sqrt 2 eps))``.

    Exact solution ``u*(x) = tanh(x / (sqrt 2 eps))``: with ``z = x/(sqrt 2 eps)``,
    ``u'' = -2 tanh(z) sech^2(z) / (2 eps^2) = -u (1 - u^2) / eps^2``. The transition layer has width ~eps.
    """

    name = "allen_cahn"

    def __init__(self, eps: float = 1.0) -> None:
        if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
            raise ConfigError(f"Allen-Cahn needs eps > 0, got {eps}")
        self.eps = float(eps)

    def residual(self, u: Field, x: Tensor) -> Tensor:
        x = as_input(x)
        v = _eval(u, x)
        return self.eps**2 * derivative(v, x, 2).reshape(-1) + v - v**3

    def exact(self, x: Tensor) -> Tensor:
        return torch.tanh(x.reshape(-1) / (math.sqrt(2.0) * self.eps))


class Poisson(BoundaryValueProblem):
    """1-D Poisson ``u'' = f`` on [-1, 1] with the manufactured two-frequency solution
    ``u*(x) = sin(pi x) + a sin(k pi x)`` (``k`` an integer, so ``u*(+-1) = 0``),
    ``f = -pi^2 sin(pi x) - a k^2 pi^2 sin(k pi x)``. ``eps`` is unused (kept for a uniform signature).
    """

    name = "poisson"

    def __init__(self, amplitude: float = 0.25, frequency: int = 4) -> None:
        if frequency < 1 or int(frequency) != frequency:
            raise ConfigError(f"the Poisson solution's frequency must be a positive integer, got {frequency}")
        self.a, self.k = float(amplitude), int(frequency)

    def forcing(self, x: Tensor) -> Tensor:
        x = x.reshape(-1)
        return -(math.pi**2) * torch.sin(math.pi * x) - self.a * (self.k * math.pi) ** 2 * torch.sin(self.k * math.pi * x)

    def residual(self, u: Field, x: Tensor) -> Tensor:
        x = as_input(x)
        v = _eval(u, x)
        return derivative(v, x, 2).reshape(-1) - self.forcing(x)

    def exact(self, x: Tensor) -> Tensor:
        x = x.reshape(-1)
        return torch.sin(math.pi * x) + self.a * torch.sin(self.k * math.pi * x)


class Burgers(BoundaryValueProblem):
    """Steady viscous Burgers ``nu u'' - u u' = 0`` on [-1, 1] with the standing shock
    ``u*(x) = -tanh(x / (2 nu))`` (``nu u'' = u u' = tanh sech^2 / (2 nu)``); shock width ~nu.
    """

    name = "burgers"

    def __init__(self, nu: float = 0.1) -> None:
        if not (math.isfinite(nu) and nu > 0):
            raise ConfigError(f"Burgers needs a viscosity nu > 0, got {nu}")
        self.nu = float(nu)

    def residual(self, u: Field, x: Tensor) -> Tensor:
        x = as_input(x)
        v = _eval(u, x)
        du = derivative(v, x, 1)
        return (self.nu * derivative(du, x, 1) - v.reshape(-1, 1) * du).reshape(-1)

    def exact(self, x: Tensor) -> Tensor:
        return -torch.tanh(x.reshape(-1) / (2.0 * self.nu))


def make_problem(pde: str, eps: float) -> BoundaryValueProblem:
    """``allen_cahn`` (eps = Allen-Cahn's eps), ``poisson`` (eps unused) or ``burgers`` (eps = viscosity nu)."""
    if pde == "allen_cahn":
        return AllenCahn(eps)
    if pde == "poisson":
        return Poisson()
    if pde == "burgers":
        return Burgers(eps)
    raise ConfigError(f"unknown pde {pde!r}; choose one of {list(PDE_NAMES)}")


# --- metrics ------------------------------------------------------------------------------------------------
class RelativeL2Error(Metric):
    """``||u - u*|| / ||u*||`` over every point of every update (sums in float64, summed across ranks)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("err", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("ref", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        p, t = preds.detach().double().reshape(-1), target.detach().double().reshape(-1)
        self.err += (p - t).square().sum()
        self.ref += t.square().sum()

    def compute(self) -> Tensor:
        return (self.err / self.ref.clamp_min(1e-300)).sqrt()


class MaxAbsError(Metric):
    """``max |u - u*|`` over every point of every update (max across ranks)."""

    full_state_update = False
    higher_is_better = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("value", torch.zeros((), dtype=torch.float64), dist_reduce_fx="max")

    def update(self, preds: Tensor, target: Tensor) -> None:
        diff = (preds.detach().double().reshape(-1) - target.detach().double().reshape(-1)).abs()
        self.value = torch.maximum(self.value, diff.max())

    def compute(self) -> Tensor:
        return self.value
