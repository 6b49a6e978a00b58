"""BestCheckpoint and LastCheckpoint: what each writes and when."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from callbacks.checkpoints import BestCheckpoint, LastCheckpoint
from datamodules.yinyang import YinYangDataModule
from modules.mlp_classifier import MLPClassifier
from tests.helpers import mlp_net, sgd


class _Count(LastCheckpoint):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.steps: list[int] = []

    def save(self, trainer) -> None:
        super().save(trainer)
        self.steps.append(trainer.global_step)


def _fit(tmp_path, callbacks, epochs=3):
    model = MLPClassifier(net=mlp_net([8]), input_shape=(4,), num_classes=3, optimizer=sgd(0.1))
    dm = YinYangDataModule(train_size=64, val_size=32, test_size=32, batch_size=32)
    trainer = L.Trainer(max_epochs=epochs, logger=False, callbacks=callbacks, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, dm)
    return trainer


def test_last_is_written_at_every_epoch_end_and_holds_the_training_state(tmp_path):
    last = _Count(str(tmp_path), min_interval_s=0.0)
    _fit(tmp_path, [last, BestCheckpoint(str(tmp_path), monitor="val/acc", mode="max")])
    assert last.steps == [2, 4, 6]  # 2 steps per epoch; training ended at the last epoch's write
    state = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert state["global_step"] == 6 and state["optimizer_states"] and state["loops"]
    (best,) = tmp_path.glob("best-*.ckpt")
    best_state = torch.load(best, weights_only=False)
    assert "optimizer_states" not in best_state and best_state["state_dict"]  # weights only


def test_short_epochs_are_checkpointed_at_the_interval_and_always_at_the_end(tmp_path):
    last = _Count(str(tmp_path), min_interval_s=3600.0)
    _fit(tmp_path, [last, BestCheckpoint(str(tmp_path), monitor="val/acc")], epochs=4)
    assert last.steps == [2, 8]  # the first epoch end, then nothing within the hour, then the end of training


# --- writing off the training thread (BackgroundCheckpointIO) and the metrics a checkpoint carries -------------


class _SeeIO(L.Callback):
    """Records the strategy's checkpoint writer during training, and where last.ckpt stood after each batch."""

    def __init__(self) -> None:
        self.during: list[str] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.during.append(type(trainer.strategy.checkpoint_io).__name__)


def test_checkpoints_are_written_on_a_thread_during_fit_and_synchronously_after_it(tmp_path):
    from lightning.fabric.plugins import TorchCheckpointIO

    see = _SeeIO()
    last = LastCheckpoint(str(tmp_path), min_interval_s=0.0)
    trainer = _fit(tmp_path, [last, BestCheckpoint(str(tmp_path), monitor="val/acc"), see])
    assert see.during == ["BackgroundCheckpointIO"] * 3
    assert type(trainer.strategy.checkpoint_io) is TorchCheckpointIO  # a save after fit returns when written
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 6  # written at teardown
    assert not list(tmp_path.glob(".*.tmp"))
    # without the background writer the same checkpoints come out
    plain = tmp_path / "plain"
    _fit(plain, [LastCheckpoint(str(plain), min_interval_s=0.0, background=False)])
    assert torch.load(plain / "last.ckpt", weights_only=False)["global_step"] == 6


def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_no_temporary_file(tmp_path):
    from callbacks.checkpoints import AtomicCheckpointIO

    io = AtomicCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, target)
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises for a lambda
        io.save_checkpoint({"step": 2, "unpicklable": lambda: 0}, target)
    assert torch.load(target, weights_only=False) == {"step": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def _write_until_killed(path: str) -> None:
    """A checkpoint of 24 MB, rewritten until the process is killed."""
    from callbacks.checkpoints import AtomicCheckpointIO

    io, step = AtomicCheckpointIO(), 0
    while True:
        step += 1
        io.save_checkpoint({"step": step, "w": torch.full((6_000_000,), float(step))}, path)


def test_kill_9_while_writing_never_leaves_a_half_written_checkpoint(tmp_path):
    import random
    import time

    from tests.helpers import forked

    target = tmp_path / "last.ckpt"
    rng = random.Random(0)
    for _ in range(4):
        # its own process (forked from the session's fork server: no fresh interpreter's imports), killed -9
        proc = forked(_write_until_killed, str(target))
        try:
            deadline = time.monotonic() + 120
            while not target.exists():
                assert proc.is_alive() and time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.6))  # somewhere in a later write
        finally:
            proc.kill()  # SIGKILL
            proc.join()
        assert proc.exitcode == -9
        state = torch.load(target, weights_only=False)  # a complete file: the previous or the new one
        assert torch.equal(state["w"], torch.full((6_000_000,), float(state["step"])))


def test_default_trainers_get_the_cheap_profiler_and_a_chosen_one_is_kept(tmp_path):
    from callbacks.profiler import NoOpProfiler

    trainer = _fit(tmp_path, [LastCheckpoint(str(tmp_path))], epochs=1)
    assert type(trainer.profiler) is NoOpProfiler
    with trainer.profiler.profile("anything") as inside:
        assert inside is None
    model = MLPClassifier(net=mlp_net([8]), input_shape=(4,), num_classes=3, optimizer=sgd(0.1))
    simple = L.Trainer(max_epochs=1, logger=False, callbacks=[LastCheckpoint(str(tmp_path / "s"))],
                       enable_progress_bar=False, enable_model_summary=False, profiler="simple",
                       default_root_dir=tmp_path)
    simple.fit(model, YinYangDataModule(train_size=64, val_size=32, test_size=32, batch_size=32))
    assert type(simple.profiler).__name__ == "SimpleProfiler"


class _StoreSeen(L.Callback):
    """What the MLflow store holds of ``val/acc`` when training ends (before the logger is finalized)."""

    def on_train_end(self, trainer, pl_module) -> None:
        from tests.helpers import client

        self.seen = client().get_metric_history(trainer.logger.run_id, "val/acc")


def test_checkpoints_cost_no_metrics_flush_and_the_run_gets_every_metric_at_its_end(paperlab_tmp):
    from tests.helpers import client
    from tracking.mlflow_logger import PaperlabMLFlowLogger

    logger = PaperlabMLFlowLogger(experiment_name="ckpt", run_name="noflush", flush_every_s=3600)
    seen = _StoreSeen()
    model = MLPClassifier(net=mlp_net([8]), input_shape=(4,), num_classes=3, optimizer=sgd(0.1))
    trainer = L.Trainer(max_epochs=3, logger=logger, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[LastCheckpoint(str(paperlab_tmp / "ck"), min_interval_s=0),
                                                           seen])
    trainer.fit(model, YinYangDataModule(train_size=64, val_size=32, test_size=32, batch_size=32))
    assert seen.seen == []  # three resumable saves, no sqlite commit of metrics for them
    assert [m.step for m in client().get_metric_history(logger.run_id, "val/acc")] == [1, 3, 5]
