"""Gradient variance diagnostic: tr(Sigma), |G|^2 and the simple noise scale from per-sample gradients.

``estimate_gradient_variance(model, per_sample_loss, batch)`` works on any ``nn.Module`` (see
``modules.components.grad_variance``); the ``GradientVariance`` callback runs it inside Lightning.
``per_sample_gradients(model, per_sample_loss, batch)`` returns the ``(B, P)`` per-sample gradients
themselves, by the same paths.

Protocol: the LightningModule exposes ``per_sample_loss(batch) -> (B,)``, the loss l_i of each sample
alone (mean over its own tokens), such that the training loss is the mean over samples. The callback
logs, every ``every_n_steps`` optimizer steps, on the batch just trained on (before the optimizer step):
  diag/grad_var/trace                  tr(Sigma): unbiased sum over parameters of the variance of g_i = grad l_i
  diag/grad_var/grad_norm_sq           |gbar|^2 = |mean_i g_i|^2, the batch gradient's squared norm
  diag/grad_var/grad_norm_sq_unbiased  |gbar|^2 - tr(Sigma) / B: unbiased estimate of |G|^2 = |E g_i|^2
  diag/grad_var/noise_scale            tr(Sigma) / unbiased |G|^2 (McCandlish et al. 2018, B_simple; NaN when
                                       the unbiased |G|^2 <= 0)
  diag/grad_var/noise_scale_plugin     tr(Sigma) / |gbar|^2 (what this key held before: it estimates
                                       B / (1 + B / n), so it saturates near the batch size)
  diag/grad_var/minibatch_var          tr(Sigma) / B: the variance of the batch-mean gradient
  diag/grad_var/n                      B, the samples measured
  diag/grad_var/<module>/<key>         per layer (``per_layer=True``), the first five keys
tr(Sigma) and minibatch_var scale with the square of the loss (half the loss, a quarter of the variance);
the noise scales do not, so compare estimators by them (see ``modules.components.grad_variance.stats``).

It never touches ``.grad`` or the optimizer, so the training step is unchanged. With gradient
accumulation it uses the last micro-batch of the window; under mixed precision it computes with autocast
off; under DDP each rank computes the sums over its shard of sum_i |g_i|^2 and sum_i g_i from per-sample
gradients (never the already averaged ``.grad``), they are summed across ranks and the estimate is formed
over the global batch.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import nn

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.components.grad_variance import (
    GradientVarianceEstimator,
    GradStats,
    estimate_gradient_variance,
    finalize,
    per_sample_gradients,
)
from modules.components.grad_variance.estimator import METHODS, param_groups
from modules.components.grad_variance.per_sample import batch_size, slice_batch
from modules.protocols import PerSampleLoss

__all__ = ["GradientVariance", "estimate_gradient_variance", "per_sample_gradients"]
KEYS = ("trace", "grad_norm_sq", "grad_norm_sq_unbiased", "noise_scale", "noise_scale_plugin")


class GradientVariance(Diagnostic):
    """Per-sample gradient variance statistics of the batch about to be trained on.

    Args:
        schedule: when to measure (default: the first step and every 25 optimiser steps).
        method: "auto" (fast hook path when it covers the model, else torch.func vmap, else a loop over
            single samples; the choice is logged once), "hooks", "vmap" or "loop".
        per_layer: also log the values of every module owning parameters.
        group_depth: cut module paths to this many components for the per-layer values (None: full path).
        max_samples: use at most this many samples of each rank's batch (None: all) to bound the cost.
        loss_method: name of the LightningModule method returning the ``(B,)`` per-sample losses.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """

    name = "grad_var"
    moment = "before_step"

    def __init__(
        self,
        schedule: Schedule = Schedule(every_n_steps=25),
        method: Literal["auto", "hooks", "vmap", "loop"] = "auto",
        per_layer: bool = True,
        group_depth: int | None = None,
        max_samples: int | None = None,
        loss_method: str = "per_sample_loss",
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = False,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if method not in METHODS:
            raise ConfigError(f"method must be one of {METHODS}, got {method!r}")
        if max_samples is not None and max_samples < 2:
            raise ConfigError(f"max_samples must be at least 2 or None, got {max_samples}")
        self.method = method
        self.per_layer = per_layer
        self.group_depth = group_depth
        self.max_samples = max_samples
        self.loss_method = loss_method
        self.estimator = GradientVarianceEstimator(method, group_depth)
        self._groups: dict[str, str] = {}

    def unsupported_reason(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in pl_module.modules()):
            return (
                f"GradientVariance cannot measure {type(pl_module).__name__}: batch normalisation couples the "
                "samples of a batch, so per-sample gradients are not defined"
            )
        ok = isinstance(pl_module, PerSampleLoss) if self.loss_method == "per_sample_loss" else True
        if ok and callable(getattr(pl_module, self.loss_method, None)):
            return None
        return (
            f"GradientVariance needs {type(pl_module).__name__}.{self.loss_method}(batch) returning the (B,) "
            "per-sample losses whose mean is the training loss: add that method or set loss_method"
        )

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any]:
        """This rank's additive statistics on its shard of the batch (never the averaged ``.grad``)."""
        batch = moment.batch
        if self.max_samples is not None:
            n = batch_size(batch)
            batch = slice_batch(batch, slice(0, min(n, self.max_samples)), n)
        name = self.loss_method

        def per_sample_loss(model: Any, b: Any) -> torch.Tensor:
            return getattr(model, name)(b)

        with torch.enable_grad(), torch.autocast(pl_module.device.type, enabled=False):
            stats = self.estimator.stats(pl_module, per_sample_loss, batch)
        self._groups = param_groups(pl_module, self.group_depth)
        out: dict[str, Any] = {"n": torch.tensor(float(stats.n), dtype=torch.float64)}
        for k in stats.sum_sq:
            out[f"sq/{k}"], out[f"g/{k}"] = stats.sum_sq[k], stats.sum_g[k]
        return out

    def reduction(self, key: str) -> Literal["sum", "max", "min"] | None:
        return "sum"

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        grads = GradStats(n=int(round(float(stats["n"]))))
        for key, value in stats.items():
            if key.startswith("sq/"):
                name = key[3:]
                grads.sum_sq[name], grads.sum_g[name] = value, stats[f"g/{name}"]
        return self.metrics(finalize(grads, self._groups))

    def metrics(self, result: dict) -> dict[str, float]:
        """The logged values (without the ``diag/grad_var/`` prefix) from ``finalize``'s estimates."""
        out = {k: float(result[k]) for k in KEYS}
        out["minibatch_var"] = float(result["trace"]) / result["n"]
        out["n"] = float(result["n"])
        if self.per_layer:
            for g, vals in result["groups"].items():
                for k, v in vals.items():
                    out[f"{g}/{k}"] = float(v)
        return out
