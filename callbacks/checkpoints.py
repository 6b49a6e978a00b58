"""The two checkpoints of a run: the best epoch's weights, and the last training state to resume from.

- ``BestCheckpoint`` (``best-epoch<NNN>.ckpt``): the weights and hyperparameters of the epoch with the best
  value of the module's ``monitor``, for ``test``/``predict --ckpt_path best``. Weights only: the
  optimizer and loop state would make every improvement cost a full save.
- ``LastCheckpoint`` (``last.ckpt``): the full training state (weights, optimizer, loops, callbacks, the
  data order), independent of the best, for ``fit --ckpt_path last``. Written at an epoch end when at least
  ``min_interval_s`` seconds have passed since the previous write, within an epoch every ``every_s``
  seconds when the training data is resumable mid-epoch (paperlab's loaders are), and always when training
  ends. An interrupt therefore loses at most ``every_s`` seconds, or one epoch, or ``min_interval_s``
  seconds of epochs shorter than that. Epochs of tiny models take a fraction of a second; a full save
  costs milliseconds to seconds, which would otherwise double such a run.

How a save leaves the training thread (``BackgroundCheckpointIO``, installed by ``LastCheckpoint`` for the
fit on one process or DDP when the strategy writes with Lightning's default ``TorchCheckpointIO``):

- the training thread builds the checkpoint and copies its tensors (as Lightning's ``AsyncCheckpointIO``
  does, with a cheaper walk of the checkpoint); one writer thread serialises it into a temporary file in the
  checkpoint's folder and renames it over the target (``os.replace``, ``AtomicCheckpointIO``). A kill -9 at any moment leaves the previous complete file
  or the new complete file, never a part of one; a temporary file it leaves behind is never read.
- the write of a resumable checkpoint (``last.ckpt``) overlaps the next training step and is awaited when
  that step ends: one handed over at an epoch end is on disk before the second step of the next epoch
  starts, so an interrupt loses what it lost before (at most ``every_s`` seconds, one epoch, or
  ``min_interval_s``). At most two writes wait at a time, so copies of the weights never pile up.
- a weights-only best checkpoint resumes nothing: it is copied at its epoch's end and held, then written
  just before the next resumable checkpoint (so a ``last.ckpt`` on disk always has its best on disk too), at
  a wait, or when training ends or fails. A best superseded in the meantime is never written: with epochs
  shorter than ``min_interval_s`` most are, and each write's serialising holds the interpreter lock that the
  training thread needs (docs/benchmarks.md, "Trainer overhead"). The removal of the previous best file
  comes after the new one's write, so once a ``last.ckpt`` is on disk a kill -9 leaves a complete best
  file beside it: the best of the epochs up to that ``last.ckpt``. Training end and failures wait for every write.
- the MLflow metrics that are not yet in the store (``PaperlabMLFlowLogger.unflushed``) travel in every full
  checkpoint and are handed back to the logger on resume (``replay``; pairs the store has are not written
  twice). So a save needs no metrics flush (a sqlite commit: 10-50 ms), the logger flushes on its own
  thread every few seconds, and a resume from any checkpoint on disk still has every metric up to it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from lightning_utilities.core.apply_func import apply_to_collection

from callbacks.profiler import use_noop_profiler
from errors import ConfigError, PaperlabError
from tracking.mlflow_logger import PaperlabMLFlowLogger

LAST = "last.ckpt"
UNFLUSHED = "paperlab_unflushed_metrics"  # checkpoint key: the MLflow metrics not yet in the store at the save


class CheckpointWriteError(PaperlabError):
    """A checkpoint could not be written (a full disk, a folder that became read-only): the previous file of
    that name is intact, and the message says which and what to do."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` into a temporary file beside the target, flushed and fsynced, then ``os.replace`` over it.

    Lightning's own ``_atomic_save`` writes the temporary file into the system's temp folder and moves it:
    across file systems that move is a copy into the target, which a kill -9 can leave half-written. Here the
    rename stays within the folder, so it is atomic; the fsync before it means the rename never points at
    data still only in the page cache (a power cut or a full disk found at write-back). A failed write
    (``ENOSPC``, ``EACCES``, an unpicklable object) removes its temporary file and leaves the previous
    checkpoint as it was; an ``OSError`` becomes one line (``CheckpointWriteError``).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # serialised in memory first: torch.save's own file writer reports a full disk as a RuntimeError
            # ("unexpected pos"), a plain write raises the OSError (ENOSPC) that says what happened
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            with open(tmp, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException as err:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(err, OSError) and not isinstance(err, PaperlabError):
                kept = f"; the previous {target.name} is intact" if target.is_file() else ""
                fix = ("free some space or write checkpoints elsewhere (--run.checkpoint_root DIR)"
                       if err.errno == errno.ENOSPC else "choose a writable folder with --run.checkpoint_root DIR")
                reason = os.strerror(err.errno) if err.errno else str(err)
                raise CheckpointWriteError(f"could not write the checkpoint {target} ({reason}){kept}: {fix}") from err
            raise


def _snapshot(value: Any) -> Any:
    """``value`` with every tensor copied (detached) and every container rebuilt; other leaves are shared.

    What ``AsyncCheckpointIO`` does with ``apply_to_collection``, whose general traversal costs about 0.5 ms
    for a small model's checkpoint (Lightning's loop state alone is 120 nested entries) against 0.13-0.22 ms
    here: the plain containers a checkpoint is made of are walked directly, anything else (an
    ``AttributeDict``, a named tuple, a dataclass) goes to ``apply_to_collection``.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    kind = type(value)
    if kind is dict or kind is OrderedDict:
        return kind((k, _snapshot(v)) for k, v in value.items())
    if kind is list:
        return [_snapshot(v) for v in value]
    if kind is tuple:
        return tuple(_snapshot(v) for v in value)
    if kind in _LEAVES:
        return value
    return apply_to_collection(value, torch.Tensor, lambda t: t.detach().clone())


_LEAVES = (str, int, float, bool, type(None), bytes)


class BackgroundCheckpointIO(CheckpointIO):
    """Checkpoints written on one thread, in the order they were handed over, by ``AtomicCheckpointIO``.

    Lightning's ``AsyncCheckpointIO`` did this until 2026-12-03 and this keeps its contract: the tensors are
    copied on the caller's thread (training goes on changing the weights), a write's error is raised at the
    next save or wait. What differs, for a fit whose epochs take milliseconds (docs/benchmarks.md, "Trainer
    overhead"): the copy walks the checkpoint's plain containers directly (``_snapshot``), the writer thread
    lives for the whole fit instead of being joined and restarted at every wait, a wait with nothing handed
    over returns at once, a weights-only checkpoint is held until the next resumable one or a wait (one
    superseded meanwhile is never written), and removing a checkpoint (the previous best) comes after the
    writes, so the new best is on disk before the old one goes.
    """

    def __init__(self) -> None:
        self.checkpoint_io = AtomicCheckpointIO()
        self._executor: ThreadPoolExecutor | None = None
        self._queued: list[Future] = []
        self._resumable_queued = False  # a full (resumable) checkpoint is among the queued: wait_resumable waits
        self._saves: list[Future] = []  # the writes among them (not the removals)
        # weights-only writes (a best epoch's) not handed to the writer yet, by file name, in the order handed
        # over: (path, copy, storage_options); and the removals handed over while they were held
        self._held: dict[str, tuple[Any, dict[str, Any], Any]] = {}
        self._removals: list[Any] = []

    def _submit(self, fn: Any, *args: Any) -> None:
        self._raise_failed()  # an earlier write's error surfaces on the training thread, as soon as it is known
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paperlab-checkpoint")
        self._queued.append(self._executor.submit(fn, *args))

    def _raise_failed(self) -> None:
        """Raise the error of the first write that has failed already (once); forget those done without one."""
        failed = next((f for f in self._queued if f.done() and f.exception() is not None), None)
        self._queued = [f for f in self._queued if not f.done() or (f.exception() is not None and f is not failed)]
        if failed is not None:
            raise failed.exception()  # type: ignore[misc]

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self._raise_failed()  # an earlier write's error surfaces on the training thread, as soon as it is known
        copy = _snapshot(checkpoint)  # now: training goes on changing the weights
        # Lightning's full dump has the optimizers' states, a weights-only one (the best epoch's) has not
        if "optimizer_states" not in checkpoint:
            # Held, not written yet: a best epoch's file resumes nothing, and with epochs of milliseconds most
            # are superseded before the next last.ckpt, so their writes (serialising holds the interpreter lock
            # the training thread needs) would be wasted. Written before the next resumable checkpoint, at a
            # wait or when training ends (``_release``). A newer one of the same name takes the held one's place.
            key = os.fspath(path)
            if key not in self._held and len(self._held) >= self.max_held:
                self._release()
            self._held[key] = (path, copy, storage_options)
            return
        self._release()  # the bests handed over before this one are on disk before it (writes are in order)
        self._write(copy, path, storage_options)
        self._resumable_queued = True

    #: weights-only writes held at most (several weights-only checkpoints of different names kept, top-k > 1)
    max_held = 2

    def _write(self, copy: dict[str, Any], path: Any, storage_options: Any | None) -> None:
        # copies of the weights never pile up: with two writes still unfinished (epochs shorter than a write)
        # the next is handed over once they are done (an epoch end hands over the best and last.ckpt together)
        self._saves = [f for f in self._saves if not f.done()]
        if len(self._saves) >= 2:
            self._drain()
        self._submit(self.checkpoint_io.save_checkpoint, copy, path, storage_options)
        self._saves.append(self._queued[-1])

    def _release(self) -> None:
        """Hand the held writes to the writer thread, then the held removals: every held file is on disk before
        an older one goes, so a kill -9 at any moment leaves a best file once one was written. A removal of a
        name that is written again after it is dropped (the write replaces the file atomically)."""
        held, removals = self._held, self._removals
        self._held, self._removals = {}, []
        for path, copy, storage_options in held.values():
            self._write(copy, path, storage_options)
        for path in removals:
            if os.fspath(path) not in held:
                self._submit(self.checkpoint_io.remove_checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        self.wait()  # a file being written is read once it is complete
        return self.checkpoint_io.load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        if not self._held:
            self._submit(self.checkpoint_io.remove_checkpoint, path)
            return
        # behind the held writes (the previous best goes once the new one is on disk); a held write of this
        # very file is dropped, never written (a best superseded before the next last.ckpt), and the removal
        # stays, for a file of that name already on disk
        self._held.pop(os.fspath(path), None)
        self._removals.append(path)

    def wait_resumable(self) -> None:
        """``wait`` when a resumable checkpoint is among those handed over (and with it, in order, every
        earlier one); otherwise only raise the error of a write that has failed already. Held weights-only
        writes stay held (``save_checkpoint``)."""
        if self._resumable_queued:
            self._drain()
        elif self._queued:
            self._raise_failed()

    def wait(self) -> None:
        """Return once everything handed over is done (written, removed), the held writes included; raise what
        the first failure raised."""
        self._release()
        self._drain()

    def _drain(self) -> None:
        """Wait for the writes handed to the thread (not the held ones); raise the first failure."""
        self._resumable_queued = False
        self._saves = []
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        errors = [future.exception() for future in queued]  # waits for each, in order
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            raise failed

    def teardown(self) -> None:
        """Wait for every write and stop the writer thread (the strategy's teardown calls it; a later save
        starts a new one)."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def background_io_applies(trainer: L.Trainer, dirpath: str) -> bool:
    """Whether ``BackgroundCheckpointIO`` may replace the strategy's writer: one process or DDP writing
    local files with Lightning's default ``TorchCheckpointIO`` (FSDP and DeepSpeed write sharded
    checkpoints their own way; a user's plugin is kept)."""
    strategy = trainer.strategy
    return (isinstance(strategy, SingleDeviceStrategy | DDPStrategy) and type(strategy.checkpoint_io) is TorchCheckpointIO
            and "://" not in str(dirpath))


class BestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` keeping the single best epoch's weights by ``monitor`` (see the module docstring).

    Lightning reads a callback's ``state_key`` on every hook call and ``ModelCheckpoint`` formats it from
    its arguments each time; they never change, so it is built once.
    """

    def __init__(self, dirpath: str, monitor: str | None = None, mode: str = "max") -> None:
        super().__init__(
            dirpath=dirpath, filename="best-epoch{epoch:03d}", auto_insert_metric_name=False, monitor=monitor,
            mode=mode, save_top_k=1, save_last=False, save_weights_only=True,
        )
        self._key = super().state_key

    @property
    def state_key(self) -> str:
        return self._key

    def _kept_best(self, trainer: L.Trainer) -> bool:
        """Whether this epoch's monitored value leaves the kept best as it is, so that ``ModelCheckpoint``
        would save nothing: it would still deep-copy every callback metric to find that out, every epoch.

        The same test as its ``check_monitor_top_k`` with ``save_top_k=1`` (strictly better, a NaN never
        is), on one process only: under DDP the decision is a collective, left to Lightning. No step-based
        saves are configured here, so Lightning has no deferred save waiting for this validation either.
        """
        if trainer.world_size > 1 or len(self.best_k_models) < self.save_top_k or self.monitor is None:
            return False
        current = trainer.callback_metrics.get(self.monitor)
        if current is None:
            return False  # Lightning's own message for a missing monitor
        value, best = float(current), float(self.kth_value)
        return not (value > best if self.mode == "max" else value < best)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # ModelCheckpoint's per-step check saves on every_n_train_steps or train_time_interval, neither of which
        # this callback has (0 and None): it always returns, after 2-4 us of tests, every step
        return None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._kept_best(trainer):
            super().on_train_epoch_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._kept_best(trainer):
            super().on_validation_end(trainer, pl_module)


class LastCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt`` with the whole training state (see the module docstring).

    Args:
        dirpath: the run's checkpoint folder.
        min_interval_s: skip an epoch-end write when the previous one is more recent than this (0: every
            epoch end).
        every_s: also write within an epoch once this many seconds have passed since the previous write
            (only when every training loader is resumable: ``state_dict``/``load_state_dict``).
        background: write checkpoints on a thread (``BackgroundCheckpointIO``) where it applies.
    """

    save_weights_only = False  # what the MLflow logger reads: a resumable save
    carries_unflushed_metrics = True  # ... and one that holds the unwritten metrics itself: no flush needed

    def __init__(self, dirpath: str, min_interval_s: float = 1.0, every_s: float = 300.0,
                 background: bool = True) -> None:
        if min_interval_s < 0 or every_s <= 0:
            raise ConfigError(f"min_interval_s must be >= 0 and every_s > 0, got {min_interval_s}, {every_s}")
        self.dirpath = dirpath
        self.min_interval_s = min_interval_s
        self.every_s = every_s
        self.background = background
        self._written_at: float | None = None
        self._started_at = time.monotonic()
        self._written_step = -1
        self._resumable = False
        self._io: BackgroundCheckpointIO | None = None
        self._replaced_io: CheckpointIO | None = None

    @property
    def path(self) -> Path:
        return Path(self.dirpath) / LAST

    def save(self, trainer: L.Trainer) -> None:
        """Hand ``last.ckpt`` over to be written (every rank calls it; the strategy writes once)."""
        trainer.save_checkpoint(str(self.path), weights_only=False)
        self._written_at = time.monotonic()
        self._written_step = trainer.global_step
        for logger in trainer.loggers:
            logger.after_save_checkpoint(self)

    def _elapsed(self) -> float:
        return time.monotonic() - (self._written_at if self._written_at is not None else self._started_at)

    @staticmethod
    def _agreed(trainer: L.Trainer, due: bool) -> bool:
        # the same decision on every rank (save_checkpoint is collective): rank 0's clock decides
        return bool(trainer.strategy.broadcast(due, src=0)) if trainer.world_size > 1 else due

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Hook dispatch (callbacks/profiler.py): installed here because this callback is in every default
        # trainer; lightning_cli's trainer defaults are the natural home once they can name it.
        use_noop_profiler(trainer)
        if stage == "fit" and self._replaced_io is None and background_io_applies(trainer, self.dirpath):
            # without the thread the same atomic writer: Lightning's own goes through the system's temp folder
            self._replaced_io = trainer.strategy.checkpoint_io
            self._io = BackgroundCheckpointIO() if self.background else None
            trainer.strategy.checkpoint_io = self._io or AtomicCheckpointIO()  # public setter; undone in teardown

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # a save after fit (trainer.save_checkpoint in a script) is written before it returns, as it was
        if self._replaced_io is not None and stage == "fit":
            try:
                if self._io is not None:
                    self._io.teardown()  # every write on disk, the writer thread stopped
            finally:
                trainer.strategy.checkpoint_io = self._replaced_io
                self._io = self._replaced_io = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started_at = time.monotonic()
        loaders = trainer.train_dataloader
        loaders = loaders.values() if isinstance(loaders, dict) else loaders if isinstance(loaders, list | tuple) else [loaders]
        self._resumable = all(callable(getattr(x, "state_dict", None)) and callable(getattr(x, "load_state_dict", None))
                              for x in loaders)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._io is not None:
            self._io.wait_resumable()  # a last.ckpt handed over before this step is on disk: see the docstring
        if not self._resumable or (trainer.world_size > 1 and batch_idx % 50):
            return  # under DDP the clock is agreed on every 50th batch: a collective per step would cost
        if self._agreed(trainer, self._elapsed() >= self.every_s):
            self.save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._agreed(trainer, self._written_at is None or self._elapsed() >= self.min_interval_s):
            self.save(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step != self._written_step:
            self.save(trainer)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        # every full checkpoint (last, interrupted, a script's) carries the metrics not yet in the store
        checkpoint[UNFLUSHED] = [row for logger in trainer.loggers if isinstance(logger, PaperlabMLFlowLogger)
                                 for row in logger.unflushed()]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        rows = checkpoint.get(UNFLUSHED)
        if rows and trainer.state.fn == "fit":  # a resume: the run continues where the checkpoint was
            for logger in trainer.loggers:
                if isinstance(logger, PaperlabMLFlowLogger):
                    logger.replay(rows)

    def state_dict(self) -> dict[str, Any]:
        return {"written_step": self._written_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._written_step = int(state_dict.get("written_step", -1))
