"""Collocation points for PINNs on an interval (paper 000-02): fresh points every step, a fixed evaluation grid.

Training batches are ``(x (n_collocation, 1),)`` drawn i.i.d. uniform on ``[low, high]`` at every step
(``CollocationSampler``), or, with a ``band`` and ``band_fraction > 0``, a fixed share of them uniform on the
band instead (denser sampling where the solution has a thin layer); the stream is a pure function of ``(seed, epoch)``, so a run
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


def check_band(band: tuple[float, float] | None, band_fraction: float, low: float, high: float) -> None:
    """A refinement band is an interval inside ``[low, high]`` and its share of the points is in [0, 1)."""
    if not 0 <= band_fraction < 1:
        raise ConfigError(f"band_fraction is the share of points drawn in the band, in [0, 1), got {band_fraction}")
    if band is None:
        if band_fraction > 0:
            raise ConfigError(f"band_fraction={band_fraction} needs a band: set band: [low, high] inside the domain")
        return
    if len(band) != 2:
        raise ConfigError(f"band is one interval [low, high], got {list(band)}")
    check_box(*band)
    if band[0] < low or band[1] > high:
        raise ConfigError(f"the band {list(band)} must lie inside the domain [{low}, {high}]")


class CollocationSampler:
    """Fresh i.i.d. points in the box ``[low, high]^dim`` at every call: uniform, or a mixture that draws a
    fixed share of them uniform on a sub-box (a band) to put more points where a solution has a thin layer.

    With ``k = round(band_fraction * n)``, the first ``n - k`` points of a call are uniform on the box and the
    last ``k`` uniform on ``band^dim``: the expected number in an interval ``I`` of the band (1-D) is
    ``(n - k) |I| / (high - low) + k |I| / |band|``. ``band_fraction = 0`` draws exactly the uniform stream.

    Args:
        n: points per call.
        low, high: the box (the same interval in every dimension).
        dim: spatial dimension.
        seed: seed of the generator; ``reseed(k)`` restarts the stream at a known point (an epoch, a rank).
        dtype: dtype of the points.
        band: the refinement interval (the same in every dimension), inside ``[low, high]``; None: no band.
        band_fraction: the share of the points drawn in the band, in [0, 1).
    """

    def __init__(self, n: int = 2048, low: float = -1.0, high: float = 1.0, dim: int = 1, seed: int = 0,
                 dtype: torch.dtype = torch.float32, band: tuple[float, float] | None = None,
                 band_fraction: float = 0.0) -> None:
        if n <= 0 or dim <= 0:
            raise ConfigError(f"the collocation sampler needs n > 0 points and dim > 0, got n={n}, dim={dim}")
        check_box(low, high)
        check_band(band, band_fraction, low, high)
        self.n, self.low, self.high, self.dim, self.seed, self.dtype = n, low, high, dim, seed, dtype
        self.band = None if band is None else (float(band[0]), float(band[1]))
        self.n_band = round(band_fraction * n) if band is not None else 0
        self.generator = torch.Generator().manual_seed(seed)

    def reseed(self, stream: int) -> None:
        """Restart at the ``stream``-th independent stream of this seed (for example the epoch)."""
        self.generator.manual_seed(self.seed * 1_000_003 + stream)

    def __call__(self) -> Tensor:
        # one draw of n uniforms whatever the band: without one the stream is the plain uniform stream
        u = torch.rand(self.n, self.dim, generator=self.generator, dtype=torch.float64)
        x = self.low + (self.high - self.low) * u
        if self.n_band:
            b_low, b_high = self.band  # type: ignore[misc]
            k = self.n - self.n_band
            x[k:] = b_low + (b_high - b_low) * u[k:]
        return x.to(self.dtype)


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
        band, band_fraction: draw ``band_fraction`` of every training batch uniform on ``band`` (an interval
            inside ``[low, high]``) and the rest uniform on the interval (``CollocationSampler``); evaluation
            grids are unchanged.
    """

    dataset_name = "collocation"

    def __init__(self, n_collocation: int = 2048, n_eval: int = 4096, steps_per_epoch: int = 250, low: float = -1.0,
                 high: float = 1.0, eval_batch_size: int = 4096, seed: int | None = None,
                 band: tuple[float, float] | None = None, band_fraction: float = 0.0) -> None:
        super().__init__()
        if n_collocation <= 0 or eval_batch_size <= 0:
            raise ConfigError(f"n_collocation and eval_batch_size must be positive, got {n_collocation}, {eval_batch_size}")
        if steps_per_epoch <= 0:
            raise ConfigError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
        check_box(low, high)
        check_band(band, band_fraction, low, high)
        self.band, self.band_fraction = band, band_fraction
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
        points = CollocationSampler(self.n_collocation, self.low, self.high, dim=1, seed=self.seed, band=self.band,
                                    band_fraction=self.band_fraction)
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
