"""A comparison as text and files: the table printed to the terminal (``table``), the CSVs (``summary_csv``
per group, ``runs_csv`` per run), the figure (``figure``) and the writing and logging of all three
(``write_outputs``, named with ``slug``).

matplotlib is imported inside the functions: a table alone does not need it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

from sweeps.comparison import Comparison, Group, Row, sort_key
from tracking.figures import figure_png, new_figure


def _fmt(v: float | None) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def short_label(key: str) -> str:
    return key.replace(".init_args.", ".")


def _paired(stat: tuple[float, float, float, int] | None, fmt: str) -> str:
    """A paired statistic's cell: ``mean [lo, hi], n pairs``, or ``mean, 1 pair`` (no interval), or ``-``."""
    if stat is None:
        return "-"
    mean, lo, hi, pairs = stat
    if math.isnan(lo):
        return f"{mean:{fmt}}, {pairs} pair"
    return f"{mean:{fmt}} [{lo:{fmt}}, {hi:{fmt}}], {pairs} pairs"


def _welch(stat: tuple[float, float, float] | None) -> str:
    return "-" if stat is None else f"t = {stat[0]:.3g}, df = {stat[1]:.3g}, p = {stat[2]:.3g}"


def table(result: Comparison) -> str:
    """The comparison as aligned text: what was compared, what was left out and why, one row per group."""
    many = len(result.metrics) > 1
    head = [*(["metric"] if many else []), *(short_label(k) for k in result.by), "n", "mean", "std", "95% CI"]
    if result.baseline:
        base = short_label(result.baseline)
        head += [f"ratio to {base} (paired by seed)", f"difference to {base} (paired by seed)",
                 f"Welch's t-test vs {base}"]
    head += ["best run", "best"]
    body = []
    for g in result.groups:
        ci = "-" if math.isnan(g.ci_low) else f"[{g.ci_low:.4g}, {g.ci_high:.4g}]"
        row = [*([g.metric] if many else []), *g.keys, str(g.n), _fmt(g.mean), _fmt(g.std), ci]
        if result.baseline:
            # the difference signed and with the table's precision: pages quote it as a gap, "+0.09 [-0.26, 0.44]"
            row += [_paired(g.ratio, ".3g"), _paired(g.difference, "+.4g"), _welch(g.welch)]
        body.append([*row, g.best_run, _fmt(g.best_value)])
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    what = result.metric if result.agg == "last" else f"{result.metric} ({result.agg} over its history)"
    if result.divide_by:
        what = (f"{result.metric} / {result.divide_by}" if result.agg == "last" else
                f"{result.metric} / {result.divide_by} (each the {result.agg} over its history)")
    n_runs = len({r.run_id for r in result.rows})
    lines = [f"{what} ({result.mode} is best) over {n_runs} run(s)"]
    if result.where:
        lines.append("only the runs with " + ", ".join(map(short_label, result.where)))
    if result.auto_by:
        lines.append("grouped also by what differs between the runs: " + ", ".join(map(short_label, result.auto_by)))
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
    baseline_cols = [
        "ratio_mean", "ratio_ci95_low", "ratio_ci95_high", "ratio_pairs",
        "diff_mean", "diff_ci95_low", "diff_ci95_high", "diff_pairs",
        "welch_t", "welch_df", "welch_p",
    ] if result.baseline else []
    w.writerow(["metric", *result.by, "n", "mean", "std", "ci95_low", "ci95_high", *baseline_cols, "best_run",
                "best_value", "runs"])
    nan = math.nan
    for g in result.groups:
        vs_baseline = [repr(v) for v in (*(g.ratio or (nan, nan, nan, 0)), *(g.difference or (nan, nan, nan, 0)),
                                         *(g.welch or (nan, nan, nan)))] if result.baseline else []
        w.writerow([g.metric, *g.keys, g.n, repr(g.mean), repr(g.std), repr(g.ci_low), repr(g.ci_high),
                    *vs_baseline, g.best_run, repr(g.best_value), json.dumps(g.runs)])
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
    fig, ax = new_figure(figsize=(6.4, 4.2))
    if len(result.metrics) > 1:  # one category per metric (per layer, ...), one series per group
        series: dict[tuple[str, ...], list[Group]] = {}
        for g in result.groups:
            series.setdefault(g.keys, []).append(g)
        names = list(result.metrics)
        for i, (keys, groups) in enumerate(series.items()):
            xs = [names.index(g.metric) for g in groups]
            err = [0.0 if math.isnan(g.ci_high) else g.ci_high - g.mean for g in groups]
            label = ", ".join(f"{short_label(k)}={v}" for k, v in zip(result.by, keys)) or None
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
        for i, (keys, members) in enumerate(sorted(by_group.items(), key=lambda kv: sort_key(kv[0]))):
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
            ax.legend(fontsize=8, title=", ".join(short_label(k) for k in result.by))
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
            label = ", ".join(f"{short_label(k)}={v}" for k, v in zip(result.by[1:], rest)) or None
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
        ax.set_xlabel(short_label(result.by[0]) if result.by else "")
        if len(series) > 1:
            ax.legend(fontsize=8)
        ax.set_title(f"{result.metric}: mean and 95% interval over runs", fontsize=10)
    ax.set_ylabel(result.metric)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")


def write_outputs(
    client: Any, result: Comparison, out_dir: Path, log_to_parent: bool = True
) -> dict[str, Path]:
    """Write ``<stem>.png``, ``<stem>.csv`` (the table), ``<stem>_runs.csv``; log them to the parent run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = slug(result.metric.replace("*", "all")) + ("_per_" + slug(result.divide_by) if result.divide_by else "")
    stem += "_vs_" + slug(result.x) if result.x else ""
    named = [k for k in result.by if k not in result.auto_by]
    stem += "_by_" + "_".join(slug(short_label(k)) for k in named) if named else ""
    png = figure_png(figure(result))
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
