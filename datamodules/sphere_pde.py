"""Tracer transport on the sphere, generated in code (paper 002-12, DIAGNO): one-step pairs and rollout windows.

A scalar tracer ``f`` on a 32 x 64 Gauss-Legendre grid (rows ``theta_j = arccos x_j``, ``x_j`` the Gauss-Legendre
nodes, north first; columns ``phi_k = 2 pi k / nlon``) obeys ``df/dt + v . grad f = kappa(x) lap f`` with a fixed,
divergence-free wind ``v``:

- ``hetero``: a westerly jet (angular speed peaked at 35 N), a weaker easterly jet (35 S) and a vortex centred at
  (15 S, 90 E); the diffusivity is 10 times lower over a "continent" (a smooth cap of radius 35 degrees at
  (40 N, 200 E)). Neither the wind nor ``kappa`` is invariant under any rotation: the one-step map is not
  equivariant, not even to rolls in longitude.
- ``control``: uniform diffusion and solid-body rotation about the polar axis. Its one-step map commutes with rolls
  in longitude (rotations about the axis), not with rotations that tilt the axis: in spectral space it is
  ``a_lm -> exp(-kappa l (l + 1) dt) exp(-i m Omega dt) a_lm``, a phase per order ``m``, which SFNO's per-degree
  weights cannot express.
- ``isotropic``: uniform diffusion alone, ``a_lm -> exp(-kappa l (l + 1) dt) a_lm`` (here its implicit-Euler
  version): equivariant to every rotation, the case SFNO's assumption describes exactly.
- ``era5``: the paper's reanalysis (WeatherBench 2), not reachable offline; it stops with one line naming
  ``hetero``.

**Scheme** (a Galerkin semi-Lagrangian scheme, all in float64 numpy): the tracer is held as real
spherical-harmonic coefficients ``c`` up to degree ``nlat - 1`` (orthonormal real basis ``B`` built from
``scipy.special.sph_harm_y``, exact analysis ``c = B^T W f`` on the Gauss grid). One substep of length ``tau``
(i) advects: the departure point of every grid node is traced back along the wind (the wind is ``omega(x) x x``:
the node is turned back about the angular velocity at the arc's midpoint, 3 fixed-point iterations; exact for
solid-body rotation), the field is evaluated there by its own harmonic expansion (``B_d c``, exact
interpolation of the band-limited field) and projected back (``A = B^T W B_d``); (ii) diffuses, implicitly:
``(I - tau B^T W diag(kappa) B Lambda) c' = c`` with ``Lambda = diag(-l (l + 1))`` (unconditionally stable). Since
the wind and ``kappa`` are fixed the step is one fixed matrix ``M = (D A)^n_sub`` (``K x K``, ``K = nlat^2``), and
a whole data set is ``n_steps`` batched matrix products: 300 trajectories x 20 steps take about a second.

Initial fields are Gaussian random fields, ``c_lm ~ N(0, s_l^2)`` with ``s_l^2 ~ 1 / (1 + (l / 6)^4)`` (zero
for ``l >= 24``), scaled to unit mean square; their law is symmetric under ``f -> -f`` and the dynamics are
linear, so the climatology is zero and the anomaly correlation (ACC) is the plain weighted correlation.

Batches are ``(x (B, 1, nlat, nlon), targets (B, K, 1, nlat, nlon))``: the state and the next ``K`` states. The
training split holds every one-step pair of its trajectories (``K = 1``); validation and test hold rollout
windows of ``rollout_steps`` steps starting every ``window_stride`` steps. Splits are disjoint trajectories.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Literal

import numpy as np
import torch
from scipy.special import sph_harm_y_all

from datamodules.base import Split, TensorDataModule
from errors import ConfigError

Scenario = Literal["hetero", "control", "isotropic", "era5"]
SCENARIOS: tuple[str, ...] = ("hetero", "control", "isotropic")
DEFAULT_CONFIG = "configs/diagno/hetero_diagno.yaml"

# wind and diffusivity of the two scenarios: angular speeds in radians per unit time, one step = DT
DT = 1.0
JET_NORTH = (0.22, 35.0, 12.0)   # (peak angular speed about the axis, latitude, width) in rad, deg, deg
JET_SOUTH = (-0.12, -35.0, 10.0)
VORTEX = (0.5, -15.0, 90.0, 18.0)  # (peak angular speed about its centre, lat, lon, radius)
CONTINENT = (40.0, 200.0, 35.0, 0.1)  # (lat, lon, radius in degrees, diffusivity ratio over it)
KAPPA = 1.5e-3                        # diffusivity (per unit time): l = 16 decays by about e^-0.4 a step
SOLID_BODY = 0.15                     # control: angular speed of the solid-body rotation


def gauss_grid(nlat: int, nlon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(theta (nlat,), phi (nlon,), weights (nlat,))``: Gauss-Legendre colatitudes north first, longitudes,
    latitude quadrature weights (summing to 2; times ``2 pi / nlon`` per cell they integrate over the sphere)."""
    x, w = np.polynomial.legendre.leggauss(nlat)
    return np.arccos(x[::-1]), 2.0 * math.pi * np.arange(nlon) / nlon, w[::-1].copy()


def _degrees(lmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(l, m, part)`` of every real basis function (``lmax^2`` of them), ``part`` 0: cos (or m = 0), 1: sin."""
    rows = []
    for ell in range(lmax):
        rows.append((ell, 0, 0))
        for m in range(1, ell + 1):
            rows += [(ell, m, 0), (ell, m, 1)]
    ell, m, part = np.array(rows).T
    return ell, m, part


def real_basis(theta: np.ndarray, phi: np.ndarray, lmax: int) -> np.ndarray:
    """The orthonormal real harmonics up to degree ``lmax - 1`` at points ``(theta, phi)`` (same shape ``(n,)``):
    ``(n, lmax^2)``, columns in ``_degrees`` order: ``Y_l0``, ``sqrt 2 Re Y_lm``, ``sqrt 2 Im Y_lm``."""
    y = sph_harm_y_all(lmax - 1, lmax - 1, theta, phi)  # (lmax, 2 lmax - 1, n), order m at index m for m >= 0
    ell, m, part = _degrees(lmax)
    picked = y[ell, m]                                   # (K, n)
    cols = np.where((m == 0)[:, None], picked.real,
                    math.sqrt(2.0) * np.where((part == 1)[:, None], picked.imag, picked.real))
    return cols.T.copy()


@lru_cache(maxsize=4)
def _synthesis_tables(nlat: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(P (m, j, l), cos (m, l), sin (m, l))``: the Legendre functions at the rows, and where each ``(l, m)``'s cos
    and sin coefficients sit in a coefficient vector padded with one zero (index ``K`` for absent ones)."""
    theta, _, _ = gauss_grid(nlat, 2 * nlat)
    legendre = sph_harm_y_all(nlat - 1, nlat - 1, theta, 0.0).real[:, :nlat]  # (l, m, j): P_lm(x_j)
    ell, m, part = _degrees(nlat)
    cos = np.full((nlat, nlat), len(ell))
    sin = np.full((nlat, nlat), len(ell))
    cos[m[part == 0], ell[part == 0]] = np.flatnonzero(part == 0)
    sin[m[part == 1], ell[part == 1]] = np.flatnonzero(part == 1)
    return np.ascontiguousarray(legendre.transpose(1, 2, 0)), cos, sin


def synthesize(coeffs: np.ndarray, nlat: int, nlon: int) -> np.ndarray:
    """The fields ``(..., nlat, nlon)`` of real coefficients ``(..., nlat^2)`` on the Gauss grid: Legendre sums per
    order, ``G_m(x_j) = sum_l (c_cos - i c_sin)_lm P_lm(x_j)``, then an inverse real FFT in longitude (the same as
    ``coeffs @ real_basis(...).T``, in far fewer operations)."""
    legendre, cos, sin = _synthesis_tables(nlat)
    batch = coeffs.shape[:-1]
    flat = coeffs.reshape(-1, coeffs.shape[-1])
    padded = np.ascontiguousarray(np.concatenate([flat, np.zeros((flat.shape[0], 1))], axis=1).T)  # (K + 1, n)
    # (m, j, l) @ (m, l, n): 32 products of contiguous matrices
    g_cos, g_sin = np.matmul(legendre, padded[cos]), np.matmul(legendre, padded[sin])
    scale = np.full((nlat, 1, 1), 1.0 / math.sqrt(2.0))
    scale[0] = 1.0  # the m = 0 harmonic is Y_l0 itself
    spectrum = np.zeros((nlon // 2 + 1, nlat, flat.shape[0]), dtype=np.complex128)
    spectrum[:nlat] = (g_cos - 1j * g_sin) * scale * nlon
    fields = np.fft.irfft(spectrum, n=nlon, axis=0)  # (nlon, nlat, n)
    return fields.transpose(2, 1, 0).reshape(*batch, nlat, nlon)


def analyse(fields: np.ndarray, nlat: int, nlon: int) -> np.ndarray:
    """Real coefficients ``(..., nlat^2)`` of fields ``(..., nlat, nlon)`` on the Gauss grid (exact up to degree
    ``nlat - 1``): ``c = B^T W f``."""
    theta, phi, w_lat = gauss_grid(nlat, nlon)
    th, ph = (a.reshape(-1) for a in np.meshgrid(theta, phi, indexing="ij"))
    weights = np.repeat(w_lat, nlon) * (2.0 * math.pi / nlon)
    return (fields.reshape(*fields.shape[:-2], -1) * weights) @ real_basis(th, ph, nlat)


def _unit(theta: np.ndarray, phi: np.ndarray) -> np.ndarray:
    return np.stack([np.sin(theta) * np.cos(phi), np.sin(theta) * np.sin(phi), np.cos(theta)], -1)


def _angles(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.arccos(np.clip(p[..., 2], -1.0, 1.0)), np.mod(np.arctan2(p[..., 1], p[..., 0]), 2.0 * math.pi)


def _axis(lat: float, lon: float) -> np.ndarray:
    return _unit(np.radians(90.0 - lat), np.radians(lon))


def angular_velocity(p: np.ndarray, scenario: str) -> np.ndarray:
    """The local angular velocity ``omega (n, 3)`` at unit vectors ``p (n, 3)``: the wind is ``omega x p``, a sum of
    rotations about axes ``e`` whose angular speed depends only on the angle to ``e`` (each divergence-free)."""
    z = np.array([0.0, 0.0, 1.0])
    if scenario == "control":
        return np.broadcast_to(SOLID_BODY * z, p.shape).copy()
    if scenario == "isotropic":
        return np.zeros_like(p)
    lat = np.degrees(np.arcsin(np.clip(p[:, 2], -1.0, 1.0)))
    speed = sum(a * np.exp(-(((lat - mu) / s) ** 2)) for a, mu, s in (JET_NORTH, JET_SOUTH))
    peak, vlat, vlon, radius = VORTEX
    e = _axis(vlat, vlon)
    r = np.degrees(np.arccos(np.clip(p @ e, -1.0, 1.0)))
    return speed[:, None] * z + (peak * np.exp(-((r / radius) ** 2)))[:, None] * e


def wind(p: np.ndarray, scenario: str) -> np.ndarray:
    """The wind ``(n, 3)`` (tangent vectors) at unit vectors ``p (n, 3)``."""
    return np.cross(angular_velocity(p, scenario), p)


def rotate(p: np.ndarray, omega: np.ndarray, t: float) -> np.ndarray:
    """``p (n, 3)`` turned about the axes ``omega (n, 3)`` by the angles ``t |omega|`` (Rodrigues)."""
    speed = np.linalg.norm(omega, axis=-1, keepdims=True)
    k = omega / np.where(speed > 0, speed, 1.0)
    angle = t * speed
    return (p * np.cos(angle) + np.cross(k, p) * np.sin(angle)
            + k * (k * p).sum(-1, keepdims=True) * (1.0 - np.cos(angle)))


def diffusivity(p: np.ndarray, scenario: str) -> np.ndarray:
    """``kappa (n,)`` at unit vectors ``p``: low over the continent for ``hetero``, else uniform."""
    if scenario != "hetero":
        return np.full(p.shape[0], KAPPA)
    clat, clon, radius, ratio = CONTINENT
    r = np.degrees(np.arccos(np.clip(p @ _axis(clat, clon), -1.0, 1.0)))
    land = 1.0 / (1.0 + np.exp((r - radius) / 4.0))  # a smooth coast, about 4 degrees wide
    return KAPPA * (1.0 - (1.0 - ratio) * land)


def departure_points(p: np.ndarray, tau: float, scenario: str, iterations: int = 3) -> np.ndarray:
    """Where the air at ``p (n, 3)`` was ``tau`` earlier: ``p`` turned back by ``tau`` about the angular velocity at
    the midpoint of the arc (implicit midpoint, ``iterations`` fixed-point passes); exact for a solid-body
    rotation, second order otherwise."""
    d = p.copy()
    for _ in range(iterations):
        mid = p + d
        mid /= np.linalg.norm(mid, axis=-1, keepdims=True)
        d = rotate(p, angular_velocity(mid, scenario), -tau)
    return d


@lru_cache(maxsize=4)
def step_operator(scenario: str, nlat: int, nlon: int, n_sub: int = 4) -> np.ndarray:
    """``M (K, K)``: the one-step map of the real coefficients (module docstring), ``K = nlat^2``, in float64."""
    if scenario not in SCENARIOS:
        raise ConfigError(f"unknown scenario {scenario!r}; choose one of {list(SCENARIOS)}")
    lmax = nlat
    theta, phi, w_lat = gauss_grid(nlat, nlon)
    th, ph = (a.reshape(-1) for a in np.meshgrid(theta, phi, indexing="ij"))
    basis = real_basis(th, ph, lmax)                                # (N, K)
    weights = np.repeat(w_lat, nlon) * (2.0 * math.pi / nlon)       # (N,)
    analysis = basis.T * weights                                    # (K, N): exact for degrees < nlat
    p = _unit(th, ph)
    tau = DT / n_sub
    advect = analysis @ real_basis(*_angles(departure_points(p, tau, scenario)), lmax)
    ell = _degrees(lmax)[0].astype(np.float64)
    laplacian = basis * -(ell * (ell + 1.0))                        # (N, K): lap of each basis function
    implicit = np.eye(len(ell)) - tau * analysis @ (diffusivity(p, scenario)[:, None] * laplacian)
    sub = np.linalg.solve(implicit, advect)
    return np.linalg.matrix_power(sub, n_sub)


def initial_coefficients(n: int, nlat: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, nlat^2)`` real coefficients of Gaussian random fields of unit expected mean square (docstring)."""
    ell = _degrees(nlat)[0].astype(np.float64)
    var = np.where(ell < 24, 1.0 / (1.0 + (ell / 6.0) ** 4), 0.0)
    var *= 4.0 * math.pi / var.sum()  # E mean_sphere f^2 = sum var / (4 pi)
    return rng.standard_normal((n, len(ell))) * np.sqrt(var)


def simulate(scenario: str, n_trajectories: int, n_steps: int, nlat: int = 32, nlon: int = 64,
             seed: int = 0) -> torch.Tensor:
    """Trajectories ``(n, n_steps + 1, 1, nlat, nlon)`` float32 of ``scenario`` from seeded random fields."""
    step = step_operator(scenario, nlat, nlon)
    c = initial_coefficients(n_trajectories, nlat, np.random.default_rng(seed))
    states = [c]
    for _ in range(n_steps):
        c = c @ step.T
        states.append(c)
    fields = synthesize(np.stack(states, axis=1), nlat, nlon)      # (n, T + 1, nlat, nlon)
    return torch.from_numpy(fields.astype(np.float32)).unsqueeze(2)


def windows(trajectories: torch.Tensor, horizon: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x (W, C, H, W'), targets (W, horizon, C, H, W'))``: every window of ``horizon`` steps starting at
    ``0, stride, 2 stride, ...`` of every trajectory ``(n, T + 1, C, H, W')``."""
    steps = trajectories.shape[1] - 1
    starts = list(range(0, steps - horizon + 1, stride))
    x = torch.cat([trajectories[:, s] for s in starts])
    y = torch.cat([trajectories[:, s + 1 : s + 1 + horizon] for s in starts])
    return x, y


class SpherePDEDataModule(TensorDataModule):
    """Tracer transport on the sphere (module docstring): one-step pairs to train on, rollout windows to test.

    Args:
        scenario: ``hetero`` (jet + vortex, a low-diffusivity continent), ``control`` (diffusion + solid-body
            rotation), ``isotropic`` (diffusion alone) or ``era5`` (the paper's reanalysis: not offline).
        n_train, n_val, n_test: trajectories per split (300 in all by default).
        n_steps: steps per trajectory (states ``0 .. n_steps``).
        rollout_steps: K, the length of the validation and test windows.
        window_stride: steps between the starts of the windows of one trajectory.
        nlat, nlon: the Gauss grid (32 x 64).
        data_seed: seed of the initial fields (the splits are independent draws).
        batch_size, eval_batch_size, seed: see ``TensorDataModule``.
    """

    def __init__(
        self,
        scenario: Scenario = "hetero",
        n_train: int = 240,
        n_val: int = 30,
        n_test: int = 30,
        n_steps: int = 20,
        rollout_steps: int = 5,
        window_stride: int = 5,
        nlat: int = 32,
        nlon: int = 64,
        data_seed: int = 0,
        batch_size: int = 16,
        eval_batch_size: int | None = 64,
        seed: int | None = None,
    ) -> None:
        super().__init__(batch_size=batch_size, eval_batch_size=eval_batch_size, seed=seed)
        if scenario == "era5":
            raise ConfigError("ERA5 (WeatherBench 2) is not available offline: use the embedded default, "
                              f"scenario hetero ({DEFAULT_CONFIG})")
        if min(n_train, n_val, n_test, n_steps, rollout_steps, window_stride) < 1:
            raise ConfigError("n_train, n_val, n_test, n_steps, rollout_steps and window_stride must be >= 1")
        if rollout_steps > n_steps:
            raise ConfigError(f"rollout_steps={rollout_steps} exceeds the trajectories' n_steps={n_steps}")
        if nlat < 2 or nlon < 2 * nlat - 1:
            raise ConfigError(f"the grid needs nlat >= 2 and nlon >= 2 nlat - 1 = {2 * nlat - 1} (exact analysis up "
                              f"to degree nlat - 1), got {nlat} x {nlon}")
        self.scenario = scenario
        self.n_train, self.n_val, self.n_test, self.n_steps = n_train, n_val, n_test, n_steps
        self.rollout_steps, self.window_stride = rollout_steps, window_stride
        self.nlat, self.nlon, self.data_seed = nlat, nlon, data_seed

    @property
    def dataset_name(self) -> str:  # type: ignore[override]
        return f"sphere_{self.scenario}"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1, self.nlat, self.nlon)

    def build_splits(self) -> dict[str, Split]:
        return {name: self._build(name) for name in ("train", "val", "test")}

    def _build(self, name: str) -> Split:
        i = ("train", "val", "test").index(name)
        n = (self.n_train, self.n_val, self.n_test)[i]
        traj = simulate(self.scenario, n, self.n_steps, self.nlat, self.nlon, seed=self.data_seed * 1000 + i)
        horizon, stride = (1, 1) if name == "train" else (self.rollout_steps, self.window_stride)
        return windows(traj, horizon, stride)

    def setup(self, stage: str | None = None) -> None:
        # each split is simulated when first asked for: `test` never pays for the 240 training trajectories
        if self.splits is None:
            self.splits = {}

    def _split(self, name: str) -> Split:
        self.setup()
        assert self.splits is not None
        name = "test" if name == "predict" else name
        if name not in ("train", "val", "test"):
            raise ConfigError(f"{type(self).__name__} has no {name!r} split (it has ['test', 'train', 'val'])")
        if name not in self.splits:
            self.splits[name] = self._build(name)
        return self.splits[name]


__all__ = ["SCENARIOS", "SpherePDEDataModule", "analyse", "angular_velocity", "departure_points", "diffusivity", "gauss_grid", "real_basis",
           "rotate", "simulate", "step_operator", "synthesize", "wind", "windows"]
