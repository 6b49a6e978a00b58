"""Gradient variance diagnostic: tr(Sigma), |G|^2 and the simple noise scale from per-sample gradients.

``estimate_gradient_variance(model, per_sample_loss, batch)`` works on any ``nn.Module`` (see
``callbacks.grad_variance``); the ``GradientVariance`` callback runs it inside Lightning.

Protocol: the LightningModule exposes ``per_sample_loss(batch) -> (B,)``, the loss l_i of each sample
alone (mean over its own tokens), such that the training loss is the mean over samples. The callback
logs, every ``every_n_steps`` optimizer steps, on the batch just trained on (before the optimizer step):
  diag/grad_var/trace          tr(Sigma): unbiased sum over parameters of the variance of g_i = grad l_i
  diag/grad_var/grad_norm_sq   |mean_i g_i|^2
  diag/grad_var/noise_scale    tr(Sigma) / |G|^2 (McCandlish et al. 2018, B_simple)
  diag/grad_var/minibatch_var  tr(Sigma) / B: the variance of the batch-mean gradient
  diag/grad_var/<module>/{trace,grad_norm_sq,noise_scale}   per layer (``per_layer=True``)

It never touches ``.grad`` or the optimizer, so the training step is unchanged. With gradient
accumulation it uses the last micro-batch of the window; under mixed precision it computes with autocast
off; under DDP each rank computes the sums over its shard of sum_i |g_i|^2 and sum_i g_i from per-sample
gradients (never the already averaged ``.grad``), they are summed across ranks and the estimate is formed
over the global batch.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from callbacks.grad_variance import GradientVarianceEstimator, GradStats, estimate_gradient_variance, finalize
from callbacks.grad_variance.estimator import METHODS, param_groups
from callbacks.grad_variance.per_sample import batch_size, slice_batch

__all__ = ["GradientVariance", "estimate_gradient_variance"]


class GradientVariance(Callback):
    """Logs per-sample gradient variance statistics every ``every_n_steps`` optimizer steps.

    Args:
        every_n_steps: cadence in optimizer steps (the first step is measured).
        method: "auto" (fast hook path when it covers the model, else torch.func vmap, else a loop over
            single samples; the choice is logged once), "hooks", "vmap" or "loop".
        per_layer: also log the values of every module owning parameters.
        group_depth: cut module paths to this many components for the per-layer values (None: full path).
        max_samples: use at most this many samples of each rank's batch (None: all) to bound the cost.
        loss_method: name of the LightningModule method returning the ``(B,)`` per-sample losses.
        prefix: metric-name prefix.
    """

    def __init__(
        self,
        every_n_steps: int = 25,
        method: str = "auto",
        per_layer: bool = True,
        group_depth: int | None = None,
        max_samples: int | None = None,
        loss_method: str = "per_sample_loss",
        prefix: str = "diag/grad_var",
    ) -> None:
        super().__init__()
        if every_n_steps <= 0:
            raise ValueError(f"every_n_steps must be a positive integer, got {every_n_steps}")
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples must be positive or None, got {max_samples}")
        self.every_n_steps = every_n_steps
        self.method = method
        self.per_layer = per_layer
        self.group_depth = group_depth
        self.max_samples = max_samples
        self.loss_method = loss_method
        self.prefix = prefix
        self.estimator = GradientVarianceEstimator(method, group_depth)
        self.last: dict | None = None
        self.history: list[tuple[int, dict]] = []
        self._batch: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not callable(getattr(pl_module, self.loss_method, None)):
            raise ValueError(
                f"GradientVariance needs {type(pl_module).__name__}.{self.loss_method}(batch) returning the "
                f"(B,) per-sample losses; add that method or set loss_method"
            )

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *_: Any
    ) -> None:
        self._batch = batch

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        if self._batch is None or trainer.global_step % self.every_n_steps != 0:
            return
        result = self.compute(trainer, pl_module, self._batch)
        self._batch = None
        self.last = result
        self.history.append((trainer.global_step, result))
        metrics = self.metrics(result)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def compute(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any) -> dict:
        """Per-sample statistics on this rank's ``batch``, summed across ranks, then the estimates."""
        if self.max_samples is not None:
            n = batch_size(batch)
            batch = slice_batch(batch, slice(0, min(n, self.max_samples)), n)
        name = self.loss_method

        def per_sample_loss(model: Any, b: Any) -> torch.Tensor:
            return getattr(model, name)(b)

        with torch.enable_grad(), torch.autocast(pl_module.device.type, enabled=False):
            stats = self.estimator.stats(pl_module, per_sample_loss, batch)
        if trainer.world_size > 1:
            names = sorted(stats.sum_sq)
            vec = trainer.strategy.reduce(stats.flatten(names), reduce_op="sum")
            stats = GradStats.unflatten(vec, names, [stats.sum_g[k].numel() for k in names])
        out = finalize(stats, param_groups(pl_module, self.group_depth))
        out["method"] = self.estimator.chosen
        return out

    def metrics(self, result: dict) -> dict[str, float]:
        p = self.prefix
        out = {f"{p}/{k}": float(result[k]) for k in ("trace", "grad_norm_sq", "noise_scale")}
        out[f"{p}/minibatch_var"] = float(result["trace"]) / result["n"]
        if self.per_layer:
            for g, vals in result["groups"].items():
                for k, v in vals.items():
                    out[f"{p}/{g}/{k}"] = float(v)
        return out
