"""A link that opens an experiment's runs table in the MLflow UI, in Model-training mode, with chosen columns.

MLflow 3.17's UI keeps a GenAI / Model-training switch in the browser's local storage; a fresh browser is in
GenAI mode and opens ``#/experiments/<id>`` on the GenAI "Overview". What its JS bundle
(``mlflow/server/js/build/static/js``) honours in the URL, and what this module writes:

- ``#/experiments/<id>/runs``: the runs tab (route ``/experiments/:experimentId/:tabName``);
- ``?workflowType=machine_learning``: the switch, read from the URL before local storage;
- ``&viewStateShareKey=<key>``: a *saved view*, the experiment tag ``mlflow.sharedViewState.<key>`` holding
  ``{"name", "createdAt", "updatedAt", "state"}`` where ``state`` is the JSON of the search facets
  (``searchFilter``, ``orderByKey``, ``orderByAsc``, ...) and of the table's UI state (``selectedColumns``,
  ...). That is the only URL state the runs table takes for its columns: the facets alone may sit in the
  query string, the columns only in a saved view (the UI's own "Share" button writes the same tag). A
  column is ``metrics.`<name>```, ``params.`<name>``` or ``attributes.`<name>```.

The key is a hash of the view's content, so one set of columns is one tag however often it is written,
and a printed link keeps showing what it showed. ``tests/tracking/test_runs_view.py`` checks that the
installed bundle still knows these names. Standard library at import time (``python main.py ui`` starts
without torch); MLflow only inside the functions that talk to a store.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from tracking.uri import retry_locked

UI_HOST = "127.0.0.1"
UI_PORT = 5000
VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # the UI's saved views (experiment tags)
VIEW_KEY_PARAM = "viewStateShareKey"
WORKFLOW = ("workflowType", "machine_learning")  # the UI's Model-training mode
LATEST_VIEW_TAG = "paperlab.runs_view"  # the key of the view a paperlab command wrote last: `ui` links it
OVERRIDES_TAG = "overrides"  # set by the CLI: "--model.optimizer.lr 0.003 --trainer.max_epochs 1"
MAX_COLUMNS = 40  # a table to read, and an experiment tag holds at most 20000 characters

Kind = Literal["attributes", "params", "metrics", "tags"]


def ui_base_url(tracking_uri: str, host: str = UI_HOST, port: int = UI_PORT) -> str:
    """Where the UI answers: the tracking server itself, or ``mlflow ui`` / ``python main.py ui`` on a local
    store (their default address)."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return f"http://{host}:{port}"


def runs_url(base_url: str, experiment_id: str, view_key: str | None = None) -> str:
    """The runs table of an experiment in Model-training mode (with a saved view's columns when given)."""
    query = f"{WORKFLOW[0]}={WORKFLOW[1]}" + (f"&{VIEW_KEY_PARAM}={view_key}" if view_key else "")
    return f"{base_url}/#/experiments/{experiment_id}/runs?{query}"


def column(kind: Kind, name: str) -> str:
    """A runs-table column as the UI names it: ``metrics.`val/acc```."""
    return f"{kind}.`{name}`"


def _strip_init_args(key: str) -> str:
    return ".".join(part for part in key.split(".") if part != "init_args")


def override_params(override_keys: Iterable[str], param_keys: Iterable[str]) -> list[str]:
    """The logged params a command line's overrides set: ``model.optimizer.lr`` (the short form) is the
    param ``model.init_args.optimizer.init_args.lr``; an override of a whole class (``model.net``) is its
    ``class_path`` and the params under it."""
    params = list(param_keys)
    by_short: dict[str, list[str]] = {}
    for key in params:
        by_short.setdefault(_strip_init_args(key), []).append(key)
    out: list[str] = []
    for override in override_keys:
        short = _strip_init_args(override)
        hits = by_short.get(short) or [p for s, keys in by_short.items() if s.startswith(short + ".") for p in keys]
        out += [p for p in sorted(hits) if p not in out]
    return out


def overridden_keys(overrides_tag: str) -> list[str]:
    """The keys of a run's ``overrides`` tag (``--key value`` pairs; values may hold spaces, keys never)."""
    return re.findall(r"(?:^|\s)--([\w.\-]+)", overrides_tag or "")


def view_state(metrics: Sequence[str], params: Sequence[str], order_by: str | None = None,
               ascending: bool = False) -> dict[str, Any]:
    """The saved view's state: the given metrics, then the given params, as the table's columns; sorted by
    ``order_by`` (a column), else newest run first (the UI's default)."""
    columns = [column("metrics", m) for m in dict.fromkeys(metrics)] + [column("params", p) for p in dict.fromkeys(params)]
    return {
        "searchFilter": "",
        "orderByKey": order_by or "attributes.start_time",
        "orderByAsc": ascending if order_by else False,
        "selectedColumns": columns[:MAX_COLUMNS],
    }


def view_key(state: dict[str, Any]) -> str:
    """A saved view's key: a hash of its state (the same columns, the same key)."""
    return hashlib.sha1(json.dumps(state, sort_keys=True).encode()).hexdigest()[:16]


def save_view(client: Any, experiment_id: str, state: dict[str, Any], name: str) -> str:
    """Store ``state`` as the experiment's saved view (unless it has it already), mark it as the latest one
    paperlab wrote, and return its key."""
    key = view_key(state)
    experiment = retry_locked(client.get_experiment, experiment_id)
    tag = VIEW_TAG_PREFIX + key
    if tag not in experiment.tags:
        now = int(time.time() * 1000)
        envelope = {"name": name[:200], "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
        retry_locked(client.set_experiment_tag, experiment_id, tag, json.dumps(envelope))
    if experiment.tags.get(LATEST_VIEW_TAG) != key:
        retry_locked(client.set_experiment_tag, experiment_id, LATEST_VIEW_TAG, key)
    return key


def experiment_view(client: Any, experiment_id: str, max_runs: int = 500) -> dict[str, Any] | None:
    """A view over an experiment's runs for ``python main.py ui``: every monitored metric (each ``<m>_best``
    and ``<m>``) and every param some run's command line overrode; None when no run shows either."""
    runs = retry_locked(client.search_runs, [experiment_id], max_results=max_runs,
                        order_by=["attributes.start_time DESC"])
    metrics: list[str] = []
    params: list[str] = []
    for run in runs:
        for key in sorted(run.data.metrics):
            if key.endswith("_best"):
                metrics += [m for m in (key, key.removesuffix("_best")) if m not in metrics]
        keys = overridden_keys(run.data.tags.get(OVERRIDES_TAG, ""))
        params += [p for p in override_params(keys, run.data.params) if p not in params]
    if not metrics and not params:
        return None
    return view_state(metrics, params)
