"""The functional API of ResidualCAN (paper 000-02): the Allen-Cahn residual and the score Fokker-Planck residual.

- ``allen_cahn_residual(u, x, eps)``: ``eps^2 u'' + u - u^3`` at 1-D points, zero for ``u* = tanh(x/(sqrt 2 eps))``;
- ``score_fp_residual(score, x, t)``: ``d_t s - grad_x(div s + |s|^2 + x . s)`` for the OU process
  ``dx = -x dt + sqrt(2) dW``, zero for the exact score.

Both differentiate by autograd with the graph kept, so a loss built on them trains the network.

Where the layer is and whether a network found it (Allen-Cahn's ``tanh`` kink, Burgers' shock):

- ``layer_half_width(pde, eps)``: the half-width ``w`` of the transition layer around ``x = 0`` (Allen-Cahn:
  ``sqrt 2 eps``, where ``|u*| <= tanh 1``; Burgers: ``2 eps``, likewise); ``count_in_layer(x, w)`` the number
  of points with ``|x| <= w``;
- ``best_shift(u, x, exact)``: the translate ``u*(x - s)`` of the exact solution closest to ``u`` on the grid,
  and its relative L2 error: small error at ``s != 0`` is a solved equation with a misplaced layer (a shifted
  kink solves Allen-Cahn up to exponentially small boundary errors), error near the plain relative L2 an
  unresolved layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.pde import AllenCahn, as_input, check_points, divergence, grad

Field1D = Callable[[Tensor], Tensor]


def check_eps(eps: float) -> float:
    """``eps`` as a float, or a ``ConfigError`` unless it is a finite number > 0."""
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
    eps = check_eps(eps)
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


def layer_half_width(pde: str, eps: float) -> float | None:
    """Half-width of the transition layer at ``x = 0`` (``|u*| <= tanh 1`` inside it): Allen-Cahn
    ``u* = tanh(x / (sqrt 2 eps))``: ``sqrt 2 eps``; Burgers ``u* = -tanh(x / (2 eps))``: ``2 eps``; Poisson has
    no layer (None)."""
    eps = check_eps(eps)
    if pde == "allen_cahn":
        return math.sqrt(2.0) * eps
    if pde == "burgers":
        return 2.0 * eps
    return None


def count_in_layer(x: Tensor, half_width: float) -> int:
    """How many of the 1-D points ``x (N, 1)`` lie in the layer ``|x| <= half_width``."""
    return int((x.reshape(-1).abs() <= half_width).sum())


def _shift_errors(u: Tensor, x: Tensor, exact: Field1D, shifts: Tensor, chunk: int = 256) -> Tensor:
    """``||u - u*(x - s)||^2`` for every ``s`` of ``shifts`` (in chunks: ``len(shifts) x N`` floats at once)."""
    out = []
    for part in shifts.split(chunk):
        moved = exact((x[None, :] - part[:, None]).reshape(-1, 1)).reshape(len(part), -1)
        out.append((u[None, :] - moved).square().sum(1))
    return torch.cat(out)


def best_shift(u: Tensor, x: Tensor, exact: Field1D, low: float = -1.0, high: float = 1.0, n_coarse: int = 401,
               n_fine: int = 101, levels: int = 3) -> tuple[float, float]:
    """The shift ``s`` in ``[low, high]`` that brings ``u*(x - s)`` closest to ``u`` on the points ``x``, and
    ``min_s ||u - u*(x - s)|| / ||u*(x)||``: ``(s, relative error)``.

    A grid of ``n_coarse`` shifts over ``[low, high]``, then ``levels`` finer grids of ``n_fine`` shifts over
    the two cells around the best one (float64): the shift is found to ``(high - low) / (n_coarse - 1) /
    ((n_fine - 1) / 2)^levels`` (about 1e-8 by default) when the error has one minimum near it. ``u``, ``x``:
    ``(N,)`` or ``(N, 1)``; ``exact`` maps ``(M, 1)`` points to ``(M,)`` values.
    """
    if n_coarse < 2 or n_fine < 3 or levels < 0:
        raise ConfigError(f"best_shift needs n_coarse >= 2, n_fine >= 3, levels >= 0, got {n_coarse}, {n_fine}, {levels}")
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ConfigError(f"best_shift searches a finite interval low < high, got [{low}, {high}]")
    u, x = u.detach().double().reshape(-1), x.detach().double().reshape(-1)
    if u.shape != x.shape or u.numel() == 0:
        raise ConfigError(f"u and x must hold the same number (>= 1) of points, got {u.numel()} and {x.numel()}")
    ref = exact(x[:, None]).reshape(-1).square().sum().clamp_min(1e-300)
    shifts = torch.linspace(low, high, n_coarse, dtype=torch.float64)
    step = (high - low) / (n_coarse - 1)
    errors = _shift_errors(u, x, exact, shifts)
    best = int(errors.argmin())
    s, e = float(shifts[best]), float(errors[best])
    for _ in range(levels):
        shifts = torch.linspace(max(low, s - step), min(high, s + step), n_fine, dtype=torch.float64)
        step = 2 * step / (n_fine - 1)
        errors = _shift_errors(u, x, exact, shifts)
        best = int(errors.argmin())
        if float(errors[best]) <= e:
            s, e = float(shifts[best]), float(errors[best])
    return s, math.sqrt(e / float(ref))
