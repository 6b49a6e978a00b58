"""Simulated reaching (paper 004-02): trajectories against finite differences, the neural lag, splits and loaders."""

from __future__ import annotations

import math

import pytest
import torch

from datamodules.neural_population import BIN_S, minimum_jerk
from datamodules.sim_reach import (
    LAG_BINS,
    MixedStreamLoader,
    SimReachDataModule,
    aligned_reaches,
    movements,
    session_latent,
)
from errors import ConfigError


def _central_difference(pos: torch.Tensor, dt: float) -> torch.Tensor:
    return (pos[:, 2:] - pos[:, :-2]) / (2 * dt)


def test_minimum_jerk_velocity_matches_finite_differences_of_its_position() -> None:
    g = torch.Generator().manual_seed(0)
    n = 6
    start, end = torch.randn(n, 2, generator=g, dtype=torch.float64), torch.randn(n, 2, generator=g, dtype=torch.float64)
    onset = torch.rand(n, generator=g, dtype=torch.float64) * 0.3
    duration = 0.4 + 0.4 * torch.rand(n, generator=g, dtype=torch.float64)
    dt = 1e-4
    t = torch.arange(0, 1.2, dt, dtype=torch.float64)
    pos, vel = minimum_jerk(start, end, onset, duration, t)
    assert torch.allclose(_central_difference(pos, dt), vel[:, 1:-1], atol=1e-5)
    assert torch.allclose(pos[:, -1], end) and torch.allclose(pos[:, 0], start)
    # the closed form at one phase: tau = 1/2 gives half the way, peak speed 15/8 |d| / duration
    mid = onset + duration / 2
    p_mid, v_mid = minimum_jerk(start, end, onset, duration, mid[:1])
    assert torch.allclose(p_mid[0, 0], (start[0] + end[0]) / 2)
    assert torch.allclose(v_mid[0, 0].norm(), 15 / 8 * (end[0] - start[0]).norm() / duration[0])


def test_aligned_reaches_velocity_matches_finite_differences_and_ends_on_a_target() -> None:
    g = torch.Generator().manual_seed(1)
    pos, vel = aligned_reaches(64, 60, g)
    fd = _central_difference(pos, BIN_S)
    # 20 ms bins: central differences of a quintic are accurate to O(dt^2 |d3x/dt3|)
    assert (fd - vel[:, 1:-1]).abs().max() < 0.1 * vel.abs().max()
    ends = pos[:, -1]
    finished = (ends.norm(dim=-1) - 1).abs() < 1e-9  # reaches that ended within the window
    assert finished.sum() > 32
    angles = torch.atan2(ends[finished, 1], ends[finished, 0]) / (2 * math.pi / 8)
    assert torch.allclose(angles, angles.round(), atol=1e-9)  # one of 8 targets


def test_random_walk_has_the_aligned_rms_speed_scale() -> None:
    g = torch.Generator().manual_seed(2)
    _, v_rw = movements("random_walk", 1000, 50, g)
    _, v_al = movements("aligned", 1000, 50, g)
    ratio = float(v_rw.pow(2).mean().sqrt() / v_al.pow(2).mean().sqrt())
    assert 0.8 < ratio < 1.25


def test_units_read_velocity_100_ms_ahead() -> None:
    g = torch.Generator().manual_seed(3)
    pos, vel = aligned_reaches(4, 50 + LAG_BINS, g)
    z = session_latent(vel, pos)
    assert z.shape == (4, 50, 5)
    assert LAG_BINS * BIN_S == pytest.approx(0.1)
    for t in (0, 17, 49):
        assert torch.allclose(z[:, t, :2] * 1.23, vel[:, t + LAG_BINS])
        assert torch.allclose(z[:, t, 2:4] * 0.41, pos[:, t])


def _small(**kw: object) -> SimReachDataModule:
    args = dict(n_unpaired=40, n_target_train=10, n_val=6, n_test=8, batch_size=8, steps_per_epoch=5, data_seed=0, seed=0)
    args.update(kw)
    return SimReachDataModule(**args)  # type: ignore[arg-type]


def test_target_session_is_the_same_whatever_the_unpaired_corpus() -> None:
    a, b = _small(), _small(n_unpaired=80, unpaired_kind="random_walk")
    a.setup(), b.setup()
    for name in ("val", "test"):
        for x, y in zip(a.parts[name], b.parts[name]):  # type: ignore[index]
            assert torch.equal(x, y)
    assert not torch.equal(a.parts["unpaired"][1][:40], b.parts["unpaired"][1][:40])  # type: ignore[index]


def test_batches_sessions_and_the_paired_pool() -> None:
    d = _small(paired_pool="all", n_sessions=2, trials_per_session=5)
    d.setup()
    u_s, u_v, p_s, p_c, p_v = next(iter(d.train_dataloader()))
    assert u_v.shape == (8, 50, 2) and p_v.shape == (8, 50, 2) and p_c.shape[:2] == (8, 50)
    assert (u_s == 0).all() and set(d.parts["paired"][0].tolist()) == {1, 2, 3}  # type: ignore[index]
    s, c, v = d.paired_training_set()
    assert (s == 3).all() and c.shape[0] == 10
    s, c, v = next(iter(d.test_dataloader()))
    assert (s == 3).all() and v.shape == (8, 50, 2)
    assert (c >= 0).all() and torch.equal(c, c.round())


def test_mixed_stream_loader_resumes_mid_epoch() -> None:
    unpaired = (torch.arange(30),)
    paired = (torch.arange(7),)
    full = MixedStreamLoader(unpaired, paired, 4, 6, seed=3)
    full.epoch = 2
    batches = list(full)
    resumed = MixedStreamLoader(unpaired, paired, 4, 6, seed=3)
    resumed.epoch = 2
    resumed.load_state_dict({"epoch": 2, "consumed": 4})
    rest = list(resumed)
    assert len(rest) == 2 and all(torch.equal(x, y) for a, b in zip(rest, batches[4:]) for x, y in zip(a, b))
    shard = MixedStreamLoader(unpaired, paired, 4, 6, seed=3, rank=1, world_size=2)
    shard.epoch = 2
    assert torch.equal(next(iter(shard))[0], batches[0][0][1::2])


def test_bad_arguments_fail_in_one_line() -> None:
    with pytest.raises(ConfigError):
        _small(units_range=(50, 40))
    with pytest.raises(ConfigError):
        _small(n_target_train=0)
