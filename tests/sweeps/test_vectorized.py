"""A sweep's ``vectorize_seeds``: a point's seeds train as one seed-parallel fit (``--run.seeds``) and leave the
runs the plain sweep leaves: the same names, params, tags, metric histories and checkpoints, under the sweep's
parent run, skipped and rerun per seed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from main import cli_main
from modules.mlp_classifier import MLPClassifier
from tests.helpers import REPO, client, runs_of
from tests.sweeps.common import write_sweep

# float64 (docs/design.md, "Seed-parallel runs"): a float32 ReLU net parts from its plain twin by rounding
EXACT = {"trainer.precision": "64-true", "trainer.limit_train_batches": 3}
# run controls and what names the sweep: they differ between the two sweeps by construction
NAMING = ("run.tags.sweep.name", "run.tags.sweep.index", "run.parent_run_id", "run.seeds", "run.seed_runs")


def _sweep_runs(name: str) -> dict[str, object]:
    runs = runs_of("mlp_classifier")
    (parent,) = [r for r in runs if r.data.tags.get("sweep.name") == name and r.data.tags.get("sweep.role") == "parent"]
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    # the newest run of each name (a rerun's, after a killed one)
    return {r.info.run_name.removeprefix(f"{name}-"): r for r in sorted(kids, key=lambda r: r.info.start_time)}


def _history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client().get_metric_history(run_id, key)]


@pytest.mark.slow  # 15 s: two sweeps, a resume and a refit; the dry run and the refusal below stay fast
def test_a_vectorized_sweep_leaves_the_runs_of_the_plain_sweep(paperlab_tmp: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    fields = {"grid": {"model.net.activation": ["relu", "tanh"]}, "seeds": [0, 1], "test": True, "overrides": EXACT}
    plain = write_sweep(paperlab_tmp, name="plain", **fields)
    vector = write_sweep(paperlab_tmp, name="vector", vectorize_seeds=True, **fields)
    assert cli_main(["sweep", "--config", str(plain), "--in-process"]) == 0
    assert cli_main(["sweep", "--config", str(vector), "--in-process"]) == 0
    out = capsys.readouterr().out
    assert "4 finished" in out

    # one process per swept value, not per seed: two seed-parallel fits, each with its seeds' runs
    log_dir = paperlab_tmp / "checkpoints/mlp_classifier/_sweeps/vector"
    assert sorted(p.name for p in log_dir.glob("*.log")) == ["vector-activation=relu.log", "vector-activation=tanh.log"]
    assert "--run.seeds '[0, 1]'" in (log_dir / "vector-activation=relu.log").read_text()
    # no '<name> seeds' run: the children hang under the sweep's parent directly
    assert not [r for r in runs_of("mlp_classifier") if r.info.run_name.endswith(" seeds")]

    a, b = _sweep_runs("plain"), _sweep_runs("vector")
    assert sorted(a) == sorted(b) == ["activation=relu-s0", "activation=relu-s1", "activation=tanh-s0",
                                      "activation=tanh-s1"]
    for key in a:
        ra, rb = a[key], b[key]
        assert ra.info.status == rb.info.status == "FINISHED"
        pa = {k: v for k, v in ra.data.params.items() if k not in NAMING}
        pb = {k: v for k, v in rb.data.params.items() if k not in NAMING}
        assert pa == pb
        for tag in ("sweep.point", "sweep.seed", "sweep.done"):
            assert ra.data.tags[tag] == rb.data.tags[tag], tag
        assert rb.data.tags["sweep.name"] == "vector" and rb.data.tags["sweep.done"] == "test"
        assert set(ra.data.metrics) == set(rb.data.metrics)
        assert {"test/acc", "test/loss", "val/acc_best"} <= set(rb.data.metrics)
        for metric in ra.data.metrics:
            ha, hb = _history(ra.info.run_id, metric), _history(rb.info.run_id, metric)
            assert [s for s, _ in ha] == [s for s, _ in hb], metric
            for (_, va), (_, vb) in zip(ha, hb):
                assert math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-12), (key, metric, va, vb)
        folder = paperlab_tmp / "checkpoints/mlp_classifier" / f"vector-{key}"
        assert (folder / "last.ckpt").is_file() and list(folder.glob("best-epoch*.ckpt"))

    # a killed stack resumes from its last.ckpt into the same runs
    relu = [b[f"activation=relu-s{s}"].info.run_id for s in (0, 1)]
    for run_id in relu:
        client().set_terminated(run_id, "KILLED")
    assert cli_main(["sweep", "--config", str(vector), "--in-process"]) == 0
    assert "2 finished, 2 skipped" in capsys.readouterr().out
    assert "--ckpt_path last" in (log_dir / "vector-activation=relu.log").read_text()
    resumed = _sweep_runs("vector")
    assert [resumed[f"activation=relu-s{s}"].info.run_id for s in (0, 1)] == relu
    assert all(resumed[f"activation=relu-s{s}"].info.status == "FINISHED" for s in (0, 1))

    # a seed killed alone (its stack's other seed finished) is fitted again, alone, into a new run
    killed = b["activation=tanh-s1"].info.run_id
    client().set_terminated(killed, "KILLED")
    assert cli_main(["sweep", "--config", str(vector), "--in-process"]) == 0
    out = capsys.readouterr().out
    assert "1 finished, 3 skipped" in out
    assert "--run.seeds '[1]'" in (log_dir / "vector-activation=tanh.log").read_text()
    again = _sweep_runs("vector")
    assert again["activation=tanh-s1"].info.run_id != killed and again["activation=tanh-s1"].info.status == "FINISHED"
    assert again["activation=relu-s0"].info.run_id == b["activation=relu-s0"].info.run_id


def test_vectorize_seeds_is_refused_at_validation_for_a_task_that_is_not_vectorizable(
        paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = paperlab_tmp / "nv.yaml"
    sweep.write_text(f"base: {REPO / 'configs/m_sync_sgd/quadratic_exp.yaml'}\nseeds: [0, 1]\nvectorize_seeds: true\n")
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run"]) == 101
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not vectorizable" in err[0] and "drop vectorize_seeds" in err[0], err


class HookedClassifier(MLPClassifier):
    """Vectorizable by its flag, but with a fit hook of its own, which a stack of seeds would not run."""

    def on_train_start(self) -> None:
        pass


def test_vectorize_seeds_refuses_what_the_fit_would_refuse_for_the_task_class() -> None:
    """The sweep's check is the fit's own (``seed_parallel.stack.task_class_refusal``): a task that overrides a
    fit hook is refused when the sweep is checked, not when its first fit starts."""
    from sweeps.spec import not_vectorizable

    assert not_vectorizable({"model": {"class_path": "modules.mlp_classifier.MLPClassifier"}}) is None
    why = not_vectorizable({"model": {"class_path": f"{__name__}.HookedClassifier"}})
    assert why is not None and "HookedClassifier overrides on_train_start" in why


def test_the_command_line_flag_vectorizes_and_the_dry_run_prints_one_fit_per_point(
        paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0, 1, 2])
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run", "--vectorize-seeds"]) == 0
    out = capsys.readouterr().out
    fits = [line for line in out.splitlines() if line.startswith("python main.py fit")]
    assert len(fits) == 2 and all("--run.seeds '[0, 1, 2]'" in f and "--run.seed_runs" in f for f in fits)
