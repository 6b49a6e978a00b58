"""Compare runs from MLflow without a browser: a table over seeds, a figure, a CSV (artifacts of the sweep).

For a metric ``m`` and grouping keys ``k_1..k_j`` (params such as ``model.init_args.activation``), the runs
are grouped by their values of the keys; each group reports ``n``, the mean ``\\bar m``, the sample standard
deviation ``s`` (``ddof = 1``), the 95% interval of the mean ``\\bar m \\pm t_{0.975, n-1} s / \\sqrt n``
(Student's t: a handful of seeds is far from normal asymptotics) and its best run. Every other difference
between the runs of a group (typically the seed) is what the statistics are taken over; ``--by seed`` as
well lists every run on its own.

With ``--x q`` (a metric or a numeric param, for example a diagnostic at initialisation) the figure is a
scatter of ``m`` against ``q`` over runs, with Spearman's rank correlation ``\\rho`` and its p-value.

This file holds the ``compare`` function, which groups the runs and fills in a ``Comparison``
(``sweeps/comparison.py``); the runs come from ``sweeps/load.py``, the numbers from ``modules/components/stats.py``,
and ``sweeps/output.py`` prints and draws the result.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from typing import Any

from modules.components.stats import (
    bootstrap_spearman,
    mean_point,
    paired_difference,
    paired_ratio,
    spearman,
    summarize,
    welch,
)
from sweeps.comparison import Comparison, Group, Row, sort_key
from sweeps.load import (
    AGGREGATES,
    RUN_CONTROL,
    SEED_KEY,
    load_runs,
    lookup,
    parse_steps,
    resolve_key,
    run_value,
    select_runs,
)
from sweeps.output import short_label
from sweeps.spec import SweepError

# Metrics where lower is better: losses and errors, bits per byte/char, barriers, divergences, times, counts of
# queries or violations. Anything else (accuracy, PSNR, R^2, throughput) is best at its maximum.
LOWER_IS_BETTER = re.compile(
    r"loss|err|nll|perplexity|ppl|mse|mae|bpb|bpc|barrier|(^|[/_])kl($|[/_])|divergence|seconds|time_to|"
    r"queries|violation|regret",
    re.I,
)


def default_mode(metric: str) -> str:
    """``min`` for a metric where lower is better (by its name), else ``max``; ``--mode`` overrides it."""
    return "min" if LOWER_IS_BETTER.search(metric) else "max"


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
    ``baseline`` (``key=value``) adds each group's ratio and difference to that group, paired by seed (the
    mean and 95% interval over the seeds both have), and Welch's unpaired t-test against it. With ``x``,
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
    runs, where_keys = select_runs(runs, where or [], available)
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
            raw = lookup(run, x_key)
            try:
                xv = float(raw) if raw is not None else None
            except ValueError as err:
                raise SweepError(f"--x {x_key} must be numeric, run {run.info.run_name} has {raw!r}") from err
        keys = tuple(str(lookup(run, k)) for k in group_keys)
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
    for m, keys in sorted(buckets, key=lambda mk: (mk[0], sort_key(mk[1]))):
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
        _add_baseline_comparisons(result, baseline)
    if bootstrap and x_key is None:
        raise SweepError("--bootstrap resamples a correlation: give --x too")
    if x_key is not None:
        _correlate(result, x_per_group, leave_one_out, bootstrap)
    return result


def _add_baseline_comparisons(result: Comparison, baseline: str) -> None:
    """Each group against the baseline group (same metric): its values divided by and minus the baseline's,
    paired by seed (``paired_ratio``, ``paired_difference``), and Welch's t-test of the two groups' means over
    all their runs, unpaired (``welch``).

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
                keys = ", ".join(short_label(result.by[j]) for j in others if j not in named)
                raise SweepError(f"--baseline {baseline}: several baseline groups match {g.keys} (they differ in "
                                 f"{keys}); add --by or --where for it")
        ref_by_seed = {r.seed: r.value for r in ref}
        mine = [r for r in result.rows if r.metric == g.metric and r.keys == g.keys]
        pairs = [(r.seed, r.value) for r in mine]
        g.ratio = paired_ratio(pairs, ref_by_seed)
        g.difference = paired_difference(pairs, ref_by_seed)
        g.welch = welch([r.value for r in mine], [r.value for r in ref])


def _cells(rows: list[Row]) -> list[list[Row]]:
    """The runs of each grid point (group keys), in the order the points first appear."""
    cells: dict[tuple[str, ...], list[Row]] = {}
    for r in rows:
        cells.setdefault(r.keys, []).append(r)
    return list(cells.values())


def _correlate(result: Comparison, per_group: bool, leave_one_out: str | None, bootstrap: int = 0) -> None:
    """Spearman's rho of the metric against ``x``: over runs, or over group means; and its robustness."""
    rows = [r for r in result.rows if r.x is not None and math.isfinite(r.x) and r.metric == result.metrics[0]]

    def points(subset: list[Row]) -> list[tuple[float, float]]:
        if not per_group:
            return [(r.x, r.value) for r in subset]
        return [mean_point([(r.x, r.value) for r in c]) for c in _cells(subset)]

    result.x_unit = "group means (seeds averaged)" if per_group else "runs"
    result.spearman = spearman(points(rows))
    if leave_one_out:
        key = resolve_key(leave_one_out, result.by) if result.by else leave_one_out
        if key not in result.by:
            raise SweepError(f"--leave-one-out {leave_one_out}: group by it too (--by {leave_one_out})")
        i = result.by.index(key)
        for value in sorted({r.keys[i] for r in rows}, key=lambda v: sort_key((v,))):
            without, within = [r for r in rows if r.keys[i] != value], [r for r in rows if r.keys[i] == value]
            for label, subset in ((f"without {key}={value}", without), (f"only {key}={value}", within)):
                rho = spearman(points(subset))
                pts = len(points(subset))
                result.robustness.append((label, *(rho if rho else (math.nan, math.nan)), pts))
    if bootstrap:
        result.bootstrap = _bootstrap_groups(rows, per_group, bootstrap)


def _bootstrap_groups(
    rows: list[Row], per_group: bool, resamples: int, seed: int = 0
) -> tuple[float, float, int, int] | None:
    """``bootstrap_spearman`` with the groups (grid points) as the clusters: a resampled group brings its mean
    (``per_group``) or all its runs."""
    groups = _cells(rows)
    if len(groups) < 3:
        raise SweepError(f"--bootstrap needs at least 3 groups (grid points), got {len(groups)}")
    if per_group:
        pts = [[mean_point([(r.x, r.value) for r in c])] for c in groups]
    else:
        pts = [[(r.x, r.value) for r in c] for c in groups]
    return bootstrap_spearman(pts, resamples, seed)
