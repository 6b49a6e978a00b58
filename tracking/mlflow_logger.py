"""paperlab's MLflow logger: explicit tracking URI, immutable-param-safe hyperparameters, run status.

Differences from Lightning's ``MLFlowLogger`` and why:
- the tracking URI is read when the logger is built (``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``);
  Lightning's default falls back to ``file:./mlruns``, which MLflow 3 refuses;
- hyperparameters are never cut at 250 characters (MLflow accepts 6000; a longer value is logged with an
  explicit marker and lives in full in the ``config/config.yaml`` artifact), ``_instantiator`` and
  ``_class_path`` noise is dropped, and a param that already exists in the run (a resume) is not sent
  again: if its value changed, the new value goes to a ``param_changed.<key>`` tag instead of crashing;
- the logger decides how a run ends: an interrupted run (Ctrl-C: ``finalize`` is called while the
  ``KeyboardInterrupt`` is being handled) ends as KILLED rather than FAILED; an evaluation logged into a run
  that has ended (``keep_end_time``: ``validate``/``test``/``predict --ckpt_path``) leaves its status and end
  time as they were, so the UI's duration stays the training's;
- metrics are buffered and written in one batch at most every ``flush_every_s`` seconds (and when the run
  ends, fails or is interrupted), by one writer thread of this logger, in order: one sqlite commit costs 10
  to 50 ms of wall time (9 ms of it CPU), several training steps of the small models most papers here
  train, and the training thread does not wait for it. MLflow's own asynchronous mode
  (``log_batch(..., synchronous=False)``) was measured and not used: ``set_terminated`` then waits for its
  queue thread, which polls once a second (about 1 s at every run's end, 2026-12-02), and its ten worker
  threads write batches out of order. A checkpoint does not force a flush: ``callbacks.checkpoints``
  stores the metrics not yet written (``unflushed``) in every resumable checkpoint and a resume hands them
  back (``replay``), so a kill -9 loses none that a checkpoint on disk had seen.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from argparse import Namespace
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from tracking.uri import (  # noqa: F401 - re-exported: the logger's module is where users look
    DEFAULT_TRACKING_URI,
    TrackingServerUnreachable,
    check_tracking_server,
    default_tracking_uri,
    prepare_store,
    retry_locked,
)

MAX_PARAM_LENGTH = 6000
DROPPED_PARAM_KEYS = ("_instantiator", "_class_path")


def flatten_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts/lists to ``{"a.b.0": "value"}`` strings, dropping Lightning's internal keys."""
    out: dict[str, str] = {}
    for key, value in params.items():
        if key in DROPPED_PARAM_KEYS:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, dict) and value:
            out.update(flatten_params(value, f"{name}."))
        else:
            out[name] = str(value)
    return out


def fit_param_value(value: str) -> str:
    if len(value) <= MAX_PARAM_LENGTH:
        return value
    marker = "...[cut: full value in the config/config.yaml artifact]"
    return value[: MAX_PARAM_LENGTH - len(marker)] + marker


class PaperlabMLFlowLogger(MLFlowLogger):
    """``MLFlowLogger`` with paperlab's defaults (see the module docstring).

    Args:
        experiment_name: the MLflow experiment (paperlab: the method's name).
        run_name: the run's name (paperlab: the experiment config's stem).
        tracking_uri: defaults to ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``.
        tags: tags set when the run is created.
        run_id: continue this run instead of creating one (resume, test of a trained checkpoint).
        flush_every_s: write buffered metrics at most this often (0: write every call).
        keep_end_time: with ``run_id``: never end the run (an evaluation of a trained run must not stretch
            its duration, end_time - start_time); its status and end time stay those its fit set.
        writer: a one-thread executor shared with other loggers of this process (a seed-parallel fit's child
            runs: one sqlite writer, not one per seed, so their commits do not wait on each other's locks);
            its owner shuts it down. None: this logger starts its own at its first flush.
    """

    def __init__(
        self,
        experiment_name: str = "paperlab",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        run_id: str | None = None,
        flush_every_s: float = 5.0,
        keep_end_time: bool = False,
        writer: ThreadPoolExecutor | None = None,
    ) -> None:
        uri = tracking_uri or default_tracking_uri()
        prepare_store(uri, None if run_id else experiment_name, writable=True)
        super().__init__(
            experiment_name=experiment_name,
            run_name=run_name,
            tracking_uri=uri,
            tags=tags,
            run_id=run_id,
            log_model=False,
        )
        # Lightning's logger keeps both in private attributes only; ours are read by the CLI's summary and sweeps
        self._uri = uri
        self._experiment = experiment_name
        self.flush_every_s = flush_every_s
        self._pending: list[Any] = []
        self._last_flush = time.monotonic()
        # the writer thread (started at the first flush) and the batches handed to it, not yet known written
        self._writer: ThreadPoolExecutor | None = writer
        self._owns_writer = writer is None
        self._in_flight: list[tuple[Future, list[Any]]] = []
        self._lock = threading.Lock()  # _pending and _in_flight: the training thread and the writer
        self._existing_params: dict[str, str] | None = None
        # a run that existed before (a resume replays the steps after its checkpoint; a test logs into the run
        # that trained): the (key, step) pairs it has are read once and not written twice
        self._continues = run_id is not None
        self._logged: set[tuple[str, int]] | None = None
        self._last_step: dict[str, int] = {}
        self._keep_end_time = keep_end_time and run_id is not None

    @property
    def tracking_uri(self) -> str:
        return self._uri

    @property
    def experiment_name(self) -> str:
        return self._experiment

    def existing_params(self) -> dict[str, str]:
        if self._existing_params is None:
            # a run this logger created has none yet: no query (a seed-parallel fit opens K such runs)
            self._existing_params = (dict(self.experiment.get_run(self.run_id).data.params) if self._continues
                                     else {})
        return self._existing_params

    @rank_zero_only
    def log_params_dict(self, params: dict[str, Any]) -> None:
        """Log flattened params; skip ones the run has with the same value, tag the ones that changed."""
        from mlflow.entities import Param, RunTag

        existing = self.existing_params()
        new_params, changed = [], []
        for key, value in flatten_params(params).items():
            value = fit_param_value(value)
            if key not in existing:
                new_params.append(Param(key, value))
                existing[key] = value
            elif existing[key] != value:
                changed.append(RunTag(f"param_changed.{key}", value[:5000]))
        for i in range(0, len(new_params), 100):
            retry_locked(self.experiment.log_batch, self.run_id, params=new_params[i : i + 100])
        if changed:
            rank_zero_warn(
                f"{len(changed)} hyperparameter(s) differ from the values this MLflow run was started with "
                f"({', '.join(t.key.removeprefix('param_changed.') for t in changed[:5])}); MLflow params are "
                "immutable, so the new values are recorded as 'param_changed.*' tags"
            )
            retry_locked(self.experiment.log_batch, self.run_id, tags=changed)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        """Nested params flattened to dotted keys (under the CLI: the resolved config, once)."""
        if isinstance(params, Namespace):
            params = vars(params)
        self.log_params_dict(dict(params))

    @rank_zero_only
    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        retry_locked(self.experiment.log_batch, self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        step = step or 0
        fresh = []
        for key, value in metrics.items():
            if isinstance(value, str):
                continue
            clean = re.sub("[^a-zA-Z0-9_/. -]+", "", key)  # the characters MLflow accepts in a metric name
            # one value per (metric, step): Lightning adds `epoch` to every call, several callers may report
            # at one step; the first value stands
            if self._last_step.get(clean) == step:
                continue
            self._last_step[clean] = step
            fresh.append(Metric(key=clean, value=float(value), timestamp=stamp, step=step))
        with self._lock:
            self._pending.extend(fresh)
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush(wait=False)

    def already_logged(self) -> set[tuple[str, int]]:
        """The (metric, step) pairs the run had in the store when this process took it over (empty for a new
        run): the steps a resume replays were written by the interrupted process already."""
        if self._logged is None:
            self._logged = set()
            if self._continues:
                client = self.experiment
                keys = list(retry_locked(client.get_run, self.run_id).data.metrics)
                self._logged = {(k, m.step) for k in keys
                                for m in retry_locked(client.get_metric_history, self.run_id, k)}
        return self._logged

    @rank_zero_only
    def flush(self, wait: bool = True) -> None:
        """Write the buffered metrics (a (metric, step) pair the run already has is not written again).

        The batch goes to this logger's writer thread, which writes batches in the order they were handed
        over. ``wait``: return once everything handed over so far is written (and raise what a write
        raised); otherwise return at once, and an error of an earlier write is raised here, on the training
        thread, at the next flush.
        """
        with self._lock:
            pending, self._pending = self._pending, []
            self._last_flush = time.monotonic()
            if pending:
                if self._writer is None:
                    self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paperlab-mlflow")
                self._in_flight.append((self._writer.submit(self._write, pending), pending))
            in_flight = list(self._in_flight)
        for future, _ in in_flight:
            if wait or future.done():
                with self._lock:  # reaped once: a failed write is raised once, not at every later flush
                    self._in_flight = [f for f in self._in_flight if f[0] is not future]
                future.result()  # raises the write's error

    def _write(self, metrics: list[Any]) -> None:
        """On the writer thread: one batch of metrics into the run, 1000 at a time (MLflow's limit)."""
        logged = self.already_logged()
        fresh = [m for m in metrics if (m.key, m.step) not in logged]
        for i in range(0, len(fresh), 1000):
            retry_locked(self.experiment.log_batch, run_id=self.run_id, metrics=fresh[i : i + 1000])

    def unflushed(self) -> list[list[Any]]:
        """The metrics logged but not known to be in the store yet, as ``[key, value, timestamp, step]`` rows
        (plain values: a checkpoint carries them, and a checkpoint loaded with ``weights_only`` reads them)."""
        with self._lock:
            # a batch counts as written once its write returned without an error
            unwritten = [b for f, b in self._in_flight if not f.done() or f.exception() is not None]
            metrics = [m for batch in unwritten for m in batch] + self._pending
        return [[m.key, m.value, m.timestamp, m.step] for m in metrics]

    def replay(self, rows: list[list[Any]]) -> None:
        """Buffer ``unflushed`` rows again (a resume from the checkpoint that carried them); the pairs the run
        already has are dropped when they are written."""
        from mlflow.entities import Metric

        metrics = [Metric(key=str(k), value=float(v), timestamp=int(t), step=int(s)) for k, v, t, s in rows]
        for m in metrics:
            self._last_step[m.key] = max(m.step, self._last_step.get(m.key, m.step))
        with self._lock:
            self._pending[:0] = metrics

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        # Metrics up to a resumable checkpoint must survive whatever happens after it. A checkpoint that
        # carries the unflushed metrics itself (``callbacks.checkpoints.LastCheckpoint``) needs no flush; any
        # other resumable one (a user's ModelCheckpoint) waits for one. A weights-only save (the best epoch)
        # resumes nothing and does not pay for a flush.
        super().after_save_checkpoint(checkpoint_callback)
        if getattr(checkpoint_callback, "carries_unflushed_metrics", False):
            return
        # (buffered metrics only: a flush with nothing pending would open the run just to write nothing)
        if self._pending and not getattr(checkpoint_callback, "save_weights_only", False):
            self.flush()

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if status == "failed" and isinstance(sys.exc_info()[1], KeyboardInterrupt):
            status = "KILLED"  # Lightning finalizes while it handles the Ctrl-C
        try:
            self.flush()  # everything handed over is written before the run is closed
        finally:
            if self._writer is not None and self._owns_writer:
                self._writer.shutdown(wait=True)
                self._writer = None
        if self._keep_end_time:
            # An evaluation logged into a run its fit has ended: ending it again would stamp the current time
            # as its end (set_terminated), and the UI's duration would become training + the time until this
            # test. Metrics, tags and artifacts go into an ended run without reopening it, so the run keeps
            # its status and end time by not being ended here. A run still RUNNING (a fit elsewhere, a
            # process killed with -9) is left for its own process (or a sweep) to end.
            return
        retry_locked(super().finalize, status)
