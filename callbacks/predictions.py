"""Write ``predict`` outputs to ``predictions.pt`` beside the checkpoints and into the MLflow run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from tracking.figures import mlflow_logger


class PredictionWriter(BasePredictionWriter):
    """Concatenates the predictions of all batches (one file per rank under DDP)."""

    def __init__(self, output_dir: str) -> None:
        super().__init__(write_interval="epoch")
        self.output_dir = output_dir

    def write_on_epoch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any],
    ) -> None:
        out = Path(self.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        preds = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        if preds and all(isinstance(p, torch.Tensor) for p in preds):
            preds = torch.cat(list(preds))
        suffix = "" if trainer.world_size == 1 else f"_rank{trainer.global_rank}"
        path = out / f"predictions{suffix}.pt"
        torch.save(preds, path)
        logger = mlflow_logger(trainer)
        if logger is not None and trainer.is_global_zero:
            logger.experiment.log_artifact(logger.run_id, str(path), artifact_path="predictions")
