"""The functional API of FRAC (paper 002-02): the power-law kernel weights and the FRAC selective scan.

``frac_kernel_weights(alpha (C,), rates (K,)) -> (C, K)`` and the scan itself live in
``modules.components.ssm`` (any selective-SSM method may use them); ``frac_selective_scan`` is the scan with
FRAC's argument order and names.
"""

from __future__ import annotations

from torch import Tensor

from modules.components.ssm import frac_kernel_weights, selective_scan

__all__ = ["frac_kernel_weights", "frac_selective_scan"]


def frac_selective_scan(
    x: Tensor,
    delta: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    rates: Tensor,
    weights: Tensor,
    lam: Tensor | None = None,
    D: Tensor | None = None,
) -> Tensor:
    """The FRAC scan ``(B, L, C)`` (package docstring), chunked-parallel, in the input's dtype.

    Args:
        x: inputs ``(B, L, C)``; delta: ``Delta >= 0 (B, L, C)``; Bm, Cm: ``(B, L, N)``; rates: ``s (K,) > 0``;
        weights: ``w (C, K)``; lam: ``lambda (C,) > 0`` (default 1); D: skip ``(C,)`` (default 0).
    """
    return selective_scan(x, delta, Bm, Cm, rates, weights, lam, D)
