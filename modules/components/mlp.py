"""A plain multilayer perceptron: Linear -> activation, repeated, then a Linear read-out."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from torch import Tensor, nn

from errors import ConfigError
from modules.components.activations import make_activation


class MLP(nn.Module):
    """``in -> hidden[0] -> ... -> hidden[-1] -> out_dim`` with ``activation`` after every hidden layer.

    A task network (``(in_shape, out_dim, ...)`` first, see ``docs/design.md``): inputs of any shape are
    flattened, so ``in_shape`` is one sample's shape or its number of features. Layers are ``self.layers``
    (an ``nn.Sequential``) so hooks and diagnostics find them by name.

    Args:
        in_shape: one input sample's shape (or its flattened size).
        out_dim: outputs (classes).
        hidden: widths of the hidden layers.
        activation: activation after every hidden layer, any registered name (``activation_names()`` of
            ``modules.components.activations``: relu, gelu, ..., the trainable cauchy and gaussian, sine).
        bias: linear layers with biases.
        init: ``"default"`` (PyTorch's uniform init) or ``"kaiming"`` (He-normal weights, zero biases).
        activation_args: keyword arguments of the activation, e.g. ``{sparsity: 0.9}`` for ``quantile_relu``
            (the forced-sparsity sweep of paper 000-09), ``{clip: 8.0}`` for ``relu2_clip``, ``{w0: 1.0}`` for ``sine``.
    """

    def __init__(
        self,
        in_shape: int | Sequence[int],
        out_dim: int,
        hidden: Sequence[int] = (64, 64),
        activation: str = "relu",
        bias: bool = True,
        init: Literal["default", "kaiming"] = "default",
        activation_args: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        if init not in ("default", "kaiming"):
            raise ConfigError(f"init must be 'default' or 'kaiming', got {init!r}")
        in_dim = in_shape if isinstance(in_shape, int) else math.prod(in_shape)
        if in_dim <= 0 or out_dim <= 0 or any(h <= 0 for h in hidden):
            raise ConfigError(
                f"MLP sizes must be positive: in={in_shape}, hidden={list(hidden)}, out_dim={out_dim}"
            )
        self.in_dim = in_dim
        self.activation_name = activation
        layers: list[nn.Module] = []
        width = in_dim
        for h in hidden:
            layers += [nn.Linear(width, h, bias=bias), make_activation(activation, activation_args)]
            width = h
        layers.append(nn.Linear(width, out_dim, bias=bias))
        self.layers = nn.Sequential(*layers)
        if init == "kaiming":
            for m in self.layers:
                if isinstance(m, nn.Linear):
                    nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        if x.shape[1] != self.in_dim:
            raise ConfigError(
                f"the MLP expects {self.in_dim} input features per sample, got {x.shape[1]}: it was built for "
                "other data (the CLI links the size from the DataModule)"
            )
        return self.layers(x)
