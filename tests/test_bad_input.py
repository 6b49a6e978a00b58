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


def test_a_misspelt_subcommand_lists_all_four(paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    """A command builds only its own subcommand's parser; one that names none still offers every subcommand."""
    assert cli_main(["fitt", "--config", BASE]) == 2
    err = capsys.readouterr().err
    assert "'fit', 'validate', 'test', 'predict'" in err and "Traceback" not in err


def test_missing_config_file(paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli_main(["fit", "--config", "configs/nope/missing.yaml"]) == 2
    err = capsys.readouterr().err
    assert "missing.yaml" in err and "Traceback" not in err


# The mistakes of a first hour with the project: each is one line that names the option to change and the fix.
ONE_LINE = [
    pytest.param(["--config", "configs/mlp_classifer/yinyang.yaml"],
                 f"--config configs/mlp_classifer/yinyang.yaml: no such file; did you mean "
                 f"{REPO / 'configs/mlp_classifier/yinyang.yaml'}?", 2, id="config-typo"),
    pytest.param(["--config", BASE, "--trainer", "configs/trainer/cpuu.yaml"],
                 f"--trainer configs/trainer/cpuu.yaml: no such file; did you mean {REPO / 'configs/trainer/cpu.yaml'}?",
                 2, id="trainer-preset-typo"),
    pytest.param(["--config", BASE, "--model.optimizer.lr", "-0.01"],
                 "the optimizer refuses its arguments: Invalid learning rate: -0.01; change --model.optimizer.lr "
                 "(model.init_args.optimizer.init_args.lr in a config file)", 2, id="negative-lr"),
    pytest.param(["--config", BASE, "--model.init_args.optimizer.init_args.lr", "-0.01"],
                 "Invalid learning rate: -0.01; change --model.optimizer.lr", 2, id="negative-lr-full-form"),
    pytest.param(["--config", BASE, "--model.optimizer.betas", "[2.0, 0.9]"],
                 "Invalid beta parameter at index 0: 2.0; change --model.optimizer.betas", 2, id="bad-beta"),
    pytest.param(["--config", BASE, "--model.optimizer", "torch.optim.SGD", "--model.optimizer.momentum", "-1"],
                 "Invalid momentum value: -1.0; change --model.optimizer.momentum", 2, id="bad-momentum"),
    pytest.param(["--config", BASE, "--model.lr_scheduler", "torch.optim.lr_scheduler.OneCycleLR",
                  "--model.lr_scheduler.max_lr", "0.1"],
                 "the learning-rate scheduler refuses its arguments: You must define either total_steps OR (epochs "
                 "AND steps_per_epoch); change --model.lr_scheduler.total_steps", 2, id="scheduler-without-steps"),
    pytest.param(["--config", BASE, "--model.lr", "0.01"],
                 "unknown option(s): --model.lr (did you mean --model.optimizer.lr?)", 2, id="lr-one-level-up"),
    pytest.param(["--config", BASE, "--model.init_args.lr", "0.01"],
                 "unknown option(s): --model.init_args.lr (did you mean --model.init_args.optimizer.init_args.lr?)",
                 2, id="lr-one-level-up-full-form"),
    pytest.param(["--config", BASE, "--model.hidden", "[8]"],
                 "unknown option(s): --model.hidden (did you mean --model.net.hidden?)", 2, id="hidden-one-level-up"),
    pytest.param(["--config", BASE, "--model.net.hiddn", "[8]"],
                 "unknown option(s): --model.net.hiddn (did you mean --model.net.hidden?)", 2, id="nested-typo"),
    pytest.param(["--config", BASE, "--model.net", "modules.components.mlp.MLPP"],
                 "--model.net modules.components.mlp.MLPP: no such class; did you mean modules.components.mlp.MLP?",
                 2, id="nested-class-typo"),
    pytest.param(["--config", BASE, "--model.init_args.net.class_path", "modules.components.mlp.MLPP"],
                 "--model.init_args.net.class_path modules.components.mlp.MLPP: no such class; did you mean "
                 "modules.components.mlp.MLP?", 2, id="nested-class-typo-full-form"),
    pytest.param(["--config", BASE, "--model.optimizer", "torch.optim.Adamm"],
                 "--model.optimizer torch.optim.Adamm: no such class; did you mean torch.optim.Adam?", 2,
                 id="optimizer-typo"),
    pytest.param(["--config", BASE, "--model.net", "torch.optim.AdamW"],
                 "--model.net torch.optim.AdamW is not a Module: --model.net takes a task network", 2,
                 id="net-not-a-module"),
    pytest.param(["--config", BASE, "--model.net", "torch.nn.Linear"],
                 "--model.net torch.nn.Linear is not a task network: Linear(input_shape, num_classes) fails", 2,
                 id="net-not-a-task-network"),
    pytest.param(["--config", BASE, "--model.optimizer.lr", "fast"],
                 "--model.optimizer.lr fast: expected a float", 2, id="nested-wrong-type"),
]


@pytest.mark.parametrize(("args", "line", "code"), ONE_LINE)
def test_first_hour_mistakes_are_one_line_naming_the_option(
    args: list[str], line: str, code: int, paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    assert cli_main(["fit", *args]) == code
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and line in errors[0], err
    assert "Traceback" not in err
    assert runs_of("mlp_classifier") == []


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        ({"model": {"init_args": {"lr": 0.01}}}, "unknown option(s): --model.lr (did you mean --model.optimizer.lr?)"),
        ({"model": {"init_args": {"net": {"class_path": "modules.components.mlp.MLPP"}}}},
         "--model.net modules.components.mlp.MLPP: no such class; did you mean modules.components.mlp.MLP?"),
    ],
    ids=["option-one-level-up", "nested-class-typo"],
)
def test_the_same_mistakes_in_a_config_file(extra: dict, line: str, paperlab_tmp: Path, capsys) -> None:
    """In a second ``--config`` (the suggestions then come from the configs that parse)."""
    mine = paperlab_tmp / "mine.yaml"
    mine.write_text(yaml.safe_dump(extra))
    assert cli_main(["fit", "--config", BASE, "--config", str(mine)]) == 2
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and line in errors[0], err
    assert "Traceback" not in err


def test_a_refused_optimizer_argument_is_named_also_for_a_task_built_in_python() -> None:
    from functools import partial

    from errors import ConfigError
    from modules.mlp_classifier import MLPClassifier

    with pytest.raises(ConfigError, match=r"Invalid weight_decay value: -1.0; change --model.optimizer.weight_decay"):
        MLPClassifier(optimizer=partial(torch.optim.SGD, lr=0.1, weight_decay=-1.0))
    with pytest.raises(ConfigError, match=r"but got 0; change --model.lr_scheduler.T_0 \(model.init_args.lr_sch"):
        MLPClassifier(lr_scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingWarmRestarts, T_0=0))


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


@pytest.mark.slow  # the default suite's Ctrl-C check is tests/test_summary.py's, with these asserts and more
def test_ctrl_c_marks_the_run_killed_and_writes_a_checkpoint(paperlab_tmp: Path) -> None:
    stopper = paperlab_tmp / "stopper.yaml"
    stopper.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "tests.helpers.SignalAtStep", "init_args": {"step": 25, "signum": int(SIGINT)}}]}}))
    proc = run_main(["fit", "--config", BASE, "--config", str(stopper), *SMALL, "--run.name", "stopper"],
                    cwd=paperlab_tmp)
    assert proc.returncode == 130, proc.stderr[-2000:]  # 128 + SIGINT, as shells report Ctrl-C
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


@pytest.mark.parametrize("command", ["sweep", "compare"])
def test_ctrl_c_outside_a_sweeps_points_is_one_line_and_exit_130(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Ctrl-C while a sweep starts (its workers' imports) or while compare reads the store: one line, exit 130,
    no traceback (the runner stops running points itself, test_runner.py)."""
    import sweeps.cli

    def interrupted(argv: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweeps.cli, f"{command}_main", interrupted)
    assert cli_main([command, "--config", "whatever.yaml"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("interrupted (Ctrl-C); the same command again") and "\n" not in err, err
