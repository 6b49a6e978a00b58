"""Where runs are logged: the tracking URI and a fast check that a tracking server answers.

Imports only the standard library, so that ``compare`` and ``sweep`` can use it without torch or Lightning.
"""

from __future__ import annotations

import contextlib
import logging
import math
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


STORE_LOCK_WAIT_S = 60.0  # how long a command waits for a store another process holds locked, in all


class StoreUnavailable(PaperlabError, RuntimeError):
    """The MLflow store cannot be written: read-only, or locked by another process for too long."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, None for any other store."""
    return Path(uri[len("sqlite:///") :]) if uri.startswith("sqlite:///") else None


def check_store_writable(uri: str) -> None:
    """One line, before any run is created, when a sqlite store cannot be written: a read-only database file
    (or a read-only folder, where sqlite writes its journal). MLflow would otherwise fail on the first write,
    after the run exists, with one traceback per writer."""
    path = sqlite_path(uri)
    if path is None:
        return
    folder = path.parent if str(path.parent) else Path(".")
    what = None
    if path.exists() and not os.access(path, os.W_OK):
        what = f"the database file {path} is read-only"
    elif folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        what = f"its folder {folder}/ is read-only (sqlite writes a journal beside the database)"
    if what is not None:
        raise StoreUnavailable(
            f"the MLflow store {uri} cannot be written: {what}. Make it writable, or log elsewhere: "
            "MLFLOW_TRACKING_URI=sqlite:///<writable folder>/mlflow.db"
        )


class _OneLineLockErrors(logging.Filter):
    """MLflow logs every sqlite ``OperationalError`` with its traceback (``mlflow.store.db.utils``) before
    raising it; paperlab retries a locked database (``retry_locked``), so "database is locked" becomes one
    warning line, at most once a minute per process. Other database errors keep MLflow's own record."""

    def __init__(self) -> None:
        super().__init__()
        self._said_at = -math.inf

    def filter(self, record: logging.LogRecord) -> bool:
        if "database is locked" not in str(record.getMessage()):
            return True
        now = time.monotonic()
        if now - self._said_at < 60:
            return False
        self._said_at = now
        record.msg, record.args, record.exc_info, record.exc_text = (
            "the MLflow store is locked by another process: waiting for it (paperlab retries the write)", None,
            None, None)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_LOCK_FILTER = _OneLineLockErrors()


def quiet_lock_errors() -> None:
    """Install ``_OneLineLockErrors`` on MLflow's database logger (idempotent)."""
    logger = logging.getLogger("mlflow.store.db.utils")
    if _LOCK_FILTER not in logger.filters:
        logger.addFilter(_LOCK_FILTER)


def prepare_store(uri: str, experiment: str | None = None, writable: bool = False) -> None:
    """Create the store's schema and the experiment once, before a run opens them.

    Several processes starting at once on a fresh sqlite file would each run MLflow's schema migration and
    fail ("Online migration expected to match one row"), and two creating one experiment collide: both
    happen here under a file lock next to the database. The experiment is tagged as a training experiment
    so that MLflow 3's UI opens it on its runs. ``writable`` (or an experiment to create): a read-only store
    is one line here, before any run exists. A database another process holds locked is waited for, up to
    ``STORE_LOCK_WAIT_S`` in all, then one line.
    """
    quiet_lock_errors()
    if writable or experiment is not None:
        check_store_writable(uri)
    lock = None
    path = sqlite_path(uri)
    if path is not None:
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock", timeout=STORE_LOCK_WAIT_S)
    try:
        with lock if lock is not None else contextlib.nullcontext():
            retry_locked(_prepare, uri, experiment)
    except TimeoutError as err:  # filelock's Timeout: another paperlab process is preparing the store
        raise StoreUnavailable(f"the MLflow store {uri} is being prepared by another process for more than "
                               f"{STORE_LOCK_WAIT_S:.0f} s ({path}.lock): run the command again") from err


def _prepare(uri: str, experiment: str | None) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    client = mlflow.MlflowClient(uri)
    if experiment is None:
        client.search_experiments(max_results=1)
        return
    found = client.get_experiment_by_name(experiment)
    if found is None:
        try:
            client.create_experiment(experiment, tags=dict([EXPERIMENT_KIND]))
        except MlflowException as err:  # created meanwhile by another process (a tracking server has no lock)
            if "database is locked" in str(err):
                raise
            client.get_experiment_by_name(experiment)
    elif found.tags.get(EXPERIMENT_KIND[0]) is None:
        client.set_experiment_tag(found.experiment_id, *EXPERIMENT_KIND)


def retry_locked(fn: Any, *args: Any, wait_s: float | None = None, **kwargs: Any) -> Any:
    """Call ``fn``; when sqlite answers "database is locked" (another writer holds it), wait and try again
    (0.1 s doubling to 2 s between tries) instead of losing the write, for up to ``wait_s`` seconds in all
    (each try itself waits up to MLflow's busy timeout, 20 s); then ``StoreUnavailable``, one line."""
    wait_s = STORE_LOCK_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    delay = 0.1
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - MLflow wraps sqlite's OperationalError in several types
            if "database is locked" not in str(err):
                raise
            if time.monotonic() + delay > deadline:
                raise StoreUnavailable(
                    f"the MLflow store {default_tracking_uri()} is still locked by another process after "
                    f"{wait_s:.0f} s (a writer holding a transaction: an open sqlite shell, a long 'mlflow gc'): "
                    "end it and run the command again"
                ) from err
            time.sleep(delay)
            delay = min(2 * delay, 2.0)
