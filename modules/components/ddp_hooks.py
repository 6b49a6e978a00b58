"""DDP communication hooks and the Lightning strategies that install them on every device.

A DDP comm hook replaces the all-reduce of each gradient bucket: ``hook(state, bucket) -> Future[Tensor]``,
the tensor becoming the bucket's gradient on every rank. Two families live here:

- ``msync_hook`` (m-Synchronous SGD, paper 002-11): every rank draws the same n = world-size computation
  times from ``(seed, step)``; the m ranks that would finish first contribute their gradient, the others
  zeros, and the all-reduced sum is divided by m, so every rank applies x - lr (1/m) sum_{i in S} g_i with
  S the m fastest. The all-reduce still blocks on every rank: the update is m-Sync SGD's, the time saving
  is not (the strategy's ``sim_clock`` reports the simulated seconds, the sum of the m-th order statistics).
- ``make_comm_hook(compressor, k_fraction, seed)`` (paper 004-18): compressed gradient exchange.

Lightning 2.6.6 registers ``DDPStrategy(ddp_comm_hook=...)`` only when the root device is CUDA and silently
ignores it on CPU; gloo supports comm hooks, so the strategies below register theirs on every device.
"""

from __future__ import annotations

from typing import Any

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
        """``callbacks.protocols.SimulatedClockSource``: simulated seconds of the m-Sync rounds so far."""
        return {"seconds": self.hook_state.clock if self.hook_state is not None else 0.0}
