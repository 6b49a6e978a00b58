"""Linear measurement operators for 2-D inverse problems: masked Fourier sampling (MRI) and parallel-beam
projections (CT). Each maps signals ``(S, H, W, C)`` to real measurements ``(S, ...)``; their adjoints come
from autograd.

- ``MaskedFourier``: y = M . FFT2(f) (orthonormal FFT) on a variable-density random mask with a fully
  sampled centre, ``fraction`` of all k-space points (25 % by default);
- ``ParallelBeam``: line integrals at ``n_angles`` angles in [0, pi): the image rotated by each angle
  (bilinear, zero outside) summed along one axis, divided by H (so a constant image of 1 integrates to 1
  across the support); ``support_disc`` is its field of view;
- ``DirectObservation``: y = f, direct fitting.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.compression_error.sparse import sparse_matmul

Task = Literal["fit", "mri", "ct"]


class DirectObservation(nn.Module):
    """y = f: the measurement of direct fitting (the signal itself is observed)."""

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


def _bilinear_sample_matrix(grid: Tensor, height: int, width: int) -> Tensor:
    """The sparse ``(N, H W)`` matrix of ``F.grid_sample(img, grid, "bilinear", "zeros", align_corners=False)``
    for sample points ``grid (N, 2)`` in [-1, 1]^2 (x along the width): four weights per row, corners outside
    the image dropped."""
    ix = ((grid[:, 0].double() + 1) * width - 1) / 2
    iy = ((grid[:, 1].double() + 1) * height - 1) / 2
    x0, y0 = ix.floor(), iy.floor()
    fx, fy = ix - x0, iy - y0
    rows, cols, vals = [], [], []
    n = torch.arange(grid.shape[0])
    for dx, dy, w in ((0, 0, (1 - fx) * (1 - fy)), (1, 0, fx * (1 - fy)), (0, 1, (1 - fx) * fy), (1, 1, fx * fy)):
        cx, cy = (x0 + dx).long(), (y0 + dy).long()
        ok = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height) & (w > 0)
        rows.append(n[ok])
        cols.append(cy[ok] * width + cx[ok])
        vals.append(w[ok])
    idx = torch.stack([torch.cat(rows), torch.cat(cols)])
    return torch.sparse_coo_tensor(idx, torch.cat(vals).float(), (grid.shape[0], height * width),
                                   check_invariants=True).coalesce()


class ParallelBeam(nn.Module):
    """CT analog: parallel-beam line integrals ``(S, n_angles, W, C)`` at angles j pi / n_angles.

    For each angle the image is rotated (bilinear, zero outside; what ``F.grid_sample`` does, written once
    as a sparse matrix) and summed along the vertical axis, divided by H. Only the inscribed disc is seen at
    every angle (``support_disc``): reconstructions restrict themselves to it.
    """

    def __init__(self, height: int, width: int, n_angles: int = 45) -> None:
        super().__init__()
        if n_angles < 1:
            raise ConfigError(f"n_angles must be positive, got {n_angles}")
        theta = torch.arange(n_angles, dtype=torch.float64) * math.pi / n_angles
        c, s = torch.cos(theta), torch.sin(theta)
        zeros = torch.zeros_like(c)
        mats = torch.stack([torch.stack([c, -s, zeros], 1), torch.stack([s, c, zeros], 1)], 1)  # (A, 2, 3)
        grid = F.affine_grid(mats, [n_angles, 1, height, width], align_corners=False)  # (A, H, W, 2)
        self.n_angles, self.H, self.W = n_angles, height, width
        sample = _bilinear_sample_matrix(grid.reshape(-1, 2), height, width)  # rows (a, i, j)
        # sum over i (the rotated vertical axis): row (a, i, j) -> projection bin (a, j)
        r, col = sample.indices()
        a, rem = r // (height * width), r % (height * width)
        bins = a * width + rem % width
        proj = torch.sparse_coo_tensor(torch.stack([bins, col]), sample.values() / height,
                                       (n_angles * width, height * width), check_invariants=True).coalesce()
        with warnings.catch_warnings():  # "sparse CSR support is in beta": matmul with a dense matrix is all we use
            warnings.simplefilter("ignore", UserWarning)
            self._proj = (proj.to_sparse_csr(), proj.t().coalesce().to_sparse_csr())

    def forward(self, f: Tensor) -> Tensor:
        s, h, w, c = f.shape
        m, mt = self._proj
        if m.device != f.device:
            self._proj = m, mt = m.to(f.device), mt.to(f.device)
        x = f.permute(1, 2, 0, 3).reshape(h * w, s * c)
        sino = sparse_matmul(m, mt, x.float()).to(f.dtype)  # (A W, S C)
        return sino.reshape(self.n_angles, w, s, c).permute(2, 0, 1, 3)



def support_disc(height: int, width: int) -> Tensor:
    """``(H, W)`` float mask of the pixels whose centres lie in the inscribed disc (the CT field of view)."""
    ys = (torch.arange(height, dtype=torch.float64) + 0.5) / height * 2 - 1
    xs = (torch.arange(width, dtype=torch.float64) + 0.5) / width * 2 - 1
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return ((xx**2 + yy**2) <= 1).float()


def make_operator(task: Task, height: int, width: int, mri_fraction: float = 0.25, ct_angles: int = 45,
                  seed: int = 0) -> nn.Module:
    """The measurement operator of ``task``: ``fit`` (direct observation), ``mri`` (masked FFT), ``ct`` (projections)."""
    if task == "fit":
        return DirectObservation()
    if task == "mri":
        return MaskedFourier(height, width, mri_fraction, seed=seed)
    if task == "ct":
        return ParallelBeam(height, width, ct_angles)
    raise ConfigError(f"task must be one of fit, mri, ct; got {task!r}")
