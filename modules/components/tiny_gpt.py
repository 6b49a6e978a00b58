"""A tiny decoder-only transformer (GPT) with a selectable MLP activation.

Defaults match minGPT's ``gpt-nano`` (3 layers, 3 heads, width 48) over a byte/char vocabulary of 128.
Pre-norm blocks ``x + Attn(LN(x))``, ``x + MLP(LN(x))``; learned positional embeddings. The MLP is
``blocks.{i}.mlp = Sequential(fc, act, proj)``: ``proj`` (the down-projection) is the layer that reads the
activation's output, which is where weight-drift diagnostics look.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.components.activations import get_activation


class SelfAttention(nn.Module):
    """Multi-head self-attention from plain linear projections (fused q, k, v); causal for the GPT.

    Plain ``nn.Linear`` projections (not ``nn.MultiheadAttention``) so forward hooks see every matrix.
    """

    def __init__(
        self, n_embd: int, n_head: int, dropout: float = 0.0, bias: bool = False, causal: bool = True
    ) -> None:
        super().__init__()
        self.causal = causal
        if n_embd % n_head != 0:
            raise ConfigError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (B, T, C) -> (B, H, T, C/H)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


CausalSelfAttention = SelfAttention


class Block(nn.Module):
    """Pre-norm transformer block ``x + Attn(LN(x))``, ``x + MLP(LN(x))`` (shared by the tiny ViT)."""

    def __init__(
        self,
        n_embd: int,
        n_head: int,
        activation: str = "gelu",
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        bias: bool = False,
        causal: bool = True,
        clip: float | None = None,
    ) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = SelfAttention(n_embd, n_head, dropout, bias, causal)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc", nn.Linear(n_embd, mlp_ratio * n_embd, bias=bias))
        self.mlp.add_module("act", get_activation(activation, clip=clip))
        self.mlp.add_module("proj", nn.Linear(mlp_ratio * n_embd, n_embd, bias=bias))
        self.mlp_drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_drop(self.mlp(self.ln_2(x)))


class TinyGPT(nn.Module):
    """GPT language model: ``idx (B, T) -> logits (B, T, vocab_size)`` with causal attention.

    A task network for next-token data: ``(block_size, vocab_size)`` come first, as ``(in_shape, out_dim)``
    (``in_shape`` of token windows is ``(block_size,)``; the output classes are the vocabulary).

    Initialisation follows GPT-2/minGPT: N(0, 0.02) weights, residual output projections scaled by
    ``1/sqrt(2 n_layer)`` so the residual stream's variance does not grow with depth.
    """

    def __init__(
        self,
        block_size: int | Sequence[int] = 64,
        vocab_size: int = 128,
        n_layer: int = 3,
        n_head: int = 3,
        n_embd: int = 48,
        activation: str = "gelu",
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        bias: bool = False,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(block_size, int):
            (block_size,) = block_size
        if min(vocab_size, block_size, n_layer, n_head, n_embd, mlp_ratio) <= 0:
            raise ConfigError("TinyGPT sizes must be positive")
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            [Block(n_embd, n_head, activation, mlp_ratio, dropout, bias) for _ in range(n_layer)]
        )
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx: Tensor) -> Tensor:
        if idx.dim() != 2:
            raise ConfigError(f"TinyGPT expects idx of shape (B, T), got {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.block_size:
            raise ConfigError(f"sequence length {t} exceeds block_size={self.block_size}; raise block_size")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
