"""Pre-norm cross-attention: a set of query tokens attends to a set of context tokens.

``CrossAttentionBlock`` is the transformer block with the attention's keys and values taken from another
token set::

    q' = q + MHA(LN_q(q), LN_k(k_src), LN_c(c))        (keys from k_src, default k_src = c)
    out = q' + MLP(LN_m(q'))

- pre-LayerNorm on the queries and on the context (and on a separate key source), a residual around the
  attention and around the MLP: the output lives on the query tokens (``(B, Q, D)`` in, ``(B, Q, D)`` out);
- the context may have any number of tokens N, also a different one per call; ``context_mask`` (``(B, N)``
  bool, True = attend) masks padded context tokens;
- ``key_context`` gives the keys a different source from the values (same N): the query then chooses which
  context token to read by comparing itself with ``key_context[n]`` and reads ``context[n]`` (a
  "transposed" read, as in backpropagation through a layer whose neurons are the keys);
- self-attention is ``block(x, x)``;
- the parameter count depends on ``dim``, ``mlp_ratio`` only, never on Q or N.

Plain ``nn.Linear`` projections (forward hooks see every matrix), ``F.scaled_dot_product_attention`` for the
product. Used by the attention hypernetwork INR (paper 004-01) and meant for any set-to-set model.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.components.activations import make_activation


class MultiHeadCrossAttention(nn.Module):
    """softmax(q W_q (k W_k)^T / sqrt(D/H)) v W_v, per head, then W_o: ``(B, Q, D), (B, N, D), (B, N, D) -> (B, Q, D)``.

    Args:
        dim: token width D (queries, keys and values).
        n_heads: H, a divisor of D.
        bias: biases in the four projections.
        dropout: attention dropout (training only).
    """

    def __init__(self, dim: int, n_heads: int = 4, bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        if dim < 1 or n_heads < 1 or dim % n_heads != 0:
            raise ConfigError(f"the token width ({dim}) must be a positive multiple of n_heads ({n_heads})")
        self.dim, self.n_heads, self.dropout = dim, n_heads, dropout
        self.q = nn.Linear(dim, dim, bias=bias)
        self.k = nn.Linear(dim, dim, bias=bias)
        self.v = nn.Linear(dim, dim, bias=bias)
        self.o = nn.Linear(dim, dim, bias=bias)

    def _heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.n_heads, self.dim // self.n_heads).transpose(1, 2)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Tensor:
        b, nq, _ = query.shape
        attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, N): True = attend
        y = F.scaled_dot_product_attention(
            self._heads(self.q(query)), self._heads(self.k(key)), self._heads(self.v(value)),
            attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0,
        )
        return self.o(y.transpose(1, 2).reshape(b, nq, self.dim))


class CrossAttentionBlock(nn.Module):
    """Pre-norm cross-attention block (module docstring): ``block(query, context, key_context=None, context_mask=None)``.

    Args:
        dim: token width D of queries and context.
        n_heads: attention heads (a divisor of D).
        mlp_ratio: hidden width of the MLP is ``mlp_ratio * D``.
        activation: the MLP's activation (any ``modules.components.activations`` name).
        dropout: attention and MLP dropout.
        separate_key_norm: a LayerNorm of its own for ``key_context`` (else it shares the context's); only for
            blocks always called with a ``key_context`` (a norm that never runs has no gradient, which DDP
            refuses).
    """

    def __init__(self, dim: int, n_heads: int = 4, mlp_ratio: int = 4, activation: str = "gelu",
                 dropout: float = 0.0, separate_key_norm: bool = False) -> None:
        super().__init__()
        if mlp_ratio < 1:
            raise ConfigError(f"mlp_ratio must be >= 1, got {mlp_ratio}")
        self.norm_q = nn.LayerNorm(dim)
        self.norm_c = nn.LayerNorm(dim)
        self.norm_k = nn.LayerNorm(dim) if separate_key_norm else None
        self.attn = MultiHeadCrossAttention(dim, n_heads, dropout=dropout)
        self.norm_m = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.add_module("fc", nn.Linear(dim, mlp_ratio * dim))
        self.mlp.add_module("act", make_activation(activation, {}))
        self.mlp.add_module("proj", nn.Linear(mlp_ratio * dim, dim))
        self.mlp_drop = nn.Dropout(dropout)

    def forward(self, query: Tensor, context: Tensor, key_context: Tensor | None = None,
                context_mask: Tensor | None = None) -> Tensor:
        """``query (B, Q, D)``, ``context (B, N, D)``, optional ``key_context (B, N, D)`` and ``context_mask
        (B, N)`` -> ``(B, Q, D)``."""
        if query.dim() != 3 or context.dim() != 3 or query.shape[0] != context.shape[0] or query.shape[2] != context.shape[2]:
            raise ConfigError(f"cross-attention needs query (B, Q, D) and context (B, N, D), got "
                              f"{tuple(query.shape)} and {tuple(context.shape)}")
        if key_context is not None and key_context.shape != context.shape:
            raise ConfigError(f"key_context {tuple(key_context.shape)} must have the context's shape {tuple(context.shape)}")
        c = self.norm_c(context)
        if key_context is None:
            k = c
        else:
            k = (self.norm_k or self.norm_c)(key_context)
        x = query + self.attn(self.norm_q(query), k, c, context_mask)
        return x + self.mlp_drop(self.mlp(self.norm_m(x)))


__all__ = ["CrossAttentionBlock", "MultiHeadCrossAttention"]
