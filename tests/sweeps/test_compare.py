"""compare on a hand-built MLflow store: nothing dropped or pooled silently, globs, history aggregates, paired
ratios to a baseline, correlations over group means and their leave-one-out robustness."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import numpy as np
import pytest
from scipy import stats

from main import cli_main
from sweeps.compare import compare, default_mode
from sweeps.spec import SweepError


def _store(tmp: Path) -> mlflow.MlflowClient:
    client = mlflow.MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")  # paperlab_tmp's store, MLFLOW_TRACKING_URI
    client.create_experiment("exp")
    return client


def _run(client, name: str, params: dict, metrics: dict, status: str = "FINISHED", dataset: str = "d1",
         history: dict | None = None) -> str:
    exp = client.get_experiment_by_name("exp").experiment_id
    run = client.create_run(exp, run_name=name, tags={"dataset": dataset})
    rid = run.info.run_id
    for k, v in params.items():
        client.log_param(rid, k, str(v))
    for k, v in metrics.items():
        client.log_metric(rid, k, v, step=0)
    for k, points in (history or {}).items():
        for step, v in points:
            client.log_metric(rid, k, v, step=step)
    client.set_terminated(rid, status)
    return rid


def test_runs_of_one_name_are_grouped_by_what_differs_and_nothing_is_dropped(paperlab_tmp: Path, capsys) -> None:
    client = _store(paperlab_tmp)
    for i, epochs in enumerate([2, 60, 60, 60, 2]):
        _run(client, "yinyang", {"trainer.max_epochs": epochs, "seed_everything": i}, {"test/acc": 0.5 + epochs / 100})
    _run(client, "yinyang", {"trainer.max_epochs": 60, "seed_everything": 9}, {"test/acc": 0.1}, status="FAILED")
    result = compare(client, "exp", "test/acc")
    assert result.auto_by == ["trainer.max_epochs"]
    assert {g.keys: g.n for g in result.groups} == {("2",): 2, ("60",): 3}
    assert result.excluded == {"status FAILED": 1}
    assert cli_main(["compare", "--experiment", "exp", "--metric", "test/acc", "--no-log",
                     "--out", str(paperlab_tmp / "c")]) == 0
    out = capsys.readouterr().out
    assert "grouped also by what differs between the runs: trainer.max_epochs" in out
    assert "left out: 1 run(s): status FAILED" in out


def test_runs_on_different_datasets_are_not_pooled_unless_asked(paperlab_tmp: Path) -> None:
    client = _store(paperlab_tmp)
    _run(client, "a", {"x": 1}, {"test/acc": 0.9}, dataset="digits")
    _run(client, "b", {"x": 1}, {"test/acc": 0.6}, dataset="yinyang")
    with pytest.raises(SweepError, match=r"2 datasets \(digits: 1, yinyang: 1\).*--by dataset"):
        compare(client, "exp", "test/acc")
    assert {g.keys for g in compare(client, "exp", "test/acc", by=["dataset"]).groups} == {("digits",), ("yinyang",)}
    assert compare(client, "exp", "test/acc", pool_datasets=True).groups[0].n == 2


def test_glob_metrics_history_aggregates_and_paired_ratios(paperlab_tmp: Path) -> None:
    client = _store(paperlab_tmp)
    rng = np.random.default_rng(0)
    values = {}
    for alpha in ("0.5", "1.0"):
        for seed in range(3):
            hist = [(s, float(rng.normal(1.0 if alpha == "1.0" else 0.4, 0.1))) for s in range(0, 100, 10)]
            values[(alpha, seed)] = hist
            _run(client, f"a{alpha}-s{seed}", {"model.init_args.alpha": alpha, "seed_everything": seed},
                 {"diag/l1/drift": seed * 0.1, "diag/l2/drift": -seed * 0.1}, history={"diag/var": hist})
    per_layer = compare(client, "exp", "diag/*/drift", by=["alpha"])
    assert per_layer.metrics == ["diag/l1/drift", "diag/l2/drift"] and len(per_layer.groups) == 4
    g = next(g for g in per_layer.groups if g.metric == "diag/l2/drift" and g.keys == ("1.0",))
    assert g.mean == pytest.approx(-0.1)

    agg = compare(client, "exp", "diag/var", by=["alpha"], agg="mean", steps="50:", baseline="alpha=1.0")
    for grp in agg.groups:
        a = grp.keys[0]
        means = [np.mean([v for s, v in values[(a, seed)] if s >= 50]) for seed in range(3)]
        assert grp.mean == pytest.approx(np.mean(means), rel=1e-12)
        ratios = [m / np.mean([v for s, v in values[("1.0", seed)] if s >= 50]) for seed, m in enumerate(means)]
        assert grp.ratio[0] == pytest.approx(np.mean(ratios)) and grp.ratio[3] == 3
        if a != "1.0":  # the baseline's own ratios are all 1: no spread
            lo, hi = stats.t.interval(0.95, 2, loc=np.mean(ratios), scale=stats.sem(ratios))
            assert (grp.ratio[1], grp.ratio[2]) == pytest.approx((lo, hi))
    assert next(g for g in agg.groups if g.keys == ("1.0",)).ratio[0] == pytest.approx(1.0)


def test_where_keeps_one_arm_and_says_so(paperlab_tmp: Path, capsys) -> None:
    client = _store(paperlab_tmp)
    for act in ("relu", "tanh"):
        for seed in range(2):
            _run(client, f"{act}-s{seed}", {"model.init_args.net.init_args.activation": act, "seed_everything": seed,
                                            "model.init_args.loss": "ce"},
                 {"diag/a/l1/sparsity": 0.5 + (seed if act == "relu" else -seed) * 0.1, "diag/a/l2/sparsity": 0.1})
    result = compare(client, "exp", "diag/a/*/sparsity", where=["model.net.activation=relu"])
    assert result.where == ["model.init_args.net.init_args.activation=relu"]
    assert {(g.metric, g.n) for g in result.groups} == {("diag/a/l1/sparsity", 2), ("diag/a/l2/sparsity", 2)}
    assert next(g for g in result.groups if g.metric == "diag/a/l1/sparsity").mean == pytest.approx(0.55)
    both = compare(client, "exp", "diag/a/l1/sparsity", where=["activation=relu", "loss=ce"])
    assert both.groups[0].n == 2 and len(both.where) == 2
    with pytest.raises(SweepError, match=r"no run left with .*activation = 'gelu' \(values: relu, tanh\)"):
        compare(client, "exp", "test/acc", where=["activation=gelu"])
    with pytest.raises(SweepError, match="KEY=VALUE"):
        compare(client, "exp", "diag/a/l1/sparsity", where=["activation"])
    assert cli_main(["compare", "--experiment", "exp", "--metric", "diag/a/l1/sparsity", "--where", "activation=tanh",
                     "--no-log", "--out", str(paperlab_tmp / "c")]) == 0
    out = capsys.readouterr().out
    assert "only the runs with model.net.activation=tanh" in out and "over 2 run(s)" in out


def test_divide_by_is_a_ratio_of_history_means_paired_by_seed(paperlab_tmp: Path, capsys) -> None:
    client = _store(paperlab_tmp)
    rng = np.random.default_rng(1)
    hist = {}
    for alpha in ("0.5", "1.0"):
        for seed in range(3):
            num = [(s, float(rng.uniform(1, 2))) for s in range(0, 100, 10)]
            den = [(s, float(rng.uniform(-0.2, 1.0))) for s in range(0, 100, 10)]  # single-step ratios blow up
            hist[(alpha, seed)] = (num, den)
            _run(client, f"a{alpha}-s{seed}", {"model.init_args.alpha": alpha, "seed_everything": seed}, {},
                 history={"gv/trace": num, "gv/g2": den})
    out = compare(client, "exp", "gv/trace", by=["alpha"], agg="mean", steps="30:", divide_by="gv/g2",
                  baseline="alpha=1.0")
    ratio = {k: np.mean([v for s, v in n if s >= 30]) / np.mean([v for s, v in d if s >= 30])
             for k, (n, d) in hist.items()}
    for grp in out.groups:
        a = grp.keys[0]
        assert sorted(grp.values) == pytest.approx(sorted(ratio[(a, s)] for s in range(3)), rel=1e-12)
        assert grp.ratio[0] == pytest.approx(np.mean([ratio[(a, s)] / ratio[("1.0", s)] for s in range(3)]))
    with pytest.raises(SweepError, match="did you mean 'gv/g2'"):
        compare(client, "exp", "gv/trace", divide_by="gv/g3")
    with pytest.raises(SweepError, match="not a glob"):
        compare(client, "exp", "gv/*", divide_by="gv/g2")
    assert cli_main(["compare", "--experiment", "exp", "--metric", "gv/trace", "--divide-by", "gv/g2",
                     "--agg", "mean", "--by", "alpha", "--no-log", "--out", str(paperlab_tmp / "c")]) == 0
    assert "gv/trace / gv/g2 (each the mean over its history)" in capsys.readouterr().out
    assert (paperlab_tmp / "c" / "gv_trace_per_gv_g2_by_model.alpha.csv").is_file()


def test_correlation_over_group_means_and_leave_one_out(paperlab_tmp: Path) -> None:
    client = _store(paperlab_tmp)
    rng = np.random.default_rng(1)
    arms = {"0.5": 1.0, "1.0": 2.0, "4.0": 8.0}
    rows = []
    for mean, x0 in arms.items():
        for std in ("0.2", "0.8"):
            for seed in range(2):
                x = x0 + float(std) + rng.normal(0, 0.1)
                y = 0.5 + 0.05 * x + rng.normal(0, 0.05)
                rows.append((mean, std, x, y))
                _run(client, f"m{mean}-s{std}-{seed}", {"model.init_args.init_mean": mean, "model.init_args.init_std": std,
                                                         "seed_everything": seed}, {"count": x, "test/acc": y})
    r = compare(client, "exp", "test/acc", by=["init_mean", "init_std"], x="count", x_per_group=True,
                leave_one_out="init_mean")
    cells = {}
    for mean, std, x, y in rows:
        cells.setdefault((mean, std), []).append((x, y))
    xs = [np.mean([c[0] for c in v]) for v in cells.values()]
    ys = [np.mean([c[1] for c in v]) for v in cells.values()]
    assert r.spearman[0] == pytest.approx(stats.spearmanr(xs, ys)[0])
    labels = {label: (rho, n) for label, rho, _, n in r.robustness}
    keep = [(m, s) for (m, s) in cells if m != "4.0"]
    rho_wo = stats.spearmanr([np.mean([c[0] for c in cells[k]]) for k in keep],
                             [np.mean([c[1] for c in cells[k]]) for k in keep])[0]
    key = "model.init_args.init_mean"
    assert labels[f"without {key}=4.0"][0] == pytest.approx(rho_wo) and labels[f"without {key}=4.0"][1] == 4
    assert labels[f"only {key}=0.5"][1] == 2 and math.isnan(labels[f"only {key}=0.5"][0])  # 2 points: undefined
    per_run = compare(client, "exp", "test/acc", by=["init_mean", "init_std"], x="count")
    assert per_run.spearman[0] == pytest.approx(stats.spearmanr([x for *_, x, _ in rows], [y for *_, y in rows])[0])


def test_bootstrap_interval_resamples_grid_points_not_seeds(paperlab_tmp: Path, capsys) -> None:
    """A perfectly monotone relation gives [1, 1]; noise gives an interval around rho about as wide as its
    sampling spread (SE ~ 1/sqrt(k - 1) for k points); seeds of one grid point stay together."""
    client = _store(paperlab_tmp)
    rng = np.random.default_rng(2)
    for i in range(12):
        for seed in range(2):
            _run(client, f"p{i}-{seed}", {"model.init_args.init_mean": i, "seed_everything": seed},
                 {"count": i + 0.01 * seed, "mono": i + 0.02 * seed, "noise": float(rng.normal())})
    mono = compare(client, "exp", "mono", by=["init_mean"], x="count", x_per_group=True, bootstrap=200)
    assert mono.bootstrap[:2] == pytest.approx((1.0, 1.0)) and mono.bootstrap[3] == 12
    noise = compare(client, "exp", "noise", by=["init_mean"], x="count", x_per_group=True, bootstrap=500)
    lo, hi, used, k = noise.bootstrap
    assert lo < noise.spearman[0] < hi and 0.5 < hi - lo < 1.6 and used == 500 and k == 12
    per_run = compare(client, "exp", "noise", by=["init_mean"], x="count", bootstrap=300)
    assert per_run.bootstrap[3] == 12  # the resampled unit is the grid point in per-run mode too
    with pytest.raises(SweepError, match="--x"):
        compare(client, "exp", "noise", by=["init_mean"], bootstrap=10)
    assert cli_main(["compare", "--experiment", "exp", "--metric", "mono", "--by", "init_mean", "--x", "count",
                     "--per-group", "--bootstrap", "100", "--no-log", "--out", str(paperlab_tmp / "c")]) == 0
    assert "95% bootstrap interval of rho, resampling the 12 grid points: [1.000, 1.000]" in capsys.readouterr().out


def test_spearman_p_is_exact_on_few_points() -> None:
    import itertools

    from scipy import stats

    from modules.components.stats import spearman as _spearman

    rho, p = _spearman([(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)])
    assert rho == pytest.approx(1.0) and p == pytest.approx(2 / 6)  # 2 of the 3! orders reach |rho| = 1
    rng = np.random.default_rng(0)
    xs, ys = list(rng.normal(size=6)), list(rng.normal(size=6))
    ys[1] = ys[4]  # a tie
    rho, p = _spearman(list(zip(xs, ys)))
    naive = [abs(stats.spearmanr(xs, perm)[0]) >= abs(rho) - 1e-12 for perm in itertools.permutations(ys)]
    assert p == pytest.approx(sum(naive) / len(naive))
    xs, ys = list(rng.normal(size=12)), list(rng.normal(size=12))  # beyond 8 points: scipy's approximation
    assert _spearman(list(zip(xs, ys)))[1] == pytest.approx(stats.spearmanr(xs, ys)[1])


def test_baseline_pairs_an_arm_whose_extra_setting_only_it_has(paperlab_tmp: Path) -> None:
    client = _store(paperlab_tmp)
    key = "model.init_args.net.init_args.activation"
    for seed in range(3):
        _run(client, f"relu-s{seed}", {key: "relu", "seed_everything": seed}, {"val/loss": 2.0 + seed})
        _run(client, f"relu2-s{seed}", {key: "relu2", "seed_everything": seed}, {"val/loss": 1.0 + seed})
        _run(client, f"clip-s{seed}", {key: "relu2_clip", "seed_everything": seed,
                                       "model.init_args.net.init_args.activation_args.clip": 4.0},
             {"val/loss": (2.0 + seed) * 1.5})
    result = compare(client, "exp", "val/loss", by=["activation"], baseline="activation=relu")
    assert result.auto_by == ["model.init_args.net.init_args.activation_args.clip"]
    ratio = {g.keys[0]: g.ratio for g in result.groups}
    assert ratio["relu2_clip"][0] == pytest.approx(1.5) and ratio["relu2_clip"][3] == 3
    assert ratio["relu2"][0] == pytest.approx(np.mean([1 / 2, 2 / 3, 3 / 4]))
    for seed in range(3):  # a second baseline arm that differs only in the extra key: which one is ambiguous
        _run(client, f"relu-clip-s{seed}", {key: "relu", "seed_everything": seed,
                                            "model.init_args.net.init_args.activation_args.clip": 2.0},
             {"val/loss": 9.0})
    with pytest.raises(SweepError, match="several baseline groups match"):
        compare(client, "exp", "val/loss", by=["activation"], baseline="activation=relu")


def test_baseline_gives_the_paired_difference_and_welch_test_printed_and_in_the_csv(paperlab_tmp: Path,
                                                                                    capsys) -> None:
    """--baseline: beside the paired ratio, each arm's difference to the baseline over the seeds both have (mean,
    95 % t-interval over the pairs, number of pairs) and Welch's unpaired t-test against the baseline's runs, by
    hand with scipy.stats.t. The arms share a large seed effect, so the paired interval is far narrower than the
    unpaired spread. At 600 steps the arms share seeds 1-4 of 0-5 (4 pairs); at 1800 steps one seed (one pair,
    no interval) and the baseline has a single run (no Welch test)."""
    import csv

    client = _store(paperlab_tmp)
    kernel, steps = "model.init_args.net.init_args.kernel", "trainer.max_steps"
    effect = [0.0, 0.3, 0.6, 0.9, 1.2, 1.5]  # what a seed does to both arms alike
    exp = {s: effect[s] + 0.50 + e for s, e in zip(range(0, 5), [0.01, -0.02, 0.015, 0.0, -0.01])}
    frac = {s: effect[s] + 0.55 + e for s, e in zip(range(1, 6), [0.02, -0.01, 0.0, 0.025, 0.01])}
    for arm, values in (("exp", exp), ("frac", frac)):
        for seed, v in values.items():
            _run(client, f"{arm}-600-s{seed}", {kernel: arm, steps: 600, "seed_everything": seed}, {"test/acc": v})
    _run(client, "exp-1800-s0", {kernel: "exp", steps: 1800, "seed_everything": 0}, {"test/acc": 0.9})
    _run(client, "frac-1800-s0", {kernel: "frac", steps: 1800, "seed_everything": 0}, {"test/acc": 0.95})
    _run(client, "frac-1800-s1", {kernel: "frac", steps: 1800, "seed_everything": 1}, {"test/acc": 0.97})

    result = compare(client, "exp", "test/acc", by=["kernel", "max_steps"], baseline="kernel=exp")
    groups = {g.keys: g for g in result.groups}
    diffs = [frac[s] - exp[s] for s in (1, 2, 3, 4)]
    mean = float(np.mean(diffs))
    lo, hi = stats.t.interval(0.95, len(diffs) - 1, loc=mean, scale=stats.sem(diffs))
    g = groups[("frac", "600")]
    assert g.difference[0] == pytest.approx(mean, rel=1e-12) and g.difference[3] == 4
    assert (g.difference[1], g.difference[2]) == pytest.approx((lo, hi), rel=1e-12)
    welch = stats.ttest_ind(list(frac.values()), list(exp.values()), equal_var=False)
    assert g.welch == pytest.approx((welch.statistic, welch.df, welch.pvalue), rel=1e-9)
    assert lo > 0 and g.welch[2] > 0.05  # pairing resolves a gap that the seed spread hides unpaired
    assert groups[("exp", "600")].difference == pytest.approx((0.0, 0.0, 0.0, 5))  # the baseline against itself
    one = groups[("frac", "1800")]
    assert one.difference[0] == pytest.approx(0.05) and one.difference[3] == 1 and math.isnan(one.difference[1])
    assert one.welch is None  # the baseline has one run: no variance

    out_dir = paperlab_tmp / "c"
    assert cli_main(["compare", "--experiment", "exp", "--metric", "test/acc", "--by", "kernel", "--by", "max_steps",
                     "--baseline", "kernel=exp", "--no-log", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "difference to model.net.kernel=exp (paired by seed)" in out
    assert f"{mean:+.4g} [{lo:+.4g}, {hi:+.4g}], 4 pairs" in out
    assert f"t = {welch.statistic:.3g}, df = {welch.df:.3g}, p = {welch.pvalue:.3g}" in out
    assert "+0.05, 1 pair" in out
    (table_csv,) = [p for p in out_dir.glob("*.csv") if not p.name.endswith("_runs.csv")]
    rows = {(r[kernel], r[steps]): r for r in csv.DictReader(table_csv.read_text().splitlines())}
    row = rows[("frac", "600")]
    assert [float(row[k]) for k in ("diff_mean", "diff_ci95_low", "diff_ci95_high")] == pytest.approx([mean, lo, hi])
    assert int(row["diff_pairs"]) == 4
    assert [float(row[k]) for k in ("welch_t", "welch_df", "welch_p")] == pytest.approx(
        [welch.statistic, welch.df, welch.pvalue])
    assert math.isnan(float(rows[("frac", "1800")]["welch_t"]))


@pytest.mark.parametrize(
    ("metric", "mode"),
    [("val/loss", "min"), ("test/bpb", "min"), ("val/barrier", "min"), ("test/kl/exact", "min"),
     ("diag/certificate/queries", "min"), ("test/time_to_target", "min"), ("test/acc", "max"),
     ("test/psnr", "max"), ("test/r2", "max"), ("train/skill", "max")],
)
def test_default_mode_knows_which_metrics_are_best_low(metric: str, mode: str) -> None:
    assert default_mode(metric) == mode
