"""The two tasks of ResidualCAN (paper 000-02): ``CauchyPINN`` (a 1-D boundary-value problem on fresh
collocation points) and ``CauchyScoreNet`` (the score of an OU-evolved mixture). The network of each is a task
network passed in as a factory (``net``), built here with the sizes the DataModule gives (see the package
docstring for the equations).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import Metric

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.local_basis import ResidualCAN
from modules.components.metrics import count_parameters
from modules.components.mlp import MLP
from modules.components.pde import (
    BoundaryValueProblem,
    MaxAbsError,
    RelativeL2Error,
    check_points,
    make_problem,
    residual_loss,
)
from modules.components.supervised import NetFactory
from modules.residual_can.figures import solution_figure
from modules.residual_can.functional import best_shift, check_eps, count_in_layer, layer_half_width, score_fp_residual

PAPER_ID = "000-02"


@contextlib.contextmanager
def autograd_on() -> Iterator[None]:
    """Autograd on inside validation/test (Lightning runs them under inference mode): residuals need u''."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


class ShiftAligned(Metric):
    """The translate of the exact solution closest to ``u`` on the evaluation grid (``best_shift``): ``shift``
    (where the network put the layer) or ``error`` (the relative L2 error after that shift).

    ``update(u (N,), x (N, 1))``; the grid's points are gathered across ranks before the search over shifts in
    the problem's interval.
    """

    full_state_update = False
    higher_is_better = False

    def __init__(self, pde: str, eps: float, output: Literal["shift", "error"]) -> None:
        super().__init__()
        self.pde, self.eps, self.output = pde, eps, output
        self.add_state("u", default=[], dist_reduce_fx="cat")
        self.add_state("x", default=[], dist_reduce_fx="cat")

    def update(self, u: Tensor, x: Tensor) -> None:
        self.u.append(u.detach().double().reshape(-1))
        self.x.append(x.detach().double().reshape(-1))

    def compute(self) -> Tensor:
        u = torch.cat(self.u) if isinstance(self.u, list) else self.u
        x = torch.cat(self.x) if isinstance(self.x, list) else self.x
        problem = make_problem(self.pde, self.eps)
        shift, error = best_shift(u, x, problem.exact, problem.low, problem.high)
        return torch.tensor(shift if self.output == "shift" else error)


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
    """A PINN ``u = net(x)`` for a 1-D boundary-value problem (see the package docstring).

    Metrics besides the errors: ``train/layer_points``, the mean number of a step's collocation points inside
    the transition layer (``layer_half_width``; Allen-Cahn and Burgers); at test ``layer_shift`` and
    ``rel_l2_aligned``, the shift of the exact solution closest to ``u`` and the error after it
    (``best_shift``): a misplaced but resolved layer has a small aligned error, an unresolved one does not.

    Args:
        net: the task network ``net(input_shape, 1)``: ``modules.components.local_basis.ResidualCAN`` (default;
            its ``basis`` swaps the Cauchy nodes for Gaussian bumps or removes them, ``activation`` its main
            path's CauchyAct), ``MLP`` (any activation), ``RBFKAN``, or this method's
            ``modules.residual_can.nets.SirenNet`` / ``FourierFeatureNet``. ``relu`` has u'' = 0 almost
            everywhere, so a second-order residual cannot train it. ResidualCAN's nodes start on a grid over its
            ``low``, ``high`` (default [-1, 1], the problems' interval).
        loss: residual penalty rho: ``l2``, ``l1``, ``huber`` or ``cauchy``; ``loss_scale`` is its c.
        pde: ``allen_cahn``, ``poisson`` or ``burgers``.
        eps: Allen-Cahn's eps, Burgers' viscosity (unused by Poisson).
        bc_weight: w_bc of the Dirichlet term (always squared error).
        anchors: interior points ``a`` where ``u(a) = u*(a)`` is imposed like the boundary values (same term,
            same weight): ``[0.0]`` pins Allen-Cahn's layer at its centre, whose position the equation fixes
            only through exponentially small boundary errors (a positive control, not the paper's method).
        eps_start, eps_anneal_steps: eps continuation: training step k solves the problem at
            ``eps_k = eps_start (eps / eps_start)^min(1, k / eps_anneal_steps)`` (geometric from ``eps_start`` to
            ``eps``, boundary data included), then at ``eps``; validation and test always at ``eps``. None
            (default): no continuation.
        plot: log a figure of u, u* and |u - u*| on the test grid.
        input_shape: one point's shape, ``(1,)`` (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask``; the scheduler steps once per optimiser step.
    """

    paper_id = PAPER_ID
    monitor = "val/pde_loss"  # L2 residual + boundary term on the grid: needs no u*
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet
    scheduler_interval = "step"  # a cosine schedule's T_max counts optimiser steps

    def __init__(
        self,
        net: NetFactory = ResidualCAN,
        loss: Literal["l2", "l1", "huber", "cauchy"] = "l2",
        loss_scale: float = 1.0,
        pde: Literal["allen_cahn", "poisson", "burgers"] = "allen_cahn",
        eps: float = 1.0,
        bc_weight: float = 10.0,
        anchors: Sequence[float] = (),
        eps_start: float | None = None,
        eps_anneal_steps: int = 0,
        plot: bool = True,
        input_shape: tuple[int, ...] = (1,),
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-3),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {"rel_l2": RelativeL2Error(), "max_abs": MaxAbsError(), "residual_ms": WeightedMean(),
                   "bc_ms": WeightedMean(), "pde_loss": WeightedMean(), "layer_points": WeightedMean(),
                   "layer_shift": ShiftAligned(pde, eps, "shift"),
                   "rel_l2_aligned": ShiftAligned(pde, eps, "error")}
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        if not loss_scale > 0:
            raise ConfigError(f"loss_scale (the Huber/Cauchy c) must be positive, got {loss_scale}")
        if bc_weight < 0:
            raise ConfigError(f"bc_weight must be >= 0, got {bc_weight}")
        if tuple(input_shape) != (1,):
            raise ConfigError(f"CauchyPINN solves 1-D problems: the data's points must be (N, 1), got input_shape "
                              f"{tuple(input_shape)}")
        problem = make_problem(pde, check_eps(eps))
        anchors = [float(a) for a in anchors]
        if not all(problem.low < a < problem.high for a in anchors):
            raise ConfigError(f"anchors must lie inside the domain ({problem.low}, {problem.high}), got {anchors}")
        self.problem, self.anchors = problem, anchors
        if eps_start is not None:
            check_eps(eps_start)
            if pde == "poisson" or eps_anneal_steps <= 0:
                raise ConfigError(f"eps continuation needs pde allen_cahn or burgers and eps_anneal_steps > 0, got "
                                  f"pde={pde}, eps_anneal_steps={eps_anneal_steps}")
        self.pde, self.eps, self.eps_start, self.eps_anneal_steps = pde, float(eps), eps_start, eps_anneal_steps
        self.layer_half_width = layer_half_width(pde, eps)
        self.loss_kind, self.loss_scale, self.bc_weight = loss, loss_scale, bc_weight
        self.plot = plot
        self.net = net(tuple(input_shape), 1)  # u is one value per point
        self._test_points: list[tuple[Tensor, Tensor, Tensor]] = []

    def u(self, x: Tensor) -> Tensor:
        """``u(x)`` for points ``(N, 1)``: ``(N,)``."""
        return self.net(x).reshape(-1)

    def eps_at(self, step: int) -> float:
        """The eps training step ``step`` solves at (``eps`` itself without continuation)."""
        if self.eps_start is None:
            return self.eps
        frac = min(1.0, step / self.eps_anneal_steps)
        return self.eps_start * (self.eps / self.eps_start) ** frac

    def terms(self, x: Tensor, problem: BoundaryValueProblem | None = None) -> tuple[Tensor, Tensor]:
        """The residual ``r (N,)`` at ``x`` and the boundary (and anchor) errors ``u(x_b) - g_b (2 + anchors,)``
        of ``problem`` (default: the task's)."""
        problem = problem or self.problem
        check_points(x, "collocation points", dim=1)
        r = problem.residual(self.u, x)
        xb, gb = problem.boundary(x.dtype)
        if self.anchors:
            xa = torch.tensor(self.anchors, dtype=x.dtype)[:, None]
            xb, gb = torch.cat([xb, xa]), torch.cat([gb, problem.exact(xa)])
        xb, gb = xb.to(x.device), gb.to(x.device)
        return r, self.u(xb) - gb

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        points = batch[0] if isinstance(batch, list | tuple) else batch
        if stage == "train":
            (x,) = self._inputs(points)
            problem = None if self.eps_start is None else make_problem(self.pde, self.eps_at(self.global_step))
            r, bc = self.terms(x, problem)
            loss = residual_loss(r, self.loss_kind, self.loss_scale) + self.bc_weight * bc.square().mean()
            in_layer = None if self.layer_half_width is None else (count_in_layer(x, self.layer_half_width), 1)
            return StepOutput(loss, n=len(x), inputs={"layer_points": in_layer})
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
        aligned = (u, x) if stage == "test" and self.layer_half_width is not None else None
        return StepOutput(loss, n=n, preds=u, target=u_star, inputs={
            "residual_ms": (r.square().mean(), n), "bc_ms": (bc_ms, n),
            "pde_loss": (r.square().mean() + self.bc_weight * bc_ms, n), "layer_points": None,
            "layer_shift": aligned, "rel_l2_aligned": aligned})

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        points, self._test_points = self._test_points, []
        # The figure is drawn from the test steps' own points at the test's end, a moment no Diagnostic
        # (fit-time, callbacks/diagnostic.py) has: the task logs it through the tracking floor itself.
        if points and self.trainer.is_global_zero and self.trainer.loggers:
            from tracking.figures import log_figure

            x, u, u_star = (torch.cat(p) for p in zip(*points))
            log_figure(self.trainer, solution_figure(x, u, u_star, self.problem.name), "figures/solution.png")


class CauchyScoreNet(_FieldTask):
    """A time-conditioned score network ``s(x, t) = net([x, t])`` for the OU process (package docstring).

    Batches: training ``(x_0, grad log p_0(x_0))`` from the mixture; evaluation
    ``(x_0, t, z, x_t, grad log p_t(x_t))`` with fixed ``t`` and noise ``z`` (``datamodules.gmm_score``).

    Args:
        net: the task network ``net((d + 1,), d)`` on ``[x, t]`` (default: ``MLP``, 3 x 64, CauchyAct;
            ``init_args.activation`` picks the hidden activation).
        loss: ``dsm`` or ``fp_pde``.
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
    vectorizable = False  # --run.seeds: it draws random numbers during training
    scheduler_interval = "step"

    def __init__(
        self,
        net: NetFactory = lambda shape, n: MLP(shape, n, hidden=[64, 64, 64], activation="cauchy"),
        loss: Literal["dsm", "fp_pde"] = "fp_pde",
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
        self.net = net((num_features + 1,), num_features)  # [x, t] in, a vector of x's dimension out

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
