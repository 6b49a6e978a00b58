"""Where runs are logged: the tracking URI and a fast check that a tracking server answers.

Imports only the standard library, so that ``compare`` and ``sweep`` can use it without torch or Lightning.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from errors import PaperlabError

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


class TrackingServerUnreachable(PaperlabError, RuntimeError):
    """The tracking URI names an HTTP server that does not answer."""


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def check_tracking_server(uri: str, timeout: float = 5.0) -> None:
    """Fail fast with one clear message when an HTTP tracking server does not answer.

    MLflow's client retries for minutes before giving up; a researcher wants to know at once.
    """
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
            if resp.status < 500:
                return
            reason = f"HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        if err.code < 500:
            return
        reason = f"HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        reason = str(getattr(err, "reason", err))
    raise TrackingServerUnreachable(
        f"the MLflow tracking server at {uri} does not answer ({reason}). Start it, fix MLFLOW_TRACKING_URI, "
        f"or unset MLFLOW_TRACKING_URI to log to the local {DEFAULT_TRACKING_URI}"
    )


EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")  # the UI opens on runs, not traces


def prepare_store(uri: str, experiment: str | None = None) -> None:
    """Create the store's schema and the experiment once, before a run opens them.

    Several processes starting at once on a fresh sqlite file would each run MLflow's schema migration and
    fail ("Online migration expected to match one row"), and two creating one experiment collide: both
    happen here under a file lock next to the database. The experiment is tagged as a training experiment
    so that MLflow 3's UI opens it on its runs.
    """
    import mlflow
    from mlflow.exceptions import MlflowException

    lock = None
    if uri.startswith("sqlite:///"):
        from filelock import FileLock

        path = Path(uri[len("sqlite:///") :])
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock", timeout=600)
    with lock if lock is not None else contextlib.nullcontext():
        client = mlflow.MlflowClient(uri)
        if experiment is None:
            client.search_experiments(max_results=1)
            return
        found = client.get_experiment_by_name(experiment)
        if found is None:
            try:
                exp_id = client.create_experiment(experiment, tags=dict([EXPERIMENT_KIND]))
            except MlflowException:  # created meanwhile by another process (a tracking server has no lock)
                exp_id = client.get_experiment_by_name(experiment).experiment_id
        else:
            exp_id = found.experiment_id
            if found.tags.get(EXPERIMENT_KIND[0]) is None:
                client.set_experiment_tag(exp_id, *EXPERIMENT_KIND)


def retry_locked(fn: Any, *args: Any, attempts: int = 12, **kwargs: Any) -> Any:
    """Call ``fn``; when sqlite answers "database is locked" (another writer holds it), wait and try again
    (0.1 s doubling to 2 s, about 20 s in all) instead of losing the write."""
    delay = 0.1
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - MLflow wraps sqlite's OperationalError in several types
            if "database is locked" not in str(err) or attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 2.0)
    return None
