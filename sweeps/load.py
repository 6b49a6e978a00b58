"""Reading runs from MLflow for a comparison: which runs count (``load_runs``, ``select_runs``), a key as the
runs spell it (``resolve_key``), a param/metric/tag of a run (``lookup``) and a run's value of a metric,
its last or summarised over a step range (``run_value``, ``parse_steps``, ``AGGREGATES``).

MLflow is imported inside the functions, so that importing this file stays cheap.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from sweeps.spec import SweepError

SEED_KEY = "seed_everything"


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


# Params that control a run, not what it computes: runs that differ only in these are replicates.
RUN_CONTROL = re.compile(
    r"^(seed_everything|run\..*|diagnostics.*|trainer\.(callbacks|logger|enable_progress_bar|enable_model_summary|"
    r"default_root_dir|log_every_n_steps|enable_checkpointing|num_sanity_val_steps|limit_test_batches|"
    r"limit_predict_batches).*)$"
)


def load_runs(client: Any, experiment: str, sweep: str | None) -> tuple[list[Any], Any | None, dict[str, int]]:
    """The runs to compare, the sweep's parent run (None without ``--sweep``), and what was left out and why.

    With ``--sweep`` (the parent's run id or the sweep's name) the parent's children; otherwise every run of
    the experiment except sweep parents. Only FINISHED runs count; the others are counted by status. A sweep
    point run twice counts once (its newest FINISHED run), with ``--sweep`` or without, and the left-out runs
    are counted ("an older run of the same sweep point"); a run outside any sweep always counts.
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
        key = point_key(run)
        if key in kept:
            excluded["an older run of the same sweep point"] = excluded.get("an older run of the same sweep point", 0) + 1
            continue
        kept[key] = run
    return list(kept.values()), parent, excluded


def point_key(run: Any) -> tuple[str, ...]:
    """What makes runs the same sweep point: the sweep's parent run and the point's run name (a rerun of a
    point, the same command again, logs under the same parent with the same name). A run outside any sweep is
    its own key: two fits with the same config are two replicates, not a rerun."""
    parent = run.data.tags.get("mlflow.parentRunId")
    if parent and run.data.tags.get("sweep.name"):
        return ("point", parent, run.info.run_name or run.info.run_id)
    return ("run", run.info.run_id)


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


def lookup(run: Any, key: str) -> str | float | None:
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


def select_runs(runs: list[Any], where: list[str], available: list[str]) -> tuple[list[Any], list[str]]:
    """The runs whose param/tag ``key`` equals ``value`` for every ``key=value`` in ``where``."""
    labels = []
    for item in where:
        key, sep, want = item.partition("=")
        if not sep:
            raise SweepError(f"--where takes KEY=VALUE (for example model.net.activation=relu), got {item!r}")
        full = resolve_key(key, available)
        values = sorted({str(lookup(r, full)) for r in runs})
        runs = [r for r in runs if str(lookup(r, full)) == want]
        if not runs:
            raise SweepError(f"--where {item}: no run left with {full} = {want!r} (values: {', '.join(values)})")
        labels.append(f"{full}={want}")
    return runs, labels

