"""Tie checkpoints to their MLflow run: one directory per (experiment, run name), the run id beside them.

``checkpoints/<experiment>/<run name>/`` holds ``last.ckpt``, the best checkpoint and ``mlflow_run.json``.
``--ckpt_path last`` / ``best`` / a file there finds the run id in that file, so a resume, a ``validate`` or a
``test`` logs into the run that produced the checkpoint instead of opening a new one.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from errors import PaperlabError
from tracking.figures import mlflow_logger
from tracking.mlflow_logger import PaperlabMLFlowLogger

RUN_FILE = "mlflow_run.json"


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
    fresh fit writes into ``directory``.

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
