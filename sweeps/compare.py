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


def load_runs(client: Any, experiment: str, sweep: str | None) -> tuple[list[Any], Any | None]:
    """The FINISHED runs to compare and the sweep's parent run (None without ``--sweep``).

    With ``--sweep`` (the parent's run id or the sweep's name) the parent's children; otherwise every run of
    the experiment except sweep parents. A point run twice (a re-run after a failure) counts once: the
    newest FINISHED run of each run name is kept.
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
    filter_string = "attributes.status = 'FINISHED'"
    if sweep:
        parent = _find_sweep(client, exp.experiment_id, sweep)
        filter_string += f" and tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=filter_string,
        run_view_type=ViewType.ACTIVE_ONLY,
        order_by=["attributes.start_time DESC"],
        max_results=50000,
    )
    newest: dict[str, Any] = {}
    for run in runs:
        if run.data.tags.get("sweep.role") == "parent":
            continue
        newest.setdefault(run.info.run_name or run.info.run_id, run)
    return list(newest.values()), parent


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


def compare(
    client: Any,
    experiment: str,
    metric: str,
    by: list[str] | None = None,
    sweep: str | None = None,
    x: str | None = None,
    mode: str | None = None,
) -> Comparison:
    """Group the runs, compute the statistics (see the module docstring); no files written."""
    runs, parent = load_runs(client, experiment, sweep)
    if not runs:
        raise SweepError(
            f"no FINISHED runs in experiment '{experiment}'" + (f" for sweep '{sweep}'" if sweep else "")
        )
    available = sorted({k for r in runs for k in (*r.data.params, *r.data.tags, *r.data.metrics)})
    metrics = sorted({k for r in runs for k in r.data.metrics})
    if metric not in metrics:
        close = difflib.get_close_matches(metric, metrics, n=1, cutoff=0.5)
        raise SweepError(
            f"no run logged the metric '{metric}'" + (f" (did you mean '{close[0]}'?)" if close else "")
        )
    by_keys = [resolve_key(k, available) for k in (by or [])]
    x_key = resolve_key(x, available) if x else None
    mode = mode or default_mode(metric)

    rows: list[Row] = []
    for run in runs:
        value = run.data.metrics.get(metric)
        if value is None or not math.isfinite(value):
            continue
        xv = None
        if x_key is not None:
            raw = _lookup(run, x_key)
            try:
                xv = float(raw) if raw is not None else None
            except ValueError as err:
                raise SweepError(f"--x {x_key} must be numeric, run {run.info.run_name} has {raw!r}") from err
        keys = tuple(str(_lookup(run, k)) for k in by_keys)
        rows.append(Row(run.info.run_id, run.info.run_name or run.info.run_id, keys, float(value), xv))
    if not rows:
        raise SweepError(f"no FINISHED run has a finite value of '{metric}'")

    buckets: dict[tuple[str, ...], list[Row]] = {}
    for row in rows:
        buckets.setdefault(row.keys, []).append(row)
    groups = []
    for keys in sorted(buckets, key=_sort_key):
        members = buckets[keys]
        best = (max if mode == "max" else min)(members, key=lambda r: r.value)
        mean, std, lo, hi = summarize([r.value for r in members])
        groups.append(
            Group(
                keys,
                [r.value for r in members],
                [r.run_name for r in members],
                best.run_name,
                best.value,
                mean,
                std,
                lo,
                hi,
            )
        )
    result = Comparison(
        metric, by_keys, rows, groups, mode, x_key, parent_id=parent.info.run_id if parent else None
    )
    if x_key is not None:
        pairs = [(r.x, r.value) for r in rows if r.x is not None and math.isfinite(r.x)]
        if len(pairs) >= 3:
            from scipy import stats

            rho, p = stats.spearmanr([a for a, _ in pairs], [b for _, b in pairs])
            result.spearman = (float(rho), float(p))
    return result


def _fmt(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def table(result: Comparison) -> str:
    """The comparison as aligned text."""
    head = [*(k for k in result.by), "n", "mean", "std", "95% CI", "best run", "best"]
    body = []
    for g in result.groups:
        ci = "-" if math.isnan(g.ci_low) else f"[{g.ci_low:.4g}, {g.ci_high:.4g}]"
        body.append([*g.keys, str(g.n), _fmt(g.mean), _fmt(g.std), ci, g.best_run, _fmt(g.best_value)])
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    lines = [f"{result.metric} ({result.mode} is best) over {len(result.rows)} run(s)"]
    lines.append("  ".join(str(h).ljust(w) for h, w in zip(head, widths)))
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in body]
    overall = (max if result.mode == "max" else min)(result.rows, key=lambda r: r.value)
    lines.append(
        f"best run: {overall.run_name} ({result.metric} = {overall.value:.4g}, run id {overall.run_id})"
    )
    if result.spearman is not None:
        rho, p = result.spearman
        lines.append(
            f"Spearman rho({result.x}, {result.metric}) = {rho:.3f} (p = {p:.3g}, n = {len(result.rows)})"
        )
    return "\n".join(lines)


def summary_csv(result: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([*result.by, "n", "mean", "std", "ci95_low", "ci95_high", "best_run", "best_value", "runs"])
    for g in result.groups:
        w.writerow(
            [
                *g.keys,
                g.n,
                repr(g.mean),
                repr(g.std),
                repr(g.ci_low),
                repr(g.ci_high),
                g.best_run,
                repr(g.best_value),
                json.dumps(g.runs),
            ]
        )
    return buf.getvalue()


def runs_csv(result: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["run_id", "run_name", *result.by, result.metric, *([result.x] if result.x else [])])
    for r in result.rows:
        w.writerow([r.run_id, r.run_name, *r.keys, repr(r.value), *([repr(r.x)] if result.x else [])])
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
    from callbacks.figures import figure_png

    out_dir.mkdir(parents=True, exist_ok=True)
    stem = slug(result.metric) + ("_vs_" + slug(result.x) if result.x else "")
    stem += "_by_" + "_".join(slug(_short(k)) for k in result.by) if result.by else ""
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
