"""The functional API of ResidualCAN (paper 000-02): the Allen-Cahn residual and the score Fokker-Planck residual.

- ``allen_cahn_residual(u, x, eps)``: ``eps^2 u'' + u - u^3`` at 1-D points, zero for ``u* = tanh(x/(sqrt 2 eps))``;
- ``score_fp_residual(score, x, t)``: ``d_t s - grad_x(div s + |s|^2 + x . s)`` for the OU process
  ``dx = -x dt + sqrt(2) dW``, zero for the exact score.

Both differentiate by autograd with the graph kept, so a loss built on them trains the network.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.pde import AllenCahn, as_input, check_points, divergence, grad


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
