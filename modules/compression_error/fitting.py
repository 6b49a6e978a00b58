"""Fitting one signal at one compression level (paper 000-13) outside Lightning: ``fit_level`` (the direct
least-squares solves where they exist, else Adam) and ``train_field``, the full-batch Adam loop with a cosine
decay of the rate that both use.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.compression_error.signal_fits import (
    Family,
    SignalField,
    check_level,
    make_field,
    solve_cp,
    solve_fourier,
    solve_grid,
)


def fit_level(signal: Tensor, family: Family, level: int, seed: int = 0, *, steps: int = 1500, lr: float = 1e-2,
              **options: Any) -> Tensor:
    """The fit of ``signal`` ``(H, W)`` or ``(H, W, C)`` at compression ``level`` of ``family`` (minimal
    pixel MSE); the same shape and dtype.

    ``grid`` (r x r nodes per channel, ``F.interpolate(G, (H, W), mode="bilinear", align_corners=True)``),
    linear ``fourier`` and single-channel ``cp`` are solved directly (least squares: the separable solve
    G = A_H^+ F (A_W^+)^T, the truncated Fourier series or ``lstsq`` on Gaussian features, the truncated
    SVD); ``hash``, Fourier with an MLP readout and multi-channel CP by ``steps`` full-batch Adam steps at
    ``lr`` with a cosine decay, from the seeded initialisation. ``options`` go to the family (see
    ``modules.compression_error.signal_fits``), e.g. ``n_levels`` for hash or ``frequencies`` for fourier.
    """
    if not isinstance(signal, Tensor) or signal.dim() not in (2, 3):
        raise ConfigError(f"signal must be a tensor (H, W) or (H, W, C), got "
                          f"{tuple(signal.shape) if isinstance(signal, Tensor) else type(signal).__name__}")
    if not torch.isfinite(signal).all():
        raise ConfigError("signal contains NaN or inf values")
    squeeze = signal.dim() == 2
    x = signal[..., None] if squeeze else signal
    h, w, c = x.shape
    check_level(family, level, h, w)
    dtype = signal.dtype if signal.is_floating_point() else torch.float32
    xf = x.to(dtype)
    if family == "grid":
        out = solve_grid(xf, level)
    elif family == "fourier" and not options.get("hidden"):
        out = solve_fourier(xf, level, options.get("frequencies", "lattice"), options.get("scale", 16.0), seed)
    elif family == "cp" and c == 1:
        out = solve_cp(xf, level)
    else:
        field = make_field(family, level, 1, h, w, c, seed=seed, **options)
        out = train_field(field, xf[None].float(), steps=steps, lr=lr)[0].to(dtype)
    return out[..., 0] if squeeze else out


def train_field(field: SignalField, target: Tensor, steps: int = 1500, lr: float = 1e-2,
                operator: nn.Module | None = None) -> Tensor:
    """Fit ``field`` to ``target (S, H, W, C)`` (through ``operator``: minimise |A f - A f*|^2) by full-batch
    Adam with a cosine decay of the rate to 1 %; return the fit ``(S, H, W, C)`` (no grad)."""
    if steps < 1:
        raise ConfigError(f"steps must be positive, got {steps}")
    op = operator if operator is not None else nn.Identity()
    with torch.no_grad():
        y = op(target)
    opt = torch.optim.Adam(field.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=lr * 0.01)
    for _ in range(steps):
        loss = (op(field()) - y).pow(2).flatten(1).mean(1).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        return field()
