"""Resume loses at most an epoch (or a cadence), its MLflow history neither repeats nor loses a step,
runs are named by their overrides, commands end with a summary and without noise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from main import cli_main
from tests.helpers import REPO, SIGKILL, client, fork_main, run_main, runs_of

BASE = str(REPO / "configs/mlp_classifier/yinyang.yaml")
# 600 samples / batch 32 = 19 steps an epoch
SMALL = ["--trainer.max_epochs", "6", "--trainer.num_sanity_val_steps", "0", "--data.init_args.train_size", "600",
         "--data.init_args.val_size", "200", "--run.checkpoint_interval_s", "0"]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def _history(run_id: str) -> dict[str, list[tuple[int, float]]]:
    c = client()
    keys = c.get_run(run_id).data.metrics
    return {k: [(m.step, m.value) for m in c.get_metric_history(run_id, k)] for k in keys}


def _kill_at(step: int, paperlab_tmp: Path, extra: list[str], name: str) -> None:
    killer = paperlab_tmp / f"killer_{name}.yaml"
    killer.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "tests.helpers.SignalAtStep", "init_args": {"step": step, "signum": int(SIGKILL)}}]}}))
    proc = fork_main(["fit", "--config", BASE, "--config", str(killer), *SMALL, *extra, "--run.name", name],
                    cwd=paperlab_tmp)
    assert proc.returncode == -int(SIGKILL), proc.stderr[-2000:]


def _check_same_as_straight(paperlab_tmp: Path, name: str) -> None:
    straight = _weights(paperlab_tmp / "checkpoints/mlp_classifier/straight/last.ckpt")
    resumed = _weights(paperlab_tmp / f"checkpoints/mlp_classifier/{name}/last.ckpt")
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    runs = {r.info.run_name: r for r in runs_of("mlp_classifier")}
    a, b = _history(runs["straight"].info.run_id), _history(runs[name].info.run_id)
    assert a.keys() == b.keys()
    for key in a:
        steps = [s for s, _ in b[key]]
        assert len(steps) == len(set(steps)), (key, steps)  # no (metric, step) pair twice
        assert sorted(steps) == sorted(s for s, _ in a[key]), key  # and none lost
        assert [v for _, v in sorted(b[key])] == pytest.approx([v for _, v in sorted(a[key])]), key


@pytest.mark.slow  # the default suite keeps the mid-epoch resume below
def test_kill_after_several_epochs_resumes_from_the_newest_epoch_end_with_a_clean_history(
    paperlab_tmp: Path, fork_server: None
) -> None:
    assert cli_main(["fit", "--config", BASE, *SMALL, "--run.name", "straight"]) == 0
    _kill_at(4 * 19 + 7, paperlab_tmp, [], "resumed")  # in the fifth epoch
    last = torch.load(paperlab_tmp / "checkpoints/mlp_classifier/resumed/last.ckpt", weights_only=False)
    assert last["global_step"] == 4 * 19  # the newest epoch end, not the best epoch's
    assert cli_main(["fit", "--config", BASE, *SMALL, "--run.name", "resumed", "--ckpt_path", "last"]) == 0
    _check_same_as_straight(paperlab_tmp, "resumed")


def test_long_epochs_are_checkpointed_within_the_epoch_and_resume_exactly(paperlab_tmp: Path, fork_server: None) -> None:
    three = [*SMALL, "--trainer.max_epochs", "3"]  # the resumed epoch is the last: what follows it adds nothing here
    assert cli_main(["fit", "--config", BASE, *three, "--run.name", "straight"]) == 0
    # a cadence shorter than one step: last.ckpt after every batch; killed in the middle of the third epoch
    _kill_at(2 * 19 + 9, paperlab_tmp, ["--trainer.max_epochs", "3", "--run.checkpoint_every_s", "1e-6"], "midepoch")
    last = torch.load(paperlab_tmp / "checkpoints/mlp_classifier/midepoch/last.ckpt", weights_only=False)
    assert 2 * 19 < last["global_step"] < 3 * 19  # within the epoch
    assert cli_main(["fit", "--config", BASE, *three, "--run.name", "midepoch", "--ckpt_path", "last",
                     "--run.checkpoint_every_s", "1e-6"]) == 0
    _check_same_as_straight(paperlab_tmp, "midepoch")


def test_a_run_started_with_overrides_carries_them_in_its_name_tags_and_folder(paperlab_tmp: Path, capsys) -> None:
    args = ["fit", "--config", BASE, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
            "--model.optimizer.lr", "0.003", "--run.num_threads", "1"]
    assert cli_main(args) == 0
    (run,) = runs_of("mlp_classifier")
    assert run.info.run_name == "yinyang max_epochs=1 limit_train_batches=2 lr=0.003"  # run controls left out
    assert run.data.tags["overrides"] == "--trainer.max_epochs 1 --trainer.limit_train_batches 2 --model.optimizer.lr 0.003"
    assert "python main.py fit --config" in run.data.tags["mlflow.note.content"]
    folder = paperlab_tmp / "checkpoints/mlp_classifier/yinyang_max_epochs=1_limit_train_batches=2_lr=0.003"
    assert (folder / "last.ckpt").is_file()
    out = capsys.readouterr().out
    # the end of a command says what came out and where it is
    assert "paperlab fit finished: mlp_classifier / yinyang max_epochs=1 limit_train_batches=2 lr=0.003" in out
    assert "val/acc: last" in out and f"MLflow run {run.info.run_id}" in out and "mlflow ui --backend-store-uri" in out
    assert "checkpoints/mlp_classifier/yinyang_max_epochs=1_limit_train_batches=2_lr=0.003/" in out
    assert cli_main(["test", "--config", BASE, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                     "--model.optimizer.lr", "0.003", "--ckpt_path", "best"]) == 0  # the same command finds it
    assert "test/acc" in capsys.readouterr().out
    exp = client().get_experiment_by_name("mlp_classifier")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # the UI opens on the runs


@pytest.mark.slow  # every command once in a subprocess (~30 s)
def test_commands_print_no_noise(paperlab_tmp: Path) -> None:
    args = ["fit", "--config", str(REPO / "configs/mlp_classifier/digits.yaml"), "--trainer.max_epochs", "2",
            "--run.name", "digits", "--trainer.log_every_n_steps", "1000"]  # an interval longer than the epoch
    first = run_main(args, cwd=paperlab_tmp)
    again = run_main(args, cwd=paperlab_tmp)  # a re-fit of the same run: the earlier checkpoints are archived
    for proc in (first, again):
        text = proc.stdout + proc.stderr
        assert proc.returncode == 0, text[-2000:]
        for noise in ("litlogger", "LeafSpec", "exists and is not empty", "weights_only", "log_every_n_steps",
                      "sync_dist", "Traceback"):
            assert noise not in text, (noise, text[-3000:])
    archived = list((paperlab_tmp / "checkpoints/mlp_classifier/digits.archive").glob("*/*"))
    assert {p.name for p in archived} >= {"last.ckpt", "mlflow_run.json"}


def test_compare_and_sweep_listing_import_neither_torch_nor_lightning(paperlab_tmp: Path) -> None:
    code = ("import sys; sys.argv = ['main.py', 'compare', '--help']; import runpy\n"
            "try:\n    runpy.run_path('main.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('HEAVY', sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    assert "HEAVY []" in out, out[-2000:]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["fit", "--config", BASE, "--trainer.max_epcohs", "1"], "--trainer.max_epcohs (did you mean --trainer.max_epochs?)"),
        (["fit", "--config", BASE, "--trainer.max_epoch", "1"], "did you mean --trainer.max_epochs?"),  # no prefixes
        (["fit", "--config", BASE, "--model", "MLPClassifer"],
         "--model MLPClassifer: no such class; did you mean modules.mlp_classifier.MLPClassifier?"),
        (["fit"], "fit needs an experiment config: --config configs/<method>/<experiment>.yaml"),
    ],
    ids=["misspelt", "prefix", "class", "no-config"],
)
def test_command_line_mistakes_are_one_line_with_the_fix(args, needle, paperlab_tmp: Path, capsys) -> None:
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.splitlines()) <= 2, err


def test_no_arguments_lists_the_commands(capsys) -> None:
    assert cli_main([]) == 2
    err = capsys.readouterr().err
    assert all(c in err for c in ("fit", "validate", "test", "predict", "sweep", "compare"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
@pytest.mark.parametrize("preset", ["gpu", "ddp", "fsdp", "deepspeed"])
def test_a_gpu_preset_without_a_gpu_names_what_runs_here(preset: str, paperlab_tmp: Path, capsys) -> None:
    assert cli_main(["fit", "--config", BASE, "--trainer", str(REPO / f"configs/trainer/{preset}.yaml")]) == 2
    err = capsys.readouterr().err
    assert "no GPU found on this machine" in err and "configs/trainer/cpu.yaml" in err and "Traceback" not in err


def test_more_cpu_processes_than_cores_warns_once(paperlab_tmp: Path, monkeypatch) -> None:
    import os

    from lightning_cli import PaperlabCLI

    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    with pytest.warns(UserWarning, match="2 CPU processes on a machine with 1 cores") as record:
        PaperlabCLI(args=["--config", BASE, "--trainer.devices", "2", "--trainer.strategy", "ddp_spawn"], run=False)
    assert sum("CPU processes on a machine" in str(w.message) for w in record) == 1


@pytest.mark.slow  # four processes at once: about a minute on 2 cores
def test_four_concurrent_fits_into_one_fresh_sqlite_store_all_finish_with_full_histories(tmp_path: Path) -> None:
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'fresh.db'}"}
    args = [BASE, "--trainer.max_epochs", "3", "--data.init_args.train_size", "300", "--run.num_threads", "1"]
    procs = [subprocess.Popen([sys.executable, str(REPO / "main.py"), "fit", "--config", *args, "--run.name", f"p{i}",
                               "--seed_everything", str(i)], cwd=tmp_path, env={**__import__("os").environ, "CI": "1",
                               "PYTHONPATH": str(REPO), **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(4)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[-1500:] for o in outs]
    import mlflow

    c = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = c.get_experiment_by_name("mlp_classifier")
    runs = c.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["p0", "p1", "p2", "p3"]
    for r in runs:
        assert r.info.status == "FINISHED"
        assert len(c.get_metric_history(r.info.run_id, "val/acc")) == 3  # one point an epoch, none lost
        assert len(c.get_metric_history(r.info.run_id, "train/loss")) == 3


def test_a_failed_background_metrics_write_is_raised_on_the_training_thread_and_its_metrics_kept(
    paperlab_tmp: Path,
) -> None:
    from mlflow.exceptions import MlflowException

    from tracking.mlflow_logger import PaperlabMLFlowLogger

    logger = PaperlabMLFlowLogger(experiment_name="writer", run_name="gone", flush_every_s=3600)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.flush()
    assert [m.value for m in client().get_metric_history(logger.run_id, "a")] == [1.0]
    client().delete_run(logger.run_id)  # the store now refuses writes to the run
    logger.log_metrics({"a": 2.0}, step=1)
    logger.flush(wait=False)  # handed to the writer thread: returns at once
    # until it is known written, a checkpoint would carry it (a failed write included)
    assert [[k, v, s] for k, v, _, s in logger.unflushed()] == [["a", 2.0, 1]]
    with pytest.raises(MlflowException):
        logger.flush()  # the write's error, raised here on the training thread
    logger.flush()  # raised once, not at every later flush
