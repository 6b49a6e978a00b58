"""``TransINRBaseline`` (Chen & Wang 2022, *Transformers as Meta-Learners for Implicit Neural Representations*,
rebuilt from its description): the single-pass baseline of paper 004-01.

One pass of ``depth`` self-attention blocks over ``[data tokens; weight tokens]``, where the weight tokens of
layer l are d_{l-1} + 1 learned tokens, one per *column* of ``[W_l | b_l]``, each mapped by a linear head to
its column of d_l entries (the same fan-in scale ``g_l`` and centring over the layer's column tokens as
``AttnOptHyperINR``). Trainable count affine in the INR width W.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.attn_hyper_inr.functional import INRParams
from modules.attn_hyper_inr.hyper_inr_net import HyperINRNet, PatchTokens, center_tokens
from modules.components.attention import CrossAttentionBlock
from modules.components.inr import Activation


class TransINRBaseline(HyperINRNet):
    """Trans-INR: one pass of ``depth`` self-attention blocks over [data tokens; column tokens] (module docstring).

    A task network, built as ``TransINRBaseline(input_shape, out_dim, **init_args)`` (see ``AttnOptHyperINR``).

    Args: as ``AttnOptHyperINR`` (no rollout), plus ``depth``, the transformer blocks.
    """

    def __init__(self, input_shape: Sequence[int] = (3, 32, 32), out_dim: int = 3,
                 inr_widths: list[int] = [32, 32, 32], fourier_dim: int = 32,  # noqa: B006 - jsonargparse reads it
                 fourier_scale: float = 10.0, d_model: int = 64, n_heads: int = 4, depth: int = 6,
                 patch_size: int = 4, activation: Activation = "relu", mlp_ratio: int = 2) -> None:
        super().__init__(input_shape, out_dim, inr_widths, fourier_dim, fourier_scale, patch_size, activation)
        if depth < 1:
            raise ConfigError(f"depth must be >= 1, got {depth}")
        self.d_model, self.depth = d_model, depth
        self.data = PatchTokens(self.in_channels, patch_size, self.image_size, d_model, fourier_scale)
        self.blocks = nn.ModuleList(CrossAttentionBlock(d_model, n_heads, mlp_ratio) for _ in range(depth))
        # one learned token per column of [W_l | b_l]: d_{l-1} + 1 tokens for layer l
        self.column_tokens = nn.ParameterList(
            nn.Parameter(torch.randn(d_in + 1, d_model)) for d_in in self.dims[:-1])
        self.norm = nn.LayerNorm(d_model)
        self.heads = nn.ModuleList(nn.Linear(d_model, d_out) for d_out in self.dims[1:])
        for head in self.heads:
            nn.init.normal_(head.weight, std=d_model**-0.5)
            nn.init.zeros_(head.bias)

    def rollout(self, images: Tensor, steps: int | None = None, include_initial: bool = False) -> list[INRParams]:
        """A single pass: ``[theta]`` (``steps`` must be 1 or None; there are no weights before it, so
        ``include_initial`` must be False)."""
        if self._steps(1 if steps is None else steps) != 1:
            raise ConfigError("TransINRBaseline is a single-pass hypernetwork: steps must be 1")
        if include_initial:
            raise ConfigError("TransINRBaseline is a single-pass hypernetwork: it has no initial weights theta_0")
        self.check_images(images)
        b = images.shape[0]
        data = self.data(images)
        sizes = [t.shape[0] for t in self.column_tokens]
        z = torch.cat([data, *(t.expand(b, -1, -1) for t in self.column_tokens)], 1)
        for block in self.blocks:
            z = block(z, z)
        cols = self.norm(z[:, data.shape[1]:]).split(sizes, 1)
        params = []
        for l, (c, head) in enumerate(zip(cols, self.heads), start=1):
            w = head(center_tokens(c[:, :-1])).transpose(1, 2)  # (B, d_l, d_{l-1}): column j from token j
            params.append((w * self.fan_in_gain(l), head(c[:, -1])))
        return [params]


__all__ = ["TransINRBaseline"]
