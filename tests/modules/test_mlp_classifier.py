"""The reference MLP and its epoch metrics: sample-weighted loss means and accuracy against direct sums."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import torchmetrics

from datamodules.yinyang import YinYangDataModule
from modules.components.epoch_metrics import EpochMetrics
from modules.mlp_classifier import MLPClassifier


class _Recorder(L.LightningModule):
    """Feeds fixed batches through EpochMetrics and keeps what it logged."""

    def __init__(self, batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self.batches = batches
        acc = torchmetrics.classification.MulticlassAccuracy(3, average="micro", validate_args=False)
        self.epoch_metrics = EpochMetrics({"acc": acc})


def test_epoch_metrics_are_sample_weighted_and_reset() -> None:
    torch.manual_seed(0)
    batches = []
    for n in (5, 17, 2):  # unequal batch sizes: a mean of batch means would be wrong
        logits, y = torch.randn(n, 3), torch.randint(0, 3, (n,))
        batches.append((F.cross_entropy(logits, y), logits.argmax(-1), y))
    module = _Recorder(batches)
    module.trainer = L.Trainer(logger=False, enable_progress_bar=False)  # a world size of 1 for the reduction
    logged = {}
    module.log = lambda key, value, **kw: logged.__setitem__(key, value)  # type: ignore[method-assign]
    for loss, preds, y in batches:
        module.epoch_metrics.update("val", loss, preds, y)
    out = module.epoch_metrics.log_epoch(module, "val")
    total = sum(loss * len(y) for loss, _, y in batches) / sum(len(y) for *_, y in batches)
    correct = sum((p == y).sum() for _, p, y in batches) / sum(len(y) for *_, y in batches)
    assert out["val/loss"] == pytest.approx(float(total), rel=1e-6)
    assert out["val/acc"] == pytest.approx(float(correct), rel=1e-6)
    assert set(logged) == {"val/loss", "val/acc"}
    assert module.epoch_metrics.log_epoch(module, "val") == {}  # reset: nothing left for the next epoch


def test_forward_predict_and_training_reduces_the_loss() -> None:
    L.seed_everything(0)
    dm = YinYangDataModule(train_size=600, val_size=100, test_size=100, batch_size=50)
    model = MLPClassifier(hidden=[32], lr=0.02)
    x, y = dm._split("train")
    before = F.cross_entropy(model(x), y).item()
    trainer = L.Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, dm)
    assert F.cross_entropy(model(x), y).item() < 0.8 * before
    probs = model.predict_step((x[:7],), 0)
    assert probs.shape == (7, 3) and torch.allclose(probs.sum(-1), torch.ones(7))
    assert 0 <= trainer.callback_metrics["val/acc"] <= 1


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(ValueError, match="lr must be positive"):
        MLPClassifier(lr=0)
    model = MLPClassifier(in_dim=4)
    with pytest.raises(ValueError, match="set --model.init_args.in_dim"):
        model._step((torch.zeros(2, 64), torch.zeros(2, dtype=torch.long)), "train")
