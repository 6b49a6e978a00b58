"""In-memory tensor data behind a loader that indexes whole batches.

A ``torch.utils.data.DataLoader`` over a ``TensorDataset`` fetches and collates every sample on its own,
which dominates the step time of the small models most papers here train. ``BatchedTensorLoader``
indexes each batch with one tensor gather instead.

Distributed training: the loader shards every *global* batch across ranks (rank r takes positions
r, r + world, ... of the batch), so the global batch size is what the config says whatever the number of
processes, the union of the ranks' batches is exactly the single-process batch, and evaluation never pads
or duplicates a sample. Lightning does not wrap it in a ``DistributedSampler`` because it is not a
``DataLoader``.

Shuffling is a pure function of ``(seed, epoch)``, so a run resumed from an epoch-end checkpoint sees the
same batches as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import lightning as L
import torch
from torch import Tensor


class _EpochSetter:
    """What Lightning's ``_set_sampler_epoch`` looks for (``loader.sampler.set_epoch``)."""

    def __init__(self, loader: BatchedTensorLoader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.epoch = epoch


class BatchedTensorLoader:
    """Iterates over aligned tensors in batches, one gather per batch.

    Args:
        tensors: tensors sharing their first dimension (for example features and labels).
        batch_size: the global batch size (summed over all ranks).
        shuffle: draw a fresh permutation every epoch from ``(seed, epoch)``.
        drop_last: drop a final global batch smaller than ``batch_size``.
        seed: seed of the shuffling permutation.
        rank, world_size: this process's place among the data-parallel processes.
    """

    def __init__(
        self,
        tensors: Sequence[Tensor],
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not tensors:
            raise ValueError("BatchedTensorLoader needs at least one tensor")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ValueError(f"tensors disagree on their first dimension: {[t.shape[0] for t in tensors]}")
        if n == 0:
            raise ValueError("this data split has no samples")
        if batch_size < world_size:
            raise ValueError(
                f"batch_size={batch_size} is smaller than the number of processes ({world_size}); "
                f"the batch size is global, so raise it to at least {world_size}"
            )
        self.tensors = tuple(tensors)
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.sampler = _EpochSetter(self)
        self.batch_sampler = None  # Lightning's loader inspection reads it

    def _global_batches(self) -> list[Tensor]:
        if self.shuffle:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=gen)
        else:
            order = torch.arange(self.n)
        batches = list(order.split(self.batch_size))
        if self.drop_last and len(batches) > 1 and len(batches[-1]) < self.batch_size:
            batches.pop()
        # A last batch with fewer samples than ranks would leave a rank empty: fold it into the previous one.
        if len(batches) > 1 and len(batches[-1]) < self.world_size:
            tail = batches.pop()
            batches[-1] = torch.cat([batches[-1], tail])
        return batches

    def __len__(self) -> int:
        full, rest = divmod(self.n, self.batch_size)
        if rest == 0:
            return full
        if self.drop_last and full >= 1:
            return full
        if rest < self.world_size and full >= 1:
            return full
        return full + 1

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        for idx in self._global_batches():
            local = idx[self.rank :: self.world_size] if self.world_size > 1 else idx
            yield tuple(t[local] for t in self.tensors)


Split = tuple[Tensor, ...]


class TensorDataModule(L.LightningDataModule):
    """Base for data that fits in memory as tensors: subclasses implement ``build_splits``.

    Args:
        batch_size: global training batch size (summed over all processes).
        eval_batch_size: batch size for validation, test and predict (default: ``batch_size``).
        seed: seed of the shuffling order (the data itself is seeded by each subclass).
    """

    #: a short name for the MLflow ``dataset`` tag; subclasses override it
    dataset_name: str = "tensors"

    def __init__(self, batch_size: int = 150, eval_batch_size: int | None = None, seed: int = 0) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        if eval_batch_size is not None and eval_batch_size <= 0:
            raise ValueError(f"eval_batch_size must be a positive integer, got {eval_batch_size}")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.seed = seed
        self.splits: dict[str, Split] | None = None

    def build_splits(self) -> dict[str, Split]:
        """Return ``{"train": (x, y), "val": (x, y), "test": (x, y)}``; ``predict`` defaults to test."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.splits is None:
            self.splits = self.build_splits()
            for name, tensors in self.splits.items():
                if len(tensors) == 0 or tensors[0].shape[0] == 0:
                    raise ValueError(f"the {name} split of {type(self).__name__} has no samples")

    def _split(self, name: str) -> Split:
        self.setup()
        assert self.splits is not None
        if name == "predict" and "predict" not in self.splits:
            name = "test"
        if name not in self.splits:
            raise ValueError(f"{type(self).__name__} has no {name!r} split (it has {sorted(self.splits)})")
        return self.splits[name]

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def loader(self, name: str, shuffle: bool = False) -> BatchedTensorLoader:
        rank, world = self._world()
        batch = self.batch_size if name == "train" else self.eval_batch_size
        return BatchedTensorLoader(
            self._split(name), batch, shuffle=shuffle, seed=self.seed, rank=rank, world_size=world
        )

    def train_dataloader(self) -> BatchedTensorLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> BatchedTensorLoader:
        return self.loader("val")

    def test_dataloader(self) -> BatchedTensorLoader:
        return self.loader("test")

    def predict_dataloader(self) -> BatchedTensorLoader:
        return self.loader("predict")

    # Properties the CLI links into model arguments (input size, number of classes).
    @property
    def num_features(self) -> int:
        return int(self._split("train")[0].shape[-1])

    @property
    def num_classes(self) -> int:
        return int(self._split("train")[1].max().item()) + 1


def seeded_split(n: int, sizes: Sequence[int], seed: int) -> list[Tensor]:
    """Disjoint index sets of the given sizes from one seeded permutation of ``range(n)``."""
    if sum(sizes) > n:
        raise ValueError(f"split sizes {list(sizes)} exceed the {n} available samples")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    out, start = [], 0
    for s in sizes:
        out.append(perm[start : start + s])
        start += s
    return out
