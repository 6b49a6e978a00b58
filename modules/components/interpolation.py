"""Linear paths between two networks' weights and the loss barrier along them (linear mode connectivity).

``interpolate(sd_a, sd_b, alpha)`` is the state dict ``(1 - alpha) theta_A + alpha theta_B``;
``loss_barrier(alphas, losses)`` is the barrier of a loss curve sampled along such a path,

    B = max_alpha L(alpha) - [(1 - alpha) L(0) + alpha L(1)],

the largest rise of the path's loss above the chord between its endpoints (Frankle et al. 2020; Ainsworth
et al. 2023). Both are used by methods that align or merge networks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from errors import ConfigError


def interpolate(sd_a: Mapping[str, Tensor], sd_b: Mapping[str, Tensor], alpha: float | Tensor) -> dict[str, Tensor]:
    """``(1 - alpha) sd_a + alpha sd_b`` entry by entry (differentiable in both and in ``alpha``).

    Integer entries (counters, index buffers) cannot be averaged: they must agree and are taken from ``sd_a``.
    """
    if set(sd_a) != set(sd_b):
        only = sorted(set(sd_a) ^ set(sd_b))
        raise ConfigError(
            f"the two state dicts differ in their entries ({', '.join(only[:3])}): interpolate "
            "networks of one architecture"
        )
    out: dict[str, Tensor] = {}
    for name, a in sd_a.items():
        b = sd_b[name]
        if a.shape != b.shape:
            raise ConfigError(
                f"{name}: shapes {tuple(a.shape)} and {tuple(b.shape)} differ; interpolate networks of one architecture"
            )
        if not (a.is_floating_point() or a.is_complex()):
            if not torch.equal(a, b):
                raise ConfigError(f"{name}: integer entries differ between the two networks and cannot be averaged")
            out[name] = a
            continue
        out[name] = a + alpha * (b - a) if isinstance(alpha, Tensor) else (1.0 - alpha) * a + alpha * b
    return out


def loss_barrier(alphas: Sequence[float] | Tensor, losses: Sequence[float] | Tensor) -> float:
    """The barrier ``max_alpha L(alpha) - [(1 - alpha) L(0) + alpha L(1)]`` of losses sampled at ``alphas``.

    ``alphas`` must start at 0 and end at 1 (the endpoints define the chord) and increase. The barrier is
    never below 0 (the endpoints themselves lie on the chord).
    """
    a = torch.as_tensor(alphas, dtype=torch.float64).flatten()
    loss = torch.as_tensor(losses, dtype=torch.float64).flatten()
    if a.numel() != loss.numel() or a.numel() < 2:
        raise ConfigError(
            f"loss_barrier needs one loss per alpha (at least 2), got {a.numel()} alphas and {loss.numel()} losses"
        )
    if a[0] != 0 or a[-1] != 1 or bool((a.diff() <= 0).any()):
        raise ConfigError("loss_barrier needs increasing alphas from 0 to 1 (the endpoints define the chord)")
    chord = (1 - a) * loss[0] + a * loss[-1]
    return float((loss - chord).max())


__all__ = ["interpolate", "loss_barrier"]
