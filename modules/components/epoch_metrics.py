"""Per-stage epoch metrics without per-step ``self.log``.

``LightningModule.log`` costs about 1 ms a call on CPU, as much as a whole training step of the small
models most papers here train. ``EpochMetrics`` keeps the loss as a running sum on the device and updates
torchmetrics objects (argument validation off: the module produces the inputs) every step, then logs each
quantity once per epoch. Under DDP the loss sums and counts are all-reduced (a sample-weighted mean) and the
torchmetrics objects sync their states themselves.
"""

from __future__ import annotations

import torch
from lightning import LightningModule
from torch import Tensor, nn
from torchmetrics import Metric

STAGES = ("train", "val", "test")


class EpochMetrics(nn.Module):
    """Args:
    metrics: name -> a torchmetrics object; one clone per stage (``train/<name>``, ``val/<name>``, ...).
    """

    def __init__(self, metrics: dict[str, Metric] | None = None) -> None:
        super().__init__()
        metrics = metrics or {}
        self.metrics = nn.ModuleDict(
            # "train" would shadow nn.Module.train, hence the suffix
            {f"{stage}_": nn.ModuleDict({name: m.clone() for name, m in metrics.items()}) for stage in STAGES}
        )
        self._loss_sum: dict[str, Tensor] = {}
        self._count: dict[str, int] = {}

    def update(self, stage: str, loss: Tensor, preds: Tensor | None = None, target: Tensor | None = None) -> None:
        n = int(target.shape[0]) if target is not None else 1
        total = loss.detach() * n
        self._loss_sum[stage] = self._loss_sum[stage] + total if stage in self._loss_sum else total
        self._count[stage] = self._count.get(stage, 0) + n
        if preds is not None:
            for metric in self.metrics[f"{stage}_"].values():
                metric.update(preds, target)

    def log_epoch(self, module: LightningModule, stage: str) -> dict[str, Tensor]:
        """Log ``<stage>/loss`` and every metric of the stage, reset, and return what was logged."""
        out: dict[str, Tensor] = {}
        if stage in self._loss_sum:
            total = self._loss_sum.pop(stage)
            count = torch.tensor(float(self._count.pop(stage)), device=total.device)
            if module.trainer.world_size > 1:
                total = module.trainer.strategy.reduce(total, reduce_op="sum")
                count = module.trainer.strategy.reduce(count, reduce_op="sum")
            out[f"{stage}/loss"] = total / count
        for name, metric in self.metrics[f"{stage}_"].items():
            if metric.update_count:
                out[f"{stage}/{name}"] = metric.compute()
            metric.reset()
        for key, value in out.items():
            module.log(key, value, on_step=False, on_epoch=True, sync_dist=False)
        return out
