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
    torch.manual_seed(7)  # without a seed the stream follows seed_everything
    a = next(iter(CollocationDataModule().train_dataloader()))[0]
    torch.manual_seed(7)
    b = next(iter(CollocationDataModule().train_dataloader()))[0]
    torch.manual_seed(8)
    c = next(iter(CollocationDataModule().train_dataloader()))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bad_settings():
    with pytest.raises(ConfigError, match="low < high"):
        CollocationDataModule(low=1.0, high=-1.0)
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        CollocationDataModule(steps_per_epoch=0)
    with pytest.raises(ConfigError, match="positive"):
        CollocationDataModule(n_collocation=0)
