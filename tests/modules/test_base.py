"""PaperTask, the contract every method subclasses: declared attributes, per-stage metrics against direct
sums, optimizer and scheduler from arguments, hparams a checkpoint can rebuild, Literal choices."""

from __future__ import annotations

from typing import Literal

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from errors import ConfigError
from modules.base import PaperTask, StepOutput, WeightedMean
from modules.components.metrics import Accuracy


class _Linear(PaperTask):
    paper_id = "test"
    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(self, kind: Literal["a", "b"] = "a", optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                 lr_scheduler=None, num_classes: int = 3) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"acc": Accuracy(), "conf": WeightedMean()})
        self.net = nn.Linear(4, num_classes)

    def step(self, batch, stage):
        x, y = batch
        logits = self.net(x)
        conf = logits.softmax(-1).amax(-1).mean()
        return StepOutput(F.cross_entropy(logits, y), preds=logits.argmax(-1), target=y,
                          inputs={"conf": (conf, len(y)) if stage == "val" else None})


def test_missing_class_attributes_fail_at_definition():
    with pytest.raises(TypeError, match="monitor_mode"):
        class _NoMode(PaperTask):  # noqa: F841 - defining it is the test
            paper_id = "x"
            monitor = "val/acc"
    with pytest.raises(TypeError, match="monitor_mode must be"):
        class _BadMode(PaperTask):  # noqa: F841
            paper_id, monitor, monitor_mode = "x", "val/acc", "maximum"

    class _Abstract(PaperTask, abstract=True):  # an intermediate base declares nothing
        pass

    with pytest.raises(TypeError, match="paper_id"):
        class _Concrete(_Abstract):  # noqa: F841
            monitor, monitor_mode = "val/acc", "max"


def test_epoch_metrics_are_sample_weighted_per_stage_and_reset():
    torch.manual_seed(0)
    model = _Linear()
    batches = [(torch.randn(n, 4), torch.randint(0, 3, (n,))) for n in (5, 17, 2)]  # unequal sizes
    for b in batches:
        model._run_step(b, "val")
    model._run_step(batches[0], "train")
    out = model.epoch_metrics("val")
    with torch.no_grad():
        losses = [F.cross_entropy(model.net(x), y) * len(y) for x, y in batches]
        correct = sum((model.net(x).argmax(-1) == y).sum() for x, y in batches)
        conf = sum(model.net(x).softmax(-1).amax(-1).mean() * len(y) for x, y in batches)
    n = sum(len(y) for _, y in batches)
    assert out["val/loss"].item() == pytest.approx((sum(losses) / n).item(), rel=1e-6)
    assert out["val/acc"].item() == pytest.approx(correct.item() / n, rel=1e-6)
    assert out["val/conf"].item() == pytest.approx((conf / n).item(), rel=1e-6)
    assert model.epoch_metrics("val") == {}  # reset: nothing left for the next epoch
    train = model.epoch_metrics("train")
    assert set(train) == {"train/loss", "train/acc"}  # conf was never updated in training: not logged


def test_optimizer_and_scheduler_come_from_the_arguments():
    model = _Linear(optimizer=lambda p: torch.optim.Adam(p, lr=0.02),
                    lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5))
    config = model.configure_optimizers()
    assert isinstance(config["optimizer"], torch.optim.Adam) and config["optimizer"].defaults["lr"] == 0.02
    assert config["lr_scheduler"]["interval"] == "epoch"
    plateau = _Linear(lr_scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o))
    assert plateau.configure_optimizers()["lr_scheduler"]["monitor"] == "val/acc"
    assert isinstance(_Linear().configure_optimizers(), torch.optim.SGD)


def test_trains_through_lightning_and_logs_once_per_epoch():
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model = _Linear()
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, loader, loader)
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "val/conf"} <= set(trainer.callback_metrics)
    with torch.no_grad():
        acc = (model.net(x).argmax(-1) == y).float().mean()
    assert trainer.callback_metrics["val/acc"].item() == pytest.approx(acc.item())


def test_hparams_keep_only_own_arguments_in_storable_form():
    model = _Linear(kind="b")
    assert set(model.hparams) == {"kind", "optimizer", "lr_scheduler", "num_classes"}
    assert isinstance(model.hparams["optimizer"], str)  # a lambda cannot be pickled into a checkpoint
    torch.save(dict(model.hparams), "/dev/null")


def test_literal_arguments_are_checked():
    with pytest.raises(ConfigError, match=r"kind must be one of \['a', 'b'\], got 'c'"):
        _Linear(kind="c")


class _Lengths(PaperTask):
    """Step outputs whose shapes vary between steps: the deferred update falls back to one per step."""

    paper_id, monitor, monitor_mode = "test", "val/loss", "min"

    def __init__(self, optimizer=lambda p: torch.optim.SGD(p, lr=0.1), lr_scheduler=None) -> None:
        from torchmetrics.aggregation import CatMetric, MeanMetric

        super().__init__(optimizer, lr_scheduler, metrics={"cat": CatMetric(), "mean": MeanMetric()})
        self.w = nn.Parameter(torch.zeros(1))

    def step(self, batch, stage):
        (x,) = batch
        return StepOutput(self.w.sum() + x.mean(), n=x.numel(), inputs={"cat": x.flatten(), "mean": x})


@pytest.mark.parametrize("flush_every", [1, 3, 32])
def test_deferred_metric_updates_equal_immediate_ones(flush_every, monkeypatch):
    monkeypatch.setattr(_Lengths, "metric_flush_every", flush_every)
    model = _Lengths()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.rand(n, k, generator=gen),) for n, k in ((2, 3), (4, 3), (1, 5), (3, 5), (2, 1))]
    for b in batches:  # trailing sizes differ: "mean" cannot concatenate (2, 3) with (1, 5)
        model._run_step(b, "val")
    out = model.epoch_metrics("val")
    flat = torch.cat([x.flatten() for (x,) in batches])
    assert torch.equal(out["val/cat"], flat)
    assert out["val/mean"].item() == pytest.approx(flat.mean().item(), rel=1e-6)
    losses = torch.stack([x.mean() for (x,) in batches]).double()
    weights = torch.tensor([x.numel() for (x,) in batches], dtype=torch.float64)
    assert out["val/loss"].item() == pytest.approx(((losses * weights).sum() / weights.sum()).item(), rel=1e-6)


def test_kept_step_inputs_hold_no_graph():
    model = _Linear()
    model._run_step((torch.randn(4, 4), torch.randint(0, 3, (4,))), "train")
    kept = [a for calls in model._pending["train"].values() for call in calls for a in call]
    assert kept and all(not getattr(a, "requires_grad", False) for a in kept)


class _Counting(_Linear):
    """A task with state beyond its parameters: the number of training steps it has taken."""

    def __init__(self) -> None:
        super().__init__()
        self.steps_taken = 0

    def step(self, batch, stage):
        self.steps_taken += stage == "train"
        return super().step(batch, stage)

    def extra_state(self) -> dict:
        return {"steps_taken": self.steps_taken}

    def load_extra_state(self, state: dict) -> None:
        self.steps_taken = state.get("steps_taken", 0)


def test_extra_state_travels_in_checkpoints_beside_the_training_metrics(tmp_path):
    x, y = torch.randn(24, 4), torch.randint(0, 3, (24,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = _Counting()
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0)
    trainer.fit(model, loader)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    saved = torch.load(tmp_path / "mid.ckpt", weights_only=False)
    assert saved["paperlab_task_state"] == {"steps_taken": 2}
    assert "paperlab_train_metrics" in saved  # the base's state is kept as well
    fresh = _Counting()
    fresh.on_load_checkpoint(saved)
    assert fresh.steps_taken == 2
    fresh.on_load_checkpoint({})  # an older checkpoint without it: the task's own default
    assert fresh.steps_taken == 0


class _Recording(L.pytorch.loggers.Logger):
    """Every ``log_metrics`` call a logger gets: (step, {key: value})."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    name = "recording"
    version = 0

    def log_metrics(self, metrics, step=None) -> None:
        self.calls.append((step, {k: float(v) for k, v in metrics.items()}))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass


class _ThroughLightning(_Linear):
    """The same task with a fit's validation values always handed to ``self.log`` (Lightning places them)."""

    def _fit_validation_step(self):
        return None


@pytest.mark.parametrize("val_check_interval", [1.0, 0.5])
def test_a_fits_validation_values_reach_the_loggers_as_lightning_would_log_them(val_check_interval):
    """``log_epoch("val")`` in a fit goes straight to the loggers and ``callback_metrics`` (``self.log`` costs
    half a millisecond a value): same keys, values, steps, the epoch Lightning adds, and the same monitor for
    the checkpoints and early stopping, as through ``self.log``; also with validation within epochs."""
    x, y = torch.randn(48, 4), torch.randint(0, 3, (48,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    seen = {}
    for cls in (_Linear, _ThroughLightning):
        torch.manual_seed(0)
        logger = _Recording()
        stop = L.pytorch.callbacks.EarlyStopping(monitor="val/acc", mode="max", patience=100)
        trainer = L.Trainer(max_epochs=3, logger=logger, callbacks=[stop], enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=2,
                            val_check_interval=val_check_interval, log_every_n_steps=1)
        trainer.fit(cls(), loader, loader)
        seen[cls] = ([(step, m) for step, m in logger.calls if any(k.startswith("val/") for k in m)],
                     {k: float(v) for k, v in trainer.callback_metrics.items()}, float(stop.best_score))
    direct, lightning = seen[_Linear], seen[_ThroughLightning]
    assert len(direct[0]) == 3 / val_check_interval  # one call per validation, none for the sanity check
    assert direct == lightning
    assert {"val/loss", "val/acc", "val/conf", "epoch"} == set(direct[0][0][1])


def test_validation_values_go_through_self_log_outside_what_the_step_rule_covers():
    task = _Linear()
    x, y = torch.randn(48, 4), torch.randint(0, 3, (48,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accumulate_grad_batches=2)
    trainer.fit(task, loader, loader)
    assert task._fit_validation_step() is None  # accumulation: Lightning's own step counter decides
    trainer.validate(task, loader)
    assert "val/acc" in trainer.callback_metrics  # validate outside a fit: through self.log, as before
