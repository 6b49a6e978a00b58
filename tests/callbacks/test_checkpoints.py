"""BestCheckpoint and LastCheckpoint: what each writes and when."""

from __future__ import annotations

import lightning as L
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
