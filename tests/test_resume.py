"""Resume after kill -9: same weights as an uninterrupted run, same MLflow run, continuing step axis."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from main import cli_main
from tests.helpers import REPO, SIGKILL, client, run_main, runs_of

SMALL = ["--trainer.max_epochs", "3", "--trainer.num_sanity_val_steps", "0",
         "--data.init_args.train_size", "600", "--data.init_args.val_size", "200"]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.slow  # the default suite keeps the mid-epoch resume of tests/test_reliability.py
def test_kill9_mid_epoch_then_resume_equals_uninterrupted_run(paperlab_tmp: Path) -> None:
    base = REPO / "configs/mlp_classifier/yinyang.yaml"
    assert cli_main(["fit", "--config", str(base), *SMALL, "--run.name", "straight"]) == 0

    # 600 samples / batch 32 = 19 steps per epoch: step 30 is in the middle of the second epoch.
    killer = paperlab_tmp / "killer.yaml"
    killer.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "tests.helpers.SignalAtStep", "init_args": {"step": 30, "signum": int(SIGKILL)}}]}}))
    proc = run_main(["fit", "--config", str(base), "--config", str(killer), *SMALL, "--run.name", "resumed"],
                    cwd=paperlab_tmp)
    assert proc.returncode == -int(SIGKILL), proc.stderr[-2000:]
    ckpt_dir = paperlab_tmp / "checkpoints/mlp_classifier/resumed"
    assert torch.load(ckpt_dir / "last.ckpt", weights_only=False)["global_step"] == 19

    assert cli_main(["fit", "--config", str(base), *SMALL, "--run.name", "resumed", "--ckpt_path", "last"]) == 0

    straight = _weights(paperlab_tmp / "checkpoints/mlp_classifier/straight/last.ckpt")
    resumed = _weights(ckpt_dir / "last.ckpt")
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key

    runs = {r.info.run_name: r for r in runs_of("mlp_classifier")}
    assert sorted(runs) == ["resumed", "straight"]  # the resume did not open a second run
    run = runs["resumed"]
    assert run.info.status == "FINISHED"
    history = client().get_metric_history(run.info.run_id, "val/acc")
    steps = [m.step for m in history]
    assert steps == [18, 37, 56], steps  # one point per epoch, the step axis continues across the resume
    # The diagnostics' state (here the best-so-far metric) came back from the checkpoint.
    best = client().get_metric_history(run.info.run_id, "val/acc_best")
    assert [m.value for m in best] == sorted(m.value for m in best)
    assert best[-1].value == max(m.value for m in history)


def test_test_on_checkpoint_logs_into_the_run_that_trained_it(paperlab_tmp: Path) -> None:
    base = REPO / "configs/mlp_classifier/digits.yaml"
    small = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3"]
    assert cli_main(["fit", "--config", str(base), *small, "--run.name", "digits"]) == 0
    ckpt = next((paperlab_tmp / "checkpoints/mlp_classifier/digits").glob("best-*.ckpt"))
    assert cli_main(["validate", "--config", str(base), "--ckpt_path", str(ckpt)]) == 0
    assert cli_main(["test", "--config", str(base), "--ckpt_path", "best", "--run.name", "digits"]) == 0
    (run,) = runs_of("mlp_classifier")
    assert "test/acc" in run.data.metrics and "val/acc" in run.data.metrics
    artifacts = [a.path for a in client().list_artifacts(run.info.run_id, "config")]
    assert sorted(artifacts) == ["config/config.yaml", "config/test_config.yaml", "config/validate_config.yaml"]


def test_resume_without_checkpoint_is_a_clear_error(paperlab_tmp: Path, capsys) -> None:
    base = REPO / "configs/mlp_classifier/digits.yaml"
    assert cli_main(["fit", "--config", str(base), "--ckpt_path", "last"]) == 1
    assert "no checkpoint in" in capsys.readouterr().err
    assert runs_of("mlp_classifier") == []


def test_fresh_fit_archives_the_previous_runs_checkpoints(paperlab_tmp: Path) -> None:
    base = REPO / "configs/mlp_classifier/digits.yaml"
    small = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    assert cli_main(["fit", "--config", str(base), *small, "--run.name", "digits"]) == 0
    assert cli_main(["fit", "--config", str(base), *small, "--run.name", "digits"]) == 0
    first, second = sorted(runs_of("mlp_classifier"), key=lambda r: r.info.start_time)
    run_dir = paperlab_tmp / "checkpoints/mlp_classifier/digits"
    archived = paperlab_tmp / "checkpoints/mlp_classifier/digits.archive" / first.info.run_id
    assert (archived / "last.ckpt").is_file()
    assert second.info.run_id in (run_dir / "mlflow_run.json").read_text()
    assert first.info.run_id in (archived / "mlflow_run.json").read_text()


def _killed_before_any_flush(ckpt: str, cwd: str, tracking_uri: str, run_file: str) -> None:
    """A fit that kills itself (kill -9) after the second step of its third epoch; its run id to ``run_file``."""
    import os

    import lightning as L

    from callbacks.checkpoints import LastCheckpoint
    from datamodules.yinyang import YinYangDataModule
    from modules.mlp_classifier import MLPClassifier
    from tests.helpers import SignalAtStep, mlp_net, sgd
    from tracking.mlflow_logger import PaperlabMLFlowLogger

    os.chdir(cwd)
    os.environ["MLFLOW_TRACKING_URI"] = tracking_uri
    logger = PaperlabMLFlowLogger(experiment_name="unflushed", run_name="killed", flush_every_s=3600)
    Path(run_file).write_text(logger.run_id)
    trainer = L.Trainer(max_epochs=4, logger=logger, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[LastCheckpoint(ckpt, min_interval_s=0),
                                                           SignalAtStep(step=2 * 4 + 2, signum=9)])
    trainer.fit(MLPClassifier(net=mlp_net([8]), input_shape=(4,), num_classes=3, optimizer=sgd(0.1)),
                YinYangDataModule(train_size=128, val_size=64, test_size=64, batch_size=32, seed=0))


def test_metrics_a_checkpoint_saw_survive_kill_9_though_none_were_flushed(paperlab_tmp: Path, fork_server: None) -> None:
    """A save writes no metrics (no sqlite commit per epoch): the checkpoint carries the unwritten ones and the
    resume writes them, so the run's history is whole."""
    import os

    import lightning as L

    from callbacks.checkpoints import UNFLUSHED, LastCheckpoint
    from datamodules.yinyang import YinYangDataModule
    from modules.mlp_classifier import MLPClassifier
    from tests.helpers import forked, mlp_net, sgd
    from tracking.mlflow_logger import PaperlabMLFlowLogger


    ckpt, run_file = paperlab_tmp / "ck", paperlab_tmp / "run_id"
    # its own process (forked from the session's fork server: no fresh interpreter's imports), killed -9
    proc = forked(_killed_before_any_flush, str(ckpt), str(paperlab_tmp), os.environ["MLFLOW_TRACKING_URI"],
                  str(run_file))
    proc.join(300)
    assert proc.exitcode == -9, proc.exitcode
    run_id = run_file.read_text()
    assert client().get_metric_history(run_id, "val/acc") == []  # nothing reached the store before the kill
    state = torch.load(ckpt / "last.ckpt", weights_only=False)
    assert state["global_step"] == 8  # 4 steps an epoch, killed after the second step of the third
    carried = sorted({(k, s) for k, _, _, s in state[UNFLUSHED] if k == "val/acc"})
    assert carried == [("val/acc", 3), ("val/acc", 7)]

    logger = PaperlabMLFlowLogger(experiment_name="unflushed", run_id=run_id, flush_every_s=3600)
    trainer = L.Trainer(max_epochs=4, logger=logger, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[LastCheckpoint(str(ckpt), min_interval_s=0)])
    trainer.fit(MLPClassifier(net=mlp_net([8]), input_shape=(4,), num_classes=3, optimizer=sgd(0.1)),
                YinYangDataModule(train_size=128, val_size=64, test_size=64, batch_size=32, seed=0),
                ckpt_path=str(ckpt / "last.ckpt"))
    for key, epoch_steps in (("val/acc", [3, 7, 11, 15]), ("train/loss", [4, 8, 12, 16])):
        steps = [m.step for m in client().get_metric_history(run_id, key)]
        assert sorted(steps) == epoch_steps, (key, steps)  # every epoch once, those before the kill too
