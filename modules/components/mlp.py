"""A plain multilayer perceptron: Linear -> activation, repeated, then a Linear read-out."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from modules.components.activations import get_activation


class MLP(nn.Module):
    """``in_dim -> hidden[0] -> ... -> hidden[-1] -> out_dim`` with ``activation`` after every hidden layer.

    Layers are ``self.layers`` (an ``nn.Sequential``) so hooks and diagnostics find them by name.
    """

    def __init__(
        self, in_dim: int, hidden: Sequence[int], out_dim: int, activation: str = "relu", bias: bool = True
    ) -> None:
        super().__init__()
        if in_dim <= 0 or out_dim <= 0 or any(h <= 0 for h in hidden):
            raise ValueError(
                f"MLP sizes must be positive: in_dim={in_dim}, hidden={list(hidden)}, out_dim={out_dim}"
            )
        layers: list[nn.Module] = []
        width = in_dim
        for h in hidden:
            layers += [nn.Linear(width, h, bias=bias), get_activation(activation)]
            width = h
        layers.append(nn.Linear(width, out_dim, bias=bias))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x.flatten(1))
