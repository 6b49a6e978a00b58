"""WeightDriftModel: every architecture trains a step, the losses match their definitions, bad input
fails clearly, and every config runs end to end through the CLI."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from datamodules.digits import DigitsDataModule
from datamodules.random_gaussian import RandomGaussianDataModule
from datamodules.text import CharTextDataModule
from modules.weight_drift import WeightDriftModel

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "weight_drift").glob("*.yaml"))


def _fit(model, dm, steps=2):
    trainer = L.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        accelerator="cpu",
    )
    trainer.fit(model, dm)
    trainer.validate(model, dm, verbose=False)
    return trainer


@pytest.mark.parametrize(
    "arch, kw, dm",
    [
        ("mlp", {"hidden": [8]}, lambda: RandomGaussianDataModule(train_size=64, val_size=32, test_size=32)),
        ("resnet", {"resnet_widths": [4, 8]}, lambda: DigitsDataModule(image_shape=True, batch_size=16)),
        (
            "vit",
            {"vit_dim": 12, "vit_depth": 1, "vit_heads": 2},
            lambda: DigitsDataModule(image_shape=True, batch_size=16),
        ),
        (
            "gpt",
            {"n_layer": 1, "n_embd": 12, "n_head": 2, "block_size": 16},
            lambda: CharTextDataModule(block_size=16, max_chars=20_000, batch_size=8),
        ),
    ],
)
def test_every_architecture_trains(arch, kw, dm):
    torch.manual_seed(0)
    model = WeightDriftModel(arch=arch, **kw)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _fit(model, dm())
    assert trainer.global_step == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert "val/loss" in trainer.callback_metrics
    if arch == "gpt":
        assert trainer.callback_metrics["val/bpc"] == pytest.approx(
            trainer.callback_metrics["val/loss"].item() / torch.log(torch.tensor(2.0)).item(), rel=1e-5
        )


def test_losses_match_definitions():
    torch.manual_seed(0)
    logits, y = torch.randn(6, 10), torch.randint(0, 10, (6,))
    ce = WeightDriftModel(hidden=[4])
    mse = WeightDriftModel(hidden=[4], loss="mse")
    assert ce._loss(logits, y).item() == pytest.approx(F.cross_entropy(logits, y).item())
    onehot = torch.zeros(6, 10)
    onehot[torch.arange(6), y] = 1.0
    assert mse._loss(logits, y).item() == pytest.approx(((logits - onehot) ** 2).mean().item())
    gpt = WeightDriftModel(arch="gpt", n_layer=1, n_embd=12, n_head=2, block_size=8)
    lm_logits, lm_y = torch.randn(2, 8, 128), torch.randint(0, 128, (2, 8))
    assert gpt._loss(lm_logits, lm_y).item() == pytest.approx(
        F.cross_entropy(lm_logits.reshape(-1, 128), lm_y.reshape(-1)).item()
    )


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"arch": "lstm"}, "arch"),
        ({"loss": "hinge"}, "loss"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"lr": 0.0}, "lr"),
        ({"activation": "swish9"}, "activation"),
        ({"init": "xavier"}, "init"),
    ],
)
def test_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        WeightDriftModel(**kw)


def test_bad_batches_name_the_fix():
    model = WeightDriftModel(hidden=[4], in_dim=64)
    with pytest.raises(ValueError, match="in_dim"):
        model._step((torch.randn(2, 10), torch.zeros(2, dtype=torch.long)), "train")
    vit = WeightDriftModel(arch="vit", vit_dim=12, vit_heads=2, vit_depth=1)
    with pytest.raises(ValueError, match="image_shape"):
        vit._step((torch.randn(2, 64), torch.zeros(2, dtype=torch.long)), "train")


def test_optimizers():
    m = WeightDriftModel(hidden=[4], optimizer="sgd", lr=0.5, momentum=0.9)
    opt = m.configure_optimizers()
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9
    opt = WeightDriftModel(hidden=[4], betas=(0.8, 0.9)).configure_optimizers()
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.8, 0.9)
    assert opt.defaults["weight_decay"] == 0.0


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_fast_dev_run(config, paperlab_tmp):
    from main import cli_main

    assert cli_main(["fit", "--config", str(config), "--trainer.fast_dev_run", "true"]) == 0
