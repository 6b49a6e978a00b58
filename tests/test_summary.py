"""The end of a command: run identity (a re-fit is ``<name> #2``), evaluations that keep the training's
duration, Ctrl-C with the command that resumes, the task's own metrics first, and a step budget's bar."""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import torch

from lightning_cli import PaperlabCLI, PaperlabProgressBar, command_overrides, train_description
from main import cli_main
from tests.helpers import REPO, client, fork_main, runs_of

DIGITS = str(REPO / "configs/mlp_classifier/digits.yaml")
YINYANG = str(REPO / "configs/mlp_classifier/yinyang.yaml")
QUADRATIC = str(REPO / "configs/m_sync_sgd/quadratic_exp.yaml")


class SigintOnce(L.Callback):
    """Ctrl-C at ``step``, once: ``marker`` records that it happened, so the resumed command trains on."""

    def __init__(self, marker: str, step: int = 25) -> None:
        self.marker, self.step = marker, step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.step and not Path(self.marker).exists():
            Path(self.marker).touch()
            os.kill(os.getpid(), signal.SIGINT)


def test_a_refit_is_the_next_instance_and_a_test_keeps_the_training_duration(paperlab_tmp: Path, capsys) -> None:
    small = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    preset = str(REPO / "configs/trainer/cpu.yaml")
    assert cli_main(["fit", "--config", DIGITS, "--trainer", preset, *small]) == 0
    base = "digits max_epochs=1 limit_train_batches=2 limit_val_batches=1"  # the preset does not name it
    assert f"paperlab fit finished: mlp_classifier / {base}\n" in capsys.readouterr().out
    assert cli_main(["fit", "--config", DIGITS, *small]) == 0
    out = capsys.readouterr().out
    runs = {r.info.run_name: r for r in runs_of("mlp_classifier")}
    assert sorted(runs) == [base, f"{base} #2"]
    assert runs[base].data.tags["trainer_preset"] == preset and "trainer_preset" not in runs[f"{base} #2"].data.tags
    root = paperlab_tmp / "checkpoints/mlp_classifier"
    first = root / "digits_max_epochs=1_limit_train_batches=2_limit_val_batches=1"
    second = first.with_name(first.name + "_#2")
    assert sorted(p.name for p in root.iterdir()) == [first.name, second.name]  # nothing moved to an archive
    assert runs[base].info.run_id in (first / "mlflow_run.json").read_text() and (first / "last.ckpt").is_file()
    assert runs[f"{base} #2"].info.run_id in (second / "mlflow_run.json").read_text()
    assert f"paperlab fit finished: mlp_classifier / {base} #2" in out
    assert f"earlier run '{base}': its files stay in {first.relative_to(paperlab_tmp)}/" in out

    # the same command plus --ckpt_path best tests the newest instance, into its run, without ending it again
    trained = client().get_run(runs[f"{base} #2"].info.run_id).info
    time.sleep(1.1)  # so that ending the run again would move its end time
    assert cli_main(["test", "--config", DIGITS, *small, "--ckpt_path", "best"]) == 0
    assert f"paperlab test finished: mlp_classifier / {base} #2" in capsys.readouterr().out
    tested = client().get_run(trained.run_id)
    assert "test/acc" in tested.data.metrics and "test/acc" not in client().get_run(runs[base].info.run_id).data.metrics
    assert (tested.info.status, tested.info.end_time) == (trained.status, trained.end_time)


def test_an_explicit_run_name_is_kept_and_the_summary_says_where_the_earlier_files_went(paperlab_tmp: Path,
                                                                                         capsys) -> None:
    small = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
             "--run.name", "mine"]
    assert cli_main(["fit", "--config", DIGITS, *small]) == 0
    assert cli_main(["fit", "--config", DIGITS, *small]) == 0  # sweeps find a point by its exact name
    assert sorted(r.info.run_name for r in runs_of("mlp_classifier")) == ["mine", "mine"]
    assert "the earlier run's files under this name were moved to checkpoints/mlp_classifier/mine.archive/" in (
        capsys.readouterr().out)


def test_ctrl_c_prints_killed_with_the_command_that_resumes_and_exits_130(paperlab_tmp: Path, fork_server: None) -> None:
    small = ["--trainer.max_epochs", "3", "--trainer.num_sanity_val_steps", "0",  # 19 steps an epoch
             "--data.init_args.train_size", "600", "--data.init_args.val_size", "200"]
    assert cli_main(["fit", "--config", YINYANG, *small]) == 0  # an earlier run takes the name
    # on the command line (a run control), not in a second --config, whose stem would name the run
    stopper = json.dumps([{"class_path": "tests.test_summary.SigintOnce",
                           "init_args": {"marker": str(paperlab_tmp / "hit")}}])
    proc = fork_main(["fit", "--config", YINYANG, "--trainer.callbacks", stopper, *small], cwd=paperlab_tmp)
    assert proc.returncode == 130, proc.stderr[-2000:]
    base = "yinyang max_epochs=3 train_size=600 val_size=200"  # num_sanity_val_steps: a run control
    lines = proc.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("paperlab fit"))
    assert head == f"paperlab fit KILLED (Ctrl-C) at step 25, epoch 1: mlp_classifier / {base} #2", head
    folder = "checkpoints/mlp_classifier/yinyang_max_epochs=3_train_size=600_val_size=200_#2"
    assert any(ln.startswith(f"  interrupted.ckpt: {folder}/interrupted.ckpt") for ln in lines), proc.stdout
    resume = next(ln for ln in lines if ln.startswith("  resume: python main.py "))
    args = shlex.split(resume.removeprefix("  resume: python main.py "))
    assert args[-4:] == ["--run.name", f"{base} #2", "--ckpt_path", "last"], resume
    killed = next(r for r in runs_of("mlp_classifier") if r.info.run_name == f"{base} #2")
    assert killed.info.status == "KILLED"
    # the checkpoint written at the interrupt holds the step it names; the epoch-end one is kept beside it
    assert torch.load(paperlab_tmp / folder / "interrupted.ckpt", weights_only=False)["global_step"] == 25
    assert (paperlab_tmp / folder / "last.ckpt").is_file()

    assert cli_main(args) == 0  # the printed command resumes the interrupted run, not a new one
    runs = {r.info.run_name: r for r in runs_of("mlp_classifier")}
    assert sorted(runs) == [base, f"{base} #2"]
    resumed = runs[f"{base} #2"]
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    assert not [t for t in resumed.data.tags if t.startswith("param_changed.")]  # --run.name is no param
    assert [m.step for m in client().get_metric_history(resumed.info.run_id, "val/acc")] == [18, 37, 56]


def test_a_simulated_method_shows_time_to_target_first_and_a_step_budget_bar(paperlab_tmp: Path, capsys) -> None:
    labels: list[str] = []

    class Spy(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            bar = trainer.progress_bar_callback
            labels.append(bar.progress.tasks[bar.train_progress_bar_id].description.strip())

    cli = PaperlabCLI(args=["--config", QUADRATIC, "--trainer.max_steps", "30", "--data.init_args.steps_per_epoch",
                            "20", "--trainer.val_check_interval", "10", "--trainer.enable_progress_bar", "true",
                            "--run.name", "budget"], run=False)
    assert isinstance(cli.trainer.progress_bar_callback, PaperlabProgressBar)
    cli.trainer.callbacks.append(Spy())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.after_fit()
    assert labels[0] == labels[19] == "Epoch 0 · 30 steps" and labels[20] == "Epoch 1 · 30 steps", labels
    out = capsys.readouterr().out
    summary = out[out.index("paperlab fit finished: m_sync_sgd / budget"):].splitlines()
    assert summary[1].startswith("  train/time_to_target "), summary  # the task's metrics come first
    assert "train/target_reached 0" in summary[1] and "train/diverged 0" in summary[1]
    assert summary[2].startswith("  val/grad_norm_sq: last ")
    assert summary[3] == "  stopped: max_steps=30 reached"


def test_bar_labels_and_run_controls() -> None:
    trainer = SimpleNamespace(current_epoch=2, max_epochs=10, max_steps=-1)
    assert train_description(trainer) == "Epoch 2/9"
    assert train_description(SimpleNamespace(current_epoch=0, max_epochs=-1, max_steps=1500)) == "Epoch 0 · 1500 steps"
    argv = ["--config", "c.yaml", "--trainer", "configs/trainer/ddp_cpu.yaml", "--trainer=configs/trainer/cpu.yaml",
            "--trainer", "mine.yaml", "--model.optimizer.lr", "0.1"]
    assert command_overrides(argv) == [("trainer", "mine.yaml"), ("model.optimizer.lr", "0.1")]
