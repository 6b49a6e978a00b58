"""The small baseline networks of the ResidualCAN PINN comparisons (paper 000-02), as task networks
``(in_shape, out_dim, ...)``: SIREN and random Fourier features. The Cauchy networks (``ResidualCAN``,
``MLP``, ``RBFKAN``) are shared components in ``modules.components.local_basis``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.components.inr import Sine
from modules.components.mlp import MLP


def _flat_dim(in_shape: int | Sequence[int]) -> int:
    return in_shape if isinstance(in_shape, int) else math.prod(in_shape)


class SirenNet(nn.Module):
    """SIREN (Sitzmann et al. 2020): ``sin(w0 (W x + b))`` layers, first-layer weights ``U(-1/n, 1/n)``,
    hidden ``U(-sqrt(6/n)/w_h, sqrt(6/n)/w_h)`` with ``w_h`` = ``hidden_w0``, a linear read-out.

    Args:
        in_shape, out_dim: sizes (a task network).
        width, depth: hidden width and number of sine layers.
        w0: the first layer's frequency factor; hidden_w0: the hidden layers'.
    """

    def __init__(self, in_shape: int | Sequence[int], out_dim: int, width: int = 64, depth: int = 3,
                 w0: float = 30.0, hidden_w0: float = 30.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = _flat_dim(in_shape)
        for i in range(depth):
            lin = nn.Linear(prev, width)
            w = w0 if i == 0 else hidden_w0
            # weights only: the biases keep nn.Linear's initialisation (the runs of docs/papers/residual_can.md)
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
    2020), into an ``MLP``.

    Args:
        in_shape, out_dim: sizes (a task network).
        width, depth, activation: the ``MLP`` after the features.
        n_features: rows of ``B`` (2 n_features inputs to the MLP); sigma: the standard deviation of ``B``.
        seed: seed of ``B``'s draw.
    """

    def __init__(self, in_shape: int | Sequence[int], out_dim: int, width: int = 64, depth: int = 2,
                 n_features: int = 32, sigma: float = 1.0, activation: str = "tanh", seed: int = 0) -> None:
        super().__init__()
        if n_features <= 0 or not sigma > 0:
            raise ConfigError(f"Fourier features need n_features > 0 and sigma > 0, got {n_features}, {sigma}")
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("B", sigma * torch.randn(n_features, _flat_dim(in_shape), generator=gen))
        self.mlp = MLP(2 * n_features, out_dim, hidden=[width] * depth, activation=activation)

    def forward(self, x: Tensor) -> Tensor:
        z = 2.0 * math.pi * x.flatten(1) @ self.B.T.to(x.dtype)
        return self.mlp(torch.cat([torch.sin(z), torch.cos(z)], dim=1))
