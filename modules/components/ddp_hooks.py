"""DDP communication hooks and the Lightning strategies that install them on every device.

A DDP comm hook replaces the all-reduce of each gradient bucket: ``hook(state, bucket) -> Future[Tensor]``,
the tensor becoming the bucket's gradient on every rank. Two families live here:

- ``msync_hook`` (m-Synchronous SGD, paper 002-11): every rank draws the same n = world-size computation
  times from ``(seed, step)``; the m ranks that would finish first contribute their gradient, the others
  zeros, and the all-reduced sum is divided by m, so every rank applies x - lr (1/m) sum_{i in S} g_i with
  S the m fastest. The all-reduce still blocks on every rank: the update is m-Sync SGD's, the time saving
  is not (the strategy's ``sim_clock`` reports the simulated seconds, the sum of the m-th order statistics).
- ``make_comm_hook(compressor, k_fraction, seed)`` and ``CompressedDDPStrategy`` (paper 004-18): compressed
  gradient buckets all-reduced (shared-seed Rand-K all-reduces only its k values), ending as the rank mean.

Lightning 2.6.6 registers ``DDPStrategy(ddp_comm_hook=...)`` only when the root device is CUDA and silently
ignores it on CPU; gloo supports comm hooks, so the strategies below register theirs on every device.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from torch import Tensor

from errors import ConfigError
from modules.components.compute_time import ComputeTimeModel

# m-Synchronous SGD ------------------------------------------------------------------------------------------


class MSyncHookState:
    """What ``msync_hook`` needs: m, the time model, the seed, the current step (set by the strategy).

    ``fastest(step)`` is a pure function of ``(seed, step)``, so every rank computes the same set.
    """

    def __init__(self, m: int, time_model: ComputeTimeModel, seed: int, world_size: int, rank: int) -> None:
        if not 1 <= m <= world_size:
            raise ConfigError(f"MSyncDDPStrategy: m must be in [1, world size] = [1, {world_size}], got {m}")
        time_model.check_workers(world_size)
        self.m, self.time_model, self.seed = m, time_model, seed
        self.world_size, self.rank = world_size, rank
        self.step = 0
        self.clock = 0.0
        self._counted = -1
        self.last_selected: list[int] = []

    def times(self, step: int) -> Tensor:
        """The n = world-size computation times of ``step``, the same on every rank."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return self.time_model.sample(self.world_size, gen)

    def fastest(self, step: int) -> list[int]:
        """The m ranks that finish first at ``step`` (ties to the lower rank), in arrival order."""
        order = torch.sort(self.times(step), stable=True).indices
        return order[: self.m].tolist()

    def begin(self, step: int) -> None:
        """Called once per optimiser step before backward: fix the set and advance the simulated clock."""
        self.step = step
        if step != self._counted:
            times = self.times(step)
            self.last_selected = torch.sort(times, stable=True).indices[: self.m].tolist()
            self.clock += float(times.sort().values[self.m - 1])
            self._counted = step


def msync_hook(state: MSyncHookState, bucket):
    """Sum of the m fastest ranks' gradients divided by m (see the module docstring).

    ``bucket`` is a ``dist.GradBucket``; it carries no annotation because torch refuses a hook whose
    annotation is not the class itself, and postponed annotations make it a string.
    """
    buffer = bucket.buffer()
    if state.step != state._counted:
        state.begin(state.step)
    weight = (1.0 / state.m) if state.rank in state.last_selected else 0.0
    buffer.mul_(weight)
    fut = dist.all_reduce(buffer, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class _HookedDDPStrategy(DDPStrategy):
    """A DDPStrategy that registers its comm hook on every device (Lightning's own does so only on CUDA)."""

    def make_hook(self) -> tuple[Any, Any]:
        raise NotImplementedError

    def _register_ddp_hooks(self) -> None:
        state, hook = self.make_hook()
        self.hook_state = state
        self.model.register_comm_hook(state, hook)


class MSyncDDPStrategy(_HookedDDPStrategy):
    """Data-parallel m-Synchronous SGD: each rank is a worker; per step only the m fastest ranks (simulated
    times, the same draw on every rank) contribute, and the sum is divided by m.

    Args:
        m: gradients averaged per step, 1 <= m <= world size.
        time_model: the workers' computation times (default Exp(1)).
        seed: seed of the per-step draws (a pure function of (seed, step)).
        **kwargs: ``DDPStrategy``'s arguments (``start_method: spawn`` for ``ddp_spawn``, ...).
    """

    strategy_name = "msync_ddp"

    def __init__(self, m: int = 1, time_model: ComputeTimeModel | None = None, seed: int = 0, **kwargs: Any) -> None:
        if m < 1:
            raise ConfigError(f"MSyncDDPStrategy: m must be >= 1, got {m}")
        super().__init__(**kwargs)
        self.m = m
        self.time_model = time_model if time_model is not None else ComputeTimeModel()
        self.seed = seed
        self.hook_state: MSyncHookState | None = None

    def make_hook(self) -> tuple[MSyncHookState, Any]:
        return MSyncHookState(self.m, self.time_model, self.seed, self.world_size, self.global_rank), msync_hook

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.hook_state is not None:
            self.hook_state.step = self.lightning_module.global_step
        return super().training_step(*args, **kwargs)

    def sim_clock(self) -> dict[str, float]:
        """``modules.protocols.SimulatedClockSource``: simulated seconds of the m-Sync rounds so far."""
        return {"seconds": self.hook_state.clock if self.hook_state is not None else 0.0}


# Compressed gradient exchange (paper 004-18) ---------------------------------------------------------------


class CompressedHookState:
    """What the compressed hook needs: the compressor, the share of coordinates, the seed, the step.

    ``generator(bucket_index)`` is a pure function of (seed, step, bucket index): with ``randk`` every rank
    draws the same k coordinates (shared randomness), so only those k values are all-reduced.
    ``coords_up`` counts the coordinates one rank sent (its bucket messages), ``steps`` the exchanges.
    """

    def __init__(self, compressor: str = "randk", k_fraction: float = 0.01, seed: int = 0, levels: int = 8) -> None:
        from modules.components.compression import COMPRESSORS

        if compressor not in COMPRESSORS:
            raise ConfigError(f"unknown compressor {compressor!r}: choose one of {', '.join(COMPRESSORS)}")
        if not (0.0 < k_fraction <= 1.0):
            raise ConfigError(f"k_fraction must be in (0, 1], got {k_fraction}")
        if levels < 1:
            raise ConfigError(f"natural dithering needs s >= 1 levels, got {levels}")
        self.compressor, self.k_fraction, self.seed, self.levels = compressor, float(k_fraction), int(seed), int(levels)
        self.step = 0
        self.coords_up = 0.0
        self.coords_dense = 0.0
        self.steps = 0

    def k_of(self, d: int) -> int:
        """Coordinates kept of a d-coordinate bucket: max(1, round(k_fraction d))."""
        return min(d, max(1, round(self.k_fraction * d)))

    def bucket_seed(self, bucket_index: int) -> int:
        """The seed of this step's bucket ``bucket_index``, the same on every rank."""
        return (self.seed * 1_000_003 + self.step) * 1_009 + bucket_index

    def generator(self, bucket_index: int) -> torch.Generator:
        """The shared randomness of a bucket (Rand-K's coordinates, Perm-K's permutation)."""
        return torch.Generator().manual_seed(self.bucket_seed(bucket_index))

    def rank_generator(self, bucket_index: int, rank: int) -> torch.Generator:
        """This rank's own randomness for a bucket (independent draws per rank: natural compression,
        dithering). The bucket seed is taken modulo 2^64, as a generator stores it."""
        return torch.Generator().manual_seed((self.bucket_seed(bucket_index) % 2**64) * 65_537 + rank)


def compressed_hook(state: CompressedHookState, bucket):
    """Compress this rank's bucket, all-reduce, divide by the world size: every rank ends with the mean of
    the ranks' compressed buckets. ``randk``: the shared k coordinates only (a k-value all-reduce), scaled
    d/k; ``permk``: rank r keeps block r of one shared permutation, times n (the mean is exact for equal
    buckets); the others compress locally (Top-K, natural compression, natural dithering; independent draws
    per rank) and all-reduce the dense result. ``bucket`` carries no annotation (see ``msync_hook``)."""
    from modules.components.compression import compress, perm_k_blocks

    buffer = bucket.buffer()
    world = dist.get_world_size()
    d = buffer.numel()
    gen = state.generator(bucket.index())
    if state.compressor == "randk":
        k = state.k_of(d)
        idx = torch.randperm(d, generator=gen)[:k].to(buffer.device)
        values = buffer[idx] * (d / k / world)
        sent = float(k)
        fut = dist.all_reduce(values, async_op=True).get_future()

        def scatter(f):
            out = torch.zeros_like(buffer)
            out[idx] = f.value()[0]
            return out

        result = fut.then(scatter)
    else:
        if state.compressor == "permk":
            owner = perm_k_blocks(world, d, gen).to(buffer.device)
            mine = owner == dist.get_rank()
            local = torch.where(mine, buffer * world, torch.zeros_like(buffer))
            sent = float(mine.sum())
        else:
            rank_gen = state.rank_generator(bucket.index(), dist.get_rank())
            flat = buffer.detach().double() if state.compressor in ("natural", "dithering") else buffer.detach()
            local = compress(state.compressor, flat, k=state.k_of(d), s=state.levels, generator=rank_gen).to(buffer.dtype)
            sent = float(state.k_of(d)) if state.compressor == "topk" else float(d)
        local = local / world
        result = dist.all_reduce(local, async_op=True).get_future().then(lambda f: f.value()[0])
    state.coords_up += sent
    state.coords_dense += float(d)
    if bucket.is_last():
        state.steps += 1
        state.step += 1
    return result


def make_comm_hook(compressor: str = "randk", k_fraction: float = 0.01, seed: int = 0) -> tuple[CompressedHookState, Any]:
    """``(state, hook)`` for ``DistributedDataParallel.register_comm_hook``: the buckets end as the rank mean
    of the compressed gradients (see ``compressed_hook``). Compressors: none, randk, permk, topk, natural,
    dithering."""
    return CompressedHookState(compressor, k_fraction, seed), compressed_hook


class CompressedDDPStrategy(_HookedDDPStrategy):
    """Data-parallel SGD with compressed gradient buckets (paper 004-18's uplink on ``torch.distributed``).

    The downlink (the server's model broadcast) stays simulated: every rank holds the same weights, and
    ``sim_clock`` counts a full broadcast of d coordinates per step. Simulated seconds per step:
    h + kappa (uplink coordinates + d).

    Args:
        compressor: none, randk (shared-seed Rand-K), permk, topk, natural, dithering.
        k_fraction: share of the coordinates of each bucket kept by randk / topk, in (0, 1].
        seed: seed of the shared randomness (a pure function of (seed, step, bucket)).
        h, kappa: the time model (seconds per gradient, seconds per coordinate per link).
        **kwargs: ``DDPStrategy``'s arguments.
    """

    strategy_name = "compressed_ddp"

    def __init__(self, compressor: Literal["none", "randk", "permk", "topk", "natural", "dithering"] = "randk",
                 k_fraction: float = 0.01, seed: int = 0, h: float = 1.0, kappa: float = 0.001, **kwargs: Any) -> None:
        CompressedHookState(compressor, k_fraction, seed)  # fail on bad arguments before any process starts
        super().__init__(**kwargs)
        self.compressor, self.k_fraction, self.seed = compressor, k_fraction, seed
        self.h, self.kappa = float(h), float(kappa)
        self.hook_state: CompressedHookState | None = None

    def make_hook(self) -> tuple[CompressedHookState, Any]:
        return make_comm_hook(self.compressor, self.k_fraction, self.seed)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.hook_state is not None:
            self.hook_state.step = self.lightning_module.global_step
        return super().training_step(*args, **kwargs)

    def sim_clock(self) -> dict[str, float]:
        """``modules.protocols.SimulatedClockSource``: simulated seconds and coordinates per link and direction."""
        s = self.hook_state
        if s is None:
            return {"seconds": 0.0, "coords_up": 0.0, "coords_down": 0.0}
        down = s.coords_dense  # a full broadcast of the d parameters per step
        return {"seconds": s.steps * self.h + self.kappa * (s.coords_up + down), "coords_up": s.coords_up,
                "coords_down": down}
