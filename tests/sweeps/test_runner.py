"""Running sweeps: parent and children in MLflow, resume after a kill, failure isolation, compare."""

from __future__ import annotations

import csv
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from main import cli_main
from tests.helpers import REPO, client, runs_of
from tests.sweeps.common import write_sweep


def _children(parent_id: str) -> list:
    return [r for r in runs_of("mlp_classifier") if r.data.tags.get("mlflow.parentRunId") == parent_id]


def _parent(name: str):
    (parent,) = [
        r
        for r in runs_of("mlp_classifier")
        if r.data.tags.get("sweep.role") == "parent" and r.data.tags.get("sweep.name") == name
    ]
    return parent


def test_sweep_logs_parent_and_children_skips_finished_points_and_compares(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    # Enough training and test data that runs differ: the statistics below must have something to check.
    more = {"trainer.limit_train_batches": 4, "trainer.limit_test_batches": 4, "model.optimizer.lr": 0.05}
    sweep = write_sweep(
        paperlab_tmp,
        grid={"model.net.activation": ["relu", "tanh"]},
        seeds=[0, 1],
        test=True,
        overrides=more,
    )
    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0
    capsys.readouterr()

    parent = _parent("tiny")
    assert parent.info.status == "FINISHED" and parent.info.run_name == "tiny"
    pid = parent.info.run_id
    text = Path(client().download_artifacts(pid, "sweep/tiny.yaml", str(paperlab_tmp / "dl"))).read_text()
    assert text == sweep.read_text()
    assert {a.path for a in client().list_artifacts(pid, "sweep")} == {"sweep/tiny.yaml", "sweep/points.json"}

    kids = _children(pid)
    assert sorted(r.info.run_name for r in kids) == [
        "tiny-activation=relu-s0",
        "tiny-activation=relu-s1",
        "tiny-activation=tanh-s0",
        "tiny-activation=tanh-s1",
    ]
    for run in kids:
        act, seed = run.info.run_name.split("=")[1].split("-s")
        assert run.info.status == "FINISHED"
        assert run.data.params["model.init_args.net.init_args.activation"] == act
        assert run.data.params["seed_everything"] == seed
        assert run.data.params["trainer.max_epochs"] == "1"
        assert run.data.tags["sweep.point"] == f"activation={act}" and run.data.tags["sweep.name"] == "tiny"
        assert run.data.tags["sweep.seed"] == seed and run.data.tags["sweep.done"] == "test"
        assert {"test/acc", "val/acc", "train/loss"} <= set(run.data.metrics)
    ckpts = {
        p: p.stat().st_mtime_ns for p in (paperlab_tmp / "checkpoints/mlp_classifier").glob("tiny-*/*.ckpt")
    }
    assert len(ckpts) >= 4

    # Re-running the finished sweep runs nothing again.
    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0
    assert "4 skipped" in capsys.readouterr().out
    assert len(_children(pid)) == 4 and len(runs_of("mlp_classifier")) == 5
    assert {p: p.stat().st_mtime_ns for p in ckpts} == ckpts

    # compare: the table's numbers against values computed by hand from the MLflow client.
    from sweeps.compare import compare

    # val/loss: continuous, so that seeds differ (accuracies of tiny runs on 100 samples often tie).
    result = compare(client(), "mlp_classifier", "val/loss", by=["model.net.activation"], sweep="tiny")
    assert result.by == ["model.init_args.net.init_args.activation"] and result.mode == "min"
    for group in result.groups:
        (act,) = group.keys
        vals = np.array(
            [r.data.metrics["val/loss"] for r in kids if r.data.params["model.init_args.net.init_args.activation"] == act]
        )
        assert group.n == 2
        assert math.isclose(group.mean, vals.mean(), rel_tol=1e-12)
        assert math.isclose(group.std, vals.std(ddof=1), rel_tol=1e-9, abs_tol=1e-15)
        lo, hi = stats.t.interval(0.95, len(vals) - 1, loc=vals.mean(), scale=stats.sem(vals))
        assert vals.std() > 0, vals  # else the interval check below would be vacuous
        if vals.std() > 0:
            assert math.isclose(group.ci_low, lo, rel_tol=1e-9) and math.isclose(
                group.ci_high, hi, rel_tol=1e-9
            )
        assert group.best_value == vals.min()

    out_dir = paperlab_tmp / "cmp"
    assert (
        cli_main(
            [
                "compare",
                "--experiment",
                "mlp_classifier",
                "--sweep",
                "tiny",
                "--metric",
                "val/loss",
                "--by",
                "model.net.activation",
                "--out",
                str(out_dir),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    for group in result.groups:
        assert f"{group.mean:.4g}" in printed and group.best_run in printed
    png = out_dir / "val_loss_by_model.net.activation.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).ndim == 3
    with open(out_dir / "val_loss_by_model.net.activation.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model.init_args.net.init_args.activation"], float(r["mean"])) for r in rows] == [
        (g.keys[0], g.mean) for g in result.groups
    ]
    logged = {a.path for a in client().list_artifacts(pid, "compare")}
    assert {"compare/val_loss_by_model.net.activation.png", "compare/val_loss_by_model.net.activation.csv"} <= logged

    # --by seed as well: every run on its own.
    per_run = compare(client(), "mlp_classifier", "val/loss", by=["model.net.activation", "seed"], sweep="tiny")
    assert len(per_run.groups) == 4 and all(g.n == 1 and math.isnan(g.std) for g in per_run.groups)

    # A scatter of two quantities: Spearman's rho against ranks correlated by hand.
    assert (
        cli_main(
            [
                "compare",
                "--experiment",
                "mlp_classifier",
                "--sweep",
                "tiny",
                "--metric",
                "val/loss",
                "--x",
                "train/loss",
                "--by",
                "activation",
                "--out",
                str(out_dir),
            ]
        )
        == 0
    )
    assert "Spearman rho(train/loss, val/loss)" in capsys.readouterr().out
    assert (out_dir / "val_loss_vs_train_loss_by_model.net.activation.png").read_bytes()[:4] == b"\x89PNG"
    scatter = compare(client(), "mlp_classifier", "val/loss", sweep="tiny", x="train/loss")
    xs = [r.data.metrics["train/loss"] for r in kids]
    ys = [r.data.metrics["val/loss"] for r in kids]
    rx, ry = stats.rankdata(xs), stats.rankdata(ys)
    expected = np.corrcoef(rx, ry)[0, 1]
    assert math.isclose(scatter.spearman[0], expected, rel_tol=1e-9, abs_tol=1e-12)


def test_compare_rejects_an_unknown_key_with_a_suggestion(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = write_sweep(paperlab_tmp, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0
    capsys.readouterr()
    assert (
        cli_main(["compare", "--experiment", "mlp_classifier", "--metric", "val/acc", "--by", "activaton"])
        == 2
    )
    assert "did you mean 'model.net.activation'" in capsys.readouterr().err
    assert cli_main(["compare", "--experiment", "mlp_clasifier", "--metric", "val/acc"]) == 2
    assert "did you mean 'mlp_classifier'" in capsys.readouterr().err
    assert cli_main(["compare", "--experiment", "mlp_classifier", "--metric", "val/accc"]) == 2
    assert "did you mean 'val/acc'" in capsys.readouterr().err


# End to end (a real kill -9 of a real runner): the slow suite. The default suite's resume check of a killed sweep
# is tests/test_faults.py::test_a_rerun_adopts_an_untagged_finished_point_resumes_a_killed_one_and_compare_collapses_reruns,
# which leaves the store and the checkpoints as this kill leaves them and asserts the same outcome.
@pytest.mark.slow
def test_killed_sweep_resumes_without_rerunning_the_finished_point(paperlab_tmp: Path) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "CI": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "main.py"), "sweep", "--config", str(sweep), "--in-process"],
        cwd=paperlab_tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[1/2] FINISHED"):
                break
            assert time.monotonic() < deadline, "".join(lines[-30:])
        else:
            pytest.fail("the sweep ended before its first point finished:\n" + "".join(lines[-30:]))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # like a crash: nothing gets to clean up
        proc.wait(timeout=30)
    first = "tiny-activation=relu-s0"
    (done,) = [r for r in runs_of("mlp_classifier") if r.info.run_name == first]
    ckpt = paperlab_tmp / "checkpoints/mlp_classifier" / first / "last.ckpt"
    stamp = ckpt.stat().st_mtime_ns

    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0
    runs = runs_of("mlp_classifier")
    assert [r.info.run_id for r in runs if r.info.run_name == first] == [done.info.run_id]
    assert ckpt.stat().st_mtime_ns == stamp
    second = [r for r in runs if r.info.run_name == "tiny-activation=tanh-s0"]
    assert sorted(r.info.status for r in second)[-1] == "FINISHED"
    assert all(r.info.status in ("FINISHED", "KILLED") for r in second)  # a run cut by the kill is closed
    assert _parent("tiny").info.status == "FINISHED"


def _check_failure_isolated(paperlab_tmp: Path) -> None:
    runs = {r.info.run_name: r for r in runs_of("mlp_classifier")}
    good, bad = runs["tiny-lr=0.01-s0"], runs["tiny-lr=-1.0-s0"]
    assert good.info.status == "FINISHED" and "val/acc" in good.data.metrics
    assert good.data.tags["sweep.done"] == "fit"
    # The fit never got as far as opening a run: the sweep opened a FAILED one so that the UI shows it.
    assert bad.info.status == "FAILED" and "exited with code" in bad.data.tags["sweep.error"]
    assert bad.data.tags["mlflow.parentRunId"] == good.data.tags["mlflow.parentRunId"]
    assert bad.data.tags["sweep.point"] == "lr=-1.0"
    log = Path(
        client().download_artifacts(bad.info.run_id, "sweep/tiny-lr=-1.0-s0.log", str(paperlab_tmp / "dl"))
    )
    assert "Invalid learning rate: -1.0" in log.read_text() and "Traceback" not in log.read_text()
    assert _parent("tiny").info.status == "FAILED"


def test_a_failing_point_does_not_stop_the_others_and_sets_the_exit_code(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    # lr = -1 passes the parser (a float) and fails when the model builds its optimizer; the other point runs.
    sweep = write_sweep(paperlab_tmp, grid={"model.optimizer.lr": [-1.0, 0.01]}, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 1
    out = capsys.readouterr().out
    assert "1 finished" in out and "1 failed" in out
    _check_failure_isolated(paperlab_tmp)


@pytest.mark.slow
def test_workers_run_points_as_separate_processes_and_isolate_failures(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.optimizer.lr": [0.01, -1.0]}, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep), "--workers", "2"]) == 1
    out = capsys.readouterr().out
    assert "1 finished" in out and "1 failed" in out
    _check_failure_isolated(paperlab_tmp)


# --- speed: warm worker processes, the dry run's estimate, the last line ------------------------------------------

_KILLER = {"class_path": "tests.helpers.SignalAtStep", "init_args": {"step": 1, "signum": 9}}
_SWEEP_IN_A_PROCESS = """
import sys
from main import cli_main
rc = cli_main(sys.argv[1:])
print("HEAVY", sorted(m for m in ("torch", "lightning") if m in sys.modules))
sys.exit(rc)
"""


def test_workers_reuse_warm_processes_and_a_point_that_kills_its_worker_fails_alone(paperlab_tmp: Path) -> None:
    # three points on two workers; the second kills the process it runs in (kill -9 at its first step)
    sweep = write_sweep(paperlab_tmp, points=[{"model.optimizer.lr": 0.01},
                                              {"model.optimizer.lr": 0.02, "trainer.callbacks": [_KILLER]},
                                              {"model.optimizer.lr": 0.03}], seeds=[0], test=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CI": "1"}
    proc = subprocess.run([sys.executable, "-c", _SWEEP_IN_A_PROCESS, "sweep", "--config", str(sweep), "--workers", "2"],
                          cwd=paperlab_tmp, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:] + proc.stderr[-3000:]
    assert "2 finished" in out and "1 failed" in out
    # the sweep's own process checked the sweep and kept the books without importing torch or Lightning
    assert "HEAVY []" in out
    runs = {r.info.run_name: r for r in runs_of("mlp_classifier")}
    killed = next(r for name, r in runs.items() if "lr=0.02" in name)
    assert killed.info.status == "FAILED" and "exited with code -9" in killed.data.tags["sweep.error"]
    logs = paperlab_tmp / "checkpoints/mlp_classifier/_sweeps/tiny"
    assert "the sweep worker running this command died (exit status -9)" in (logs / f"{killed.info.run_name}.log").read_text()
    # every command ran in a worker; the five commands of the two good points (and the one that crashed)
    # ran in at most three processes: the two workers, and the one forked to replace the killed worker
    pids = [int(m) for p in logs.glob("*.log") for m in re.findall(r"# sweep worker pid (\d+)", p.read_text())]
    assert len(pids) == 5 and len(set(pids)) <= 3, pids
    for name, run in runs.items():
        if "lr=0.01" in name or "lr=0.03" in name:
            assert run.info.status == "FINISHED" and run.data.tags["sweep.done"] == "test"
            assert "test/acc" in run.data.metrics
    assert out.strip().splitlines()[-2].startswith("compare: python main.py compare --experiment mlp_classifier")


def test_dry_run_estimates_the_time_left_from_earlier_runs_of_the_same_points(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run"]) == 0
    assert "estimated time: unknown, no earlier finished run of these points" in capsys.readouterr().out
    assert cli_main(["sweep", "--config", str(sweep), "--in-process", "--point", "0"]) == 0
    capsys.readouterr()
    (done,) = [r for r in runs_of("mlp_classifier") if r.info.run_name == "tiny-activation=relu-s0"]
    seconds = (done.info.end_time - done.info.start_time) / 1000
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run", "--workers", "2"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("estimated time"))
    assert line.startswith("estimated time: 1 of 2 point(s) to run, about ")
    assert f"MLflow durations of 1 earlier run(s) of these points, median {seconds:.1f} s" in line
    # the same points with another seed: the earlier runs of the sweep still set the median
    write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0, 1])
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("estimated time"))
    assert line.startswith("estimated time: 3 of 4 point(s) to run") and "0 point(s) timed by their own" in line


def test_the_last_line_names_the_compare_command_and_the_mlflow_ui_page(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0], test=True)
    assert cli_main(["sweep", "--config", str(sweep), "--in-process"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    exp = client().get_experiment_by_name("mlp_classifier")
    command = ("python main.py compare --experiment mlp_classifier --sweep tiny --metric test/acc "
               "--by model.net.activation")
    ui = f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?workflowType=machine_learning"
    assert last == (f"compare: {command} | MLflow UI: {ui} "
                    f"(after: mlflow ui --backend-store-uri {os.environ['MLFLOW_TRACKING_URI']})")
    assert cli_main(command.split()[2:] + ["--no-log", "--out", str(paperlab_tmp / "cmp")]) == 0  # it runs
