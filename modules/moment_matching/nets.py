"""Random residual nets and the four ways to push a Gaussian through them (paper 002-06).

A ``ResidualNet`` is ``depth`` blocks ``y = A x + B phi(C x + d)`` of width ``n`` and hidden width ``h``
(``A = I`` for a residual net, ``A = None`` for a plain one), weights ``N(0, 1 / fan_in)``, biases
``N(0, bias_scale^2)``. ``propagate(net, mean, cov, method)`` gives the output law's moments:

- ``exact``: layer-by-layer exact moment matching (``residual_layer_moments``);
- ``linearize``: the first-order (delta-method) law, ``f(mu)`` and ``J Sigma J^T``, layer by layer (the chain
  rule makes it the whole net's linearisation);
- ``diag``: moment matching with independent units: only variances propagate (``Var(Wx)_i = sum_k W_ik^2 v_k``,
  each activation's mean and variance exact for its own Gaussian), the output covariance diagonal;
- ``unscented``: per layer, the ``2n`` symmetric sigma points ``mu +- sqrt(n) L_k`` (``L L^T = Sigma``, weights
  ``1 / 2n``: the unscented transform with kappa = 0), their mean and covariance after the layer.

``mc_moments`` is the ground truth: the sample mean and covariance of the net's outputs on draws of the input.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.components.gaussian import MomentAccumulator
from modules.moment_matching.functional import (
    ACTIVATIONS,
    _layer,
    activation_derivative,
    activation_fn,
    check_gaussian,
)

Method = Literal["exact", "linearize", "diag", "unscented"]
METHODS: tuple[str, ...] = get_args(Method)


class ResidualNet(nn.Module):
    """``depth`` blocks ``y = A x + B phi(C x + d)`` (module docstring); the weights are buffers (nothing trains).

    Args:
        width: n, the width of the residual stream (input and output dimension).
        depth: the number of blocks.
        hidden: h, the width inside a block (default n).
        activation: probit, heaviside, gelu, relu or sine.
        residual: ``A = I`` (True) or a plain block ``y = B phi(C x + d)`` (False).
        seed: the weights' seed.
        bias_scale: standard deviation of the biases d.
    """

    def __init__(
        self, width: int, depth: int, hidden: int | None = None, activation: str = "gelu", residual: bool = True,
        seed: int = 0, bias_scale: float = 0.0,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {activation!r}; choose from {list(ACTIVATIONS)}")
        if width < 1 or depth < 1 or (hidden is not None and hidden < 1) or bias_scale < 0:
            raise ConfigError(f"need width, depth, hidden >= 1 and bias_scale >= 0, got {width}, {depth}, {hidden}, "
                              f"{bias_scale}")
        h = hidden or width
        gen = torch.Generator().manual_seed(seed)
        self.activation, self.residual, self.depth = activation, residual, depth
        for i in range(depth):
            self.register_buffer(f"C{i}", torch.randn(h, width, generator=gen, dtype=torch.float64) / width**0.5)
            self.register_buffer(f"d{i}", torch.randn(h, generator=gen, dtype=torch.float64) * bias_scale)
            self.register_buffer(f"B{i}", torch.randn(width, h, generator=gen, dtype=torch.float64) / h**0.5)

    def blocks(self) -> list[tuple[Tensor | None, Tensor, Tensor, Tensor]]:
        """``[(A, B, C, d)]`` input to output (``A`` the identity or None)."""
        out = []
        for i in range(self.depth):
            c = getattr(self, f"C{i}")
            a = torch.eye(c.shape[1], dtype=c.dtype, device=c.device) if self.residual else None
            out.append((a, getattr(self, f"B{i}"), c, getattr(self, f"d{i}")))
        return out

    def forward(self, x: Tensor) -> Tensor:
        for i in range(self.depth):
            c, d, b = (getattr(self, f"{k}{i}") for k in "CdB")
            y = activation_fn(x @ c.T + d, self.activation) @ b.T
            x = x + y if self.residual else y  # A = I: no matmul with the identity on every sample
        return x


def _linearized_block(mean: Tensor, cov: Tensor, a: Tensor | None, b: Tensor, c: Tensor, d: Tensor,
                      activation: str) -> tuple[Tensor, Tensor]:
    z = mean @ c.T + d
    y = activation_fn(z, activation) @ b.T
    jac = b @ (activation_derivative(z, activation).unsqueeze(-1) * c)  # (N, n_out, n_in)
    if a is not None:
        y = y + mean @ a.T
        jac = jac + a
    out = jac @ cov @ jac.transpose(-1, -2)
    return y, 0.5 * (out + out.transpose(-1, -2))


def _matrix_sqrt(cov: Tensor) -> Tensor:
    """``L`` with ``L L^T = cov`` for a PSD ``cov`` (eigendecomposition: also for singular ones)."""
    evals, evecs = torch.linalg.eigh(cov)
    return evecs * evals.clamp_min(0).sqrt().unsqueeze(-2)


def _unscented_block(mean: Tensor, cov: Tensor, a: Tensor | None, b: Tensor, c: Tensor, d: Tensor,
                     activation: str) -> tuple[Tensor, Tensor]:
    n = mean.shape[-1]
    root = _matrix_sqrt(cov) * n**0.5  # columns are the offsets
    points = torch.cat([mean.unsqueeze(-2) + root.transpose(-1, -2), mean.unsqueeze(-2) - root.transpose(-1, -2)], -2)
    y = activation_fn(points @ c.T + d, activation) @ b.T
    if a is not None:
        y = y + points @ a.T
    mu = y.mean(-2)
    dev = y - mu.unsqueeze(-2)
    return mu, dev.transpose(-1, -2) @ dev / (2 * n)


def propagate(net: ResidualNet, mean: Tensor, cov: Tensor, method: Method) -> tuple[Tensor, Tensor]:
    """The output law's ``(mean (N, n), cov (N, n, n))`` for inputs ``N(mean, cov)`` by ``method``."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose from {list(METHODS)}")
    check_gaussian(mean, cov)
    if method == "diag":
        cov = torch.diag_embed(torch.diagonal(cov, dim1=-2, dim2=-1))
    for a, b, c, d in net.blocks():
        if method == "exact":
            mean, cov = _layer(mean, cov, a, b, c, d, net.activation)
        elif method == "diag":
            mean, cov = _layer(mean, cov, a, b, c, d, net.activation, diagonal=True)
        elif method == "linearize":
            mean, cov = _linearized_block(mean, cov, a, b, c, d, net.activation)
        else:
            mean, cov = _unscented_block(mean, cov, a, b, c, d, net.activation)
    return mean, cov


@torch.no_grad()
def mc_moments(
    net: nn.Module, mean: Tensor, cov: Tensor, n_samples: int, generator: torch.Generator,
    shift: Tensor | None = None, chunk: int = 50_000,
) -> tuple[Tensor, Tensor]:
    """Sample mean and covariance of ``net(x)``, ``x ~ N(mean, cov)`` (one law per row), from ``n_samples`` draws
    in chunks, accumulated about ``shift`` (e.g. the predicted output mean; default the first chunk's mean)."""
    root = _matrix_sqrt(cov)
    acc: MomentAccumulator | None = MomentAccumulator(shift) if shift is not None else None
    done = 0
    while done < n_samples:
        m = min(chunk, n_samples - done)
        eps = torch.randn(mean.shape[0], m, mean.shape[1], generator=generator, dtype=mean.dtype)
        x = mean.unsqueeze(-2) + eps @ root.transpose(-1, -2)
        y = net(x.reshape(-1, x.shape[-1])).reshape(mean.shape[0], m, -1)
        if acc is None:
            acc = MomentAccumulator(y.mean(-2))
        acc.update(y)
        done += m
    assert acc is not None
    return acc.moments()


__all__ = ["METHODS", "Method", "ResidualNet", "mc_moments", "propagate"]
