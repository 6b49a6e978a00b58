"""Localised basis functions for low-dimensional function fitting (PINNs, scores, fields).

- ``CauchyNodes`` (Cauchy adaptive nodes) and ``GaussianBumps``: a dense residual of M local functions
  ``R(x) = s sum_j softmax(a)_j N_j(x)`` with learnable centres ``c_j`` (initialised on a uniform grid over
  the domain), widths ``d_j``, amplitudes ``b1_j`` (a vector in d > 1), ``b2_j``, logits ``a`` and scale
  ``s`` (0.1 at init), where
  ``N_j(x) = (b1_j . (x - c_j) + b2_j) / (|x - c_j|^2 + d_j^2)`` (Cauchy) or
  ``N_j(x) = (b1_j . (x - c_j) + b2_j) exp(-|x - c_j|^2 / (2 d_j^2))`` (Gaussian). Both are ``AdaptiveNodes``:
  ``node_state()`` gives the centres, widths, weights and scale a diagnostic tracks.
- ``ResidualCAN``: an ``MLP`` (CauchyAct by default) plus one of those residuals.
- ``RBFKANLayer`` / ``RBFKAN``: a Kolmogorov-Arnold layer whose edge functions are Gaussian radial bases on
  a fixed grid plus a SiLU base term (FastKAN-style, pure torch).
- ``InterpolatedGrid``: learnable values on a regular grid of nodes, evaluated at any point of the box by
  multilinear interpolation (nodes on both ends, ``align_corners=True``).

The local activations (``CauchyAct``, ``GaussianAct``: ``cauchy``, ``gaussian``) are registered activations
and live in ``modules.components.activations``; they are importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.components.activations import D_MIN, inverse_softplus, positive
from modules.components.activations import CauchyAct as CauchyAct  # re-exported: its import path before the registry
from modules.components.activations import GaussianAct as GaussianAct
from modules.components.mlp import MLP


def grid_centres(n_nodes: int, dim: int, low: float, high: float, seed: int = 0) -> tuple[Tensor, float]:
    """``n_nodes`` centres in ``[low, high]^dim`` and their spacing: a uniform grid when ``n_nodes`` is a
    ``dim``-th power (always in 1-D), else seeded uniform draws (spacing ``(high-low) / n_nodes^(1/dim)``)."""
    side = round(n_nodes ** (1.0 / dim))
    if side**dim == n_nodes:
        axis = torch.linspace(low, high, side, dtype=torch.float64) if side > 1 else torch.tensor([(low + high) / 2])
        mesh = torch.meshgrid(*([axis] * dim), indexing="ij")
        centres = torch.stack([m.reshape(-1) for m in mesh], dim=1)
        spacing = (high - low) / max(side - 1, 1)
    else:
        gen = torch.Generator().manual_seed(seed)
        centres = low + (high - low) * torch.rand(n_nodes, dim, generator=gen, dtype=torch.float64)
        spacing = (high - low) / n_nodes ** (1.0 / dim)
    return centres.float(), spacing


class NodeState(NamedTuple):
    """The learnable layout of M weighted local functions."""

    centres: Tensor  # (M, d)
    widths: Tensor  # (M,)
    weights: Tensor  # (M,), summing to 1
    scale: Tensor  # (), the residual's overall scale


@runtime_checkable
class AdaptiveNodes(Protocol):
    """A layer of M weighted local functions whose centres and widths train (what
    ``callbacks.activation_params`` summarises)."""

    def node_state(self) -> NodeState: ...


class LocalBasisResidual(nn.Module):
    """``R(x) = s sum_j softmax(a)_j N_j(x)``, ``N_j(x) = (b1_j . (x - c_j) + b2_j) k_j(x)`` (see subclasses).

    Args:
        in_dim: dimension d of the points.
        out_dim: outputs (each has its own ``b1``, ``b2``; centres, widths and weights are shared).
        n_nodes: M.
        low, high: the domain box; centres start on a uniform grid over it.
        scale: the initial ``s``.
        width: the initial ``d_j`` (default: twice the grid spacing, so neighbours overlap).
        seed: seed of the amplitude initialisation (and of the centres when M is not a d-th power).
    """

    kind: ClassVar[str] = "local"

    def __init__(self, in_dim: int = 1, out_dim: int = 1, n_nodes: int = 32, low: float = -1.0, high: float = 1.0,
                 scale: float = 0.1, width: float | None = None, seed: int = 0) -> None:
        super().__init__()
        if in_dim <= 0 or out_dim <= 0 or n_nodes <= 0:
            raise ConfigError(f"a local-basis residual needs positive sizes, got in={in_dim}, out={out_dim}, nodes={n_nodes}")
        if not high > low:
            raise ConfigError(f"the node domain needs low < high, got [{low}, {high}]")
        centres, spacing = grid_centres(n_nodes, in_dim, low, high, seed)
        d0 = float(width) if width is not None else 2.0 * spacing
        if d0 <= D_MIN:
            raise ConfigError(f"node width must start above {D_MIN}, got {d0}")
        self.in_dim, self.out_dim, self.n_nodes = in_dim, out_dim, n_nodes
        self.centres = nn.Parameter(centres)
        self.raw_width = nn.Parameter(torch.full((n_nodes,), inverse_softplus(d0 - D_MIN)))
        self.logits = nn.Parameter(torch.zeros(n_nodes))
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        gen = torch.Generator().manual_seed(seed)
        b1, b2 = self.amplitude_init(d0, gen)
        self.b1 = nn.Parameter(b1)
        self.b2 = nn.Parameter(b2)

    def amplitude_init(self, d0: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """``b1 (M, d, out)``, ``b2 (M, out)`` with every node O(1) at its peak."""
        raise NotImplementedError

    def envelope(self, sq_dist: Tensor, width: Tensor) -> Tensor:
        """``k_j`` from ``|x - c_j|^2 (N, M)`` and ``d_j (M,)``."""
        raise NotImplementedError

    @property
    def widths(self) -> Tensor:
        return positive(self.raw_width)

    @property
    def weights(self) -> Tensor:
        return self.logits.softmax(0)

    def node_state(self) -> NodeState:
        """``AdaptiveNodes``: the current centres, widths, weights and scale."""
        return NodeState(self.centres, self.widths, self.weights, self.scale)

    def nodes(self, x: Tensor) -> Tensor:
        """Every ``N_j(x)``: ``(N, M, out)``."""
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ConfigError(f"{type(self).__name__} expects points of shape (N, {self.in_dim}), got {tuple(x.shape)}")
        if self.in_dim == 1 and self.out_dim == 1:  # the PINN case: element-wise (N, M), no batched products
            diff = x - self.centres[:, 0]  # (N, M)
            env = self.envelope(diff.square(), self.widths)
            return ((diff * self.b1[:, 0, 0] + self.b2[:, 0]) * env)[..., None]
        diff = x[:, None, :] - self.centres[None]  # (N, M, d)
        env = self.envelope(diff.square().sum(-1), self.widths)  # (N, M)
        lin = (diff[..., None] * self.b1[None]).sum(2) + self.b2[None]  # (N, M, out)
        return lin * env[..., None]

    def forward(self, x: Tensor) -> Tensor:
        nodes = self.nodes(x)  # (N, M, out)
        return self.scale * (nodes * self.weights[None, :, None]).sum(1)

    def extra_repr(self) -> str:
        return f"in_dim={self.in_dim}, out_dim={self.out_dim}, n_nodes={self.n_nodes}"


class CauchyNodes(LocalBasisResidual):
    """Cauchy adaptive nodes: ``N_j(x) = (b1_j . (x - c_j) + b2_j) / (|x - c_j|^2 + d_j^2)``."""

    kind = "cauchy"

    def amplitude_init(self, d0: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        # peaks: |b2| / d^2 at the centre, |b1| / (2 d) at distance d
        b1 = torch.randn(self.n_nodes, self.in_dim, self.out_dim, generator=gen) * d0
        b2 = torch.randn(self.n_nodes, self.out_dim, generator=gen) * d0**2
        return b1, b2

    def envelope(self, sq_dist: Tensor, width: Tensor) -> Tensor:
        return 1.0 / (sq_dist + width.square())


class GaussianBumps(LocalBasisResidual):
    """Gaussian bumps: ``N_j(x) = (b1_j . (x - c_j) + b2_j) exp(-|x - c_j|^2 / (2 d_j^2))``."""

    kind = "gaussian"

    def amplitude_init(self, d0: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        # peaks: |b2| at the centre, |b1| d e^{-1/2} at distance d
        b1 = torch.randn(self.n_nodes, self.in_dim, self.out_dim, generator=gen) / d0
        b2 = torch.randn(self.n_nodes, self.out_dim, generator=gen)
        return b1, b2

    def envelope(self, sq_dist: Tensor, width: Tensor) -> Tensor:
        return torch.exp(-0.5 * sq_dist / width.square())


def local_basis(kind: Literal["cauchy", "gaussian"], **kwargs: Any) -> LocalBasisResidual:
    """``CauchyNodes`` or ``GaussianBumps`` by name."""
    classes = {"cauchy": CauchyNodes, "gaussian": GaussianBumps}
    if kind not in classes:
        raise ConfigError(f"unknown local basis {kind!r}; choose one of {sorted(classes)}")
    return classes[kind](**kwargs)


class RBFKANLayer(nn.Module):
    """``y_o = sum_i [sum_g w_{o,i,g} exp(-((x_i - g_g)/h)^2) + v_{o,i} silu(x_i)] + b_o`` (FastKAN-style).

    Args:
        in_dim, out_dim: sizes.
        n_grid: G radial-basis centres per input, equispaced on ``[low, high]``; ``h`` = their spacing.
        low, high: the grid's range.
    """

    def __init__(self, in_dim: int, out_dim: int, n_grid: int = 8, low: float = -2.0, high: float = 2.0) -> None:
        super().__init__()
        if in_dim <= 0 or out_dim <= 0 or n_grid < 2:
            raise ConfigError(f"RBFKANLayer needs positive sizes and n_grid >= 2, got {in_dim}, {out_dim}, {n_grid}")
        if not high > low:
            raise ConfigError(f"RBFKANLayer's grid needs low < high, got [{low}, {high}]")
        self.register_buffer("grid", torch.linspace(low, high, n_grid))
        self.h = (high - low) / (n_grid - 1)
        self.spline = nn.Parameter(torch.randn(out_dim, in_dim, n_grid) * (1.0 / math.sqrt(in_dim * n_grid)))
        self.base = nn.Linear(in_dim, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        phi = torch.exp(-((x[..., None] - self.grid) / self.h).square())  # (N, in, G)
        return torch.einsum("nig,oig->no", phi, self.spline) + self.base(F.silu(x))


class RBFKAN(nn.Module):
    """A stack of ``RBFKANLayer`` (a task network: ``(in_shape, out_dim, ...)``)."""

    def __init__(self, in_shape: int | Sequence[int], out_dim: int, hidden: Sequence[int] = (16, 16), n_grid: int = 8,
                 low: float = -2.0, high: float = 2.0) -> None:
        super().__init__()
        in_dim = in_shape if isinstance(in_shape, int) else math.prod(in_shape)
        widths = [in_dim, *hidden, out_dim]
        self.layers = nn.Sequential(*(RBFKANLayer(a, b, n_grid, low, high) for a, b in zip(widths[:-1], widths[1:])))

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x.flatten(1))


class InterpolatedGrid(nn.Module):
    """Learnable values ``G (C, R_0, ..., R_{d-1})`` on a regular grid over ``[low, high]^d`` (d = 1, 2 or 3),
    read at points ``x (N, d)`` by multilinear interpolation (node 0 at ``low``, node R-1 at ``high``,
    ``align_corners=True``; points outside are clamped to the border). Returns ``(N, C)``.

    Args:
        resolution: nodes per axis (an int for 1-D, or one per axis).
        channels: C.
        low, high: the box.
        init: ``zeros`` or ``normal`` (std 0.01) initial values.
    """

    def __init__(self, resolution: int | Sequence[int] = 17, channels: int = 1, low: float = -1.0, high: float = 1.0,
                 init: Literal["zeros", "normal"] = "zeros") -> None:
        super().__init__()
        res = (resolution,) if isinstance(resolution, int) else tuple(int(r) for r in resolution)
        if not 1 <= len(res) <= 3 or any(r < 2 for r in res) or channels <= 0:
            raise ConfigError(f"InterpolatedGrid needs 1-3 axes of >= 2 nodes and channels > 0, got {res}, {channels}")
        if not high > low:
            raise ConfigError(f"InterpolatedGrid needs low < high, got [{low}, {high}]")
        self.resolution, self.low, self.high = res, float(low), float(high)
        values = torch.zeros(channels, *res)
        if init == "normal":
            values.normal_(0.0, 0.01)
        self.values = nn.Parameter(values)

    def forward(self, x: Tensor) -> Tensor:
        d = len(self.resolution)
        if x.dim() != 2 or x.shape[1] != d:
            raise ConfigError(f"InterpolatedGrid over {d} axes expects points (N, {d}), got {tuple(x.shape)}")
        u = 2.0 * (x - self.low) / (self.high - self.low) - 1.0  # [-1, 1] per axis
        vals = self.values.to(x.dtype)
        if d == 1:  # as a 1 x R image read at height 0: coordinates (along R, along the height)
            vals = vals[:, None, :]
            u = torch.cat([u, torch.zeros_like(u)], dim=1)
        else:  # grid_sample's first coordinate indexes the last spatial axis: reverse the axis order
            u = u.flip(-1)
        grid = u.reshape(1, *([1] * (max(d, 2) - 1)), -1, max(d, 2))
        out = F.grid_sample(vals[None], grid, mode="bilinear", padding_mode="border", align_corners=True)
        return out.reshape(vals.shape[0], -1).T

    def render(self, shape: Sequence[int]) -> Tensor:
        """The interpolant on a full grid of ``shape`` points spanning the box (endpoints included):
        ``F.interpolate(G, shape, mode="linear"/"bilinear"/"trilinear", align_corners=True)``, ``(C, *shape)``."""
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(self.resolution)]
        return F.interpolate(self.values[None], size=tuple(shape), mode=mode, align_corners=True)[0]


class ResidualCAN(nn.Module):
    """ResidualCAN: ``u(x) = MLP_act(x) + s sum_j softmax(a)_j N_j(x)``, a CauchyAct main path (``activation``)
    plus a dense local-basis residual (``basis``: Cauchy adaptive nodes, Gaussian bumps, or ``none``).

    Args:
        in_shape, out_dim: sizes (a task network).
        width, depth, activation: the main path, an ``MLP`` with ``depth`` hidden layers of ``width`` and
            ``activation`` (any registered name; a fresh module per layer, so CauchyAct's ``lambda1, lambda2, d``
            are per layer).
        basis: ``cauchy`` (``CauchyNodes``), ``gaussian`` (``GaussianBumps``) or ``none`` (the main path alone).
        n_nodes, low, high, scale, node_width, seed: see ``LocalBasisResidual``.
    """

    def __init__(self, in_shape: int | Sequence[int], out_dim: int, width: int = 64, depth: int = 3,
                 activation: str = "cauchy", basis: Literal["cauchy", "gaussian", "none"] = "cauchy",
                 n_nodes: int = 32, low: float = -1.0, high: float = 1.0, scale: float = 0.1,
                 node_width: float | None = None, seed: int = 0) -> None:
        super().__init__()
        in_dim = in_shape if isinstance(in_shape, int) else math.prod(in_shape)
        if depth < 1:  # the main path is the activation's network: at least one hidden layer
            raise ConfigError(f"ResidualCAN needs depth >= 1, got depth={depth}")
        self.main = MLP(in_dim, out_dim, hidden=[width] * depth, activation=activation)
        if basis == "none":
            self.residual = None
        else:
            self.residual = local_basis(basis, in_dim=in_dim, out_dim=out_dim, n_nodes=n_nodes, low=low, high=high,
                                        scale=scale, width=node_width, seed=seed)

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        out = self.main(x)
        return out if self.residual is None else out + self.residual(x)
