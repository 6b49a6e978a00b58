"""ResidualCAN / Cauchy co-design (paper 000-02): Cauchy activations, robust residual losses and a dense
local-basis residual for low-dimensional scientific learning (PINNs and score learning).

PINN (``CauchyPINN``). A network ``u`` (``arch``) is trained on fresh collocation points ``x ~ U[-1, 1]``
every step to minimise

    L = mean_i rho(r(x_i)) + w_bc * mean_b (u(x_b) - g_b)^2,

with ``r`` the PDE residual and ``rho`` an L2, L1, Huber or Cauchy penalty
(``rho_c(r) = (c^2/2) log(1 + (r/c)^2)``, ``modules.components.pde``). PDEs (all with closed-form ``u*``):

- ``allen_cahn``: ``eps^2 u'' + u - u^3 = 0``, ``u(+-1) = tanh(+-1/(sqrt 2 eps))``, ``u* = tanh(x/(sqrt 2 eps))``;
- ``poisson``: ``u'' = f``, ``u* = sin(pi x) + 0.25 sin(4 pi x)`` (a boundary check away from layers);
- ``burgers``: steady viscous ``eps u'' - u u' = 0``, ``u* = -tanh(x / (2 eps))``.

``arch``: ``residual_can`` (``u = MLP_CauchyAct(x) + s sum_j softmax(a)_j (b1_j (x - c_j) + b2_j) /
((x - c_j)^2 + d_j^2)``, 32 grid-initialised centres, ``s = 0.1`` at init; ``residual_basis`` swaps the
Cauchy nodes for Gaussian bumps or removes them, ``activation`` swaps the main path's CauchyAct), ``mlp``
(any ``activation``), ``siren`` (sine layers, first-layer frequency ``siren_w0``), ``fourier`` (random
Fourier features of scale ``fourier_sigma`` into an MLP), ``kan`` (RBF-KAN).

Score learning (``CauchyScoreNet``). The OU process ``dx = -x dt + sqrt(2) dW`` carries a Gaussian mixture
``p_0`` to ``p_t``; a network ``s(x, t)`` learns ``grad log p_t`` with

- ``dsm``: denoising score matching, ``E ||sigma_t s(x_t, t) + z||^2``, ``x_t = e^{-t} x_0 + sigma_t z``,
  ``sigma_t^2 = 1 - e^{-2t}`` (weight ``lambda(t) = sigma_t^2``);
- ``fp_pde``: the score Fokker-Planck residual ``d_t s - grad_x(div s + |s|^2 + x . s)`` (zero for the exact
  score, ``score_fp_residual``) at ``(x_t, t)`` plus the initial condition ``|s(x_0, 0) - grad log p_0(x_0)|^2``.

Functional API: ``allen_cahn_residual(u, x, eps)`` and ``score_fp_residual(score, x, t)``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.activations import Sine
from modules.components.local_basis import RBFKAN, ResidualCAN
from modules.components.metrics import count_parameters
from modules.components.mlp import MLP
from modules.components.pde import (
    AllenCahn,
    MaxAbsError,
    RelativeL2Error,
    as_input,
    check_points,
    divergence,
    grad,
    make_problem,
    residual_loss,
)

PAPER_ID = "000-02"


# --- functional API -----------------------------------------------------------------------------------------
def _check_eps(eps: float) -> float:
    if isinstance(eps, Tensor):
        eps = float(eps)
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise ConfigError(f"eps must be a finite number > 0, got {eps}")
    return float(eps)


def allen_cahn_residual(u: Callable[[Tensor], Tensor], x: Tensor, eps: float) -> Tensor:
    """``eps^2 u''(x) + u(x) - u(x)^3`` at points ``x (N, 1)``, by autograd with the graph kept: ``(N,)``.

    ``u`` maps ``(N, 1)`` to ``(N, 1)`` or ``(N,)``; the result has ``x``'s dtype and can be back-propagated
    into ``u``'s parameters. Zero for ``u* = tanh(x / (sqrt 2 eps))``.
    """
    eps = _check_eps(eps)
    check_points(x, "x", dim=1)
    return AllenCahn(eps).residual(u, x).to(x.dtype)


def score_fp_residual(score: Callable[[Tensor, Tensor], Tensor], x: Tensor, t: Tensor) -> Tensor:
    """The score Fokker-Planck residual of the OU process ``dx = -x dt + sqrt(2) dW`` at ``(x (N, d), t (N, 1))``:

        r = d_t s - grad_x( div_x s + |s|^2 + x . s ),   ``(N, d)``,

    by autograd with the graph kept; ``score(x, t) -> (N, d)``. ``log p_t`` solves
    ``d_t log p = d + x . grad log p + Lap log p + |grad log p|^2``, whose gradient is ``r = 0`` for the exact
    score. Points must be finite and ``t >= 0``; the result has ``x``'s dtype.
    """
    check_points(x, "x")
    check_points(t, "t", dim=1)
    if t.shape[0] != x.shape[0]:
        raise ConfigError(f"x and t need the same number of points, got {x.shape[0]} and {t.shape[0]}")
    if (t < 0).any():
        raise ConfigError("t must be >= 0 (the OU process starts at t = 0)")
    x, t = as_input(x), as_input(t)
    s = score(x, t)
    if s.shape != x.shape:
        raise ConfigError(f"score(x, t) must return (N, d) = {tuple(x.shape)}, got {tuple(s.shape)}")
    ds_dt = torch.cat([grad(s[:, i], t) for i in range(s.shape[1])], dim=1)  # (N, d)
    phi = divergence(s, x) + s.square().sum(1) + (x * s).sum(1)  # (N,)
    return (ds_dt - grad(phi, x)).to(x.dtype)


# --- baseline networks (small, for the PINN comparisons; SIREN and Fourier features live here until a shared
# --- INR component exists) ----------------------------------------------------------------------------------
class SirenNet(nn.Module):
    """SIREN (Sitzmann et al. 2020): ``sin(w0 (W x + b))`` layers, first-layer weights ``U(-1/n, 1/n)``,
    hidden ``U(-sqrt(6/n)/w_h, sqrt(6/n)/w_h)`` with ``w_h = 30``, a linear read-out."""

    def __init__(self, in_dim: int, out_dim: int, width: int = 64, depth: int = 3, w0: float = 30.0,
                 hidden_w0: float = 30.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_dim
        for i in range(depth):
            lin = nn.Linear(prev, width)
            w = w0 if i == 0 else hidden_w0
            bound = 1.0 / prev if i == 0 else math.sqrt(6.0 / prev) / hidden_w0
            nn.init.uniform_(lin.weight, -bound, bound)
            layers += [lin, Sine(w)]
            prev = width
        layers.append(nn.Linear(prev, out_dim))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x.flatten(1))


class FourierFeatureNet(nn.Module):
    """Random Fourier features ``[sin(2 pi B x), cos(2 pi B x)]``, ``B ~ N(0, sigma^2)`` fixed (Tancik et al.
    2020), into an ``MLP``."""

    def __init__(self, in_dim: int, out_dim: int, width: int = 64, depth: int = 2, n_features: int = 32,
                 sigma: float = 1.0, activation: str = "tanh", seed: int = 0) -> None:
        super().__init__()
        if n_features <= 0 or not sigma > 0:
            raise ConfigError(f"Fourier features need n_features > 0 and sigma > 0, got {n_features}, {sigma}")
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("B", sigma * torch.randn(n_features, in_dim, generator=gen))
        self.mlp = MLP(2 * n_features, out_dim, hidden=[width] * depth, activation=activation)

    def forward(self, x: Tensor) -> Tensor:
        z = 2.0 * math.pi * x.flatten(1) @ self.B.T.to(x.dtype)
        return self.mlp(torch.cat([torch.sin(z), torch.cos(z)], dim=1))


Arch = Literal["mlp", "residual_can", "siren", "fourier", "kan"]
Activation = Literal["cauchy", "silu", "tanh", "gaussian", "relu"]


def build_network(arch: str, in_dim: int, out_dim: int, width: int = 64, depth: int = 3, activation: str = "cauchy",
                  residual_basis: str = "cauchy", n_nodes: int = 32, node_scale: float = 0.1,
                  domain: tuple[float, float] = (-1.0, 1.0), siren_w0: float = 30.0, fourier_features: int = 32,
                  fourier_sigma: float = 1.0, kan_grid: int = 8) -> nn.Module:
    """The network of ``arch`` (see the module docstring); ``residual_basis`` applies to ``residual_can`` only."""
    if arch == "residual_can":
        return ResidualCAN(in_dim, out_dim, width, depth, activation, residual_basis, n_nodes, domain[0], domain[1],
                           node_scale)
    if arch == "mlp":
        return MLP(in_dim, out_dim, hidden=[width] * depth, activation=activation)
    if arch == "siren":
        return SirenNet(in_dim, out_dim, width, depth, siren_w0)
    if arch == "fourier":
        return FourierFeatureNet(in_dim, out_dim, width, depth, fourier_features, fourier_sigma, activation)
    if arch == "kan":
        return RBFKAN(in_dim, out_dim, [width] * depth, kan_grid)
    raise ConfigError(f"unknown arch {arch!r}; choose one of mlp, residual_can, siren, fourier, kan")


@contextlib.contextmanager
def autograd_on() -> Iterator[None]:
    """Autograd on inside validation/test (Lightning runs them under inference mode): residuals need u''."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


class _FieldTask(PaperTask, abstract=True):
    """What both tasks share: the network, its dtype for the inputs, the parameter count at test."""

    net: nn.Module

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def _inputs(self, *tensors: Tensor) -> list[Tensor]:
        param = next(self.net.parameters(), None)
        # inside autograd_on(), .clone() turns an inference-mode tensor from the loader into one autograd can use
        return [(t if param is None else t.to(param.dtype)).clone() for t in tensors]

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        if f"{stage}/residual_ms" in values:
            out[f"{stage}/residual_rms"] = values[f"{stage}/residual_ms"].sqrt()
        if stage == "test":
            out["test/n_params"] = torch.tensor(float(count_parameters(self.net)))
        return out


class CauchyPINN(_FieldTask):
    """A PINN for a 1-D boundary-value problem (see the module docstring).

    Args:
        arch: ``residual_can``, ``mlp``, ``siren``, ``fourier`` or ``kan``.
        activation: the hidden activation of ``mlp``, ``fourier`` and ResidualCAN's main path (``cauchy`` is
            CauchyAct; ``relu`` has u'' = 0 almost everywhere, so a second-order residual cannot train it).
        loss: residual penalty rho: ``l2``, ``l1``, ``huber`` or ``cauchy``; ``loss_scale`` is its c.
        pde: ``allen_cahn``, ``poisson`` or ``burgers``.
        eps: Allen-Cahn's eps, Burgers' viscosity (unused by Poisson).
        residual_basis: ResidualCAN's residual: ``cauchy`` nodes, ``gaussian`` bumps or ``none``.
        width, depth: hidden width and number of hidden layers (KAN: hidden widths ``[width] * depth``).
        n_nodes, node_scale: M nodes of the residual and its initial scale s.
        bc_weight: w_bc of the Dirichlet term (always squared error).
        siren_w0, fourier_features, fourier_sigma, kan_grid: baseline settings.
        plot: log a figure of u, u* and |u - u*| on the test grid.
        optimizer, lr_scheduler: see ``PaperTask``; the scheduler steps once per optimiser step.
    """

    paper_id = PAPER_ID
    monitor = "val/pde_loss"  # L2 residual + boundary term on the grid: needs no u*
    monitor_mode = "min"
    scheduler_interval = "step"  # a cosine schedule's T_max counts optimiser steps

    def __init__(
        self,
        arch: Arch = "residual_can",
        activation: Activation = "cauchy",
        loss: Literal["l2", "l1", "huber", "cauchy"] = "l2",
        loss_scale: float = 1.0,
        pde: Literal["allen_cahn", "poisson", "burgers"] = "allen_cahn",
        eps: float = 1.0,
        residual_basis: Literal["cauchy", "gaussian", "none"] = "cauchy",
        width: int = 64,
        depth: int = 3,
        n_nodes: int = 32,
        node_scale: float = 0.1,
        bc_weight: float = 10.0,
        siren_w0: float = 30.0,
        fourier_features: int = 32,
        fourier_sigma: float = 1.0,
        kan_grid: int = 8,
        plot: bool = True,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-3),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {"rel_l2": RelativeL2Error(), "max_abs": MaxAbsError(), "residual_ms": WeightedMean(),
                   "bc_ms": WeightedMean(), "pde_loss": WeightedMean()}
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        if not loss_scale > 0:
            raise ConfigError(f"loss_scale (the Huber/Cauchy c) must be positive, got {loss_scale}")
        if bc_weight < 0:
            raise ConfigError(f"bc_weight must be >= 0, got {bc_weight}")
        self.problem = make_problem(pde, _check_eps(eps))
        self.loss_kind, self.loss_scale, self.bc_weight = loss, loss_scale, bc_weight
        self.plot = plot
        self.net = build_network(arch, 1, 1, width, depth, activation, residual_basis, n_nodes, node_scale,
                                 (self.problem.low, self.problem.high), siren_w0, fourier_features, fourier_sigma,
                                 kan_grid)
        self._test_points: list[tuple[Tensor, Tensor, Tensor]] = []

    def u(self, x: Tensor) -> Tensor:
        """``u(x)`` for points ``(N, 1)``: ``(N,)``."""
        return self.net(x).reshape(-1)

    def terms(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The residual ``r (N,)`` at ``x`` and the boundary errors ``u(x_b) - g_b (2,)``."""
        check_points(x, "collocation points", dim=1)
        r = self.problem.residual(self.u, x)
        xb, gb = self.problem.boundary(x.dtype)
        xb, gb = xb.to(x.device), gb.to(x.device)
        return r, self.u(xb) - gb

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        points = batch[0] if isinstance(batch, list | tuple) else batch
        if stage == "train":
            (x,) = self._inputs(points)
            r, bc = self.terms(x)
            loss = residual_loss(r, self.loss_kind, self.loss_scale) + self.bc_weight * bc.square().mean()
            return StepOutput(loss, n=len(x))
        with autograd_on():
            (x,) = self._inputs(points)
            r, bc = self.terms(x)
            u = self.u(x).detach()
        r, bc = r.detach(), bc.detach()
        loss = residual_loss(r, self.loss_kind, self.loss_scale) + self.bc_weight * bc.square().mean()
        u_star = self.problem.exact(x)
        if stage == "test" and self.plot:
            self._test_points.append((x.reshape(-1).cpu(), u.cpu(), u_star.cpu()))
        n = len(x)
        bc_ms = bc.square().mean()
        return StepOutput(loss, n=n, preds=u, target=u_star, inputs={
            "residual_ms": (r.square().mean(), n), "bc_ms": (bc_ms, n),
            "pde_loss": (r.square().mean() + self.bc_weight * bc_ms, n)})

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        points, self._test_points = self._test_points, []
        if points and self.trainer.is_global_zero and self.trainer.loggers:
            from tracking.figures import log_figure

            x, u, u_star = (torch.cat(p) for p in zip(*points))
            log_figure(self.trainer, solution_figure(x, u, u_star, self.problem.name), "figures/solution.png")


def solution_figure(x: Tensor, u: Tensor, u_star: Tensor, title: str) -> Any:
    """``u`` and ``u*`` against ``x``, and ``|u - u*|`` on a log axis."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    order = x.argsort()
    x, u, u_star = x[order].double(), u[order].double(), u_star[order].double()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    axes[0].plot(x, u_star, "k-", lw=2, label="u*")
    axes[0].plot(x, u, "r--", lw=1, label="u")
    axes[0].set(xlabel="x", title=title)
    axes[0].legend()
    axes[1].semilogy(x, (u - u_star).abs().clamp_min(1e-300))
    axes[1].set(xlabel="x", ylabel="|u - u*|", title="pointwise error")
    fig.tight_layout()
    return fig


class CauchyScoreNet(_FieldTask):
    """A time-conditioned score network ``s(x, t) = net([x, t])`` for the OU process (module docstring).

    Batches: training ``(x_0, grad log p_0(x_0))`` from the mixture; evaluation
    ``(x_0, t, z, x_t, grad log p_t(x_t))`` with fixed ``t`` and noise ``z`` (``datamodules.gmm_score``).

    Args:
        activation: hidden activation (``cauchy`` is CauchyAct).
        loss: ``dsm`` or ``fp_pde``.
        width, depth: the MLP.
        num_features: the dimension d of x (linked from the DataModule).
        t_min, t_max: training times ``t ~ U[t_min, t_max]``.
        ic_weight: weight of the initial-condition term of ``fp_pde``.
        optimizer, lr_scheduler: see ``PaperTask``.

    Metrics: ``fisher`` = mean ``|s - grad log p_t|^2`` (the Fisher divergence on the evaluation points),
    ``rel_l2`` = ``||s - grad log p_t|| / ||grad log p_t||``, ``dsm`` = the DSM loss on the fixed evaluation
    noise (an estimate of the weighted Fisher divergence up to a constant, which needs no exact score: the
    checkpoint monitor).
    """

    paper_id = PAPER_ID
    monitor = "val/dsm"
    monitor_mode = "min"
    scheduler_interval = "step"

    def __init__(
        self,
        activation: Activation = "cauchy",
        loss: Literal["dsm", "fp_pde"] = "fp_pde",
        width: int = 64,
        depth: int = 3,
        num_features: int = 1,
        t_min: float = 1e-3,
        t_max: float = 1.0,
        ic_weight: float = 1.0,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-3),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {"fisher": WeightedMean(), "rel_l2": RelativeL2Error(), "dsm": WeightedMean()}
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        if not 0 <= t_min < t_max:
            raise ConfigError(f"need 0 <= t_min < t_max, got t_min={t_min}, t_max={t_max}")
        if num_features <= 0:
            raise ConfigError(f"num_features (the dimension d) must be positive, got {num_features}")
        if ic_weight < 0:
            raise ConfigError(f"ic_weight must be >= 0, got {ic_weight}")
        self.loss_kind, self.t_min, self.t_max, self.ic_weight = loss, t_min, t_max, ic_weight
        self.dim = num_features
        self.net = MLP(num_features + 1, num_features, hidden=[width] * depth, activation=activation)

    def score(self, x: Tensor, t: Tensor) -> Tensor:
        """``s(x (N, d), t (N, 1)) -> (N, d)``."""
        return self.net(torch.cat([x, t], dim=1))

    def dsm_loss(self, x_t: Tensor, t: Tensor, z: Tensor) -> Tensor:
        """Per-point ``|sigma_t s(x_t, t) + z|^2`` (``(N,)``)."""
        sigma = (-torch.expm1(-2.0 * t)).sqrt()
        return (sigma * self.score(x_t, t) + z).square().sum(1)

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        if stage == "train":
            x0, s0 = self._inputs(*batch)
            if x0.shape[1] != self.dim:
                raise ConfigError(f"the score net was built for d={self.dim}, the data has d={x0.shape[1]}")
            n = len(x0)
            t = self.t_min + (self.t_max - self.t_min) * torch.rand(n, 1, dtype=x0.dtype, device=x0.device)
            z = torch.randn_like(x0)
            x_t = torch.exp(-t) * x0 + (-torch.expm1(-2.0 * t)).sqrt() * z
            if self.loss_kind == "dsm":
                loss = self.dsm_loss(x_t, t, z).mean()
            else:
                r = score_fp_residual(self.score, x_t, t)
                ic = (self.score(x0, torch.zeros_like(t)) - s0).square().sum(1).mean()
                loss = r.square().sum(1).mean() + self.ic_weight * ic
            return StepOutput(loss, n=n)
        with autograd_on():
            x0, t, z, x_t, s_true = self._inputs(*batch)
            s = self.score(x_t, t).detach()
            if self.loss_kind == "fp_pde":
                r = score_fp_residual(self.score, x_t, t).detach()
                loss = r.square().sum(1).mean()
            else:
                loss = None
        n = len(x0)
        dsm = (((-torch.expm1(-2.0 * t)).sqrt() * s + z).square().sum(1)).mean()
        loss = dsm if loss is None else loss
        return StepOutput(loss, n=n, preds=s, target=s_true, inputs={
            "fisher": ((s - s_true).square().sum(1).mean(), n), "dsm": (dsm, n)})


__all__: Sequence[str] = (
    "allen_cahn_residual",
    "score_fp_residual",
    "CauchyPINN",
    "CauchyScoreNet",
    "build_network",
    "SirenNet",
    "FourierFeatureNet",
)
