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
same batches as an uninterrupted one. The loader is also *resumable* mid-epoch (``state_dict`` /
``load_state_dict``, which Lightning saves in checkpoints): a resume skips the batches the interrupted run
had trained on, and sees the rest of the same epoch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import ClassVar, Protocol, TypeVar

import lightning as L
import torch
from torch import Tensor

from errors import ConfigError


class _HasEpoch(Protocol):
    epoch: int


class EpochSetter:
    """What Lightning's ``_set_sampler_epoch`` looks for (``loader.sampler.set_epoch``)."""

    def __init__(self, loader: _HasEpoch) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.epoch = epoch


class ResumableLoader:
    """An epoch-aware loader of whole batches that resumes mid-epoch: subclasses yield the epoch's batches
    from ``batches(skip)`` and give ``__len__``; this class counts what left it and skips on a resume."""

    def __init__(self) -> None:
        self.epoch = 0
        self.sampler = EpochSetter(self)
        self.batch_sampler = None  # Lightning's loader inspection reads it
        self._yielded = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches to skip) from a checkpoint

    def __len__(self) -> int:
        raise NotImplementedError

    def batches(self, skip: int = 0) -> Iterator[tuple[Tensor, ...]]:
        """This epoch's batches after the first ``skip``."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        return self.counted(self.batches)

    def counted(self, items: Callable[[int], Iterator[T]]) -> Iterator[T]:
        """``items(skip)`` (this epoch's batches, or what stands for them) after what a resume skips, each
        counted as it leaves (``state_dict``)."""
        skip = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            skip = self._resume[1]
        self._resume = None
        self._yielded = skip
        for item in items(skip):
            self._yielded += 1
            yield item

    def state_dict(self) -> dict[str, int]:
        """The epoch and how many of its batches were trained on (for a mid-epoch resume). Lightning fetches
        nothing ahead from a loader that has a length, so what left the loader is what was trained on."""
        return {"epoch": self.epoch, "consumed": self._yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = (int(state["epoch"]), int(state["consumed"]))


class StepLoader(ResumableLoader):
    """``n`` batches that carry only their index: paces a loop in which the model draws its own data.
    Resumable (``ResumableLoader``), so a checkpoint written within an epoch resumes at its step."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def __len__(self) -> int:
        return self.n

    def batches(self, skip: int = 0) -> Iterator[Tensor]:  # type: ignore[override]
        return (torch.tensor([k]) for k in range(skip, self.n))


class BatchedTensorLoader(ResumableLoader):
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
            raise ConfigError("BatchedTensorLoader needs at least one tensor")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ConfigError(f"tensors disagree on their first dimension: {[t.shape[0] for t in tensors]}")
        if n == 0:
            raise ConfigError("this data split has no samples")
        if batch_size < world_size:
            raise ConfigError(
                f"batch_size={batch_size} is smaller than the number of processes ({world_size}); "
                f"the batch size is global, so raise it to at least {world_size}"
            )
        super().__init__()
        self.tensors = tuple(tensors)
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size

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

    def indices(self, skip: int = 0) -> Iterator[Tensor]:
        """This process's sample indices of each of this epoch's batches after the first ``skip``."""
        for idx in self._global_batches()[skip:]:
            yield idx[self.rank :: self.world_size] if self.world_size > 1 else idx

    def batches(self, skip: int = 0) -> Iterator[tuple[Tensor, ...]]:
        for local in self.indices(skip):
            yield tuple(t[local] for t in self.tensors)


class ChainedLoader(ResumableLoader):
    """The batches of several loaders one after the other, every epoch: a curriculum whose parts may hold
    samples of different shapes (each batch comes from one part). Each part shuffles on its own
    ``(seed, epoch)``; the chain resumes mid-epoch like a single loader.

    Args:
        parts: the loaders, in the order their batches are wanted.
    """

    def __init__(self, parts: Sequence[BatchedTensorLoader]) -> None:
        super().__init__()
        if not parts:
            raise ConfigError("ChainedLoader needs at least one loader")
        self.parts = tuple(parts)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def batches(self, skip: int = 0) -> Iterator[tuple[Tensor, ...]]:
        for part in self.parts:
            part.epoch = self.epoch
            if skip >= len(part):
                skip -= len(part)
                continue
            yield from part.batches(skip)
            skip = 0


Split = tuple[Tensor, ...]
T = TypeVar("T")

#: DataModule properties the CLI links into model ``__init__`` arguments of the same name, when both exist
#: (``input_shape``: one sample's shape; ``num_features``: its flattened size; ``num_classes``: output
#: classes, the vocabulary for next-token data; ``vocab_size``, ``block_size``: token data).
_RUN_SEED: ContextVar[int] = ContextVar("paperlab_run_seed", default=0)


@contextlib.contextmanager
def run_seed_context(seed: int) -> Iterator[None]:
    """Tasks and DataModules built inside take ``seed`` as their ``run_seed``: the CLI builds them in it,
    so that the seed is there already while they are built (a linked size may build the data)."""
    token = _RUN_SEED.set(int(seed))
    try:
        yield
    finally:
        _RUN_SEED.reset(token)


def current_run_seed() -> int:
    """The run seed of the ``run_seed_context`` being built in (0 outside one)."""
    return _RUN_SEED.get()


#: splits built once and shared, per DataModule class (``shared_splits``)
SplitsCache = dict[type, dict[str, Split]]
_SHARED_SPLITS: ContextVar[SplitsCache | None] = ContextVar("paperlab_shared_splits", default=None)


@contextlib.contextmanager
def shared_splits(cache: SplitsCache) -> Iterator[None]:
    """DataModules set up inside, of one configuration but for different run seeds, build their splits once per
    class into ``cache`` when the class declares ``splits_follow_run_seed = False``: a seed-parallel fit builds
    and sets up its K seeds' DataModules in it, so seed-independent data costs one build instead of K (each seed
    keeps its own loader order, which ``seed`` sets, not the splits)."""
    token = _SHARED_SPLITS.set(cache)
    try:
        yield
    finally:
        _SHARED_SPLITS.reset(token)


LINKED_SIZES = ("input_shape", "num_features", "num_classes", "vocab_size", "block_size")


class PaperlabDataModule(L.LightningDataModule):
    """Base of every paperlab DataModule: a ``dataset_name`` for the MLflow tag, and sizes as properties.

    A DataModule exposes what the model's size arguments need as properties named in ``LINKED_SIZES``;
    the CLI links each one it has into the model argument of the same name.
    """

    #: a short name for the MLflow ``dataset`` tag; subclasses override it
    dataset_name: str = "data"
    #: the run's seed: ``seed_everything`` of the command (the CLI builds the DataModule in a
    #: ``run_seed_context``; 0 for a DataModule built in Python, unless set). A ``seed: int | None = None``
    #: argument of a subclass means "the run seed" when None (``seed_or_run``).
    run_seed: int

    def __init__(self) -> None:
        super().__init__()
        self.run_seed = current_run_seed()

    def seed_or_run(self, seed: int | None) -> int:
        """``seed`` when given, else the run's seed."""
        return self.run_seed if seed is None else int(seed)

    def __str__(self) -> str:
        # Lightning's own builds every dataloader to describe them; jsonargparse formats the DataModule
        # whenever a linked size is absent, so that would build the data twice.
        return f"{type(self).__name__}({self.dataset_name})"


class TensorDataModule(PaperlabDataModule):
    """Base for data that fits in memory as tensors: subclasses implement ``build_splits``.

    Args:
        batch_size: global training batch size (summed over all processes).
        eval_batch_size: batch size for validation, test and predict (default: ``batch_size``).
        seed: seed of the shuffling order (the data itself is seeded by each subclass); None: the run's seed.
    """

    dataset_name: str = "tensors"
    #: whether ``build_splits`` depends on the run seed, directly (``run_seed``, ``seed_or_run``) or through a
    #: global generator that ``seed_everything`` seeds. True unless a subclass knows better: False lets the K
    #: seeds of a seed-parallel fit share one build (``shared_splits``); a test checks each such declaration.
    splits_follow_run_seed: ClassVar[bool] = True

    def __init__(self, batch_size: int = 150, eval_batch_size: int | None = None, seed: int | None = 0) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size}")
        if eval_batch_size is not None and eval_batch_size <= 0:
            raise ConfigError(f"eval_batch_size must be a positive integer, got {eval_batch_size}")
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.fixed_seed = seed
        self.splits: dict[str, Split] | None = None

    @property
    def seed(self) -> int:
        """The shuffling seed: ``seed``, else the run's seed (read at setup and later, when the CLI has set it)."""
        return self.seed_or_run(self.fixed_seed)

    def build_splits(self) -> dict[str, Split]:
        """Return ``{"train": (x, y), "val": (x, y), "test": (x, y)}``; ``predict`` defaults to test."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.splits is not None:
            return
        shared = None if self.splits_follow_run_seed else _SHARED_SPLITS.get()
        if shared is not None and type(self) in shared:
            self.splits = shared[type(self)]
            return
        self.splits = self.build_splits()
        for name, tensors in self.splits.items():
            if len(tensors) == 0 or tensors[0].shape[0] == 0:
                raise ConfigError(f"the {name} split of {type(self).__name__} has no samples")
        if shared is not None:
            shared[type(self)] = self.splits

    def _split(self, name: str) -> Split:
        self.setup()
        assert self.splits is not None
        if name == "predict" and "predict" not in self.splits:
            name = "test"
        if name not in self.splits:
            raise ConfigError(f"{type(self).__name__} has no {name!r} split (it has {sorted(self.splits)})")
        return self.splits[name]

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def loader(self, name: str, shuffle: bool = False, batch_size: int | None = None) -> BatchedTensorLoader:
        """A loader of split ``name``, batched by ``batch_size`` (default: the training batch for ``train``,
        the evaluation batch for the rest)."""
        rank, world = self._world()
        batch = batch_size or (self.batch_size if name == "train" else self.eval_batch_size)
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

    # Sizes the CLI links into the model's arguments of the same names (LINKED_SIZES).
    @property
    def input_shape(self) -> tuple[int, ...]:
        """The shape of one input sample (without the batch dimension)."""
        return tuple(int(d) for d in self._split("train")[0].shape[1:])

    @property
    def num_features(self) -> int:
        """The number of input features of one sample (its flattened size)."""
        return int(torch.Size(self.input_shape).numel())

    @property
    def num_classes(self) -> int:
        return int(self._split("train")[1].max().item()) + 1


def seeded_split(n: int, sizes: Sequence[int], seed: int) -> list[Tensor]:
    """Disjoint index sets of the given sizes from one seeded permutation of ``range(n)``."""
    if sum(sizes) > n:
        raise ConfigError(f"split sizes {list(sizes)} exceed the {n} available samples")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    out, start = [], 0
    for s in sizes:
        out.append(perm[start : start + s])
        start += s
    return out
