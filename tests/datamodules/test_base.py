"""The batched loader: every sample once per epoch, DDP shards that union to the global batch, resume order."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch
from lightning.fabric.utilities.seed import seed_everything

import datamodules
from datamodules.base import (
    BatchedTensorLoader,
    SplitsCache,
    TensorDataModule,
    run_seed_context,
    seeded_split,
    shared_splits,
)
from datamodules.digits import DigitsDataModule


def _batches(loader: BatchedTensorLoader) -> list[torch.Tensor]:
    return [b[0] for b in loader]


@pytest.mark.parametrize(("n", "batch"), [(100, 32), (96, 32), (33, 32), (5, 8)])
def test_every_sample_once_in_order_of_a_seeded_permutation(n: int, batch: int) -> None:
    x = torch.arange(n)
    loader = BatchedTensorLoader([x, x * 10], batch, shuffle=True, seed=3)
    got = _batches(loader)
    assert len(got) == len(loader)
    assert torch.equal(torch.cat(got).sort().values, x)
    assert all(len(b) <= batch for b in got[:-1])
    for xb, yb in loader:
        assert torch.equal(yb, xb * 10)  # features and labels stay aligned


def test_shuffle_depends_on_seed_and_epoch_only() -> None:
    x = torch.arange(50)
    a = BatchedTensorLoader([x], 10, shuffle=True, seed=1)
    b = BatchedTensorLoader([x], 10, shuffle=True, seed=1)
    first = torch.cat(_batches(a))
    assert torch.equal(first, torch.cat(_batches(b)))
    a.sampler.set_epoch(1)  # what Lightning calls at every epoch start (and after a resume)
    assert not torch.equal(first, torch.cat(_batches(a)))
    b.sampler.set_epoch(1)
    assert torch.equal(torch.cat(_batches(a)), torch.cat(_batches(b)))


@pytest.mark.parametrize(("n", "batch", "world"), [(100, 32, 2), (101, 32, 2), (97, 24, 3), (65, 32, 2)])
def test_ranks_split_each_global_batch_exactly(n: int, batch: int, world: int) -> None:
    x = torch.arange(n)
    single = _batches(BatchedTensorLoader([x], batch, shuffle=True, seed=5))
    ranks = [_batches(BatchedTensorLoader([x], batch, shuffle=True, seed=5, rank=r, world_size=world))
             for r in range(world)]
    assert len({len(r) for r in ranks}) == 1, "every rank must see the same number of batches"
    assert all(len(r) == len(BatchedTensorLoader([x], batch, rank=0, world_size=world)) for r in ranks)
    assert all(len(b) > 0 for r in ranks for b in r)
    unions = [torch.cat([r[i] for r in ranks]).sort().values for i in range(len(ranks[0]))]
    assert torch.equal(torch.cat(unions).sort().values, x)  # every sample exactly once per epoch
    if 0 < n % batch < world:
        # A tail smaller than the number of ranks is folded into the previous batch (no rank goes empty).
        assert len(unions) == len(single) - 1
        single = single[:-2] + [torch.cat(single[-2:])]
    for union, global_batch in zip(unions, single):
        assert torch.equal(union, global_batch.sort().values)


def test_errors() -> None:
    with pytest.raises(ValueError, match="no samples"):
        BatchedTensorLoader([torch.empty(0, 3)], 4)
    with pytest.raises(ValueError, match="first dimension"):
        BatchedTensorLoader([torch.zeros(3), torch.zeros(4)], 2)
    with pytest.raises(ValueError, match="smaller than the number of processes"):
        BatchedTensorLoader([torch.zeros(10)], 1, world_size=2)
    with pytest.raises(ValueError, match="exceed"):
        seeded_split(10, [6, 6], 0)


def test_digits_split_is_disjoint_and_seeded() -> None:
    dm = DigitsDataModule(val_size=200, test_size=300, split_seed=1)
    dm.setup()
    sizes = [dm.splits[s][0].shape[0] for s in ("train", "val", "test")]
    assert sizes == [1297, 200, 300]
    rows = {tuple(r.tolist()) for s in ("train", "val", "test") for r in dm.splits[s][0]}
    assert len(rows) >= 1790  # a few digits are pixel-identical duplicates in the original data
    x = dm.splits["train"][0]
    assert x.min() >= 0 and x.max() <= 1


# --- seed-independent splits, shared by the seeds of a seed-parallel fit --------------------------------------
def _declared_seed_independent() -> list[type[TensorDataModule]]:
    for info in pkgutil.iter_modules(datamodules.__path__):
        importlib.import_module(f"datamodules.{info.name}")
    found, todo = set(), [TensorDataModule]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.add(sub)
            todo.append(sub)
    return sorted((c for c in found if c.__module__.startswith("datamodules.") and not c.splits_follow_run_seed),
                  key=lambda c: c.__name__)


def _built(cls: type[TensorDataModule], run_seed: int) -> dict[str, tuple[torch.Tensor, ...]]:
    seed_everything(run_seed)  # what a plain run of that seed does first: global generators too
    with run_seed_context(run_seed):
        dm = cls()
        dm.setup("fit")
    assert dm.splits is not None
    return dm.splits


@pytest.mark.parametrize("cls", _declared_seed_independent(), ids=lambda c: c.__name__)
def test_a_datamodule_declared_seed_independent_builds_the_same_splits_for_every_run_seed(cls: type) -> None:
    first, other = _built(cls, 0), _built(cls, 7)
    assert first.keys() == other.keys()
    for name in first:
        assert all(torch.equal(a, b) for a, b in zip(first[name], other[name], strict=True)), name


class _Counted(TensorDataModule):
    builds = 0

    def build_splits(self) -> dict[str, tuple[torch.Tensor, ...]]:
        type(self).builds += 1
        x = torch.randn(8, 2)  # the global generator: follows the run seed
        return {"train": (x,), "val": (x,), "test": (x,)}


class _CountedFixed(_Counted):
    splits_follow_run_seed = False


def test_shared_splits_builds_seed_independent_data_once_and_the_rest_per_datamodule() -> None:
    _Counted.builds = _CountedFixed.builds = 0
    cache: SplitsCache = {}
    with shared_splits(cache):
        fixed = [_CountedFixed(), _CountedFixed()]
        seeded = [_Counted(), _Counted()]
        for dm in fixed + seeded:
            dm.setup("fit")
    assert fixed[0].splits is fixed[1].splits and _CountedFixed.builds == 1
    assert seeded[0].splits is not seeded[1].splits and _Counted.builds == 2
    alone = _CountedFixed()  # outside the context nothing is shared
    alone.setup("fit")
    assert alone.splits is not fixed[0].splits and _CountedFixed.builds == 2
