"""``MLPOptStepBaseline``: the MLP instantiation of an optimisation-oriented hypernetwork that paper 004-01's
abstract criticises.

Learned initial INR weights ``theta_0``, then K true chain-rule steps: ``G_l`` from ``inr_chain_rule_step``
on the image, and ``W_l <- W_l + MLP_l(flatten(W_l, G_l))`` with ``MLP_l: 2 n_l -> n_l -> n_l``,
``n_l = d_l d_{l-1}``; ``b_l <- b_l - eta_l grad_b`` with a learned ``eta_l``. About ``3 n_l^2 ~ 3 W^4``
parameters per W x W layer, so widths above 64 are refused (``mlp_opt_parameter_count`` counts without
building).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.attn_hyper_inr.functional import INRParams, inr_chain_rule_step
from modules.attn_hyper_inr.hyper_inr_net import HyperINRNet
from modules.components.activations import get_activation
from modules.components.inr import Activation

#: the widest INR layer the baseline builds (3 W^4 = 5 x 10^7 parameters per 64 x 64 layer)
MLP_OPT_MAX_WIDTH = 64


class MLPOptStepBaseline(HyperINRNet):
    """K true chain-rule steps whose weight update is an MLP of ``flatten(W_l, G_l)`` (module docstring).

    A task network, built as ``MLPOptStepBaseline(input_shape, out_dim, **init_args)`` (see ``AttnOptHyperINR``).

    Args: as ``AttnOptHyperINR``'s INR arguments, plus ``rollout_steps`` (K), ``mlp_activation`` (the update
    MLPs' activation, ``modules.components.activations``) and ``base_lr`` (the initial eta_l). Widths above
    64 are refused: the count is ``mlp_opt_parameter_count`` (about 3 W^4 per W x W layer).
    """

    has_initial_weights: ClassVar[bool] = True

    def __init__(self, input_shape: Sequence[int] = (3, 32, 32), out_dim: int = 3,
                 inr_widths: list[int] = [16, 16], fourier_dim: int = 32,  # noqa: B006 - jsonargparse reads it
                 fourier_scale: float = 10.0, rollout_steps: int = 3, patch_size: int = 4,
                 activation: Activation = "relu", mlp_activation: str = "gelu", base_lr: float = 1.0) -> None:
        super().__init__(input_shape, out_dim, inr_widths, fourier_dim, fourier_scale, patch_size, activation)
        if max(self.inr_widths) > MLP_OPT_MAX_WIDTH:
            raise ConfigError(f"MLPOptStepBaseline has ~3 W^4 parameters per layer: widths above {MLP_OPT_MAX_WIDTH} are "
                              f"refused (got {self.inr_widths}); count larger ones with mlp_opt_parameter_count")
        if not isinstance(rollout_steps, int) or rollout_steps < 1:
            raise ConfigError(f"rollout_steps must be an integer >= 1, got {rollout_steps!r}")
        self.rollout_steps = rollout_steps
        self.w0 = nn.ParameterList()
        self.b0 = nn.ParameterList()
        self.updates = nn.ModuleList()
        self.log_lr_b = nn.Parameter(torch.full((self.n_layers,), math.log(base_lr)))
        for l, (d_in, d_out) in enumerate(zip(self.dims[:-1], self.dims[1:]), start=1):
            self.w0.append(nn.Parameter(torch.randn(d_out, d_in) * self.fan_in_gain(l)))
            self.b0.append(nn.Parameter(torch.zeros(d_out)))
            n = d_in * d_out
            mlp = nn.Sequential(nn.Linear(2 * n, n), get_activation(mlp_activation), nn.Linear(n, n))
            nn.init.zeros_(mlp[2].weight)  # starts as the identity step, W <- W
            nn.init.zeros_(mlp[2].bias)
            self.updates.append(mlp)

    def rollout(self, images: Tensor, steps: int | None = None, include_initial: bool = False) -> list[INRParams]:
        """``[theta_1, ..., theta_K]`` (``[theta_0, ...]`` with ``include_initial``: the learned initial weights)."""
        steps = self._steps(steps)
        self.check_images(images)
        b = images.shape[0]
        x = self.features().expand(b, -1, -1)
        y = self.pixels(images)
        ws = [w.expand(b, -1, -1) for w in self.w0]
        bs = [bias.expand(b, -1) for bias in self.b0]
        out = [list(zip(ws, bs))] if include_initial else []
        for _ in range(steps):
            chain = inr_chain_rule_step(ws, bs, x, y, self.activation)
            ws = [w + mlp(torch.cat([w.flatten(1), g.flatten(1)], 1)).view_as(w)
                  for w, g, mlp in zip(ws, chain["grad_w"], self.updates)]
            bs = [bias - self.log_lr_b[l].exp() * g for l, (bias, g) in enumerate(zip(bs, chain["grad_b"]))]
            out.append(list(zip(ws, bs)))
        return out


__all__ = ["MLP_OPT_MAX_WIDTH", "MLPOptStepBaseline"]
