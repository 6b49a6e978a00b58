"""A tiny decoder-only transformer (GPT) with a selectable MLP activation.

Defaults match minGPT's ``gpt-nano`` (3 layers, 3 heads, width 48) over a byte/char vocabulary of 128.
Pre-norm blocks ``x + Attn(N(x))``, ``x + MLP(N(x))``; learned positional embeddings. The MLP is
``blocks.{i}.mlp = Sequential(fc, act, proj)``: ``proj`` (the down-projection) is the layer that reads the
activation's output, which is where weight-drift diagnostics look.

The norm ``N`` is LayerNorm (default) or RMSNorm (``norm="rmsnorm"``, as in the modded-nanoGPT models of
paper 000-09). The choice matters for weight drift. LayerNorm subtracts the feature mean, so the gradient it
passes back, ``dL/dx``, sums to zero over features for every token; the residual stream's gradient is a sum
of such terms (every read of the stream goes through a norm), so a layer writing into the stream
(``attn.proj``, ``mlp.proj``) gets weight-gradient columns that sum to zero and its mean weight cannot move
under SGD. A layer reading a LayerNorm output (``attn.qkv``, ``mlp.fc``) reads features that sum to zero
while the norm's gain is uniform (at initialisation), so its mean gradient is zero there too. RMSNorm only
rescales, and neither identity holds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.components.activations import make_activation
from modules.components.norms import TokenNorm, make_norm


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
    """Pre-norm transformer block ``x + Attn(N(x))``, ``x + MLP(N(x))`` (shared by the tiny ViT).

    ``N`` is ``norm`` (LayerNorm or RMSNorm); ``clip`` and ``activation_args`` are the activation's keyword
    arguments (``activation_args`` wins where both give one).
    """

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
        norm: TokenNorm = "layernorm",
        activation_args: dict[str, float] | None = None,
    ) -> None:
        super().__init__()
        self.ln_1 = make_norm(norm, n_embd, bias=bias, choices=TokenNorm)
        self.attn = SelfAttention(n_embd, n_head, dropout, bias, causal)
        self.ln_2 = make_norm(norm, n_embd, bias=bias, choices=TokenNorm)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc", nn.Linear(n_embd, mlp_ratio * n_embd, bias=bias))
        act_args = {**({"clip": clip} if clip is not None else {}), **(activation_args or {})}
        self.mlp.add_module("act", make_activation(activation, act_args))
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

    Args:
        block_size, vocab_size: context length and vocabulary (linked from the DataModule).
        n_layer, n_head, n_embd, mlp_ratio: depth, heads, width and MLP expansion.
        activation: the MLP activation (``activation_names()``); ``activation_args`` its keyword arguments
            (``{clip: 8.0}`` for ``relu2_clip`` / ``gelu2_clip``).
        dropout, bias, tie_weights: dropout in the blocks, biases in linear layers and norms, head tied to
            the token embedding.
        norm: ``layernorm`` (default) or ``rmsnorm`` in every block and before the head (see the module
            docstring for why weight-drift studies use ``rmsnorm``).
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
        norm: TokenNorm = "layernorm",
        activation_args: dict[str, float] | None = None,
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
            [
                Block(n_embd, n_head, activation, mlp_ratio, dropout, bias, norm=norm, activation_args=activation_args)
                for _ in range(n_layer)
            ]
        )
        self.ln_f = make_norm(norm, n_embd, bias=bias, choices=TokenNorm)
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
