"""Collocation points for PINNs on an interval (paper 000-02): fresh points every step, a fixed evaluation grid.

Training batches are ``(x (n_collocation, 1),)`` drawn i.i.d. uniform on ``[low, high]`` at every step
(``CollocationSampler``); the stream is a pure function of ``(seed, epoch)``, so a run
resumed from an epoch-end checkpoint sees the points an uninterrupted run would. Under DDP every rank draws
the same global batch and keeps positions ``rank, rank + world, ...``: the union of the ranks' points is the
single-process batch. Validation and test batches are the ``n_eval`` equispaced grid points (both ends
included); the task evaluates the exact solution on them.

The data carries no PDE: the task owns the equation, its boundary data and ``u*``, so the two can never
disagree about eps.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from datamodules.base import BatchedTensorLoader, PaperlabDataModule, ResumableLoader
from errors import ConfigError


def check_box(low: float, high: float) -> None:
    """``[low, high]`` is a finite interval with ``low < high``, or a ``ConfigError`` says so."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        raise ConfigError(f"the collocation domain needs finite low < high, got [{low}, {high}]")


class CollocationSampler:
    """Fresh i.i.d. uniform points in the box ``[low, high]^dim`` at every call.

    Args:
        n: points per call.
        low, high: the box (the same interval in every dimension).
        dim: spatial dimension.
        seed: seed of the generator; ``reseed(k)`` restarts the stream at a known point (an epoch, a rank).
        dtype: dtype of the points.
    """

    def __init__(self, n: int = 2048, low: float = -1.0, high: float = 1.0, dim: int = 1, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> None:
        if n <= 0 or dim <= 0:
            raise ConfigError(f"the collocation sampler needs n > 0 points and dim > 0, got n={n}, dim={dim}")
        check_box(low, high)
        self.n, self.low, self.high, self.dim, self.seed, self.dtype = n, low, high, dim, seed, dtype
        self.generator = torch.Generator().manual_seed(seed)

    def reseed(self, stream: int) -> None:
        """Restart at the ``stream``-th independent stream of this seed (for example the epoch)."""
        self.generator.manual_seed(self.seed * 1_000_003 + stream)

    def __call__(self) -> Tensor:
        u = torch.rand(self.n, self.dim, generator=self.generator, dtype=torch.float64)
        return (self.low + (self.high - self.low) * u).to(self.dtype)


def uniform_grid(n: int, low: float = -1.0, high: float = 1.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """``n`` equispaced points from ``low`` to ``high`` (both included), shape ``(n, 1)``."""
    if n < 2:
        raise ConfigError(f"an evaluation grid needs at least 2 points, got {n}")
    return torch.linspace(low, high, n, dtype=torch.float64).to(dtype)[:, None]


class FreshPointsLoader(ResumableLoader):
    """``steps`` batches of fresh uniform points per epoch, ``(x,)`` with ``x (n / world, dim)`` on each rank.

    The epoch's stream restarts from ``(seed, epoch)`` (``CollocationSampler.reseed``), so it is a pure function
    of the two; a mid-epoch resume draws the batches it skips and drops them, which puts the generator where
    the interrupted run had it.
    """

    def __init__(self, points: CollocationSampler, steps: int, rank: int = 0, world_size: int = 1) -> None:
        if steps <= 0:
            raise ConfigError(f"steps_per_epoch must be positive, got {steps}")
        if points.n < world_size:
            raise ConfigError(f"n_collocation={points.n} is smaller than the number of processes ({world_size})")
        super().__init__()
        self.points, self.steps, self.rank, self.world_size = points, steps, rank, world_size

    def __len__(self) -> int:
        return self.steps

    def batches(self, skip: int = 0) -> Iterator[tuple[Tensor]]:
        self.points.reseed(self.epoch)
        for i in range(self.steps):
            x = self.points()  # drawn also when skipped: the later batches depend on every earlier draw
            if i >= skip:
                yield (x[self.rank :: self.world_size] if self.world_size > 1 else x,)


class CollocationDataModule(PaperlabDataModule):
    """Fresh collocation points on ``[low, high]`` (training) and an equispaced grid (validation, test).

    Args:
        n_collocation: points per training step (global over ranks).
        n_eval: grid points for validation and test (both ends included).
        steps_per_epoch: training steps per epoch (one validation per epoch).
        low, high: the interval.
        eval_batch_size: grid points per evaluation batch.
        seed: seed of the point stream; None (default): the run's seed (``seed_everything``), so seeds replicate
            the points too.
    """

    dataset_name = "collocation"

    def __init__(self, n_collocation: int = 2048, n_eval: int = 4096, steps_per_epoch: int = 250, low: float = -1.0,
                 high: float = 1.0, eval_batch_size: int = 4096, seed: int | None = None) -> None:
        super().__init__()
        if n_collocation <= 0 or eval_batch_size <= 0:
            raise ConfigError(f"n_collocation and eval_batch_size must be positive, got {n_collocation}, {eval_batch_size}")
        if steps_per_epoch <= 0:
            raise ConfigError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
        check_box(low, high)
        self.grid = uniform_grid(n_eval, low, high)
        self.n_collocation, self.n_eval, self.steps_per_epoch = n_collocation, n_eval, steps_per_epoch
        self.low, self.high, self.eval_batch_size, self.fixed_seed = low, high, eval_batch_size, seed

    @property
    def seed(self) -> int:
        """The point stream's seed: ``seed``, else the run's seed (read when the loader is built, after the CLI
        has set it)."""
        return self.seed_or_run(self.fixed_seed)

    def _world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)

    def train_dataloader(self) -> FreshPointsLoader:
        rank, world = self._world()
        points = CollocationSampler(self.n_collocation, self.low, self.high, dim=1, seed=self.seed)
        return FreshPointsLoader(points, self.steps_per_epoch, rank, world)

    def _grid_loader(self) -> BatchedTensorLoader:
        rank, world = self._world()
        return BatchedTensorLoader((self.grid,), self.eval_batch_size, rank=rank, world_size=world)

    def val_dataloader(self) -> BatchedTensorLoader:
        return self._grid_loader()

    def test_dataloader(self) -> BatchedTensorLoader:
        return self._grid_loader()

    def predict_dataloader(self) -> BatchedTensorLoader:
        return self._grid_loader()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1,)

    @property
    def num_features(self) -> int:
        return 1
