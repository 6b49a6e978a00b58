"""BestCheckpoint and LastCheckpoint: what each writes and when."""

from __future__ import annotations

from pathlib import Path

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
    # ... and no resume state: the loops' progress and the training metrics' state are last.ckpt's
    assert "loops" not in best_state and "paperlab_train_metrics" not in best_state
    assert best_state["hyper_parameters"] and "paperlab_task_state" in best_state and "paperlab_train_metrics" in state


def test_short_epochs_are_checkpointed_at_the_interval_and_always_at_the_end(tmp_path):
    last = _Count(str(tmp_path), min_interval_s=3600.0)
    _fit(tmp_path, [last, BestCheckpoint(str(tmp_path), monitor="val/acc")], epochs=4)
    assert last.steps == [2, 8]  # the first epoch end, then nothing within the hour, then the end of training


class _Scripted(L.LightningModule):
    """Logs ``val/score`` from a script, one value per epoch."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = scores
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w - 1).pow(2).sum()

    def validation_step(self, batch, batch_idx) -> None:
        self.log("val/score", self.scores[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize(("mode", "scores"), [
    # exact in float32; an equal value (epochs 1 and 3, 1 and 2) and a NaN are no improvement
    ("max", [0.5, 0.75, 0.625, 0.75, 0.875, float("nan"), 0.8125]),
    ("min", [0.5, 0.25, 0.25, float("nan"), 0.625, 0.125, 0.1875]),
])
def test_best_keeps_the_epoch_lightning_keeps_and_skips_epochs_that_do_not_improve(tmp_path, mode, scores):
    from lightning.pytorch.callbacks import ModelCheckpoint

    ours = BestCheckpoint(str(tmp_path / "ours"), monitor="val/score", mode=mode)
    reference = ModelCheckpoint(dirpath=str(tmp_path / "ref"), filename="best-epoch{epoch:03d}",
                                auto_insert_metric_name=False, monitor="val/score", mode=mode, save_top_k=1,
                                save_weights_only=True)
    seen: list[tuple[str, str]] = []  # after each epoch's saves (checkpoint callbacks run last): the bests so far

    class Spy(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module) -> None:
            seen.append((Path(ours.best_model_path).name, Path(reference.best_model_path).name))

    x = torch.zeros(4, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=2)
    trainer = L.Trainer(max_epochs=len(scores), logger=False, callbacks=[ours, reference, Spy()],
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=tmp_path)
    trainer.fit(_Scripted(scores), loader, loader)
    firsts = {"max": [0, 1, 1, 1, 4, 4], "min": [0, 1, 1, 1, 1, 5]}[mode]  # the best before epochs 1..6
    assert seen[1:] == [(f"best-epoch{e:03d}.ckpt",) * 2 for e in firsts]
    best_epoch = 4 if mode == "max" else 5
    assert [p.name for p in (tmp_path / "ours").glob("best-*.ckpt")] == [f"best-epoch{best_epoch:03d}.ckpt"]
    assert [p.name for p in (tmp_path / "ref").glob("best-*.ckpt")] == [f"best-epoch{best_epoch:03d}.ckpt"]
    assert float(ours.best_model_score) == float(reference.best_model_score) == scores[best_epoch]
    assert ours.best_model_path.endswith(f"best-epoch{best_epoch:03d}.ckpt")


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


def test_background_writes_copy_at_hand_over_keep_order_and_raise_a_failure_once(tmp_path):
    from collections import OrderedDict

    from callbacks.checkpoints import BackgroundCheckpointIO

    io = BackgroundCheckpointIO()
    w = torch.zeros(3)
    state = {"state_dict": OrderedDict(w=w), "loops": {"a": [1, (w, "x")]}, "epoch": 0}
    io.save_checkpoint({"big": torch.zeros(5_000_000)}, tmp_path / "big.ckpt")  # keeps the writer busy a while
    io.save_checkpoint(state, tmp_path / "a.ckpt")
    w += 1  # training goes on, before the write: the file holds the weights at the hand-over
    io.wait()
    written = torch.load(tmp_path / "a.ckpt", weights_only=False)
    assert torch.equal(written["state_dict"]["w"], torch.zeros(3)) and torch.equal(written["loops"]["a"][1][0], torch.zeros(3))
    io.save_checkpoint({"w": w}, tmp_path / "b.ckpt")
    io.remove_checkpoint(tmp_path / "a.ckpt")  # queued behind the write
    io.remove_checkpoint(tmp_path / "big.ckpt")
    io.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.ckpt"]
    assert torch.equal(torch.load(tmp_path / "b.ckpt", weights_only=False)["w"], torch.ones(3))
    io.save_checkpoint(state, tmp_path / "a.ckpt")
    io.wait()
    written = torch.load(tmp_path / "a.ckpt", weights_only=False)
    assert type(written["state_dict"]) is OrderedDict and written["loops"]["a"][1][1] == "x"
    assert torch.equal(written["state_dict"]["w"], torch.ones(3)) and written["loops"]["a"][1][0] is not w
    io.save_checkpoint({"bad": lambda: 0}, tmp_path / "c.ckpt")
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises for a lambda
        io.wait()
    io.wait()  # raised once
    assert torch.load(tmp_path / "a.ckpt", weights_only=False)["epoch"] == 0 and not (tmp_path / "c.ckpt").exists()
    io.teardown()


def test_a_best_is_held_until_the_next_resumable_write_and_a_superseded_one_is_never_written(tmp_path):
    import threading
    import time

    from callbacks.checkpoints import AtomicCheckpointIO, BackgroundCheckpointIO

    gate, written, contents = threading.Event(), [], {}

    class Held(AtomicCheckpointIO):  # the writer thread holds each write until the gate opens; records removals
        def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
            gate.wait(timeout=10)
            written.append(Path(path).name)
            contents[Path(path).name] = checkpoint

        def remove_checkpoint(self, path) -> None:
            written.append("-" + Path(path).name)

    io = BackgroundCheckpointIO()
    io.checkpoint_io = Held()
    w = torch.zeros(2)
    weights, full = {"state_dict": {"w": w}}, {"state_dict": {}, "optimizer_states": []}
    gate.set()  # the writer is free: whatever is handed to it is written at once
    io.save_checkpoint(weights, tmp_path / "best-epoch000.ckpt")
    w += 1  # training goes on: the held write has the weights of its hand-over
    io.save_checkpoint(weights, str(tmp_path / "best-epoch001.ckpt"))  # ModelCheckpoint's order: the new best,
    io.remove_checkpoint(str(tmp_path / "best-epoch000.ckpt"))  # then the old one's removal (str or Path alike)
    io.wait_resumable()  # a weights-only checkpoint resumes nothing: nothing is awaited, nothing written yet
    time.sleep(0.05)
    assert written == []
    io.save_checkpoint(full, tmp_path / "last.ckpt")
    io.wait_resumable()  # last.ckpt is on disk after this, and before it the held best; the superseded one never
    assert written == ["best-epoch001.ckpt", "-best-epoch000.ckpt", "last.ckpt"]
    assert torch.equal(contents["best-epoch001.ckpt"]["state_dict"]["w"], torch.ones(2))

    written.clear()
    io.save_checkpoint(weights, tmp_path / "best-epoch002.ckpt")
    io.remove_checkpoint(tmp_path / "best-epoch001.ckpt")  # on disk: removed only after the new one is written
    io.save_checkpoint({"state_dict": {"w": torch.full((2,), 5.0)}}, tmp_path / "best-epoch002.ckpt")  # same name
    io.wait()  # a wait writes what is held
    assert written == ["best-epoch002.ckpt", "-best-epoch001.ckpt"]
    assert torch.equal(contents["best-epoch002.ckpt"]["state_dict"]["w"], torch.full((2,), 5.0))

    written.clear()  # several weights-only names kept (top-k > 1): at most two are held
    for name in ("a.ckpt", "b.ckpt", "c.ckpt"):
        io.save_checkpoint(weights, tmp_path / name)
    for _ in range(500):
        if written == ["a.ckpt", "b.ckpt"]:
            break
        time.sleep(0.01)
    assert written == ["a.ckpt", "b.ckpt"]
    io.wait()
    assert written == ["a.ckpt", "b.ckpt", "c.ckpt"]

    written.clear()  # at most two writes wait at a time
    gate.clear()
    io.save_checkpoint(full, tmp_path / "d.ckpt")
    io.save_checkpoint(full, tmp_path / "e.ckpt")
    threading.Timer(0.2, gate.set).start()
    io.save_checkpoint(full, tmp_path / "f.ckpt")  # two writes unfinished: handed over once they are done
    assert written[:2] == ["d.ckpt", "e.ckpt"]
    io.wait()
    assert written[2:] == ["f.ckpt"]

    class Failing(Held):
        def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
            if Path(path).name in ("g.ckpt", "h.ckpt"):
                raise OSError("disk gone")
            super().save_checkpoint(checkpoint, path, storage_options)

    io.checkpoint_io = Failing()
    io.save_checkpoint(weights, tmp_path / "g.ckpt")
    with pytest.raises(OSError, match="disk gone"):
        io.wait()  # a held write's failure is raised where it is written
    for name in ("h.ckpt", "i.ckpt", "j.ckpt"):  # the third hands the first two over
        io.save_checkpoint(weights, tmp_path / name)
    for _ in range(500):  # a handed-over write's failure is raised at the first per-step check after it
        try:
            io.wait_resumable()
        except OSError:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the failed write was never raised")
    io.wait_resumable()  # raised once
    io.teardown()  # and the held one is written at the end
    assert written[-1] == "j.ckpt"


def _write_until_killed(path: str) -> None:
    """A checkpoint of 24 MB, rewritten until the process is killed."""
    from callbacks.checkpoints import AtomicCheckpointIO

    io, step = AtomicCheckpointIO(), 0
    while True:
        step += 1
        io.save_checkpoint({"step": step, "w": torch.full((6_000_000,), float(step))}, path)


def test_kill_9_while_writing_never_leaves_a_half_written_checkpoint(tmp_path, fork_server):
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
