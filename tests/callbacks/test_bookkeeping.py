"""RunBookkeeping: callbacks without per-batch hooks as one trainer.callbacks entry; each part sees the hooks it
would see on its own, keeps its state across a resume (also from a checkpoint written before the fold), and the
default stack of a plain run has one such entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelSummary

from callbacks.best_metric import BestMetric
from callbacks.bookkeeping import FORWARDED_HOOKS, RunBookkeeping, find_callback, per_batch_hooks
from callbacks.checkpoints import LastCheckpoint
from callbacks.guards import FiniteLossGuard, InterruptCheckpoint
from tests.helpers import REPO

YINYANG = str(REPO / "configs/mlp_classifier/yinyang.yaml")


class Recorder(Callback):
    """Records every forwarded hook it receives (its name and the stage or exception where there is one)."""

    def __init__(self, log: list[str]) -> None:
        self.seen = log


def _recording(hook: str) -> Any:
    def method(self: Recorder, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        (arg,) = (*args, *kwargs.values()) or (None,)  # the stage of setup/teardown (Lightning passes it by name)
        self.seen.append(f"{hook}({type(arg).__name__ if isinstance(arg, BaseException) else arg})")
    return method


for _hook in FORWARDED_HOOKS:
    setattr(Recorder, _hook, _recording(_hook))


class Stateful(Callback):
    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.value = state_dict["value"]


class Tiny(L.LightningModule):
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.fail_at = fail_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise RuntimeError("boom")
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callbacks: list[Callback], fail_at: int | None = None) -> None:
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=callbacks, num_sanity_val_steps=1)
    model = Tiny(fail_at)
    try:
        trainer.fit(model, data, data)
    except RuntimeError:
        assert fail_at is not None
    trainer.validate(model, data, verbose=False)


def test_parts_see_the_hooks_they_would_see_on_their_own_in_order() -> None:
    for fail_at in (None, 1):
        alone: list[str] = []
        _fit([Recorder(alone)], fail_at)
        first: list[str] = []
        second: list[str] = []
        _fit([RunBookkeeping([Recorder(first), Recorder(second)])], fail_at)
        assert first == second == alone, (fail_at, first, alone)
        assert "on_validation_end(None)" in alone and "setup(TrainerFn.FITTING)" in alone
        assert ("on_exception(RuntimeError)" in alone) == (fail_at is not None)
    # only the parts that override a hook are called for it
    recorder, interrupt = Recorder([]), InterruptCheckpoint()
    folded = RunBookkeeping([recorder, interrupt])
    assert folded._hooked["on_exception"] == [recorder, interrupt] and folded._hooked["on_fit_start"] == [recorder]


def test_a_part_with_a_per_batch_hook_or_found_by_type_is_refused() -> None:
    assert per_batch_hooks(FiniteLossGuard()) == ["on_train_batch_start", "on_train_batch_end"]
    assert per_batch_hooks(BestMetric()) == []
    with pytest.raises(TypeError, match="per-batch hooks .*on_train_batch_start"):
        RunBookkeeping([FiniteLossGuard()])
    with pytest.raises(TypeError, match="cannot hold LastCheckpoint"):
        RunBookkeeping([LastCheckpoint("unused")])
    with pytest.raises(TypeError, match="state key 'BestMetric'"):
        RunBookkeeping([BestMetric(), BestMetric(mode="min")])


def test_part_state_round_trips_and_a_checkpoint_from_before_the_fold_still_loads() -> None:
    best, other = BestMetric(), Stateful()
    best.best, other.value = 0.75, 3
    folded = RunBookkeeping([InterruptCheckpoint(), best, other])
    state = folded.state_dict()
    assert state == {"BestMetric": {"best": 0.75}, "Stateful": {"value": 3}}

    again = RunBookkeeping([InterruptCheckpoint(), BestMetric(), Stateful()])
    again.load_state_dict(state)
    assert find_callback([again], BestMetric).best == 0.75 and find_callback([again], Stateful).value == 3

    # written before the fold: each part's state under its own key at the top of "callbacks"
    old = RunBookkeeping([BestMetric(), Stateful()])
    old.on_load_checkpoint(None, None, {"callbacks": {"BestMetric": {"best": 0.5}, "Stateful": {"value": 7}}})
    assert find_callback([old], BestMetric).best == 0.5 and find_callback([old], Stateful).value == 7
    # written after it: the composite's own entry wins, a stray top-level one is not read
    new = RunBookkeeping([BestMetric()])
    new.on_load_checkpoint(None, None, {"callbacks": {"RunBookkeeping": state, "BestMetric": {"best": 0.1}}})
    assert find_callback([new], BestMetric).best is None  # load_state_dict (Lightning's next call) sets it


def test_the_default_stack_dispatches_each_hook_once_for_all_parts_without_per_batch_hooks(paperlab_tmp: Path) -> None:
    from lightning_cli import PaperlabCLI
    from tracking.config_artifact import ConfigArtifact
    from tracking.run_registry import RunRegistry

    cli = PaperlabCLI(args=["--config", YINYANG, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                            "--trainer.limit_val_batches", "1", "--run.name", "stack", "--trainer.callbacks", "[]"],
                      run=False)
    callbacks = cli.trainer.callbacks
    assert [c for c in callbacks if not per_batch_hooks(c)] == [next(c for c in callbacks
                                                                    if isinstance(c, RunBookkeeping))]
    for kind in (RunRegistry, InterruptCheckpoint, BestMetric, ConfigArtifact, ModelSummary):
        assert find_callback(callbacks, kind) is not None and not any(isinstance(c, kind) for c in callbacks), kind
    assert isinstance(find_callback(callbacks, FiniteLossGuard), FiniteLossGuard)  # the guard is its own entry
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.after_fit()
    assert find_callback(callbacks, BestMetric).best is not None
    assert (paperlab_tmp / "checkpoints/mlp_classifier/stack/mlflow_run.json").is_file()
