"""The spherical-harmonic transform against scipy's orthonormal harmonics (sph_harm_y, Condon-Shortley phase)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import sph_harm_y

from errors import ConfigError
from modules.components.spherical import grid, isht, sht


def random_coefficients(lmax: int, seed: int, batch: tuple[int, ...] = ()) -> torch.Tensor:
    """Lower-triangular complex coefficients of a real field (a[l, 0] real)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.complex(torch.randn(*batch, lmax, lmax, generator=gen, dtype=torch.float64),
                      torch.randn(*batch, lmax, lmax, generator=gen, dtype=torch.float64))
    a = a * torch.tril(torch.ones(lmax, lmax, dtype=torch.bool))
    a[..., :, 0] = a[..., :, 0].real.to(a.dtype)
    return a


def scipy_field(a: np.ndarray, nlat: int, nlon: int) -> np.ndarray:
    """f = sum_l [a_l0 Y_l0 + 2 sum_{m>0} Re(a_lm Y_lm)] on the grid, harmonic by harmonic with scipy."""
    theta, phi, _ = grid(nlat, nlon)
    th, ph = np.meshgrid(theta.numpy(), phi.numpy(), indexing="ij")
    f = np.zeros((nlat, nlon))
    for ell in range(a.shape[0]):
        f += (a[ell, 0] * sph_harm_y(ell, 0, th, ph)).real
        for m in range(1, ell + 1):
            f += 2 * (a[ell, m] * sph_harm_y(ell, m, th, ph)).real
    return f


@pytest.mark.parametrize(("nlat", "nlon", "lmax"), [(8, 16, 8), (9, 15, 8), (12, 24, 6)])
def test_synthesis_and_analysis_match_scipy(nlat: int, nlon: int, lmax: int) -> None:
    a = random_coefficients(lmax, seed=nlat)
    f_ref = scipy_field(a.numpy(), nlat, nlon)
    f = isht(a, nlat, nlon)
    assert np.allclose(f.numpy(), f_ref, atol=1e-11)
    back = sht(torch.from_numpy(f_ref), lmax)
    assert torch.allclose(back, a, atol=1e-11)


def test_round_trip_float32_and_batched() -> None:
    a = random_coefficients(10, seed=1, batch=(2, 3))
    f = isht(a, 10, 20)
    assert f.shape == (2, 3, 10, 20)
    assert torch.allclose(sht(f), a, atol=1e-11)
    f32 = f.float()
    a32 = sht(f32)
    assert a32.dtype == torch.complex64 and torch.allclose(a32, a.to(torch.complex64), atol=1e-4)
    assert isht(a32, 10, 20).dtype == torch.float32


def test_grid_weights_integrate_polynomials_in_cos_theta() -> None:
    theta, _, w = grid(6, 11)
    assert float(w.sum()) == pytest.approx(4 * math.pi, rel=1e-13)
    assert float((torch.cos(theta)[:, None] ** 2 * w).sum()) == pytest.approx(4 * math.pi / 3, rel=1e-13)
    assert bool((theta[1:] > theta[:-1]).all())  # row 0 is the northernmost


def test_bad_grids_and_inputs() -> None:
    f = torch.zeros(8, 16, dtype=torch.float64)
    with pytest.raises(ConfigError, match="lmax must be in"):
        sht(f, lmax=9)
    with pytest.raises(ConfigError, match="nlon=14 aliases"):
        sht(torch.zeros(8, 14), lmax=8)
    with pytest.raises(ConfigError, match="real float field"):
        sht(torch.zeros(8, 16, dtype=torch.complex128))
    with pytest.raises(ConfigError, match="complex coefficients"):
        isht(torch.zeros(8, 8), 8, 16)
