"""Bad input: one clear message, a non-zero exit, and never an MLflow run left RUNNING."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import yaml

from main import cli_main
from tests.helpers import REPO, SIGINT, run_main, runs_of

BASE = str(REPO / "configs/mlp_classifier/yinyang.yaml")
SMALL = ["--trainer.max_epochs", "3", "--trainer.num_sanity_val_steps", "0",
         "--data.init_args.train_size", "600", "--data.init_args.val_size", "200"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--model.init_args.hiddn", "[3]"], "hiddn"),
        (["--trainer.max_epochs", "many"], "max_epochs"),
        (["--model", "modules.nope.Nope"], "modules.nope.Nope"),
        (["--data.init_args.batch_size", "0"], "batch_size must be a positive integer"),
        (["--data.init_args.batch_size", "-4"], "batch_size must be a positive integer"),
        (["--model", "torch.nn.Linear"], "--model torch.nn.Linear is not a PaperTask: --model takes a subclass of "
                                         "modules.base.PaperTask"),
        (["--data", "modules.base.PaperTask"], "is not a PaperlabDataModule: --data takes a subclass of "
                                               "datamodules.base.PaperlabDataModule"),
    ],
    ids=["unknown-key", "wrong-type", "bad-class-path", "zero-batch", "negative-batch", "model-not-a-task",
         "data-not-a-datamodule"],
)
def test_config_errors(args: list[str], needle: str, paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    rc = cli_main(["fit", "--config", BASE, *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err
    assert runs_of("mlp_classifier") == []


def test_missing_config_file(paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["fit", "--config", "configs/nope/missing.yaml"]) == 2
    err = capsys.readouterr().err
    assert "missing.yaml" in err and "Traceback" not in err


def test_nan_loss_stops_names_the_step_fails_the_run_and_keeps_the_last_good_checkpoint(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    rc = cli_main(["fit", "--config", BASE, *SMALL, "--model.class_path", "tests.helpers.NaNAtStep",
                   "--model.init_args.nan_step", "25", "--run.experiment", "mlp_classifier",
                   "--run.name", "yinyang"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "NaN or infinite at step 25" in err and "Traceback" not in err
    (run,) = runs_of("mlp_classifier")
    assert run.info.status == "FAILED"
    last = torch.load(paperlab_tmp / "checkpoints/mlp_classifier/yinyang/last.ckpt", weights_only=False)
    assert last["global_step"] == 19  # the end of the first epoch, before the NaN
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())


def test_ctrl_c_marks_the_run_killed_and_writes_a_checkpoint(paperlab_tmp: Path) -> None:
    stopper = paperlab_tmp / "stopper.yaml"
    stopper.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "tests.helpers.SignalAtStep", "init_args": {"step": 25, "signum": int(SIGINT)}}]}}))
    proc = run_main(["fit", "--config", BASE, "--config", str(stopper), *SMALL, "--run.name", "stopper"],
                    cwd=paperlab_tmp)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (run,) = runs_of("mlp_classifier")
    assert run.info.status == "KILLED"
    ckpt_dir = paperlab_tmp / "checkpoints/mlp_classifier/stopper"
    assert torch.load(ckpt_dir / "interrupted.ckpt", weights_only=False)["global_step"] == 25
    assert (ckpt_dir / "last.ckpt").is_file()


def test_unreachable_tracking_server(paperlab_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    assert cli_main(["fit", "--config", BASE, *SMALL]) == 1
    err = capsys.readouterr().err
    assert f"http://127.0.0.1:{port} does not answer" in err and "Traceback" not in err
