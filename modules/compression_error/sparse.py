"""Products with a constant sparse matrix whose transpose is precomputed (CT projections, hash-grid lookups)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class _SparseMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, m: Tensor, mt: Tensor, x: Tensor) -> Tensor:
        ctx.mt = mt
        return m @ x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[None, None, Tensor]:
        return None, None, ctx.mt @ grad


def sparse_matmul(m: Tensor, mt: Tensor, x: Tensor) -> Tensor:
    """``m @ x`` for a constant sparse ``m`` with ``mt = m.T`` given: the backward pass uses ``mt`` instead of
    transposing ``m`` at every step, as torch's own sparse backward does."""
    return _SparseMatmul.apply(m, mt, x)
