"""DDP on 2 CPU processes: one MLflow run, synced metrics equal to the single-process run's, one writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from main import cli_main
from tests.helpers import REPO, client, run_main, runs_of

SMALL = ["--trainer.max_epochs", "2", "--trainer.num_sanity_val_steps", "0",
         "--data.init_args.train_size", "640", "--data.init_args.val_size", "300"]


@pytest.mark.slow  # the default suite keeps the forked 2-process DDP checks of the diagnostics
def test_ddp_cpu_two_processes_one_run_same_metrics(paperlab_tmp: Path) -> None:
    config = str(REPO / "configs/mlp_classifier/yinyang.yaml")
    assert cli_main(["fit", "--config", config, *SMALL, "--run.name", "single"]) == 0
    proc = run_main(["fit", "--config", config, "--trainer", str(REPO / "configs/trainer/ddp_cpu.yaml"), *SMALL,
                     "--run.name", "ddp"], cwd=paperlab_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.info.run_name: r for r in runs_of("mlp_classifier")}
    assert sorted(runs) == ["ddp", "single"]  # rank 1 opened no run of its own
    ddp, single = runs["ddp"], runs["single"]
    assert ddp.info.status == "FINISHED"
    assert ddp.data.tags["strategy"] == "DDPStrategy" and ddp.data.tags["devices"] == "2"
    assert ddp.data.params["data.init_args.batch_size"] == "32"  # the global batch, as configured
    # Each rank trains on its half of every global batch: the averaged gradient is the single-process
    # gradient, so the synced metrics agree up to float summation order.
    for key in ("train/loss", "val/loss", "val/acc", "train/acc"):
        assert ddp.data.metrics[key] == pytest.approx(single.data.metrics[key], rel=1e-4, abs=1e-5), key
    history = client().get_metric_history(ddp.info.run_id, "val/acc")
    assert len(history) == 2  # one value per epoch: only rank 0 wrote
    assert [a.path for a in client().list_artifacts(ddp.info.run_id, "config")] == ["config/config.yaml"]
