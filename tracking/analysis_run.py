"""A run of its own for an analysis over other runs (``python -m modules.<method> <analysis>``): created through
one ``MlflowClient`` on the store the analysis read (never MLflow's fluent API, whose process-wide URI an earlier
in-process fit may have pointed elsewhere), tagged with the code's git state, FINISHED when the analysis logged
everything and FAILED when it raised."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tracking.config_artifact import git_state


@contextmanager
def analysis_run(
    client: Any, experiment: str, run_name: str, tags: Mapping[str, str], params: Mapping[str, object]
) -> Iterator[str]:
    """Create run ``run_name`` in ``experiment`` (created if missing) with ``tags`` and ``params``; yield its id
    for the metrics and artifacts, then end it FINISHED, or FAILED if the body raised."""
    from mlflow.entities import Param

    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    run_id = client.create_run(exp_id, run_name=run_name, tags={**tags, **git_state()}).info.run_id
    try:
        client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()])
        yield run_id
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")


def log_metrics(client: Any, run_id: str, metrics: Mapping[str, float]) -> None:
    """``metrics`` in one batch at step 0."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()])


def sweep_analysis_main(
    argv: list[str],
    prog: str,
    analysis: str,
    help_text: str,
    defaults: tuple[str, str],
    run: Callable[[str, str], dict[str, float]],
    describe: Callable[[dict[str, float], str, str], str],
) -> int:
    """The command line of a method's one analysis over a sweep: ``python -m <prog> <analysis> [--sweep S]
    [--metric M]`` (``defaults``: S, M). ``run(sweep, metric)`` computes and logs; ``describe(result, sweep,
    metric)`` is the line printed. A ``ConfigError`` is one ``error:`` line and exit code 2."""
    import argparse

    from errors import ConfigError

    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="analysis", required=True)
    command = sub.add_parser(analysis, help=help_text)
    command.add_argument("--sweep", default=defaults[0])
    command.add_argument("--metric", default=defaults[1])
    args = parser.parse_args(argv)
    try:
        result = run(args.sweep, args.metric)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(describe(result, args.sweep, args.metric))
    return 0


def finished_sweep_runs(client: Any, experiment: str, sweep: str) -> tuple[str, list[Any]]:
    """The newest sweep ``sweep``'s parent run id in ``experiment`` and its FINISHED children, newest first, one
    per run name (a rerun point counts once, by its newest run). A missing experiment or sweep is a
    ``ConfigError`` naming the command that makes it (``configs/<experiment>/<sweep>_sweep.yaml``)."""
    from mlflow.entities import ViewType

    from errors import ConfigError

    hint = f"python main.py sweep --config configs/{experiment}/{sweep}_sweep.yaml --workers 2"
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(f"no MLflow experiment {experiment!r}: run the sweep first: {hint}")
    parents = client.search_runs([exp.experiment_id],
                                 f"tags.`sweep.name` = '{sweep}' and tags.`sweep.role` = 'parent'",
                                 run_view_type=ViewType.ACTIVE_ONLY, order_by=["attributes.start_time DESC"],
                                 max_results=1)
    if not parents:
        raise ConfigError(f"no sweep {sweep!r} in experiment {experiment!r}: run it first: {hint}")
    parent_id = parents[0].info.run_id
    children = client.search_runs([exp.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent_id}' and attributes.status = 'FINISHED'",
                                  run_view_type=ViewType.ACTIVE_ONLY, order_by=["attributes.start_time DESC"],
                                  max_results=5000)
    newest: dict[str, Any] = {}
    for run in children:
        newest.setdefault(run.info.run_name or run.info.run_id, run)
    return parent_id, list(newest.values())
