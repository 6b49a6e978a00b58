"""A tiny Vision Transformer (Dosovitskiy et al. 2021): patch embedding, [CLS] token, pre-norm blocks.

The blocks are the tiny GPT's (``tiny_gpt.Block``) with non-causal attention, so the MLP of block ``i`` is
``blocks.{i}.mlp.{fc,act,proj}`` as in the GPT.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.components.norms import TokenNorm, make_norm
from modules.components.tiny_gpt import Block


class ViT(nn.Module):
    """``images (B, C, H, W) -> logits (B, num_classes)`` (a task network).

    Args:
        in_shape: one image's shape ``(C, H, W)``, square.
        num_classes: classes.
        patch_size: side of a square patch (must divide the image side).
        dim, depth, heads, mlp_ratio: transformer width, number of blocks, heads, MLP expansion.
        activation: the MLP activation (see ``activation_names()``); ``activation_args`` its keyword
            arguments (``{clip: 8.0}`` for ``relu2_clip``).
        dropout: dropout inside the blocks.
        norm: ``layernorm`` (default) or ``rmsnorm``, in the blocks and before the head. Under LayerNorm the
            layers writing into the residual stream have a mean weight gradient of exactly zero (see
            ``modules.components.tiny_gpt``), so weight-drift studies use ``rmsnorm``.
    """

    def __init__(
        self,
        in_shape: Sequence[int] = (1, 8, 8),
        num_classes: int = 10,
        patch_size: int = 2,
        dim: int = 48,
        depth: int = 3,
        heads: int = 3,
        mlp_ratio: int = 4,
        activation: str = "gelu",
        dropout: float = 0.0,
        norm: TokenNorm = "layernorm",
        activation_args: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        if len(in_shape) != 3 or in_shape[1] != in_shape[2]:
            raise ConfigError(f"ViT needs square images (C, H, H), got samples of shape {tuple(in_shape)}: set image_shape: true")
        in_channels, image_size = int(in_shape[0]), int(in_shape[1])
        if patch_size <= 0 or image_size % patch_size != 0:
            raise ConfigError(f"patch_size={patch_size} must divide image_size={image_size}")
        n_patches = (image_size // patch_size) ** 2
        self.image_size = image_size
        self.patch = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(
            [
                Block(dim, heads, activation, mlp_ratio, dropout, bias=True, causal=False, norm=norm,
                      activation_args=activation_args)
                for _ in range(depth)
            ]
        )
        self.ln = make_norm(norm, dim, choices=TokenNorm)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            raise ConfigError(
                f"ViT expects images (B, C, {self.image_size}, {self.image_size}), got {tuple(x.shape)}; "
                "use image_shape=True"
            )
        z = self.patch(x).flatten(2).transpose(1, 2)
        z = torch.cat([self.cls.expand(z.shape[0], -1, -1), z], dim=1) + self.pos
        for block in self.blocks:
            z = block(z)
        return self.head(self.ln(z)[:, 0])
