"""datamodules/collocation.py: fresh points every step, replayable per epoch, sharded under DDP, the grid."""

from __future__ import annotations

import pytest
import torch

from datamodules.collocation import CollocationDataModule, CollocationSampler, FreshPointsLoader
from errors import ConfigError


def test_every_training_step_gets_fresh_points_and_an_epoch_replays():
    dm = CollocationDataModule(n_collocation=2048, steps_per_epoch=4, seed=1)
    loader = dm.train_dataloader()
    first = [b[0] for b in loader]
    assert len(first) == 4 == len(loader) and first[0].shape == (2048, 1)
    assert not any(torch.equal(first[0], b) for b in first[1:])
    assert all((b >= -1).all() and (b <= 1).all() for b in first)
    again = [b[0] for b in loader]  # same epoch: the same stream (resume-safe)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    loader.sampler.set_epoch(1)  # what Lightning calls at every epoch
    assert not torch.equal(next(iter(loader))[0], first[0])


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_mid_epoch_resume_yields_exactly_the_rest_of_the_epoch(world_size: int):
    """A loader restored from another's state after k batches (a checkpoint mid-epoch) yields the batches an
    uninterrupted epoch yields after its first k, on every rank; the next epoch is unaffected."""

    def loader(rank: int = 0) -> FreshPointsLoader:
        return FreshPointsLoader(CollocationSampler(n=64, seed=3), steps=6, rank=rank, world_size=world_size)

    for rank in range(world_size):
        whole = loader(rank)
        whole.sampler.set_epoch(2)
        epoch = [b[0] for b in whole]
        interrupted = loader(rank)
        interrupted.sampler.set_epoch(2)
        it = iter(interrupted)
        seen = [next(it)[0] for _ in range(2)]
        state = interrupted.state_dict()
        assert state == {"epoch": 2, "consumed": 2}
        resumed = loader(rank)  # a fresh process: a new loader, the state from the checkpoint
        resumed.load_state_dict(state)
        resumed.sampler.set_epoch(2)
        rest = [b[0] for b in resumed]
        assert len(rest) == 4 and all(torch.equal(a, b) for a, b in zip(seen + rest, epoch, strict=True))
        resumed.sampler.set_epoch(3)
        whole.sampler.set_epoch(3)
        assert all(torch.equal(a[0], b[0]) for a, b in zip(resumed, whole, strict=True))


def test_ranks_split_the_global_batch():
    points = CollocationSampler(n=10, seed=2)
    single = next(iter(FreshPointsLoader(points, 1)))[0]
    shards = [next(iter(FreshPointsLoader(points, 1, rank=r, world_size=2)))[0] for r in range(2)]
    assert torch.equal(torch.cat(shards).sort(0).values, single.sort(0).values)
    with pytest.raises(ConfigError, match="smaller than the number of processes"):
        FreshPointsLoader(CollocationSampler(n=1), 1, world_size=2)


def test_evaluation_grid_and_seed_default():
    dm = CollocationDataModule(n_eval=4096, eval_batch_size=1000)
    batches = [b[0] for b in dm.val_dataloader()]
    grid = torch.cat(batches)
    assert grid.shape == (4096, 1) and grid[0, 0] == -1 and grid[-1, 0] == 1
    assert torch.allclose(grid[1:] - grid[:-1], torch.full((4095, 1), 2 / 4095), atol=1e-6)
    assert dm.num_features == 1 and dm.input_shape == (1,)
    def first_batch(run_seed: int) -> torch.Tensor:
        dm = CollocationDataModule()
        dm.run_seed = run_seed  # without a seed the stream follows seed_everything (the CLI sets run_seed)
        return next(iter(dm.train_dataloader()))[0]

    a, b, c = first_batch(7), first_batch(7), first_batch(8)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bad_settings():
    with pytest.raises(ConfigError, match="low < high"):
        CollocationDataModule(low=1.0, high=-1.0)
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        CollocationDataModule(steps_per_epoch=0)
    with pytest.raises(ConfigError, match="positive"):
        CollocationDataModule(n_collocation=0)


def test_a_band_draws_its_share_of_points_and_the_layer_count_matches_the_mixture_density():
    """With a band, the last round(f n) points of a call are uniform on the band and the rest uniform on the
    interval: the mean count in a sub-interval of the band over many calls is the mixture's expected count
    (n - k)|I|/2 + k|I|/|band| (closed form), within 4 standard errors; without a band the stream is unchanged."""
    n, f, band = 1024, 0.5, (-0.3, 0.3)
    s = CollocationSampler(n=n, seed=5, band=band, band_fraction=f, dtype=torch.float64)
    assert s.n_band == 512
    calls = torch.stack([s() for _ in range(200)])[..., 0]  # (200, n)
    assert (calls[:, 512:].abs() <= 0.3).all() and (calls.abs() <= 1).all()
    half = 0.1  # the layer |x| <= 0.1, inside the band
    counts = (calls.abs() <= half).sum(1).double()
    expected = (n - 512) * (2 * half) / 2.0 + 512 * (2 * half) / 0.6
    assert abs(counts.mean() - expected) < 4 * counts.std() / len(counts) ** 0.5, (counts.mean(), expected)
    # an interval off-centre, across the band's edge: (n - k) 0.3 / 2 + k 0.15 / 0.6
    off = ((calls >= 0.15) & (calls <= 0.45)).sum(1).double()
    expected_off = (n - 512) * 0.3 / 2.0 + 512 * 0.15 / 0.6
    assert abs(off.mean() - expected_off) < 4 * off.std() / len(off) ** 0.5, (off.mean(), expected_off)
    plain, banded = CollocationSampler(n=64, seed=2), CollocationSampler(n=64, seed=2, band=band, band_fraction=0.0)
    assert torch.equal(plain(), banded())


def test_the_datamodule_passes_its_band_and_bad_bands_are_one_line_errors():
    dm = CollocationDataModule(n_collocation=100, steps_per_epoch=1, seed=0, band=(-0.1, 0.1), band_fraction=0.25)
    (x,) = next(iter(dm.train_dataloader()))
    assert (x[75:].abs() <= 0.1).all() and x.shape == (100, 1)
    for kwargs, match in (({"band_fraction": 0.5}, "needs a band"), ({"band": (-2.0, 0.0), "band_fraction": 0.5},
                          "inside the domain"), ({"band": (0.1, -0.1), "band_fraction": 0.5}, "low < high"),
                          ({"band": (-0.1, 0.1), "band_fraction": 1.0}, r"in \[0, 1\)")):
        with pytest.raises(ConfigError, match=match):
            CollocationDataModule(**kwargs)
