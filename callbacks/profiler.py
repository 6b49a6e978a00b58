"""A profiler that costs nothing when nothing is profiled.

Lightning wraps every hook call, of every callback, the module and the strategy, in
``trainer.profiler.profile(name)``. Its default ``PassThroughProfiler`` inherits ``profile`` from ``Profiler``,
a ``@contextmanager`` generator: 2-4 microseconds per call on the development CPU, about 25 calls per training
step for Lightning itself and 6 per step for each callback. paperlab's default stack has seven callbacks:
about 0.2 ms a step (2026-12-02, ``python bench/trainer_overhead.py``, docs/benchmarks.md), a fifth of a
small MLP's step. ``NoOpProfiler.profile`` returns one shared context object instead (0.2 microseconds).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.profilers import PassThroughProfiler


class _Nothing:
    """A reusable context manager that does nothing."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NOTHING = _Nothing()


class NoOpProfiler(PassThroughProfiler):
    """``PassThroughProfiler`` whose ``profile`` context is built once (see the module docstring)."""

    def profile(self, action_name: str) -> _Nothing:  # type: ignore[override]
        return _NOTHING


def use_noop_profiler(trainer: L.Trainer) -> None:
    """Give ``trainer`` a ``NoOpProfiler`` when it has Lightning's default one; a profiler the user chose
    (``--trainer.profiler simple``) is kept."""
    if type(trainer.profiler) is PassThroughProfiler:
        trainer.profiler = NoOpProfiler()
