"""A tiny Vision Transformer (Dosovitskiy et al. 2021): patch embedding, [CLS] token, pre-norm blocks.

The blocks are the tiny GPT's (``tiny_gpt.Block``) with non-causal attention, so the MLP of block ``i`` is
``blocks.{i}.mlp.{fc,act,proj}`` as in the GPT.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from modules.components.tiny_gpt import Block


class ViT(nn.Module):
    """``images (B, C, H, W) -> logits (B, num_classes)``.

    Args:
        image_size: side of the square input image.
        patch_size: side of a square patch (must divide ``image_size``).
        in_channels, num_classes: input channels and classes.
        dim, depth, heads, mlp_ratio: transformer width, number of blocks, heads, MLP expansion.
        activation: the MLP activation (see ``activation_names()``).
        dropout: dropout inside the blocks.
    """

    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        in_channels: int = 1,
        num_classes: int = 10,
        dim: int = 48,
        depth: int = 3,
        heads: int = 3,
        mlp_ratio: int = 4,
        activation: str = "gelu",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if patch_size <= 0 or image_size % patch_size != 0:
            raise ValueError(f"patch_size={patch_size} must divide image_size={image_size}")
        n_patches = (image_size // patch_size) ** 2
        self.image_size = image_size
        self.patch = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(
            [Block(dim, heads, activation, mlp_ratio, dropout, bias=True, causal=False) for _ in range(depth)]
        )
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            raise ValueError(
                f"ViT expects images (B, C, {self.image_size}, {self.image_size}), got {tuple(x.shape)}; "
                "use image_shape=True or set image_size"
            )
        z = self.patch(x).flatten(2).transpose(1, 2)
        z = torch.cat([self.cls.expand(z.shape[0], -1, -1), z], dim=1) + self.pos
        for block in self.blocks:
            z = block(z)
        return self.head(self.ln(z)[:, 0])
