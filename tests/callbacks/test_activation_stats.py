"""ActivationStats: sparsity / max / spike ratio against direct computation, eval mode, state, DDP."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from torch import nn

from callbacks.activation_stats import (
    ActivationStats,
    activation_modules,
    histogram_median,
    layer_input_stats,
    near_zero_count,
    negative_count,
)
from callbacks.diagnostic import Schedule
from callbacks.weight_drift import WeightDrift
from datamodules.random_gaussian import RandomGaussianDataModule
from tests.helpers import CleanDistributedExit, drift_model


def _trainer(callbacks, max_steps, **kw):
    args = dict(
        callbacks=callbacks,
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=1,
    )
    return L.Trainer(**(args | kw))


def _data(**kw):
    return RandomGaussianDataModule(
        **({"train_size": 256, "val_size": 64, "test_size": 64, "batch_size": 32} | kw)
    )


def test_layer_input_stats_by_hand():
    h = torch.tensor([[0.0, 2.0, -3.0], [0.0, 0.5, 0.0]])
    zeros, n, mx, hist = layer_input_stats(h)
    assert (zeros, n, mx) == (3, 6, 3.0)
    assert hist.sum().item() == 3
    assert histogram_median(hist) == pytest.approx(2.0, rel=0.012)  # median of {0.5, 2, 3}


def test_near_zero_and_negative_counts_by_hand():
    h = torch.tensor([[0.0, 2e-4, -5e-4, 1e-3], [-1e-3, 0.5, -2.0, 3e-3]])
    assert near_zero_count(h, 1e-3) == 3  # 0, 2e-4, -5e-4; |h| = 1e-3 is not below the threshold
    assert near_zero_count(h, 1e-2) == 6
    assert negative_count(h) == (3, 8)


def test_activation_modules_skip_shortcuts():
    from modules.components.resnet import ResNet

    names = [n for n, _ in activation_modules(ResNet(widths=(4, 8), blocks_per_stage=1))]
    assert names == ["stem_act", "stages.0.0.act1", "stages.0.0.act2", "stages.1.0.act1", "stages.1.0.act2"]
    net = nn.Sequential(nn.Linear(2, 2), nn.Identity(), nn.Tanh())
    assert [n for n, _ in activation_modules(net)] == ["2"]  # a plain nn.Identity is a shortcut, not an activation


def test_histogram_median_against_sort():
    x = torch.randn(10_001, generator=torch.Generator().manual_seed(0)).exp()
    *_, hist = layer_input_stats(x)
    assert histogram_median(hist) == pytest.approx(x.median().item(), rel=0.012)


class _Tiny(L.LightningModule):
    """Linear -> act -> Dropout -> Linear: dropout must be off in the measured (eval) forward."""

    def __init__(self, act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(64, 32), act(), nn.Dropout(0.5), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, i):
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, i):
        self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_validation_numbers_equal_direct_computation():
    model, dm = _Tiny(), _data()
    cb = ActivationStats(eval_batches=2)
    _trainer([cb], 1, limit_val_batches=5, num_sanity_val_steps=0).validate(model, dm)
    dm.setup()
    x = dm.splits["val"][0][:64]  # two eval batches of 32
    with torch.no_grad():
        h = torch.relu(model.net[0](x))
    rec = cb.history[-1]
    assert cb.roles == {"net.0": "other", "net.3": "downstream"}
    assert rec["net.3/sparsity"] == pytest.approx((h == 0).double().mean().item(), abs=1e-12)
    assert rec["net.3/max"] == pytest.approx(h.abs().max().item(), rel=1e-6)
    assert rec["net.3/spike_ratio"] == pytest.approx(h.max().item() / h[h > 0].median().item(), rel=0.012)
    assert rec["net.0/sparsity"] == 0.0 and rec["net.0/max"] == pytest.approx(x.abs().max().item(), rel=1e-6)
    assert rec["downstream_sparsity"] == rec["net.3/sparsity"] and rec["downstream_max"] == rec["net.3/max"]
    z = model.net[0](x).detach()
    # the pre-activation of net.1 (the ReLU's input, not its output, which is never negative)
    assert rec["net.1/pre_negative"] == pytest.approx((z < 0).double().mean().item(), abs=1e-12)
    assert rec["net.1/pre_negative"] > 0.3 and rec["downstream_pre_negative"] == rec["net.1/pre_negative"]
    assert rec["net.3/near_zero"] == pytest.approx((h.abs() < 1e-3).double().mean().item(), abs=1e-12)
    assert rec["downstream_near_zero"] == rec["net.3/near_zero"]


@pytest.mark.parametrize("act, eps", [(nn.GELU, 1e-3), (nn.GELU, 0.05), (nn.Tanh, 0.05)])
def test_smooth_activations_near_zero_and_pre_negative(act, eps):
    """GELU has no exact zeros, so sparsity is ~0 by construction; near_zero and pre_negative are not."""
    model, dm = _Tiny(act), _data()
    cb = ActivationStats(eval_batches=2, near_zero_eps=eps)
    _trainer([cb], 1, limit_val_batches=5, num_sanity_val_steps=0).validate(model, dm)
    dm.setup()
    x = dm.splits["val"][0][:64]
    with torch.no_grad():
        z = model.net[0](x)
        h = model.net[1](z)
    rec = cb.history[-1]
    assert rec["net.3/sparsity"] == pytest.approx((h == 0).double().mean().item(), abs=1e-12)
    assert rec["net.3/near_zero"] == pytest.approx((h.abs() < eps).double().mean().item(), abs=1e-12)
    assert rec["net.1/pre_negative"] == pytest.approx((z < 0).double().mean().item(), abs=1e-12)
    assert 0.3 < rec["net.1/pre_negative"] < 0.7
    if act is nn.GELU:
        assert rec["net.3/sparsity"] < 0.01 and rec["downstream_pre_negative"] == rec["net.1/pre_negative"]
        assert rec["net.3/near_zero"] > (0.0 if eps == 1e-3 else 0.1)
    else:  # tanh is symmetric: no downstream summaries, the symmetric control instead
        assert "downstream_pre_negative" not in rec and "downstream_near_zero" not in rec
        assert rec["symmetric_pre_negative"] == rec["net.1/pre_negative"]


def test_train_cadence_uses_eval_mode_and_every_n_steps():
    model, dm = _Tiny(), _data()
    cb = ActivationStats(schedule=Schedule(at_fit_start=False, every_n_steps=2), eval_batches=0)
    _trainer([cb], 6, limit_val_batches=0).fit(model, dm)
    assert [h["step"] for h in cb.history] == [2, 4, 6]
    assert model.training  # restored after the measurement
    # with dropout active half the inputs of net.3 would be extra zeros; eval mode keeps sparsity near 1/2
    assert 0.3 < cb.history[-1]["net.3/sparsity"] < 0.65
    fresh = ActivationStats()
    fresh.load_state_dict(cb.state_dict())
    assert fresh.history == cb.history and fresh.roles == cb.roles


def test_bad_arguments():
    with pytest.raises(ValueError, match="never measure"):
        ActivationStats(schedule=Schedule(at_fit_start=False, at_validation=True), eval_batches=0)
    with pytest.raises(ValueError, match="near_zero_eps must be positive"):
        ActivationStats(near_zero_eps=0.0)


class _DumpDrift(WeightDrift):
    def __init__(self, path: str) -> None:
        super().__init__(schedule=Schedule(every_n_steps=2), plot=False)
        self.path = path

    def on_fit_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            with open(self.path, "w") as f:
                json.dump(self.history, f)


class _DumpActs(ActivationStats):
    def __init__(self, path: str) -> None:
        super().__init__(schedule=Schedule(at_fit_start=False, at_validation=True, every_n_steps=2),
                         eval_batches=2, plot=False)
        self.path = path

    def on_fit_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            with open(self.path, "w") as f:
                json.dump(self.history, f)


def _run(tmp_path, tag, devices, strategy):
    L.seed_everything(0)
    model = drift_model(hidden=[16, 16], lr=0.1)
    cbs = [_DumpDrift(str(tmp_path / f"drift_{tag}.json")), _DumpActs(str(tmp_path / f"acts_{tag}.json")),
           CleanDistributedExit()]
    trainer = _trainer(
        cbs,
        4,
        devices=devices,
        strategy=strategy,
        val_check_interval=4,
        limit_val_batches=2,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, _data())
    return (
        json.loads((tmp_path / f"drift_{tag}.json").read_text()),
        json.loads((tmp_path / f"acts_{tag}.json").read_text()),
    )


def test_ddp_two_processes_equal_single_process(tmp_path):
    drift1, acts1 = _run(tmp_path, "single", 1, "auto")
    drift2, acts2 = _run(tmp_path, "ddp", 2, "ddp_fork")  # forked (spawned ranks re-import torch: ~17 s)
    assert [h["step"] for h in drift1] == [h["step"] for h in drift2] == [0, 2, 4]
    for a, b in zip(drift1, drift2):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-7), k
    assert [h["step"] for h in acts1] == [h["step"] for h in acts2] == [2, 4]
    for a, b in zip(acts1, acts2):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-4 if "ratio" not in k else 0.012), k
