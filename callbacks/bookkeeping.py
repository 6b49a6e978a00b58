"""One callback object for the run's bookkeeping callbacks, which have no per-step hook.

Lightning calls every hook of every callback in ``trainer.callbacks``, whether the callback overrides it or not
(``lightning.pytorch.trainer.call._call_callback_hooks``: a ``getattr``, the profiler's context, the action
name's f-string and the call, about 1 us per callback and hook on the development CPU). A training step calls
six callback hooks (``on_train_batch_start``/``_end``, ``on_before_backward``, ``on_after_backward``,
``on_before_optimizer_step``, ``on_before_zero_grad``), so each callback in the default stack costs about
6 us a step even when it only acts at fit start or on Ctrl-C: a tenth of a millisecond-step of a small model
for the five such callbacks of a plain run (docs/benchmarks.md, "Trainer overhead").

``RunBookkeeping`` holds such callbacks (the run record, the interrupt checkpoint, ``<monitor>_best``, the
config artifact, the system metrics) as its parts and is one entry in ``trainer.callbacks``: each per-step
hook costs one dispatch for all of them. Each part stays its own class, tested on its own; the composite
forwards every hook but the per-batch ones to the parts that override it, in the parts' order, and refuses a
part that overrides a per-batch hook (it belongs in ``trainer.callbacks`` itself) or one Lightning treats
specially (a ``Checkpoint``, ``EarlyStopping``, a progress bar: Lightning finds and orders them by type).
Find a part with ``find_callback(trainer.callbacks, BestMetric)``.

A part's state (``state_dict``) is saved in the composite's entry of the checkpoint, keyed by the part's
``state_key``; a checkpoint written before the parts were folded (the part's own top-level entry) is still
read by a resume.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

import lightning as L
from lightning.pytorch.callbacks import Callback, Checkpoint, EarlyStopping, ProgressBar

__all__ = ["PER_BATCH_HOOKS", "RunBookkeeping", "find_callback", "per_batch_hooks"]

# hooks Lightning calls for every batch (training, evaluation, prediction): a part overriding one would make
# the composite cost a dispatch per part again, so such a callback stays in trainer.callbacks
PER_BATCH_HOOKS = (
    "on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end",
)
# every other hook of Callback, forwarded to the parts (state_dict/load_state_dict are handled apart)
FORWARDED_HOOKS = (
    "setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
    "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_validation_start",
    "on_validation_end", "on_validation_epoch_start", "on_validation_epoch_end", "on_test_start", "on_test_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_predict_start", "on_predict_end", "on_predict_epoch_start",
    "on_predict_epoch_end", "on_exception", "on_save_checkpoint", "on_load_checkpoint",
)
_SPECIAL = (Checkpoint, EarlyStopping, ProgressBar)

C = TypeVar("C", bound=Callback)


def per_batch_hooks(callback: Callback) -> list[str]:
    """The per-batch hooks ``callback``'s class overrides (``Callback``'s own do nothing)."""
    return [name for name in PER_BATCH_HOOKS if getattr(type(callback), name) is not getattr(Callback, name)]


def _stateful(callback: Callback) -> bool:
    return type(callback).state_dict is not Callback.state_dict


def find_callback(callbacks: Iterable[Callback], kind: type[C]) -> C | None:
    """The first callback of type ``kind`` in ``callbacks``, looking into ``RunBookkeeping`` parts too."""
    for callback in callbacks:
        if isinstance(callback, kind):
            return callback
        if isinstance(callback, RunBookkeeping):
            found = find_callback(callback.parts, kind)
            if found is not None:
                return found
    return None


class RunBookkeeping(Callback):
    """Callbacks without per-batch hooks as one ``trainer.callbacks`` entry (see the module docstring).

    Args:
        parts: the callbacks, in the order their hooks run; none may override a per-batch hook.
    """

    def __init__(self, parts: Sequence[Callback] = ()) -> None:
        self.parts: list[Callback] = []
        self._hooked: dict[str, list[Callback]] = {name: [] for name in FORWARDED_HOOKS}
        for part in parts:
            self.add(part)

    def add(self, part: Callback) -> None:
        """Append ``part``; a ``TypeError`` if it overrides a per-batch hook, is one of the callbacks Lightning
        finds by type, is a ``RunBookkeeping`` itself, or has state under a stateful part's ``state_key``."""
        name = type(part).__name__
        if isinstance(part, (RunBookkeeping, *_SPECIAL)):
            raise TypeError(f"RunBookkeeping cannot hold {name}: put it in trainer.callbacks itself")
        stepped = per_batch_hooks(part)
        if stepped:
            raise TypeError(f"RunBookkeeping cannot hold {name}: it overrides the per-batch hooks {stepped}; put it "
                            "in trainer.callbacks itself")
        if _stateful(part) and any(_stateful(p) and p.state_key == part.state_key for p in self.parts):
            # as Lightning refuses two stateful callbacks of one key: one state would overwrite the other
            raise TypeError(f"RunBookkeeping holds a stateful callback with the state key {part.state_key!r} already")
        self.parts.append(part)
        for hook, hooked in self._hooked.items():
            if getattr(type(part), hook) is not getattr(Callback, hook):
                hooked.append(part)

    # --- forwarded hooks: only to the parts that override them ------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for part in self._hooked["setup"]:
            part.setup(trainer, pl_module, stage)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for part in self._hooked["teardown"]:
            part.teardown(trainer, pl_module, stage)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_fit_start"]:
            part.on_fit_start(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_fit_end"]:
            part.on_fit_end(trainer, pl_module)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_sanity_check_start"]:
            part.on_sanity_check_start(trainer, pl_module)

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_sanity_check_end"]:
            part.on_sanity_check_end(trainer, pl_module)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_train_start"]:
            part.on_train_start(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_train_end"]:
            part.on_train_end(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_train_epoch_start"]:
            part.on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_train_epoch_end"]:
            part.on_train_epoch_end(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_validation_start"]:
            part.on_validation_start(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_validation_end"]:
            part.on_validation_end(trainer, pl_module)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_validation_epoch_start"]:
            part.on_validation_epoch_start(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_validation_epoch_end"]:
            part.on_validation_epoch_end(trainer, pl_module)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_test_start"]:
            part.on_test_start(trainer, pl_module)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_test_end"]:
            part.on_test_end(trainer, pl_module)

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_test_epoch_start"]:
            part.on_test_epoch_start(trainer, pl_module)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_test_epoch_end"]:
            part.on_test_epoch_end(trainer, pl_module)

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_predict_start"]:
            part.on_predict_start(trainer, pl_module)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_predict_end"]:
            part.on_predict_end(trainer, pl_module)

    def on_predict_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_predict_epoch_start"]:
            part.on_predict_epoch_start(trainer, pl_module)

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for part in self._hooked["on_predict_epoch_end"]:
            part.on_predict_epoch_end(trainer, pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        for part in self._hooked["on_exception"]:
            part.on_exception(trainer, pl_module, exception)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        for part in self._hooked["on_save_checkpoint"]:
            part.on_save_checkpoint(trainer, pl_module, checkpoint)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        for part in self._hooked["on_load_checkpoint"]:
            part.on_load_checkpoint(trainer, pl_module, checkpoint)
        # a checkpoint from before the parts were folded keeps a part's state under the part's own key (Lightning
        # calls every on_load_checkpoint before any load_state_dict, and loads this object's entry only if any)
        states = checkpoint.get("callbacks") or {}
        if self.state_key not in states:
            for part in self.parts:
                state = states.get(part.state_key)
                if state:
                    part.load_state_dict(copy.deepcopy(state))

    # --- state: each part's under its own state key ------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {part.state_key: state for part in self.parts if (state := part.state_dict())}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part in self.parts:
            state = state_dict.get(part.state_key)
            if state:
                part.load_state_dict(state)
