"""Compare runs from MLflow without a browser: a table over seeds, a figure, a CSV (artifacts of the sweep).

For a metric ``m`` and grouping keys ``k_1..k_j`` (params such as ``model.init_args.activation``), the runs
are grouped by their values of the keys; each group reports ``n``, the mean ``\\bar m``, the sample standard
deviation ``s`` (``ddof = 1``), the 95% interval of the mean ``\\bar m \\pm t_{0.975, n-1} s / \\sqrt n``
(Student's t: a handful of seeds is far from normal asymptotics) and its best run. Every other difference
between the runs of a group (typically the seed) is what the statistics are taken over; ``--by seed`` as
well lists every run on its own.

With ``--x q`` (a metric or a numeric param, for example a diagnostic at initialisation) the figure is a
scatter of ``m`` against ``q`` over runs, with Spearman's rank correlation ``\\rho`` and its p-value.
"""

from __future__ import annotations

import csv
import difflib
import fnmatch
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps.spec import SweepError

SEED_KEY = "seed_everything"


@dataclass
class Row:
    run_id: str
    run_name: str
    keys: tuple[str, ...]
    value: float
    x: float | None = None
    metric: str = ""
    seed: str = ""


@dataclass
class Group:
    keys: tuple[str, ...]
    values: list[float]
    runs: list[str]
    best_run: str
    best_value: float
    mean: float
    std: float
    ci_low: float
    ci_high: float
    metric: str = ""
    ratio: tuple[float, float, float, int] | None = None  # paired ratio to the baseline: mean, lo, hi, pairs

    @property
    def n(self) -> int:
        return len(self.values)


@dataclass
class Comparison:
    metric: str
    by: list[str]
    rows: list[Row]
    groups: list[Group]
    mode: str
    x: str | None = None
    spearman: tuple[float, float] | None = None
    files: dict[str, Path] = field(default_factory=dict)
    parent_id: str | None = None
    metrics: list[str] = field(default_factory=list)
    agg: str = "last"
    auto_by: list[str] = field(default_factory=list)
    excluded: dict[str, int] = field(default_factory=dict)
    baseline: str | None = None
    robustness: list[tuple[str, float, float, int]] = field(default_factory=list)
    x_unit: str = "runs"
    where: list[str] = field(default_factory=list)
    bootstrap: tuple[float, float, int, int] | None = None  # rho's 95% interval, resamples used, grid points
    divide_by: str | None = None


def summarize(values: list[float]) -> tuple[float, float, float, float]:
    """Mean, sample std and the 95% Student-t interval of the mean (std and interval are NaN for n = 1)."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.975, n - 1)) * std / math.sqrt(n)
    return mean, std, mean - half, mean + half


def default_mode(metric: str) -> str:
    return "min" if re.search(r"loss|err|nll|perplexity|ppl|mse|mae", metric, re.I) else "max"


def resolve_key(key: str, available: list[str]) -> str:
    """A ``--by`` key as a run's param/tag key: exact, then without ``init_args``, then a unique suffix.

    ``model.net.activation`` and ``activation`` both find ``model.init_args.net.init_args.activation``;
    ``seed`` finds ``seed_everything``.
    """
    if key in available:
        return key
    if key == "seed" and SEED_KEY in available:
        return SEED_KEY
    plain = {k.replace(".init_args.", "."): k for k in available}
    if key in plain:
        return plain[key]
    suffix = [
        k for k in available if k.endswith("." + key) or k.replace(".init_args.", ".").endswith("." + key)
    ]
    if len(set(suffix)) == 1:
        return suffix[0]
    if len(set(suffix)) > 1:
        raise SweepError(f"'{key}' is ambiguous: {', '.join(sorted(set(suffix))[:6])}")
    # suggest in the short form a user types, matching the whole key or its last component
    short = {k.replace(".init_args.", "."): k for k in available}
    close = difflib.get_close_matches(key, list(short), n=1, cutoff=0.5)
    if not close:
        by_leaf = {s.rsplit(".", 1)[-1]: s for s in short}
        leaf = difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_leaf), n=1, cutoff=0.75)
        close = [by_leaf[leaf[0]]] if leaf else []
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise SweepError(f"no run has a param or metric '{key}'{hint}")


def _sort_key(keys: tuple[str, ...]) -> tuple:
    out = []
    for k in keys:
        try:
            out.append((0, float(k), ""))
        except ValueError:
            out.append((1, 0.0, k))
    return tuple(out)


# Params that control a run, not what it computes: runs that differ only in these are replicates.
RUN_CONTROL = re.compile(
    r"^(seed_everything|run\..*|diagnostics.*|trainer\.(callbacks|logger|enable_progress_bar|enable_model_summary|"
    r"default_root_dir|log_every_n_steps|enable_checkpointing|num_sanity_val_steps|limit_test_batches|"
    r"limit_predict_batches).*)$"
)


def load_runs(client: Any, experiment: str, sweep: str | None) -> tuple[list[Any], Any | None, dict[str, int]]:
    """The runs to compare, the sweep's parent run (None without ``--sweep``), and what was left out and why.

    With ``--sweep`` (the parent's run id or the sweep's name) the parent's children; otherwise every run of
    the experiment except sweep parents. Only FINISHED runs count; the others are counted by status. Within
    a sweep a point run twice counts once (its newest FINISHED run); outside one, every run counts.
    """
    from mlflow.entities import ViewType

    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        close = difflib.get_close_matches(experiment, names, n=1, cutoff=0.5)
        hint = (
            f" (did you mean '{close[0]}'?)" if close else f"; experiments: {', '.join(sorted(names)[:12])}"
        )
        raise SweepError(f"no MLflow experiment '{experiment}'{hint}")
    parent = None
    filter_string = ""
    if sweep:
        parent = _find_sweep(client, exp.experiment_id, sweep)
        filter_string = f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=filter_string,
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time DESC"],
        max_results=50000,
    )
    excluded: dict[str, int] = {}
    kept: dict[str, Any] = {}
    for run in runs:
        if run.data.tags.get("sweep.role") == "parent":
            continue
        if run.info.status != "FINISHED":
            excluded[f"status {run.info.status}"] = excluded.get(f"status {run.info.status}", 0) + 1
            continue
        name = run.info.run_name or run.info.run_id
        if sweep and name in kept:
            excluded["an older run of the same sweep point"] = excluded.get("an older run of the same sweep point", 0) + 1
            continue
        kept[name if sweep else run.info.run_id] = run
    return list(kept.values()), parent, excluded


def _find_sweep(client: Any, experiment_id: str, sweep: str) -> Any:
    from mlflow.entities import ViewType

    if re.fullmatch(r"[0-9a-f]{32}", sweep):
        return client.get_run(sweep)
    runs = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`sweep.name` = '{sweep}' and tags.`sweep.role` = 'parent'",
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        parents = client.search_runs(
            [experiment_id],
            filter_string="tags.`sweep.role` = 'parent'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=100,
        )
        names = sorted({r.data.tags.get("sweep.name", "") for r in parents})
        raise SweepError(
            f"no sweep '{sweep}' in this experiment" + (f"; sweeps: {', '.join(names)}" if names else "")
        )
    return runs[0]


def _lookup(run: Any, key: str) -> str | float | None:
    if key in run.data.params:
        return run.data.params[key]
    if key in run.data.metrics:
        return run.data.metrics[key]
    return run.data.tags.get(key)


AGGREGATES = ("last", "mean", "min", "max")


def parse_steps(text: str | None) -> tuple[float, float]:
    """``"A:B"`` (either side may be empty) -> the inclusive step range."""
    if not text:
        return -math.inf, math.inf
    lo, sep, hi = text.partition(":")
    if not sep:
        raise SweepError(f"--steps takes A:B (for example 500: or 100:900), got {text!r}")
    try:
        return (float(lo) if lo else -math.inf), (float(hi) if hi else math.inf)
    except ValueError:
        raise SweepError(f"--steps takes integers A:B, got {text!r}") from None


def run_value(client: Any, run: Any, metric: str, agg: str, steps: tuple[float, float]) -> float | None:
    """The run's value of ``metric``: its last logged value, or the mean/min/max of its history in ``steps``."""
    if agg == "last" and steps == (-math.inf, math.inf):
        return run.data.metrics.get(metric)
    history = [m for m in client.get_metric_history(run.info.run_id, metric) if steps[0] <= m.step <= steps[1]]
    values = [m.value for m in history if math.isfinite(m.value)]
    if not values:
        return None
    if agg == "last":
        return max(history, key=lambda m: (m.step, m.timestamp)).value
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}[agg]


EXACT_P_MAX_N = 8  # up to 8! = 40320 permutations: exact p-values are cheap


def _spearman(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Spearman's rho and its two-sided p-value: exact (all permutations) for n <= EXACT_P_MAX_N, where
    scipy's t approximation is wrong (it gives p = 0 for rho = 1 on 3 points; the exact value is 1/3)."""
    from scipy import stats

    if len(pairs) < 3 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2:
        return None
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    rho, p = stats.spearmanr(xs, ys)
    if len(pairs) <= EXACT_P_MAX_N:
        p = _exact_spearman_p(xs, ys, float(rho))
    return float(rho), float(p)


def _exact_spearman_p(xs: list[float], ys: list[float], rho: float) -> float:
    """P(|rho| >= |observed|) over every permutation of the y ranks (ties keep their average ranks)."""
    import itertools

    import numpy as np
    from scipy import stats

    rx = stats.rankdata(xs) - (len(xs) + 1) / 2
    ry = stats.rankdata(ys) - (len(ys) + 1) / 2
    perms = np.array(list(itertools.permutations(ry)))
    rhos = perms @ rx / math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))


def compare(
    client: Any,
    experiment: str,
    metric: str,
    by: list[str] | None = None,
    sweep: str | None = None,
    x: str | None = None,
    mode: str | None = None,
    agg: str = "last",
    steps: str | None = None,
    baseline: str | None = None,
    x_per_group: bool = False,
    leave_one_out: str | None = None,
    pool_datasets: bool = False,
    where: list[str] | None = None,
    bootstrap: int = 0,
    divide_by: str | None = None,
) -> Comparison:
    """Group the runs, compute the statistics (see the module docstring); no files written.

    ``metric`` may be a glob (``diag/weight_drift/*/drift``): every matching metric is compared, a table row
    per (metric, group). ``agg``/``steps`` summarise each run's history instead of taking its last value.
    ``baseline`` (``key=value``) adds each group's ratio to that group, paired by seed. With ``x``,
    ``x_per_group`` correlates the group means (seeds averaged) instead of runs, and ``leave_one_out`` (a
    key) recomputes Spearman's rho leaving out each value of that key, and within each value. ``where``
    (``key=value`` items, all must hold) keeps only the runs with those param/tag values, for a table of one
    arm of a sweep (the table says so). ``bootstrap``
    (a number of resamples) adds a 95% percentile interval of rho from resampling the groups (grid points)
    with replacement: a resampled group brings its mean (``x_per_group``) or all its runs, so seeds of one
    grid point are never treated as independent points. ``divide_by``
    (a metric) divides each run's value by its value of that metric, summarised the same way: with
    ``agg="mean"`` a ratio of means (a noise scale over a phase is mean tr(Sigma) / mean |G|^2, not the mean
    of single-step ratios, whose noisy denominators make them heavy-tailed).
    """
    if agg not in AGGREGATES:
        raise SweepError(f"--agg must be one of {AGGREGATES}, got {agg!r}")
    step_range = parse_steps(steps)
    runs, parent, excluded = load_runs(client, experiment, sweep)
    if not runs:
        raise SweepError(
            f"no FINISHED runs in experiment '{experiment}'" + (f" for sweep '{sweep}'" if sweep else "")
            + (f" ({', '.join(f'{n} {k}' for k, n in excluded.items())})" if excluded else "")
        )
    available = sorted({k for r in runs for k in (*r.data.params, *r.data.tags, *r.data.metrics)})
    runs, where_keys = _select(runs, where or [], available)
    all_metrics = sorted({k for r in runs for k in r.data.metrics})
    metrics = [m for m in all_metrics if fnmatch.fnmatchcase(m, metric)] if any(c in metric for c in "*?[") else (
        [metric] if metric in all_metrics else []
    )
    if not metrics:
        close = difflib.get_close_matches(metric, all_metrics, n=1, cutoff=0.5)
        raise SweepError(
            f"no run logged the metric '{metric}'" + (f" (did you mean '{close[0]}'?)" if close else "")
        )
    if divide_by is not None:
        if len(metrics) > 1 or any(c in metric for c in "*?["):
            raise SweepError("--divide-by takes one --metric, not a glob")
        if divide_by not in all_metrics:
            close = difflib.get_close_matches(divide_by, all_metrics, n=1, cutoff=0.5)
            raise SweepError(f"no run logged the metric '{divide_by}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    by_keys = [resolve_key(k, available) for k in (by or [])]
    x_key = resolve_key(x, available) if x else None
    mode = mode or default_mode(metrics[0])

    # Runs on different datasets are never pooled silently.
    datasets = {str(r.data.tags.get("dataset", "?")) for r in runs}
    if len(datasets) > 1 and "dataset" not in by_keys and not pool_datasets:
        counts = {d: sum(r.data.tags.get("dataset", "?") == d for r in runs) for d in sorted(datasets)}
        raise SweepError(
            f"the runs are on {len(datasets)} datasets ({', '.join(f'{d}: {n}' for d, n in counts.items())}); "
            "add --by dataset, choose a sweep with --sweep, or pass --pool-datasets to pool them anyway"
        )
    # Runs whose configs differ in more than the compared keys are not replicates: they get their own groups.
    auto_by = []
    for key in sorted({k for r in runs for k in r.data.params}):
        if key in by_keys or RUN_CONTROL.match(key):
            continue
        if len({r.data.params.get(key) for r in runs}) > 1:
            auto_by.append(key)
    group_keys = by_keys + auto_by

    rows: list[Row] = []
    missing = 0
    for run in runs:
        xv = None
        if x_key is not None:
            raw = _lookup(run, x_key)
            try:
                xv = float(raw) if raw is not None else None
            except ValueError as err:
                raise SweepError(f"--x {x_key} must be numeric, run {run.info.run_name} has {raw!r}") from err
        keys = tuple(str(_lookup(run, k)) for k in group_keys)
        seed = str(run.data.params.get(SEED_KEY, ""))
        for m in metrics:
            value = run_value(client, run, m, agg, step_range)
            if divide_by is not None and value is not None:
                den = run_value(client, run, divide_by, agg, step_range)
                value = value / den if den is not None and math.isfinite(den) and den != 0 else None
            if value is None or not math.isfinite(value):
                missing += 1
                continue
            rows.append(Row(run.info.run_id, run.info.run_name or run.info.run_id, keys, float(value), xv, m, seed))
    if missing:
        what = metric + (f" / {divide_by}" if divide_by else "")
        excluded[f"no finite value of {what}" + (f" ({agg} over steps {steps})" if steps else "")] = missing
    if not rows:
        raise SweepError(f"no FINISHED run has a finite value of '{metric}'")

    buckets: dict[tuple[str, tuple[str, ...]], list[Row]] = {}
    for row in rows:
        buckets.setdefault((row.metric, row.keys), []).append(row)
    groups = []
    for m, keys in sorted(buckets, key=lambda mk: (mk[0], _sort_key(mk[1]))):
        members = buckets[(m, keys)]
        best = (max if mode == "max" else min)(members, key=lambda r: r.value)
        mean, std, lo, hi = summarize([r.value for r in members])
        groups.append(Group(keys, [r.value for r in members], [r.run_name for r in members], best.run_name,
                            best.value, mean, std, lo, hi, metric=m))
    result = Comparison(
        metric, group_keys, rows, groups, mode, x_key, parent_id=parent.info.run_id if parent else None,
        metrics=metrics, agg=agg if (agg != "last" or steps) else "last", auto_by=auto_by, excluded=excluded,
        where=where_keys, divide_by=divide_by,
    )
    if baseline:
        _add_ratios(result, baseline)
    if bootstrap and x_key is None:
        raise SweepError("--bootstrap resamples a correlation: give --x too")
    if x_key is not None:
        _correlate(result, x_per_group, leave_one_out, bootstrap)
    return result


def _select(runs: list[Any], where: list[str], available: list[str]) -> tuple[list[Any], list[str]]:
    """The runs whose param/tag ``key`` equals ``value`` for every ``key=value`` in ``where``."""
    labels = []
    for item in where:
        key, sep, want = item.partition("=")
        if not sep:
            raise SweepError(f"--where takes KEY=VALUE (for example model.net.activation=relu), got {item!r}")
        full = resolve_key(key, available)
        values = sorted({str(_lookup(r, full)) for r in runs})
        runs = [r for r in runs if str(_lookup(r, full)) == want]
        if not runs:
            raise SweepError(f"--where {item}: no run left with {full} = {want!r} (values: {', '.join(values)})")
        labels.append(f"{full}={want}")
    return runs, labels


def _add_ratios(result: Comparison, baseline: str) -> None:
    """Each group's values divided by the baseline group's, paired by seed (same metric).

    The partner of a group is the baseline group that agrees with it on every other grouping key; failing
    that, on the other keys the user grouped by: a key compare added because it differs between the runs
    (``activation_args`` set only for a clipped activation) often varies with the compared arm itself.
    """
    key, sep, want = baseline.partition("=")
    if not sep:
        raise SweepError(f"--baseline takes KEY=VALUE (for example model.alpha=1.0), got {baseline!r}")
    full = resolve_key(key, result.by) if result.by else key
    if full not in result.by:
        raise SweepError(f"--baseline {key}: group by it too (--by {key})")
    i = result.by.index(full)
    result.baseline = f"{full}={want}"
    if not any(r.keys[i] == want for r in result.rows):
        raise SweepError(f"--baseline {baseline}: no run has {full} = {want!r} (values: "
                         f"{sorted({r.keys[i] for r in result.rows})})")
    others = [j for j in range(len(result.by)) if j != i]
    named = [j for j in others if result.by[j] not in result.auto_by]
    for g in result.groups:
        candidates = [r for r in result.rows if r.metric == g.metric and r.keys[i] == want]
        ref = [r for r in candidates if all(r.keys[j] == g.keys[j] for j in others)]
        if not ref:
            ref = [r for r in candidates if all(r.keys[j] == g.keys[j] for j in named)]
            if len({r.keys for r in ref}) > 1:
                keys = ", ".join(_short_label(result.by[j]) for j in others if j not in named)
                raise SweepError(f"--baseline {baseline}: several baseline groups match {g.keys} (they differ in "
                                 f"{keys}); add --by or --where for it")
        ref_by_seed = {r.seed: r.value for r in ref}
        mine = [r for r in result.rows if r.metric == g.metric and r.keys == g.keys]
        ratios = [r.value / ref_by_seed[r.seed] for r in mine if r.seed in ref_by_seed and ref_by_seed[r.seed] != 0]
        if ratios:
            mean, _, lo, hi = summarize(ratios)
            g.ratio = (mean, lo, hi, len(ratios))


def _correlate(result: Comparison, per_group: bool, leave_one_out: str | None, bootstrap: int = 0) -> None:
    """Spearman's rho of the metric against ``x``: over runs, or over group means; and its robustness."""
    rows = [r for r in result.rows if r.x is not None and math.isfinite(r.x) and r.metric == result.metrics[0]]

    def points(subset: list[Row]) -> list[tuple[float, float]]:
        if not per_group:
            return [(r.x, r.value) for r in subset]
        cells: dict[tuple[str, ...], list[Row]] = {}
        for r in subset:
            cells.setdefault(r.keys, []).append(r)
        return [(sum(r.x for r in c) / len(c), sum(r.value for r in c) / len(c)) for c in cells.values()]

    result.x_unit = "group means (seeds averaged)" if per_group else "runs"
    result.spearman = _spearman(points(rows))
    if leave_one_out:
        key = resolve_key(leave_one_out, result.by) if result.by else leave_one_out
        if key not in result.by:
            raise SweepError(f"--leave-one-out {leave_one_out}: group by it too (--by {leave_one_out})")
        i = result.by.index(key)
        for value in sorted({r.keys[i] for r in rows}, key=lambda v: _sort_key((v,))):
            without, within = [r for r in rows if r.keys[i] != value], [r for r in rows if r.keys[i] == value]
            for label, subset in ((f"without {key}={value}", without), (f"only {key}={value}", within)):
                rho = _spearman(points(subset))
                pts = len(points(subset))
                result.robustness.append((label, *(rho if rho else (math.nan, math.nan)), pts))
    if bootstrap:
        result.bootstrap = _bootstrap_groups(rows, per_group, bootstrap)


def _bootstrap_groups(rows: list[Row], per_group: bool, resamples: int, seed: int = 0):
    """Percentile 95% interval of Spearman's rho over ``resamples`` resamples of the groups with replacement
    (numpy ``default_rng(seed)``); resamples whose rho is undefined (a constant side) are skipped."""
    import numpy as np
    from scipy import stats

    cells: dict[tuple[str, ...], list[Row]] = {}
    for r in rows:
        cells.setdefault(r.keys, []).append(r)
    groups = list(cells.values())
    if len(groups) < 3:
        raise SweepError(f"--bootstrap needs at least 3 groups (grid points), got {len(groups)}")
    if per_group:
        pts = [[(sum(r.x for r in c) / len(c), sum(r.value for r in c) / len(c))] for c in groups]
    else:
        pts = [[(r.x, r.value) for r in c] for c in groups]
    rng = np.random.default_rng(seed)
    rhos = []
    for _ in range(resamples):
        sample = [p for i in rng.integers(0, len(groups), len(groups)) for p in pts[i]]
        xs, ys = zip(*sample)
        if len(set(xs)) > 1 and len(set(ys)) > 1:
            rhos.append(float(stats.spearmanr(xs, ys)[0]))
    if not rhos:
        return None
    lo, hi = np.percentile(rhos, [2.5, 97.5])
    return float(lo), float(hi), len(rhos), len(groups)


def _fmt(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def _short_label(key: str) -> str:
    return key.replace(".init_args.", ".")


def table(result: Comparison) -> str:
    """The comparison as aligned text: what was compared, what was left out and why, one row per group."""
    many = len(result.metrics) > 1
    head = [*(["metric"] if many else []), *(_short_label(k) for k in result.by), "n", "mean", "std", "95% CI"]
    if result.baseline:
        head += [f"ratio to {_short_label(result.baseline)} (paired by seed)"]
    head += ["best run", "best"]
    body = []
    for g in result.groups:
        ci = "-" if math.isnan(g.ci_low) else f"[{g.ci_low:.4g}, {g.ci_high:.4g}]"
        row = [*([g.metric] if many else []), *g.keys, str(g.n), _fmt(g.mean), _fmt(g.std), ci]
        if result.baseline:
            row.append("-" if g.ratio is None else (
                f"{g.ratio[0]:.3g} [{g.ratio[1]:.3g}, {g.ratio[2]:.3g}], {g.ratio[3]} pairs"
                if not math.isnan(g.ratio[1]) else f"{g.ratio[0]:.3g}, {g.ratio[3]} pair"))
        body.append([*row, g.best_run, _fmt(g.best_value)])
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    what = result.metric if result.agg == "last" else f"{result.metric} ({result.agg} over its history)"
    if result.divide_by:
        what = (f"{result.metric} / {result.divide_by}" if result.agg == "last" else
                f"{result.metric} / {result.divide_by} (each the {result.agg} over its history)")
    n_runs = len({r.run_id for r in result.rows})
    lines = [f"{what} ({result.mode} is best) over {n_runs} run(s)"]
    if result.where:
        lines.append("only the runs with " + ", ".join(map(_short_label, result.where)))
    if result.auto_by:
        lines.append("grouped also by what differs between the runs: " + ", ".join(map(_short_label, result.auto_by)))
    if result.excluded:
        lines.append("left out: " + "; ".join(f"{n} run(s): {why}" for why, n in result.excluded.items()))
    lines.append("  ".join(str(h).ljust(w) for h, w in zip(head, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in body]
    if not many:
        overall = (max if result.mode == "max" else min)(result.rows, key=lambda r: r.value)
        lines.append(
            f"best run: {overall.run_name} ({result.metric} = {overall.value:.4g}, run id {overall.run_id})"
        )
    if result.spearman is not None:
        rho, p = result.spearman
        n_pts = len({r.keys for r in result.rows}) if result.x_unit != "runs" else len(
            [r for r in result.rows if r.x is not None and r.metric == result.metrics[0]])
        lines.append(
            f"Spearman rho({result.x}, {result.metrics[0]}) = {rho:.3f} (p = {p:.3g}, n = {n_pts} {result.x_unit})"
        )
    if result.bootstrap is not None:
        lo, hi, used, k = result.bootstrap
        lines.append(f"  95% bootstrap interval of rho, resampling the {k} grid points: [{lo:.3f}, {hi:.3f}] "
                     f"({used} resamples)")
    for label, rho, p, n in result.robustness:
        lines.append(f"  {label}: rho = {rho:.3f} (p = {p:.3g}, n = {n})" if not math.isnan(rho)
                     else f"  {label}: rho undefined (n = {n})")
    return "\n".join(lines)


def summary_csv(result: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    ratio_cols = ["ratio_mean", "ratio_ci95_low", "ratio_ci95_high", "ratio_pairs"] if result.baseline else []
    w.writerow(["metric", *result.by, "n", "mean", "std", "ci95_low", "ci95_high", *ratio_cols, "best_run",
                "best_value", "runs"])
    for g in result.groups:
        ratio = [repr(v) for v in (g.ratio or (math.nan, math.nan, math.nan, 0))] if result.baseline else []
        w.writerow([g.metric, *g.keys, g.n, repr(g.mean), repr(g.std), repr(g.ci_low), repr(g.ci_high), *ratio,
                    g.best_run, repr(g.best_value), json.dumps(g.runs)])
    return buf.getvalue()


def runs_csv(result: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["run_id", "run_name", "metric", *result.by, "value", *([result.x] if result.x else [])])
    for r in result.rows:
        w.writerow([r.run_id, r.run_name, r.metric, *r.keys, repr(r.value), *([repr(r.x)] if result.x else [])])
    return buf.getvalue()


def _numeric(labels: list[str]) -> list[float] | None:
    try:
        return [float(v) for v in labels]
    except ValueError:
        return None


def figure(result: Comparison) -> Any:
    """Metric against the first ``--by`` value (mean and 95% interval), one line per value of the others;
    with ``--x``, a scatter of the metric against ``x`` with Spearman's rho."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    if len(result.metrics) > 1:  # one category per metric (per layer, ...), one series per group
        series: dict[tuple[str, ...], list[Group]] = {}
        for g in result.groups:
            series.setdefault(g.keys, []).append(g)
        names = list(result.metrics)
        for i, (keys, groups) in enumerate(series.items()):
            xs = [names.index(g.metric) for g in groups]
            err = [0.0 if math.isnan(g.ci_high) else g.ci_high - g.mean for g in groups]
            label = ", ".join(f"{_short(k)}={v}" for k, v in zip(result.by, keys)) or None
            ax.errorbar(xs, [g.mean for g in groups], yerr=err, fmt="o", capsize=3, color=f"C{i % 10}", label=label)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=6)
        ax.axhline(0.0, color="k", lw=0.5)
        if len(series) > 1:
            ax.legend(fontsize=7)
        ax.set_title(f"{result.metric}: mean and 95% interval over runs", fontsize=10)
        ax.set_ylabel(result.metric)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        return fig
    if result.x is not None:
        by_group: dict[tuple[str, ...], list[Row]] = {}
        for r in result.rows:
            if r.x is not None:
                by_group.setdefault(r.keys, []).append(r)
        for i, (keys, members) in enumerate(sorted(by_group.items(), key=lambda kv: _sort_key(kv[0]))):
            ax.scatter(
                [r.x for r in members],
                [r.value for r in members],
                color=f"C{i % 10}",
                s=28,
                label=", ".join(keys) or None,
            )
        ax.set_xlabel(result.x)
        title = f"{result.metric} vs {result.x}"
        if result.spearman is not None:
            title += f"\nSpearman $\\rho$ = {result.spearman[0]:.3f} (p = {result.spearman[1]:.2g})"
        ax.set_title(title, fontsize=10)
        if result.by:
            ax.legend(fontsize=8, title=", ".join(_short(k) for k in result.by))
    else:
        series: dict[tuple[str, ...], list[Group]] = {}
        for g in result.groups:
            series.setdefault(g.keys[1:], []).append(g)
        first_values = list(dict.fromkeys(g.keys[0] for g in result.groups)) if result.by else ["all"]
        numeric = _numeric(first_values) if result.by else None
        positions = dict(zip(first_values, numeric if numeric else range(len(first_values))))
        # Series side by side on a categorical axis, so that their error bars do not hide each other.
        dodge = 0.0 if numeric or len(series) == 1 else 0.25 / (len(series) - 1)
        for i, (rest, groups) in enumerate(series.items()):
            shift = (i - (len(series) - 1) / 2) * dodge
            xs = [positions[g.keys[0]] + shift if result.by else 0 for g in groups]
            ys = [g.mean for g in groups]
            err = [0.0 if math.isnan(g.ci_high) else g.ci_high - g.mean for g in groups]
            label = ", ".join(f"{_short(k)}={v}" for k, v in zip(result.by[1:], rest)) or None
            ax.errorbar(
                xs, ys, yerr=err, fmt="o-" if numeric else "o", capsize=4, color=f"C{i % 10}", label=label
            )
            for g, xv in zip(groups, xs):  # every run, so that the spread behind the interval is visible
                ax.scatter([xv] * g.n, g.values, color=f"C{i % 10}", alpha=0.35, s=12)
        if numeric and min(numeric) > 0 and max(numeric) / min(numeric) >= 100:
            ax.set_xscale("log")  # learning rates, widths, init scales: orders of magnitude apart
        if not numeric:
            ax.set_xticks(
                list(positions.values()),
                list(positions.keys()),
                rotation=30 if len(first_values) > 5 else 0,
                ha="right" if len(first_values) > 5 else "center",
            )
        ax.set_xlabel(_short(result.by[0]) if result.by else "")
        if len(series) > 1:
            ax.legend(fontsize=8)
        ax.set_title(f"{result.metric}: mean and 95% interval over runs", fontsize=10)
    ax.set_ylabel(result.metric)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _short(key: str) -> str:
    return key.replace(".init_args.", ".")


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def write_outputs(
    client: Any, result: Comparison, out_dir: Path, log_to_parent: bool = True
) -> dict[str, Path]:
    """Write ``<stem>.png``, ``<stem>.csv`` (the table), ``<stem>_runs.csv``; log them to the parent run."""
    from tracking.figures import figure_png

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = slug(result.metric.replace("*", "all")) + ("_per_" + slug(result.divide_by) if result.divide_by else "")
    stem += "_vs_" + slug(result.x) if result.x else ""
    named = [k for k in result.by if k not in result.auto_by]
    stem += "_by_" + "_".join(slug(_short(k)) for k in named) if named else ""
    fig = figure(result)
    try:
        png = figure_png(fig)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    files = {
        "figure": out_dir / f"{stem}.png",
        "csv": out_dir / f"{stem}.csv",
        "runs_csv": out_dir / f"{stem}_runs.csv",
    }
    files["figure"].write_bytes(png)
    files["csv"].write_text(summary_csv(result))
    files["runs_csv"].write_text(runs_csv(result))
    if log_to_parent and result.parent_id:
        for path in files.values():
            client.log_artifact(result.parent_id, str(path), artifact_path="compare")
    result.files = files
    return files
