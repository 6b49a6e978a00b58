"""CD scaling (paper 000-12): the schedule, exact token accounting, and ``fit_laws`` over runs in MLflow.

The fitters themselves (a planted Chinchilla law recovered, ``eta_bar`` against a fine grid, the cd form
recovered and beating the constant one) are tested in ``test_scaling_laws.py``; here ``fit_laws`` reads
synthetic sweep runs from an MLflow store and must recover the law planted in their losses.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from mlflow.entities import Metric

from callbacks.token_accounting import TokenAccounting
from datamodules.text import CharTextDataModule
from errors import ConfigError
from modules.cd_scaling import (
    CDScalingLM,
    ScalingRun,
    analyse,
    fit_chinchilla,
    fit_effectiveness,
    fit_laws,
    warmup_cosine,
)
from modules.cd_scaling.__main__ import main
from modules.components.scaling_laws import ChinchillaLaw, EffectivenessLaw
from modules.components.tiny_gpt import TinyGPT
from tests.helpers import client as store_client

BLOCK = 8
U_CHARS = 50 * BLOCK + 1  # 50 windows whose inputs and targets cover exactly the first U characters


def _tiny(shape: tuple[int, ...], n: int) -> TinyGPT:
    return TinyGPT(shape, n, n_layer=2, n_head=2, n_embd=16, norm="rmsnorm")


class _Record(L.Callback):
    def __init__(self) -> None:
        self.inputs: dict[int, list[torch.Tensor]] = {}
        self.lrs: list[float] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.inputs.setdefault(trainer.current_epoch, []).append(batch[0].clone())
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_reexports_the_shared_fitters() -> None:
    from modules.components import scaling_laws

    assert fit_chinchilla is scaling_laws.fit_chinchilla and fit_effectiveness is scaling_laws.fit_effectiveness


def test_warmup_cosine_against_its_closed_form() -> None:
    total, warmup, final = 100, 5, 0.1
    f = [warmup_cosine(s, total, warmup, final) for s in range(total + 1)]
    assert f[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert f[warmup] == pytest.approx(1.0) and f[total] == pytest.approx(final)
    mid = warmup + (total - warmup) // 2  # progress 1/2 (95 steps: 47.5 exactly is between two steps)
    assert f[mid] == pytest.approx(final + (1 - final) * 0.5 * (1 + math.cos(math.pi * 47 / 95)))
    assert all(b <= a for a, b in zip(f[warmup:], f[warmup + 1 :]))


def test_exactly_U_unique_chars_each_epoch_and_the_schedule_over_the_run(paperlab_tmp: Any) -> None:
    torch.manual_seed(0)
    dm = CharTextDataModule(block_size=BLOCK, max_chars=60_000, batch_size=16, train_chars=U_CHARS)
    stream = dm.streams()["train"]
    assert stream.numel() == U_CHARS
    task = CDScalingLM(net=_tiny, input_shape=(BLOCK,), num_classes=128, warmup_fraction=0.25,
                       optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    rec = _Record()
    acct = TokenAccounting()
    epochs = 3
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=0, callbacks=[rec, acct])
    trainer.fit(task, dm)
    expected = sorted(tuple(stream[i * BLOCK : (i + 1) * BLOCK].tolist()) for i in range(50))
    for e in range(epochs):  # every window once per epoch: the first U characters, no other
        seen = sorted(tuple(row) for b in rec.inputs[e] for row in b.tolist())
        assert seen == expected
    assert task.token_budget() == {"n_params": sum(p.numel() for p in task.net.blocks.parameters()),
                                   "unique": 50 * BLOCK, "seen": epochs * 50 * BLOCK}
    last = acct.history[-1]
    assert last["epochs"] == pytest.approx(epochs) and last["unique"] == 50 * BLOCK
    # 4 batches an epoch (50 windows of 16): 12 steps, 3 of warm-up, cosine to 10 % at the end
    total = trainer.estimated_stepping_batches
    assert total == 12 and len(rec.lrs) == 12
    assert rec.lrs == pytest.approx([1e-2 * warmup_cosine(s, 12, 3, 0.1) for s in range(12)])


def test_n_params_is_48_d_squared() -> None:
    task = CDScalingLM(net=lambda s, n: TinyGPT(s, n, n_layer=4, n_head=4, n_embd=32, norm="rmsnorm"))
    assert task.n_params == 4 * (12 * 32**2 + 2 * 32)  # 12 d^2 of weights + two RMSNorm gains per layer


def test_bad_schedule_arguments() -> None:
    with pytest.raises(ConfigError, match="warmup_fraction"):
        CDScalingLM(warmup_fraction=1.0)
    with pytest.raises(ConfigError, match="final_lr_fraction"):
        CDScalingLM(final_lr_fraction=-0.1)


def test_U_beyond_the_train_split_names_its_size() -> None:
    dm = CharTextDataModule(max_chars=20_000, train_chars=10**7)
    with pytest.raises(ConfigError, match=r"exceeds the train split's \d+ characters"):
        dm.streams()


# --- fit_laws over synthetic sweeps in MLflow ------------------------------------------------------------------
LAW = ChinchillaLaw(E=1.1, A=40.0, alpha=0.4, B=250.0, beta=0.4)
PLANTED = EffectivenessLaw(LAW, "cd", c0=60.0, a=0.3, b=0.3)
SIZES = (27_648.0, 110_592.0, 442_368.0)


def _planted_runs() -> tuple[list[ScalingRun], list[ScalingRun]]:
    anchors = [ScalingRun(f"a{n:.0f}_{u}", n, u, u, float(LAW.predict(n, u))) for n in SIZES
               for u in (32_768.0, 65_536.0, 131_072.0, 262_144.0, 524_288.0)]
    repeat = [ScalingRun(f"r{n:.0f}_{u}_{e}", n, u, u * e, float(PLANTED.predict(n, u, u * e))) for n in SIZES
              for u in (32_768.0, 65_536.0) for e in (2, 4, 8)]
    return anchors, repeat


def _log_sweep(client: Any, exp_id: str, name: str, runs: list[ScalingRun]) -> None:
    parent = client.create_run(exp_id, run_name=name, tags={"sweep.name": name, "sweep.role": "parent"})
    for r in runs:
        child = client.create_run(exp_id, run_name=r.name, tags={"mlflow.parentRunId": parent.info.run_id, "sweep.name": name})
        values = (("val/loss", r.L), ("diag/token_accounting/n_params", r.N),
                  ("diag/token_accounting/unique", r.U), ("diag/token_accounting/seen", r.D))
        client.log_batch(child.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in values])
        client.set_terminated(child.info.run_id, "FINISHED")
    # a failed child never counts
    failed = client.create_run(exp_id, run_name="broken", tags={"mlflow.parentRunId": parent.info.run_id})
    client.log_metric(failed.info.run_id, "val/loss", float("nan"))
    client.set_terminated(failed.info.run_id, "FAILED")


@pytest.mark.slow  # three L-BFGS grids and ~40 MLflow runs: ~3 s on quiet cores; test_claims_counts is its fast twin
def test_fit_laws_recovers_a_planted_law_from_mlflow_runs(paperlab_tmp: Any, capsys: pytest.CaptureFixture[str]) -> None:
    client = store_client()
    exp_id = client.create_experiment("cd_scaling")
    anchors, repeat = _planted_runs()
    _log_sweep(client, exp_id, "anchors", anchors)
    _log_sweep(client, exp_id, "repeat", repeat)
    assert main(["fit-laws", "--anchors", "anchors", "--repeat", "repeat"]) == 0
    assert "rmse" in capsys.readouterr().out
    runs = client.search_runs([exp_id], filter_string="attributes.run_name = 'fit_laws'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    m = runs[0].data.metrics
    for k, v in LAW.params.items():
        assert m[f"law/{k}"] == pytest.approx(v, rel=1e-3)
    assert (m["cd/c0"], m["cd/a"], m["cd/b"]) == pytest.approx((60.0, 0.3, 0.3), rel=1e-3)
    assert m["cd/rmse"] < 1e-6 < m["constant/rmse"]
    assert m["claim/rmse_reduction_cd_vs_constant"] > 0.99
    # eta_bar measured by inverting the law equals the planted form's in every cell
    for n in SIZES:
        for u in (32_768, 65_536):
            for e in (2, 4, 8):
                key = f"N{n:.0f}_U{u}_ep{e}"
                assert m[f"eta_bar/{key}"] == pytest.approx(float(PLANTED.eta_bar(n, u, u * e)), rel=1e-4)
    # R* falls with N here (a > 0, U/N < 1 at the large model), so every cell is lower at the largest N
    assert m["claim/cells_lower_at_largest_N"] == 6 and m["claim/pairs_falling_with_epochs"] == 6
    arts = {a.path for a in client.list_artifacts(runs[0].info.run_id, "tables")}
    assert arts == {"tables/runs.csv", "tables/cells.csv"}
    assert runs[0].data.params["repeat_runs"] == "18"


def test_fit_laws_errors(paperlab_tmp: Any) -> None:

    with pytest.raises(ConfigError, match="anchors_sweep.yaml"):
        fit_laws()  # nothing run yet: the message names the sweep command
    client = store_client()
    exp_id = client.create_experiment("cd_scaling")
    anchors, repeat = _planted_runs()
    _log_sweep(client, exp_id, "anchors", anchors[:2])
    with pytest.raises(ConfigError, match="repeat_sweep.yaml"):
        fit_laws()
    two_epochs = [ScalingRun("x", 1e4, 1e4, 2e4, 3.0), *anchors]
    with pytest.raises(ConfigError, match="more than one epoch"):
        analyse(two_epochs, repeat)
    with pytest.raises(ConfigError, match="D >= U"):
        analyse(anchors, [ScalingRun("short", 1e4, 2e4, 1e4, 3.0), *repeat])
    with pytest.raises(ConfigError, match="not finite"):
        analyse([*anchors[:-1], ScalingRun("nan", 1e4, 1e4, 1e4, math.nan)], repeat)
    with pytest.raises(ConfigError, match="cannot determine"):
        analyse(anchors[:4], repeat)
    bad = client.create_run(exp_id, run_name="no_budget", tags={"mlflow.parentRunId": _parent(client, exp_id, "anchors")})
    client.log_metric(bad.info.run_id, "val/loss", 3.0)
    client.set_terminated(bad.info.run_id, "FINISHED")
    with pytest.raises(ConfigError, match="TokenAccounting"):
        fit_laws()


def _parent(client: Any, exp_id: str, name: str) -> str:
    runs = client.search_runs([exp_id], filter_string=f"tags.`sweep.name` = '{name}' and tags.`sweep.role` = 'parent'")
    return runs[0].info.run_id


def test_claims_counts_against_a_naive_reading() -> None:
    from modules.cd_scaling.laws import claims

    rng = np.random.default_rng(0)
    cells = [{"N": n, "U": u, "epochs": e, "eta_bar": float(rng.uniform(-0.2, 1.2))}
             for n in (1.0, 2.0, 3.0) for u in (10.0, 20.0) for e in (2, 4, 8)]
    cells[0]["eta_bar"] = math.nan  # a run below the law's floor: undefined, counts as a failure
    for c, v in zip(cells[6:9], (0.8, 0.5, 0.3)):  # N=2, U=10: falling, and 8 epochs at 0.375 x its 2-epoch value
        c["eta_bar"] = v
    out = claims(cells, rmse_cd=0.01, rmse_constant=0.04)
    eta = {(c["N"], c["U"], c["epochs"]): c["eta_bar"] for c in cells}
    falling = lower8 = halved = 0
    for n in (1.0, 2.0, 3.0):
        for u in (10.0, 20.0):
            a, b, c = eta[(n, u, 2)], eta[(n, u, 4)], eta[(n, u, 8)]
            falling += int(b < a and c < b)
            lower8 += int(c < a)
            halved += int(c < 0.5 * a)
    lower = sum(int(eta[(3.0, u, e)] < eta[(1.0, u, e)]) for u in (10.0, 20.0) for e in (2, 4, 8))
    assert out["cells"] == 18 and out["cells_defined"] == 17
    assert out["cells_eta_below_1"] == sum(v < 1 for v in eta.values() if not math.isnan(v))
    assert (out["pairs_falling_with_epochs"], out["pairs_eta8_below_half_eta2"]) == (falling, halved)
    assert out["pairs_eta8_below_eta2"] == lower8 and lower8 > halved
    assert falling >= 1 and halved >= 1
    assert out["cells_lower_at_largest_N"] == lower and out["cells_U_epochs"] == 6
    assert out["rmse_reduction_cd_vs_constant"] == pytest.approx(0.75)


def test_an_endless_run_has_no_schedule(paperlab_tmp: Any) -> None:
    dm = CharTextDataModule(block_size=BLOCK, max_chars=60_000, batch_size=16, train_chars=U_CHARS)
    trainer = L.Trainer(max_epochs=-1, max_steps=-1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    with pytest.raises(ConfigError, match="max_epochs"):
        trainer.fit(CDScalingLM(net=_tiny, input_shape=(BLOCK,), num_classes=128), dm)


def test_each_cell_carries_the_student_t_interval_of_its_seeds_eta_bar() -> None:
    from scipy import stats

    anchors, repeat = _planted_runs()
    rng = np.random.default_rng(1)
    seeds = [ScalingRun(f"{r.name}_s{s}", r.N, r.U, r.D, r.L * float(np.exp(rng.normal(0, 0.01))))
             for r in repeat for s in range(3)]
    result = analyse(anchors, seeds)
    rows = {}
    for row in result.runs:
        rows.setdefault((row["N"], row["U"], row["epochs"]), []).append(row["eta_bar"])
    assert len(result.cells) == len(repeat)
    for cell in result.cells:
        etas = rows[(cell["N"], cell["U"], cell["epochs"])]
        assert len(etas) == cell["runs"] == 3
        lo, hi = stats.t.interval(0.95, 2, loc=np.mean(etas), scale=stats.sem(etas))
        assert (cell["eta_bar_lo"], cell["eta_bar_hi"]) == pytest.approx((lo, hi), rel=1e-9)
    below = [c["eta_bar_hi"] < 1 for c in result.cells]
    assert result.claims["cells_eta_interval_below_1"] == sum(below)
    assert result.claims["cells_eta8_interval_below_1"] == sum(b for b, c in zip(below, result.cells) if c["epochs"] == 8)
