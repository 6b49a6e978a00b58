"""Tie checkpoints to their MLflow run: one directory per (experiment, run name), the run id beside them.

``checkpoints/<experiment>/<run name>/`` holds ``last.ckpt``, the best checkpoint and ``mlflow_run.json``.
``--ckpt_path last`` / ``best`` / a file there finds the run id in that file, so a resume, a ``validate`` or a
``test`` logs into the run that produced the checkpoint instead of opening a new one.

Run identity: a fresh fit of a run name that is taken (a folder with files, or an MLflow run of that name in
the experiment) is the next *instance* of that name, ``yinyang #2``, ``yinyang #3``, ... (MLflow run name and
folder ``yinyang_#2``); the earlier instances' files stay where they are. ``--ckpt_path last|best`` without
``--run.name`` means the newest instance that has a ``last.ckpt``.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from errors import PaperlabError
from tracking.figures import mlflow_logger
from tracking.mlflow_logger import PaperlabMLFlowLogger
from tracking.uri import prepare_store, retry_locked

RUN_FILE = "mlflow_run.json"
INSTANCE = re.compile(r"^(?P<base>.+) #(?P<n>[0-9]+)$")


def folder_name(run_name: str) -> str:
    """A run name as a portable folder name (``yinyang lr=0.003 #2`` -> ``yinyang_lr=0.003_#2``)."""
    return re.sub(r"[^A-Za-z0-9._,=+#\[\]-]+", "_", run_name).strip("_") or "run"


def instance_name(base: str, n: int) -> str:
    """The n-th run of a name: the name itself, then ``<name> #2``, ``<name> #3``, ..."""
    return base if n == 1 else f"{base} #{n}"


def _has_files(directory: Path) -> bool:
    return directory.is_dir() and any(p.is_file() for p in directory.iterdir())


def taken_instances(base: str, experiment_dir: Path, mlflow_names: Iterable[str] = ()) -> dict[int, Path | None]:
    """The instances of ``base`` already taken, ``{n: its folder if it has files there, else None}``: a folder
    with files under ``experiment_dir``, or a run of that name in the MLflow experiment (``mlflow_names``)."""
    taken: dict[int, Path | None] = {}
    for name in mlflow_names:
        match = INSTANCE.match(name)
        if name == base:
            taken[1] = None
        elif match and match["base"] == base:
            taken[int(match["n"])] = None
    experiment_dir = Path(experiment_dir)
    if experiment_dir.is_dir():
        stem = folder_name(base)
        for path in experiment_dir.iterdir():
            if path.name == stem:
                n = 1
            else:
                match = re.fullmatch(r".*_#([0-9]+)", path.name)
                if not match or folder_name(instance_name(base, int(match[1]))) != path.name:
                    continue
                n = int(match[1])
            if _has_files(path):
                taken[n] = path
    return taken


def next_instance(base: str, experiment_dir: Path, mlflow_names: Iterable[str] = ()) -> int:
    """The number a fresh fit of ``base`` gets: 1 when the name is free, else one past the highest taken."""
    taken = taken_instances(base, experiment_dir, mlflow_names)
    return max(taken) + 1 if taken else 1


def latest_instance(base: str, experiment_dir: Path) -> int:
    """The instance ``--ckpt_path last|best`` means without ``--run.name``: the newest with a ``last.ckpt``
    (1 when none has one: the error then names the plain name's folder)."""
    with_last = [n for n, path in taken_instances(base, experiment_dir).items()
                 if path is not None and (path / "last.ckpt").is_file()]
    return max(with_last, default=1)


def mlflow_run_names(tracking_uri: str, experiment: str, base: str) -> list[str]:
    """Names of the experiment's runs (deleted ones too: they can be restored) that are ``base`` or an
    instance of it."""
    import mlflow
    from mlflow.entities import ViewType

    prepare_store(tracking_uri, experiment)
    client = mlflow.MlflowClient(tracking_uri)
    found = retry_locked(client.get_experiment_by_name, experiment)
    if found is None:
        return []
    # LIKE on the name up to its first quote (a quote would end the filter's string): a superset, cut below
    prefix = re.split(r"['\"\\]", base, maxsplit=1)[0]
    names: list[str] = []
    token = None
    while True:
        page = retry_locked(client.search_runs, [found.experiment_id],
                            filter_string=f"attributes.run_name LIKE '{prefix}%'", run_view_type=ViewType.ALL,
                            max_results=1000, page_token=token)
        names += [r.info.run_name for r in page]
        token = page.token
        if not token:
            break
    return [n for n in names if n == base or ((m := INSTANCE.match(n or "")) is not None and m["base"] == base)]


class CheckpointNotFound(PaperlabError, FileNotFoundError):
    """``--ckpt_path`` names a checkpoint that does not exist."""


def read_run_record(directory: Path) -> dict[str, Any] | None:
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def run_id_for_checkpoint(ckpt: Path, tracking_uri: str) -> str | None:
    """The MLflow run that wrote ``ckpt``, if it was logged to the same tracking URI."""
    record = read_run_record(Path(ckpt).parent)
    if record and record.get("tracking_uri") == tracking_uri:
        return record.get("run_id")
    return None


def resolve_checkpoint(ckpt_path: str | None, directory: Path) -> str | None:
    """``last`` and ``best`` -> files in ``directory``; a path -> itself; clear errors when missing."""
    if ckpt_path is None:
        return None
    directory = Path(directory)
    if ckpt_path in ("last", "best"):
        last = directory / "last.ckpt"
        if not last.is_file():
            runs = sorted(p.parent.name for p in directory.parent.glob("*/last.ckpt"))
            known = f"; runs with checkpoints: {', '.join(runs[:8])}" if runs else ""
            raise CheckpointNotFound(
                f"--ckpt_path {ckpt_path}: no checkpoint in {directory}/. The run name is the config's stem plus the "
                "command-line overrides: pass the same overrides as the fit, or --run.name NAME" + known
            )
        if ckpt_path == "last":
            return str(last)
        state = torch.load(last, map_location="cpu", weights_only=False).get("callbacks", {})
        for value in state.values():
            if isinstance(value, dict) and value.get("best_model_path"):
                best = Path(value["best_model_path"])
                if best.is_file():
                    return str(best)
        raise CheckpointNotFound(f"--ckpt_path best: {last} records no best checkpoint that still exists")
    if not Path(ckpt_path).is_file():
        raise CheckpointNotFound(f"--ckpt_path {ckpt_path}: no such checkpoint file")
    return ckpt_path


def archive_previous(directory: Path) -> Path | None:
    """Move everything an earlier run wrote (checkpoints, its run file, predictions) out of the way before a
    fresh fit writes into ``directory``: a fit that names its run exactly (``--run.name``, as sweeps do) and
    reuses the name. The CLI's summary says where they went.

    They go to ``<directory>.archive/<old run id>/``, beside the run's folder rather than inside it, so the
    fresh run starts from an empty folder.
    """
    directory = Path(directory)
    old = sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
    if not old:
        return None
    record = read_run_record(directory) or {}
    dest = directory.with_name(directory.name + ".archive") / (record.get("run_id") or time.strftime("%Y%m%d-%H%M%S"))
    dest.mkdir(parents=True, exist_ok=True)
    for p in old:
        shutil.move(str(p), dest / p.name)
    return dest


class RunRegistry(Callback):
    """Writes ``mlflow_run.json`` (run id, experiment, tracking URI) into the checkpoint directory.

    Written at fit start, after ``ModelCheckpoint.setup`` has looked at the folder, so a fresh run does not
    warn about a non-empty checkpoint directory.
    """

    def __init__(self, dirpath: str) -> None:
        self.dirpath = dirpath

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logger = mlflow_logger(trainer)
        if not isinstance(logger, PaperlabMLFlowLogger) or not trainer.is_global_zero:
            return
        directory = Path(self.dirpath)
        directory.mkdir(parents=True, exist_ok=True)
        record = {
            "run_id": logger.run_id,
            "experiment_name": logger.experiment_name,
            "experiment_id": logger.experiment_id,
            "tracking_uri": logger.tracking_uri,
        }
        (directory / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n")
