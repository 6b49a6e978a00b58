"""A simulator of neural populations driven by latent trajectories, shared by the DataModules of the neural-data
methods (002-08 spike tokenizers, 004-02 BeeMO). No DataModule lives here (one per method's file), only the pieces:

- trajectories: the Lorenz system (a shared latent), minimum-jerk reaches, curved reaches through a smooth
  perpendicular bump, and smoothed random-walk pursuit, all at ``BIN_S`` = 20 ms bins;
- a session: its own random readout of the latent (``log rate = C z + b``), so sessions share dynamics but not
  units;
- noise and spikes: a stationary Ornstein-Uhlenbeck process added to the log rates, Poisson counts per bin.

Every function draws from the ``torch.Generator`` it is given and nothing else, so a dataset is a function of
its seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from errors import ConfigError

BIN_S = 0.02  # seconds per bin


# --- trajectories -------------------------------------------------------------------------------------------


def lorenz_derivative(x: Tensor, sigma: float = 10.0, rho: float = 28.0, beta: float = 8.0 / 3.0) -> Tensor:
    """The Lorenz vector field at states ``x (..., 3)``."""
    a, b, c = x.unbind(-1)
    return torch.stack([sigma * (b - a), a * (rho - c) - b, a * b - beta * c], dim=-1)


def integrate_lorenz(x0: Tensor, n_steps: int, dt: float) -> Tensor:
    """Classical RK4 from ``x0 (n, 3)``: the states ``(n, n_steps + 1, 3)``, ``x0`` first."""
    states = [x0]
    x = x0
    for _ in range(n_steps):
        k1 = lorenz_derivative(x)
        k2 = lorenz_derivative(x + 0.5 * dt * k1)
        k3 = lorenz_derivative(x + 0.5 * dt * k2)
        k4 = lorenz_derivative(x + dt * k3)
        x = x + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        states.append(x)
    return torch.stack(states, dim=1)


def lorenz_latents(
    n_trials: int, n_bins: int, generator: torch.Generator, time_per_bin: float = 0.01, substeps: int = 4,
    burn_in: int = 300,
) -> Tensor:
    """``(n_trials, n_bins, 3)`` float64 Lorenz trajectories on the attractor, each trial from its own random
    start, standardised per coordinate over all trials and bins. ``time_per_bin`` is Lorenz time per 20 ms bin:
    a larger value is a faster system (the "other species" session of 002-08)."""
    if n_trials <= 0 or n_bins <= 0 or time_per_bin <= 0 or substeps <= 0:
        raise ConfigError("lorenz_latents needs positive n_trials, n_bins, time_per_bin and substeps")
    x0 = torch.randn(n_trials, 3, generator=generator, dtype=torch.float64) * 5.0 + torch.tensor([0.0, 0.0, 25.0])
    dt = time_per_bin / substeps
    warm = integrate_lorenz(x0, burn_in, 0.01)[:, -1]  # onto the attractor: the start's transient is not data
    states = integrate_lorenz(warm, n_bins * substeps, dt)[:, substeps::substeps]
    flat = states.reshape(-1, 3)
    return (states - flat.mean(0)) / flat.std(0)


def _movement_phase(onset: Tensor, duration: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """``(tau, moving)``, each ``(n, T)``: the movement's phase ``clip((t - onset) / duration, 0, 1)`` and 1 strictly
    inside the movement, 0 outside (where every time derivative of the phase is zero)."""
    raw = (t[None, :] - onset[:, None]) / duration[:, None]
    return raw.clamp(0.0, 1.0), ((raw > 0) & (raw < 1)).to(t.dtype)


def minimum_jerk(start: Tensor, end: Tensor, onset: Tensor, duration: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """Minimum-jerk reaches ``start (n, 2) -> end (n, 2)`` beginning at ``onset (n,)`` and lasting ``duration
    (n,)``, sampled at times ``t (T,)``: ``(pos, vel)``, each ``(n, T, 2)``.
    ``pos = start + (end - start)(10 tau^3 - 15 tau^4 + 6 tau^5)``, ``tau = clip((t - onset) / duration, 0, 1)``;
    ``vel`` is its exact time derivative (zero outside the movement)."""
    if start.shape != end.shape or start.shape[-1] != 2 or onset.shape != start.shape[:1] or duration.shape != start.shape[:1]:
        raise ConfigError(f"minimum_jerk: start/end (n, 2), onset/duration (n,); got {tuple(start.shape)}, "
                          f"{tuple(end.shape)}, {tuple(onset.shape)}, {tuple(duration.shape)}")
    if bool((duration <= 0).any()):
        raise ConfigError("minimum_jerk: every duration must be positive")
    tau, moving = _movement_phase(onset, duration, t)
    shape = 10 * tau**3 - 15 * tau**4 + 6 * tau**5
    rate = (30 * tau**2 - 60 * tau**3 + 30 * tau**4) * moving / duration[:, None]
    delta = (end - start)[:, None, :]
    return start[:, None, :] + delta * shape[..., None], delta * rate[..., None]


def curved_reach(
    start: Tensor, end: Tensor, bulge: Tensor, onset: Tensor, duration: Tensor, t: Tensor
) -> tuple[Tensor, Tensor]:
    """A minimum-jerk reach plus a smooth sideways excursion ``bulge (n,)`` (signed, in position units,
    perpendicular to the reach, ``64 tau^3 (1 - tau)^3``: peak at mid-reach, zero velocity at both ends), the
    analog of a maze reach around a via point. ``(pos, vel)`` as ``minimum_jerk``."""
    pos, vel = minimum_jerk(start, end, onset, duration, t)
    d = end - start
    normal = torch.stack([-d[:, 1], d[:, 0]], dim=-1) / d.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    tau, moving = _movement_phase(onset, duration, t)
    bump = 64 * tau**3 * (1 - tau) ** 3
    bump_rate = 64 * (3 * tau**2 * (1 - tau) ** 3 - 3 * tau**3 * (1 - tau) ** 2) * moving / duration[:, None]
    side = (bulge[:, None] * normal)[:, None, :]
    return pos + side * bump[..., None], vel + side * bump_rate[..., None]


def random_walk_pursuit(
    n: int, n_bins: int, generator: torch.Generator, speed: float = 0.15, smooth_s: float = 0.2
) -> tuple[Tensor, Tensor]:
    """Smoothed random-walk movements, not aligned to any task: velocity is white noise through a Gaussian
    kernel of width ``smooth_s``, scaled to RMS speed ``speed`` per axis; ``(pos, vel)`` each ``(n, n_bins, 2)``
    float64, starting at the origin."""
    width = max(smooth_s / BIN_S, 1e-6)
    half = int(math.ceil(3 * width))
    k = torch.exp(-0.5 * (torch.arange(-half, half + 1, dtype=torch.float64) / width) ** 2)
    noise = torch.randn(n * 2, 1, n_bins + 2 * half, generator=generator, dtype=torch.float64)
    vel = torch.nn.functional.conv1d(noise, (k / k.norm()).view(1, 1, -1)).view(n, 2, n_bins).transpose(1, 2)
    vel = vel * speed
    pos = torch.cumsum(vel, dim=1) * BIN_S
    return pos - pos[:, :1], vel


# --- sessions, noise, spikes --------------------------------------------------------------------------------


@dataclass
class PopulationSession:
    """One recording: its units' readout of the latent and their baseline log rates (spikes per bin)."""

    readout: Tensor  # (units, latent_dim)
    baseline: Tensor  # (units,)

    @property
    def n_units(self) -> int:
        return int(self.readout.shape[0])

    def log_rates(self, latents: Tensor) -> Tensor:
        """``C z + b`` for latents ``(..., latent_dim)``: ``(..., units)``."""
        return latents @ self.readout.T + self.baseline


def draw_session(
    n_units: int, latent_dim: int, generator: torch.Generator, gain: float = 0.5,
    mean_rate_hz: tuple[float, float] = (5.0, 20.0),
) -> PopulationSession:
    """A session of ``n_units`` units reading a standardised latent: readout rows ``N(0, gain^2 / latent_dim)``
    (so each unit's log-rate modulation has standard deviation ~``gain``), baselines at log of a firing rate
    drawn uniformly in ``mean_rate_hz``, per 20 ms bin."""
    if n_units <= 0 or latent_dim <= 0 or gain < 0:
        raise ConfigError(f"draw_session: n_units and latent_dim positive, gain >= 0; got {n_units}, {latent_dim}, {gain}")
    lo, hi = mean_rate_hz
    readout = torch.randn(n_units, latent_dim, generator=generator, dtype=torch.float64) * gain / latent_dim**0.5
    hz = lo + (hi - lo) * torch.rand(n_units, generator=generator, dtype=torch.float64)
    return PopulationSession(readout, torch.log(hz * BIN_S))


def ou_noise(shape: tuple[int, ...], tau_s: float, sigma: float, generator: torch.Generator) -> Tensor:
    """A stationary Ornstein-Uhlenbeck process along dim 1 of ``shape`` (n, T, ...), sampled exactly at 20 ms
    bins: variance ``sigma^2`` and lag-k correlation ``exp(-k BIN_S / tau_s)``."""
    if tau_s <= 0 or sigma < 0:
        raise ConfigError(f"ou_noise: tau_s > 0 and sigma >= 0, got {tau_s}, {sigma}")
    a = math.exp(-BIN_S / tau_s)
    eps = torch.randn(shape, generator=generator, dtype=torch.float64)
    out = torch.empty_like(eps)
    out[:, 0] = sigma * eps[:, 0]
    innovation = sigma * math.sqrt(1 - a * a)
    for t in range(1, shape[1]):
        out[:, t] = a * out[:, t - 1] + innovation * eps[:, t]
    return out


def poisson_counts(rates: Tensor, generator: torch.Generator) -> Tensor:
    """Poisson spike counts with expected counts ``rates`` (per bin, >= 0), as float64."""
    if not bool(torch.isfinite(rates).all()) or bool((rates < 0).any()):
        raise ConfigError("poisson_counts: rates must be finite and non-negative")
    return torch.poisson(rates.double(), generator=generator)
