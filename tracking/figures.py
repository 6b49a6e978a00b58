"""Log a matplotlib figure as a PNG artifact of the current MLflow run (rank 0 only)."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported lazily: compare draws figures without Lightning
    import lightning as L
    from lightning.pytorch.loggers import MLFlowLogger


def mlflow_logger(trainer: L.Trainer) -> MLFlowLogger | None:
    """The trainer's MLflow logger, if it has one."""
    from lightning.pytorch.loggers import MLFlowLogger

    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger):
            return logger
    return None


def figure_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def log_figure(trainer: L.Trainer, fig: Any, artifact_file: str) -> bool:
    """Save ``fig`` as ``artifact_file`` (for example ``"figures/piece_map.png"``) in the run; close it.

    Returns whether it was logged (False without an MLflow logger, or on ranks other than 0).
    """
    import matplotlib.pyplot as plt

    logger = mlflow_logger(trainer)
    try:
        if logger is None or trainer.global_rank != 0:
            return False
        log_artifact_bytes(logger, figure_png(fig), artifact_file)
        return True
    finally:
        plt.close(fig)


def log_artifact_bytes(logger: MLFlowLogger, data: bytes | str, artifact_file: str) -> None:
    """Write ``data`` to ``artifact_file`` inside the logger's run."""
    path = Path(artifact_file)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / path.name
        if isinstance(data, str):
            local.write_text(data)
        else:
            local.write_bytes(data)
        parent = str(path.parent) if str(path.parent) != "." else None
        logger.experiment.log_artifact(logger.run_id, str(local), artifact_path=parent)
