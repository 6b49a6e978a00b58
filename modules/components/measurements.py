"""Linear measurement operators for 2-D inverse problems: masked Fourier sampling (MRI) and parallel-beam
projections (CT). Each maps signals ``(S, H, W, C)`` to real measurements ``(S, ...)``; their adjoints come
from autograd.

- ``MaskedFourier``: y = M . FFT2(f) (orthonormal FFT) on a variable-density random mask with a fully
  sampled centre, ``fraction`` of all k-space points (25 % by default);
- ``ParallelBeam``: line integrals at ``n_angles`` angles in [0, pi): the image rotated by each angle
  (bilinear, zero outside) summed along one axis, divided by H (so a constant image of 1 integrates to 1
  across the support);
- ``Identity``: direct fitting.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError

Task = Literal["fit", "mri", "ct"]


class Identity(nn.Module):
    """y = f (direct fitting)."""

    def forward(self, f: Tensor) -> Tensor:
        return f


def variable_density_mask(height: int, width: int, fraction: float = 0.25, center_fraction: float = 0.04,
                          decay: float = 0.12, seed: int = 0) -> Tensor:
    """A boolean k-space mask ``(H, W)`` in FFT layout (zero frequency at [0, 0]) with round(fraction H W)
    points: the ``center_fraction`` lowest frequencies (a disc) always, the rest drawn without replacement
    with probability proportional to 1 / (1 + (|k| / decay)^2), |k| in cycles per sample (at most ~0.71)."""
    if not 0 < fraction <= 1:
        raise ConfigError(f"the sampling fraction must be in (0, 1], got {fraction}")
    if not 0 <= center_fraction <= fraction:
        raise ConfigError(f"center_fraction must be in [0, fraction], got {center_fraction}")
    ky = torch.fft.fftfreq(height, dtype=torch.float64)[:, None]
    kx = torch.fft.fftfreq(width, dtype=torch.float64)[None, :]
    r = torch.sqrt(kx**2 + ky**2).reshape(-1)
    n_total = height * width
    n_keep = max(1, round(fraction * n_total))
    n_center = round(center_fraction * n_total)
    order = r.argsort(stable=True)
    mask = torch.zeros(n_total, dtype=torch.bool)
    mask[order[:n_center]] = True
    rest = (~mask).nonzero().squeeze(1)
    weights = 1.0 / (1.0 + (r[rest] / decay) ** 2)
    gen = torch.Generator().manual_seed(int(seed) + 101)
    if n_keep > n_center:
        mask[rest[torch.multinomial(weights, n_keep - n_center, replacement=False, generator=gen)]] = True
    return mask.reshape(height, width)


class MaskedFourier(nn.Module):
    """MRI analog: y = M . FFT2(f) as real pairs ``(S, M, C, 2)`` (orthonormal FFT, so |y| <= |f|)."""

    def __init__(self, height: int, width: int, fraction: float = 0.25, center_fraction: float = 0.04,
                 seed: int = 0) -> None:
        super().__init__()
        self.register_buffer("mask", variable_density_mask(height, width, fraction, center_fraction, seed=seed))

    def forward(self, f: Tensor) -> Tensor:
        k = torch.fft.fft2(f, dim=(1, 2), norm="ortho")  # (S, H, W, C)
        return torch.view_as_real(k[:, self.mask])  # (S, M, C, 2)


class ParallelBeam(nn.Module):
    """CT analog: parallel-beam line integrals ``(S, n_angles, W, C)`` at angles j pi / n_angles."""

    def __init__(self, height: int, width: int, n_angles: int = 45) -> None:
        super().__init__()
        if n_angles < 1:
            raise ConfigError(f"n_angles must be positive, got {n_angles}")
        theta = torch.arange(n_angles, dtype=torch.float64) * math.pi / n_angles
        c, s = torch.cos(theta), torch.sin(theta)
        zeros = torch.zeros_like(c)
        mats = torch.stack([torch.stack([c, -s, zeros], 1), torch.stack([s, c, zeros], 1)], 1)  # (A, 2, 3)
        grid = F.affine_grid(mats.float(), [n_angles, 1, height, width], align_corners=False)
        self.register_buffer("grid", grid)  # (A, H, W, 2)
        self.n_angles, self.H = n_angles, height

    def forward(self, f: Tensor) -> Tensor:
        s, h, w, c = f.shape
        img = f.permute(0, 3, 1, 2).reshape(1, s * c, h, w).expand(self.n_angles, -1, -1, -1)
        rot = F.grid_sample(img, self.grid.to(f.dtype), mode="bilinear", padding_mode="zeros", align_corners=False)
        sino = rot.sum(2) / self.H  # (A, S C, W): integrate along the rotated vertical axis
        return sino.reshape(self.n_angles, s, c, w).permute(1, 0, 3, 2)


def make_operator(task: Task, height: int, width: int, mri_fraction: float = 0.25, ct_angles: int = 45,
                  seed: int = 0) -> nn.Module:
    """The measurement operator of ``task``: ``fit`` (identity), ``mri`` (masked FFT), ``ct`` (projections)."""
    if task == "fit":
        return Identity()
    if task == "mri":
        return MaskedFourier(height, width, mri_fraction, seed=seed)
    if task == "ct":
        return ParallelBeam(height, width, ct_angles)
    raise ConfigError(f"task must be one of fit, mri, ct; got {task!r}")
