"""Log a matplotlib figure as a PNG artifact of the current MLflow run (rank 0 only)."""

from __future__ import annotations

import io
import sys
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


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **subplots_kw: Any) -> tuple[Any, Any]:
    """A figure and its axes (``Figure.subplots``), made without pyplot: a fit in a notebook leaves the notebook's
    backend as it was (``matplotlib.use("Agg")`` would switch it and close its figures), the figure is in no
    global registry, so nothing needs closing, and it renders with Agg whatever the display."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **subplots_kw)


def figure_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def log_figure(trainer: L.Trainer, fig: Any, artifact_file: str) -> bool:
    """Save ``fig`` as ``artifact_file`` (for example ``"figures/piece_map.png"``) in the run.

    Returns whether it was logged (False without an MLflow logger, or on ranks other than 0).
    """
    logger = mlflow_logger(trainer)
    try:
        if logger is None or trainer.global_rank != 0:
            return False
        log_artifact_bytes(logger, figure_png(fig), artifact_file)
        return True
    finally:
        close_pyplot_figure(fig)


def close_pyplot_figure(fig: Any) -> None:
    """Drop ``fig`` from pyplot's registry, where a figure drawn with pyplot (a user's own diagnostic may) would
    otherwise stay for the life of the process; ``new_figure``'s figures are not in it."""
    pyplot = sys.modules.get("matplotlib.pyplot")  # not imported: no pyplot figure exists
    if pyplot is not None:
        pyplot.close(fig)


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
