"""Analyses over MLflow runs: ``python -m modules.mono_barrier slope --sweep scaling``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from errors import ConfigError
from modules.mono_barrier.task import MonotoneBarrierModule


def fit_loglog(n: Sequence[float], q: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of log q = a + k log n over the runs: the slope k, its 95 % interval (t quantile over
    runs - 2 degrees of freedom), a, and R^2."""
    from scipy import stats

    x, y = np.log(np.asarray(n, dtype=float)), np.log(np.asarray(q, dtype=float))
    if len(x) < 3 or np.ptp(x) == 0:
        raise ConfigError(f"a slope needs runs at 2 or more values of n and 3 or more runs, got {len(x)}")
    res = stats.linregress(x, y)
    half = float(stats.t.ppf(0.975, len(x) - 2) * res.stderr)
    return {"slope": float(res.slope), "slope_lo": float(res.slope) - half, "slope_hi": float(res.slope) + half,
            "intercept": float(res.intercept), "r2": float(res.rvalue**2), "runs": float(len(x))}


def slope_analysis(sweep: str, metric: str = "diag/certificate/queries", tracking_uri: str | None = None,
                   experiment: str = "mono_barrier") -> dict[str, float]:
    """Read the FINISHED certified child runs of sweep ``sweep`` (newest per run name), fit the log-log slope of
    ``metric`` against ``data.init_args.n`` and log it as a run ``slope <sweep>`` of the experiment (params: the
    sweep, its parent run, the metric; metrics: the fit; table: the runs used)."""
    import mlflow

    from tracking.analysis_run import finished_sweep_runs
    from tracking.uri import default_tracking_uri

    client = mlflow.MlflowClient(tracking_uri or default_tracking_uri())
    parent_id, children = finished_sweep_runs(client, experiment, sweep)
    rows: dict[str, dict[str, float]] = {}
    for run in children:
        name = run.info.run_name or run.info.run_id
        if metric not in run.data.metrics:
            continue
        n = run.data.params.get("data.init_args.n")
        if n is None:
            continue
        rows[name] = {"n": float(n), metric.rsplit("/", 1)[-1]: float(run.data.metrics[metric]),
                      "certified": float(run.data.metrics.get("diag/certificate/certified", float("nan"))),
                      "seed": float(run.data.params.get("seed_everything", "nan"))}
    used = [r for r in rows.values() if r["certified"] == 1.0]
    key = metric.rsplit("/", 1)[-1]
    fit = fit_loglog([r["n"] for r in used], [r[key] for r in used])
    fit["uncertified_runs"] = float(len(rows) - len(used))
    from tracking.analysis_run import analysis_run, log_metrics

    tags = {"analysis": "slope", "paper": MonotoneBarrierModule.paper_id, "method": experiment}
    params = {"sweep": sweep, "sweep_parent": parent_id, "metric": metric, "x": "data.init_args.n"}
    with analysis_run(client, experiment, f"slope {sweep}", tags, params) as run_id:
        log_metrics(client, run_id, {f"slope/{k}": v for k, v in fit.items()})
        client.log_dict(run_id, {"runs": sorted(used, key=lambda r: (r["n"], r["seed"]))}, "tables/slope_runs.json")
    fit["run_id"] = run_id  # type: ignore[assignment]
    return fit


def main(argv: list[str]) -> int:
    from tracking.analysis_run import sweep_analysis_main

    def describe(fit: dict[str, float], sweep: str, metric: str) -> str:
        return (f"log-log slope of {metric} against n over {int(fit['runs'])} certified runs of sweep {sweep!r}: "
                f"{fit['slope']:.4g} [{fit['slope_lo']:.4g}, {fit['slope_hi']:.4g}] (95 %), R^2 {fit['r2']:.4f}, "
                f"{int(fit['uncertified_runs'])} uncertified runs left out; MLflow run {fit['run_id']}")

    return sweep_analysis_main(argv, "python -m modules.mono_barrier", "slope",
                               "log-log slope of queries against n over a sweep's runs, logged as a run",
                               ("scaling", "diag/certificate/queries"), slope_analysis, describe)
