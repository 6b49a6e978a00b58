"""Group-wise asymmetric round-to-nearest (RTN) weight quantisation, and its straight-through form.

``quantize_rtn(w, bits, group_size)`` quantises a weight ``w (out, in)`` row by row in groups of
``group_size`` consecutive columns: with the group's minimum ``m`` and maximum ``M``,

    s = (M - m) / (2^bits - 1),    w_hat = m + clamp(round((w - m) / s), 0, 2^bits - 1) * s,

so the group's extremes are represented exactly. A constant group (``s = 0``) is returned unchanged.
``quantize_ste`` is the same value with the identity as its gradient (the straight-through estimator), for
quantisation-aware training or for gradients "at the quantised model" taken through the full-precision
weights.
"""

from __future__ import annotations

import torch
from torch import Tensor

from errors import ConfigError


def _check(w: Tensor, bits: int, group_size: int) -> None:
    if w.dim() != 2:
        raise ConfigError(f"quantize_rtn takes a 2-D weight (out, in), got shape {tuple(w.shape)}")
    if not 1 <= bits <= 16:
        raise ConfigError(f"bits must be in 1..16, got {bits}")
    if group_size <= 0 or w.shape[1] % group_size != 0:
        raise ConfigError(
            f"group_size={group_size} must be positive and divide the weight's {w.shape[1]} input columns; "
            "choose a divisor of every layer's width"
        )


def quantize_rtn(w: Tensor, bits: int, group_size: int) -> Tensor:
    """RTN of ``w (out, in)`` with ``2^bits`` levels per group of ``group_size`` columns of a row; same shape
    and dtype as ``w`` (module docstring)."""
    _check(w, bits, group_size)
    out_f, in_f = w.shape
    g = w.reshape(out_f, in_f // group_size, group_size)
    lo = g.amin(-1, keepdim=True)
    hi = g.amax(-1, keepdim=True)
    levels = 2**bits - 1
    scale = (hi - lo) / levels
    flat = scale == 0
    # a constant group keeps its values: divide by 1 there and select the original below
    q = torch.clamp(torch.round((g - lo) / torch.where(flat, torch.ones_like(scale), scale)), 0, levels)
    out = torch.where(flat, g, lo + q * scale)
    return out.reshape(out_f, in_f).to(w.dtype)


def quantize_ste(w: Tensor, bits: int, group_size: int) -> Tensor:
    """``quantize_rtn(w)`` in the forward pass, the identity in the backward pass (straight-through)."""
    # (w - w) is an exact zero, so the forward value is quantize_rtn(w) bit for bit
    return (w - w.detach()) + quantize_rtn(w.detach(), bits, group_size)
