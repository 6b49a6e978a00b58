"""Write ``predict`` outputs, labelled, to ``predictions.pt`` beside the checkpoints and into the MLflow run.

The file is a dict of tensors (``torch.load`` reads it with the default ``weights_only=True``):

- ``"prediction"``: what ``predict_step`` returned for every sample, concatenated along the first dimension
  (a dict or tuple of tensors when the task returns one; a list of the batches' outputs when they do not
  concatenate);
- ``"index"``: each row's sample index in the predict split (int64), so a row can be matched to its sample;
- ``"target"``: the sample's target, where the batches carry one (``(x, y, ...)`` batches).

Under DDP every rank writes ``predictions_rank<r>.pt`` with its own rows, indexed in the whole split.

Why not Lightning's ``BasePredictionWriter``: the prediction loop looks for the sample indices of a batch
in a ``torch.utils.data.DataLoader``'s batch sampler, and paperlab's loaders are not DataLoaders (they gather
whole batches, ``datamodules/base.py``); it then warns "Couldn't infer the batch indices fetched from your
dataloader" and hands the writer empty indices. This callback counts the samples itself, on batch end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from datamodules.base import BatchedTensorLoader
from tracking.figures import mlflow_logger


def _cpu(value: Any) -> Any:
    """Tensors detached on the CPU, in the same containers."""
    if isinstance(value, Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu(v) for v in value)
    return value


def _rows(value: Any) -> int | None:
    """How many samples a batch's output holds: the first dimension of its (first) tensor."""
    if isinstance(value, Tensor):
        return int(value.shape[0]) if value.dim() else None
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple) and value:
        return _rows(value[0])
    return None


def _concat(parts: list[Any]) -> Any:
    """The batches' outputs as one: tensors concatenated, dicts and tuples key by key; else the list."""
    first = parts[0]
    try:
        if isinstance(first, Tensor):
            return torch.cat(parts)
        if isinstance(first, dict):
            return {k: _concat([p[k] for p in parts]) for k in first}
        if isinstance(first, tuple):
            return tuple(_concat(list(p)) for p in zip(*parts, strict=True))
    except (RuntimeError, TypeError, ValueError, KeyError):  # shapes or keys that differ between batches
        pass
    return parts


def _target(batch: Any, rows: int) -> Tensor | None:
    """The batch's target: the second tensor of an ``(x, y, ...)`` batch with one entry per sample."""
    if isinstance(batch, list | tuple) and len(batch) >= 2 and isinstance(batch[1], Tensor):
        y = batch[1]
        if y.dim() and y.shape[0] == rows:
            return y.detach().cpu()
    return None


def sharded_indices(local_rows: Tensor, rank: int, world_size: int) -> Tensor:
    """The split indices of one rank's prediction rows under ``BatchedTensorLoader``'s sharding.

    ``local_rows`` is ``(world_size, batches)``: how many rows each rank got from each global batch. Global
    batch ``b`` is the split's samples ``start_b, start_b + 1, ...`` (the predict loader does not shuffle), and
    rank ``r`` takes its positions ``r, r + world_size, ...``.
    """
    per_batch = local_rows.sum(0)
    starts = torch.cumsum(per_batch, 0) - per_batch
    mine = [start + rank + world_size * torch.arange(int(n)) for start, n in zip(starts, local_rows[rank], strict=True)]
    return torch.cat(mine) if mine else torch.zeros(0, dtype=torch.long)


class PredictionWriter(Callback):
    """Collects every predict batch's output, sample indices and target; writes them at the end of the epoch.

    Args:
        output_dir: the run's checkpoint folder; the file is ``<output_dir>/predictions.pt``.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self._outputs: dict[int, list[Any]] = {}
        self._targets: dict[int, list[Tensor | None]] = {}
        self._rows: dict[int, list[int]] = {}

    def on_predict_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._outputs, self._targets, self._rows = {}, {}, {}

    def on_predict_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        rows = _rows(outputs)
        if rows is None:  # the output is not per sample: keep it, unlabelled
            rows = 0
        self._outputs.setdefault(dataloader_idx, []).append(_cpu(outputs))
        self._targets.setdefault(dataloader_idx, []).append(_target(batch, rows) if rows else None)
        self._rows.setdefault(dataloader_idx, []).append(rows)

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tables = [self._table(trainer, i) for i in sorted(self._outputs)]
        out = Path(self.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        suffix = "" if trainer.world_size == 1 else f"_rank{trainer.global_rank}"
        path = out / f"predictions{suffix}.pt"
        torch.save(tables[0] if len(tables) == 1 else tables, path)
        logger = mlflow_logger(trainer)
        if logger is not None and trainer.is_global_zero:
            logger.experiment.log_artifact(logger.run_id, str(path), artifact_path="predictions")

    def _table(self, trainer: L.Trainer, dataloader_idx: int) -> dict[str, Any]:
        """One predict dataloader's rows: ``prediction``, ``index`` and, when every batch has one, ``target``."""
        rows = self._rows[dataloader_idx]
        table: dict[str, Any] = {"prediction": _concat(self._outputs[dataloader_idx])}
        index = self._indices(trainer, dataloader_idx, rows)
        if index is not None:
            table["index"] = index
        targets = self._targets[dataloader_idx]
        if targets and all(t is not None for t in targets):
            table["target"] = _concat(list(targets))
        return table

    def _indices(self, trainer: L.Trainer, dataloader_idx: int, rows: Sequence[int]) -> Tensor | None:
        """Each row's index in the predict split (None where it cannot be known).

        One process: the running count of rows, the split's order for a loader that does not shuffle. DDP:
        paperlab's ``BatchedTensorLoader`` shards every global batch, so the rows every rank got per batch
        (one all-gather) place this rank's rows; another loader's rows cannot be placed.
        """
        loaders = trainer.predict_dataloaders
        loader = loaders[dataloader_idx] if isinstance(loaders, list | tuple) else loaders
        if not all(rows) or isinstance(loader, BatchedTensorLoader) and loader.shuffle:
            return None
        counts = torch.tensor(list(rows), dtype=torch.long)
        if trainer.world_size == 1:
            return torch.arange(int(counts.sum()))
        if not isinstance(loader, BatchedTensorLoader):
            return None
        gathered = trainer.strategy.all_gather(counts).reshape(trainer.world_size, -1).cpu()
        return sharded_indices(gathered, trainer.global_rank, trainer.world_size)
