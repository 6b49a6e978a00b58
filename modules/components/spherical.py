"""A real-signal spherical-harmonic transform on a Gauss-Legendre grid, in pure torch (papers 002-12 and any
spherical operator after it).

Grid: ``nlat`` rows at ``theta_j = arccos x_j``, ``x_j`` the Gauss-Legendre nodes in descending order (row 0 is the
northernmost), ``nlon`` columns at ``phi_k = 2 pi k / nlon``. Harmonics ``Y_l^m`` are orthonormal on the sphere
with the Condon-Shortley phase (scipy's ``sph_harm_y(l, m, theta, phi)``).

``sht(f)[..., l, m] = int f conj(Y_l^m) dOmega`` for ``0 <= m <= l < lmax`` (zero above the diagonal), computed as
an FFT over longitude and a Gauss-Legendre quadrature over latitude; ``isht`` is the synthesis
``f = sum_l [a_l0 Y_l0 + 2 sum_{m>0} Re(a_lm Y_lm)]`` (the negative orders of a real signal folded in). The pair
is exact for signals band-limited to ``lmax`` when ``lmax <= nlat`` and ``nlon >= 2 lmax - 1``: the quadrature
integrates polynomials in ``x`` of degree up to ``2 nlat - 1`` exactly, and longitude orders below ``lmax`` do not
alias.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from errors import ConfigError


def _gauss_legendre(nlat: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x (nlat,), weights (nlat,))``: Gauss-Legendre nodes in descending order (row 0 northernmost)."""
    nodes, weights = np.polynomial.legendre.leggauss(nlat)
    return nodes[::-1].copy(), weights[::-1].copy()


@lru_cache(maxsize=32)
def _legendre_table(nlat: int, lmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``(weights (nlat,), P (lmax, lmax, nlat))`` in float64: Gauss-Legendre weights in the grid's row order and
    the orthonormal associated Legendre functions, ``Y_l^m(theta, phi) = P[l, m](cos theta) e^{i m phi}``."""
    x, w = _gauss_legendre(nlat)
    sin_theta = np.sqrt(np.clip(1.0 - x * x, 0.0, None))
    p = np.zeros((lmax, lmax, nlat))
    # Stable three-term recursions in l at fixed m (Holmes and Featherstone 2002), starting from the sectoral
    # P_m^m = -sqrt((2m + 1) / 2m) sin(theta) P_{m-1}^{m-1}, the minus sign being the Condon-Shortley phase.
    p_mm = np.full(nlat, 1.0 / math.sqrt(4.0 * math.pi))
    for m in range(lmax):
        if m > 0:
            p_mm = -math.sqrt((2 * m + 1) / (2 * m)) * sin_theta * p_mm
        p[m, m] = p_mm
        if m + 1 < lmax:
            p[m + 1, m] = math.sqrt(2 * m + 3) * x * p_mm
        for ell in range(m + 2, lmax):
            a = math.sqrt((4 * ell * ell - 1) / (ell * ell - m * m))
            b = math.sqrt(((ell - 1) ** 2 - m * m) / (4 * (ell - 1) ** 2 - 1))
            p[ell, m] = a * (x * p[ell - 1, m] - b * p[ell - 2, m])
    return w, p


def _check_grid(nlat: int, nlon: int, lmax: int) -> None:
    if lmax < 1 or lmax > nlat:
        raise ConfigError(f"lmax must be in [1, nlat={nlat}] for an exact quadrature, got lmax={lmax}")
    if nlon < 2 * lmax - 1:
        raise ConfigError(f"nlon={nlon} aliases orders up to lmax - 1 = {lmax - 1}: it needs nlon >= 2 lmax - 1 = "
                          f"{2 * lmax - 1}")


def _tables(nlat: int, lmax: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    w, p = _legendre_table(nlat, lmax)
    return torch.as_tensor(w, dtype=dtype, device=device), torch.as_tensor(p, dtype=dtype, device=device)


def sht(f: Tensor, lmax: int | None = None) -> Tensor:
    """Spherical-harmonic coefficients of a real field ``f (..., nlat, nlon)``: complex ``(..., lmax, lmax)``
    indexed ``[l, m]``, zero for ``m > l`` (``lmax`` defaults to ``nlat``)."""
    if f.is_complex() or not f.is_floating_point() or f.dim() < 2:
        raise ConfigError(f"sht takes a real float field (..., nlat, nlon), got {f.dtype} of shape {tuple(f.shape)}")
    nlat, nlon = f.shape[-2:]
    lmax = nlat if lmax is None else lmax
    _check_grid(nlat, nlon, lmax)
    w, p = _tables(nlat, lmax, f.dtype, f.device)
    # longitude: sum_k f e^{-i m phi_k} (2 pi / nlon), orders m < lmax
    fm = torch.fft.rfft(f, dim=-1)[..., :lmax] * (2.0 * math.pi / nlon)
    # latitude: a[l, m] = sum_j w_j P[l, m, j] F[j, m]
    return torch.einsum("lmj,...jm->...lm", (p * w).to(fm.dtype), fm)


def isht(a: Tensor, nlat: int, nlon: int) -> Tensor:
    """The real field ``(..., nlat, nlon)`` with coefficients ``a (..., lmax, lmax)`` (entries above the diagonal
    are ignored; the imaginary part of ``a[l, 0]`` too, as a real field's is zero)."""
    if not a.is_complex() or a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ConfigError(f"isht takes complex coefficients (..., lmax, lmax), got {a.dtype} of shape {tuple(a.shape)}")
    lmax = a.shape[-1]
    _check_grid(nlat, nlon, lmax)
    real = a.real.dtype
    _, p = _tables(nlat, lmax, real, a.device)
    lower = torch.tril(torch.ones(lmax, lmax, dtype=torch.bool, device=a.device))
    g = torch.einsum("lmj,...lm->...jm", p.to(a.dtype), a * lower)  # G_m(theta_j) = sum_l a_lm P_lm(x_j)
    spectrum = torch.zeros(*g.shape[:-1], nlon // 2 + 1, dtype=a.dtype, device=a.device)
    spectrum[..., :lmax] = g
    # irfft(X)_k = (1/n)[Re X_0 + 2 sum_{0<m<n/2} Re(X_m e^{i m phi_k})]: the synthesis times n
    return torch.fft.irfft(spectrum * nlon, n=nlon, dim=-1)


def grid(nlat: int, nlon: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:
    """``(theta (nlat,), phi (nlon,), quadrature weights (nlat, nlon))`` of the grid; the weights sum to 4 pi, so
    ``(f * w).sum()`` integrates ``f`` over the sphere."""
    nodes, w = _gauss_legendre(nlat)
    theta = torch.as_tensor(np.arccos(nodes), dtype=dtype)
    phi = torch.arange(nlon, dtype=dtype) * (2.0 * math.pi / nlon)
    weights = torch.as_tensor(w, dtype=dtype)[:, None].expand(nlat, nlon) * (2.0 * math.pi / nlon)
    return theta, phi, weights.contiguous()
