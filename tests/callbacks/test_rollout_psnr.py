"""RolloutPSNR and ParameterScaling (paper 004-01) on a tiny hypernetwork fit."""

from __future__ import annotations

import math
from functools import partial

import lightning as L
import pytest
import torch

from callbacks.diagnostic import Schedule
from callbacks.param_scaling import ParameterScaling, scaling_table
from callbacks.rollout_psnr import RolloutPSNR, rollout_summary
from datamodules.image_sets import ImageSetDataModule
from errors import ConfigError
from modules.attn_hyper_inr import AttnOptHyperINR, HyperINRTask, mlp_opt_parameter_count
from modules.mlp_classifier import MLPClassifier


def test_rollout_summary() -> None:
    out = rollout_summary(torch.tensor([float("nan"), 10.0, 12.0, 11.5]))
    assert "k0" not in out and out["k1"] == 10.0 and out["k3"] == 11.5
    assert out["gain"] == pytest.approx(1.5)
    assert out["min_increment"] == pytest.approx(-0.5)
    assert out["monotone"] == 0.0
    up = rollout_summary(torch.tensor([5.0, 10.0, 10.0, 11.0]))
    assert up["k0"] == 5.0 and up["monotone"] == 1.0 and up["min_increment"] == 0.0


def _fit(callbacks: list, steps: int = 2, widths: tuple[int, ...] = (8,)) -> tuple[L.Trainer, HyperINRTask]:
    torch.manual_seed(0)
    net = partial(AttnOptHyperINR, inr_widths=list(widths), fourier_dim=8, d_model=16, n_heads=2, rollout_steps=3,
                  patch_size=4)
    task = HyperINRTask(net=net, input_shape=(1, 8, 8))  # the sizes of digits at size 8, as the CLI links them
    data = ImageSetDataModule(dataset="digits", size=8, batch_size=8, eval_batch_size=16)
    trainer = L.Trainer(max_steps=steps, limit_val_batches=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        num_sanity_val_steps=0, val_check_interval=steps, accelerator="cpu", devices=1)
    trainer.fit(task, datamodule=data)
    return trainer, task


def test_rollout_psnr_logs_every_step_on_the_fixed_validation_batch() -> None:
    cb = RolloutPSNR(Schedule(at_fit_start=True, at_validation=True), max_images=16)
    trainer, task = _fit([cb])
    assert len(cb.history) == 2  # fit start, the validation at the end
    last = cb.history[-1]
    images = next(iter(trainer.datamodule.val_dataloader()))[0][:16]
    task.eval()
    expected = task.rollout_psnr((images,)).mean(0)
    for k in range(4):
        assert last[f"k{k}"] == pytest.approx(float(expected[k]), abs=1e-4)
    assert trainer.callback_metrics["diag/rollout_psnr/k3"] == pytest.approx(float(expected[3]), abs=1e-4)
    assert last["gain"] == pytest.approx(float(expected[3] - expected[1]), abs=1e-4)
    # the figure the base logs at fit end (the smoke fit runs without it): one PSNR curve per measurement
    fig = cb.figure()
    curves = [line.get_ydata() for line in fig.axes[0].get_lines()]
    assert len(curves) == 2 and list(curves[-1][1:]) == pytest.approx([last[f"k{k}"] for k in (1, 2, 3)], abs=1e-4)


def test_param_scaling_counts_once() -> None:
    cb = ParameterScaling(widths=[16, 32, 64])
    trainer, task = _fit([cb], steps=1, widths=(8, 8))
    counts = cb.counts
    assert counts["AttnOptHyperINR"][0] == counts["AttnOptHyperINR"][-1]
    assert counts["MLPOptStepBaseline"] == [mlp_opt_parameter_count([w, w], 8, 1) for w in (16, 32, 64)]
    m = trainer.callback_metrics
    assert float(m["diag/param_scaling/AttnOptHyperINR/max_over_min"]) == 1.0
    assert 1.0 < float(m["diag/param_scaling/TransINRBaseline/last_ratio"]) < 2.0
    # one W x W layer (2 hidden layers): ~16 per doubling once it dominates (here 32 -> 64)
    assert 14.0 < float(m["diag/param_scaling/MLPOptStepBaseline/last_ratio"]) < 16.0
    assert len(cb.history) == 1
    # the figure the base logs at fit end (the smoke fit runs without it): one count curve per network
    fig = cb.figure()
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in fig.axes[0].get_lines()}
    assert lines == {name: ([16, 32, 64], c) for name, c in counts.items()}
    csv = scaling_table(cb.widths, counts).splitlines()
    assert csv[0] == "width,AttnOptHyperINR,TransINRBaseline,MLPOptStepBaseline" and csv[1].startswith("16,")


def test_bad_arguments_and_unsupported_modules() -> None:
    with pytest.raises(ConfigError, match="increasing"):
        ParameterScaling(widths=[32, 16])
    with pytest.raises(ConfigError, match="max_images"):
        RolloutPSNR(max_images=0)
    cb = RolloutPSNR()
    reason = cb.unsupported_reason(None, MLPClassifier())
    assert reason is not None and "rollout_psnr" in reason
    assert math.isfinite(rollout_summary(torch.tensor([1.0, 2.0]))["gain"])
