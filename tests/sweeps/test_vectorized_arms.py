"""A sweep's ``vectorize_arms``: points that differ only in their optimizer's hyperparameters and seed train as
one stack of rows (``fit --run.rows``) and leave the runs the plain sweep leaves, which ``compare`` reads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from main import cli_main
from sweeps.runner import SweepPlan
from sweeps.spec import Point, SweepSpec
from tests.helpers import client
from tests.sweeps.common import BASE, write_sweep
from tests.sweeps.test_vectorized import EXACT, _history, _sweep_runs

LR = "model.init_args.optimizer.init_args.lr"
ACT = "model.init_args.net.init_args.activation"


def _plan(arms: bool) -> SweepPlan:
    spec = SweepSpec(name="g", base=BASE, grid={ACT: ["relu", "tanh"], LR: [0.01, 0.03]}, seeds=[0, 1],
                     vectorize_seeds=True, vectorize_arms=arms)
    points = []
    for act in ("relu", "tanh"):
        for lr in (0.01, 0.03):
            for seed in (0, 1):
                label = f"activation={act}-lr={lr}"
                values = {ACT: act, LR: lr}
                points.append(Point(len(points), label, values, {"trainer.max_epochs": 1, **values}, seed,
                                    f"g-{label}-s{seed}"))
    return SweepPlan(spec=spec, points=points, experiment="e", checkpoint_root=Path("ck"), tracking_uri="sqlite://")


def test_vectorize_arms_puts_points_that_differ_in_optimizer_hyperparameters_and_seed_into_one_job() -> None:
    seeds_only, arms = _plan(False), _plan(True)
    assert [[p.index for p in job] for job in seeds_only.jobs(seeds_only.points)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    jobs = arms.jobs(arms.points)
    assert [[p.index for p in job] for job in jobs] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # one per activation
    assert [arms.group_name(job[0]) for job in jobs] == ["g-activation=relu-arms", "g-activation=tanh-arms"]
    assert arms.group_name(jobs[0][3]) == arms.group_name(jobs[0][0])  # any point of a job names it
    args = arms.seeds_fit_args(jobs[0][1:], "PARENT")
    rows = __import__("json").loads(args[args.index("--run.rows") + 1])
    assert [(r["seed"], r["name"], r["overrides"]) for r in rows] == [
        (1, "g-activation=relu-lr=0.01-s1", {LR: 0.01}), (0, "g-activation=relu-lr=0.03-s0", {LR: 0.03}),
        (1, "g-activation=relu-lr=0.03-s1", {LR: 0.03})]
    assert rows[0]["tags"]["sweep.point"] == "activation=relu-lr=0.01" and rows[0]["tags"]["sweep.seed"] == "1"
    assert f"--{LR}" not in args and f"--{ACT}" in args and "--seed_everything" not in args  # rows carry the lr
    assert args[args.index("--run.name") + 1] == "g-activation=relu-arms"


def test_the_dry_run_shows_the_arms_grouping(paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.optimizer.init_args.lr": [0.01, 0.03]}, seeds=[0, 1])
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run", "--vectorize-arms"]) == 0
    out = capsys.readouterr().out
    fits = [line for line in out.splitlines() if line.startswith("python main.py fit")]
    assert len(fits) == 1 and "--run.rows" in fits[0] and "--run.seeds" not in fits[0]
    assert "# tiny-base-arms (points 0, 1, 2, 3)" in out and "vectorize_arms" in out


@pytest.mark.slow  # two sweeps of 4 points and a compare: about 15 s
def test_a_sweep_of_arms_in_one_process_leaves_the_runs_of_the_plain_sweep(paperlab_tmp: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    fields = {"grid": {"model.optimizer.init_args.lr": [0.01, 0.03]}, "seeds": [0, 1], "test": True,
              "overrides": EXACT}
    assert cli_main(["sweep", "--config", str(write_sweep(paperlab_tmp, name="plain", **fields)), "--in-process"]) == 0
    assert cli_main(["sweep", "--config", str(write_sweep(paperlab_tmp, name="arms", vectorize_arms=True, **fields)),
                     "--in-process"]) == 0
    assert "4 finished" in capsys.readouterr().out
    log_dir = paperlab_tmp / "checkpoints/mlp_classifier/_sweeps/arms"
    assert [p.name for p in log_dir.glob("*.log")] == ["arms-base-arms.log"]  # one process for the 4 points
    a, b = _sweep_runs("plain"), _sweep_runs("arms")
    assert sorted(a) == sorted(b) == ["lr=0.01-s0", "lr=0.01-s1", "lr=0.03-s0", "lr=0.03-s1"]
    naming = ("run.tags.sweep.name", "run.tags.sweep.index", "run.parent_run_id")
    for key in a:
        ra, rb = a[key], b[key]
        assert rb.info.status == "FINISHED" and rb.data.tags["sweep.done"] == "test"
        assert {k: v for k, v in ra.data.params.items() if k not in naming} == \
            {k: v for k, v in rb.data.params.items() if k not in naming}
        assert rb.data.params[LR] == key[3:7]
        assert set(ra.data.metrics) == set(rb.data.metrics)
        for metric in ra.data.metrics:
            ha, hb = _history(ra.info.run_id, metric), _history(rb.info.run_id, metric)
            assert [s for s, _ in ha] == [s for s, _ in hb], metric
            for (_, va), (_, vb) in zip(ha, hb):
                assert math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-12), (key, metric, va, vb)
    assert cli_main(["compare", "--experiment", "mlp_classifier", "--sweep", "arms", "--metric", "test/acc",
                     "--by", "model.optimizer.lr", "--no-log", "--out", str(paperlab_tmp / "c")]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("0.0")}
    assert rows == {"0.01": "2", "0.03": "2"}  # each arm a group of its two seeds' runs

    # a killed stack of arms resumes from its last.ckpt into the same runs
    ids = [b[k].info.run_id for k in sorted(b)]
    for run_id in ids:
        client().set_terminated(run_id, "KILLED")
    assert cli_main(["sweep", "--config", str(paperlab_tmp / "arms.yaml"), "--in-process"]) == 0
    assert "4 finished" in capsys.readouterr().out
    assert "--ckpt_path last" in (log_dir / "arms-base-arms.log").read_text()
    again = _sweep_runs("arms")
    assert [again[k].info.run_id for k in sorted(again)] == ids
