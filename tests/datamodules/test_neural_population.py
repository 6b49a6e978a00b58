"""The neural-population simulator: trajectories against exact derivatives and an ODE solver, noise and spikes
against their stated moments (Monte Carlo, tolerances in standard errors)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.integrate import solve_ivp

from datamodules.neural_population import (
    BIN_S,
    curved_reach,
    draw_session,
    integrate_lorenz,
    lorenz_derivative,
    lorenz_latents,
    minimum_jerk,
    ou_noise,
    poisson_counts,
    random_walk_pursuit,
)
from errors import ConfigError


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reach_args(n: int = 4) -> tuple[torch.Tensor, ...]:
    g = gen(1)
    start = torch.randn(n, 2, generator=g, dtype=torch.float64)
    end = torch.randn(n, 2, generator=g, dtype=torch.float64)
    onset = torch.rand(n, generator=g, dtype=torch.float64) * 0.3
    duration = 0.4 + 0.4 * torch.rand(n, generator=g, dtype=torch.float64)
    return start, end, onset, duration


def test_minimum_jerk_endpoints_peak_and_velocity() -> None:
    start, end, onset, duration = reach_args()
    t = torch.linspace(0, 1.5, 15001, dtype=torch.float64)
    pos, vel = minimum_jerk(start, end, onset, duration, t)
    assert torch.allclose(pos[:, 0], start) and torch.allclose(pos[:, -1], end)
    fd = torch.gradient(pos, spacing=(t,), dim=1)[0]
    assert torch.allclose(vel[:, 1:-1], fd[:, 1:-1], atol=2e-3)
    # the bell's peak speed: 15/8 of the mean speed |end - start| / duration
    peak = vel.norm(dim=-1).max(dim=1).values
    assert torch.allclose(peak, 1.875 * (end - start).norm(dim=-1) / duration, rtol=1e-4)


def test_curved_reach_ends_where_it_should_and_bulges_sideways() -> None:
    start, end, onset, duration = reach_args()
    bulge = torch.tensor([0.5, -0.5, 1.0, 0.0], dtype=torch.float64)
    t = torch.linspace(0, 1.5, 15001, dtype=torch.float64)
    pos, vel = curved_reach(start, end, bulge, onset, duration, t)
    straight, _ = minimum_jerk(start, end, onset, duration, t)
    assert torch.allclose(pos[:, -1], end) and torch.allclose(pos[:, 0], start)
    assert torch.allclose(vel[:, 1:-1], torch.gradient(pos, spacing=(t,), dim=1)[0][:, 1:-1], atol=2e-3)
    assert torch.allclose((pos - straight).norm(dim=-1).max(dim=1).values, bulge.abs(), atol=1e-6)


def test_lorenz_rk4_matches_scipy() -> None:
    x0 = torch.tensor([[1.0, 1.0, 20.0]], dtype=torch.float64)
    ours = integrate_lorenz(x0, 100, 0.005)[0, -1].numpy()
    ref = solve_ivp(lambda _t, y: lorenz_derivative(torch.from_numpy(y)).numpy(), (0, 0.5), x0[0].numpy(),
                    rtol=1e-10, atol=1e-10).y[:, -1]
    assert np.allclose(ours, ref, atol=1e-4)


def test_lorenz_latents_are_standardised_seeded_and_faster_when_asked() -> None:
    z = lorenz_latents(20, 50, gen(0), burn_in=100)
    flat = z.reshape(-1, 3)
    assert z.shape == (20, 50, 3) and torch.allclose(flat.mean(0), torch.zeros(3, dtype=z.dtype), atol=1e-10)
    assert torch.equal(z, lorenz_latents(20, 50, gen(0), burn_in=100))
    assert not torch.equal(z, lorenz_latents(20, 50, gen(1), burn_in=100))
    slow = lorenz_latents(20, 50, gen(0), time_per_bin=0.005, burn_in=100).diff(dim=1).abs().mean()
    assert float(z.diff(dim=1).abs().mean()) > 1.5 * float(slow)


def test_ou_noise_has_its_variance_and_correlation() -> None:
    tau = 0.1
    x = ou_noise((4000, 30, 2), tau, 0.7, gen(2))
    var = float(x[:, 10:].var())
    assert abs(var - 0.49) < 5 * 0.49 * math.sqrt(2 / 4000)  # trials are the independent unit
    rho = float((x[:, 11:] * x[:, 10:-1]).mean() / x[:, 10:].var())
    assert abs(rho - math.exp(-BIN_S / tau)) < 0.01


def test_poisson_counts_mean_and_variance() -> None:
    rates = torch.tensor([0.1, 1.0, 4.0], dtype=torch.float64).expand(40000, 3)
    c = poisson_counts(rates, gen(3))
    se = (rates[0] / 40000).sqrt()
    assert torch.all((c.mean(0) - rates[0]).abs() < 5 * se)
    assert torch.allclose(c.var(0), rates[0], rtol=0.05)
    with pytest.raises(ConfigError, match="non-negative"):
        poisson_counts(torch.tensor([-1.0]), gen(0))


def test_sessions_share_latents_but_not_units() -> None:
    a, b = draw_session(80, 3, gen(4)), draw_session(80, 3, gen(5))
    z = lorenz_latents(10, 20, gen(0), burn_in=10)
    ra, rb = a.log_rates(z), b.log_rates(z)
    assert ra.shape == (10, 20, 80) and not torch.allclose(ra, rb)
    hz = a.baseline.exp() / BIN_S
    assert bool((hz >= 5).all() and (hz <= 20).all())


def test_random_walk_starts_at_origin_and_integrates_its_velocity() -> None:
    pos, vel = random_walk_pursuit(500, 50, gen(6))
    assert torch.allclose(pos[:, 0], torch.zeros(500, 2, dtype=pos.dtype))
    assert torch.allclose(pos[:, 1:] - pos[:, :-1], vel[:, 1:] * BIN_S)
    assert abs(float(vel.std()) - 0.15) < 0.01


def test_bad_reach_shapes() -> None:
    start, end, onset, duration = reach_args()
    with pytest.raises(ConfigError, match="minimum_jerk"):
        minimum_jerk(start, end, onset[:2], duration, torch.zeros(3))
    with pytest.raises(ConfigError, match="duration must be positive"):
        minimum_jerk(start, end, onset, -duration, torch.zeros(3))
