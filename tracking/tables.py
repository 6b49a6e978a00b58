"""Log a table (rows of one mapping each) as a CSV artifact of the current MLflow run (rank 0 only)."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tracking.figures import log_artifact_bytes, mlflow_logger

if TYPE_CHECKING:
    import lightning as L


def table_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """CSV text of ``rows``: the columns in the order they first appear, floats with 6 significant digits."""
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in row.items()})
    return out.getvalue()


def log_table(trainer: L.Trainer, rows: Sequence[Mapping[str, Any]], artifact_file: str) -> bool:
    """Save ``rows`` as ``artifact_file`` (for example ``"tables/error_ladder.csv"``) in the run.

    Returns whether it was logged (False without an MLflow logger, on ranks other than 0, or without rows).
    """
    logger = mlflow_logger(trainer)
    if logger is None or trainer.global_rank != 0 or not rows:
        return False
    log_artifact_bytes(logger, table_csv(rows), artifact_file)
    return True
