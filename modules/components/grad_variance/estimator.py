"""Choose how to compute per-sample gradient statistics, once per model, and compute them.

``method="auto"`` tries, in order: the hook fast path (every trainable parameter in a Linear /
Embedding / LayerNorm / RMSNorm, checked once against the single-sample loop on two samples), then
``torch.func`` vmap (checked to run on two samples), then the loop over single-sample micro-batches.
The choice is logged (logger ``modules.components.grad_variance``) and kept for later calls.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.components.grad_variance.hooks import Layout, hook_modules, hook_stats, probe_batched
from modules.components.grad_variance.per_sample import (
    PerSampleLoss,
    batch_size,
    loop_grads,
    loop_stats,
    slice_batch,
    trainable,
    vmap_stats,
)
from modules.components.grad_variance.stats import GradStats, PerSampleGrads, finalize

log = logging.getLogger("modules.components.grad_variance")
METHODS = ("auto", "hooks", "vmap", "loop")


@contextmanager
def _eval_mode(model: nn.Module):
    """Dropout off while checking the fast path: the comparison needs the same function twice."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def _agree(a: GradStats, b: GradStats, rtol: float) -> bool:
    for k in b.sum_sq:
        scale = max(b.sum_sq[k].abs().item(), 1e-30)
        if abs(a.sum_sq[k].item() - b.sum_sq[k].item()) > rtol * scale + 1e-20:
            return False
        gscale = max(b.sum_g[k].norm().item(), (b.sum_sq[k].item() * b.n) ** 0.5, 1e-30)
        if (a.sum_g[k] - b.sum_g[k]).norm().item() > rtol * gscale + 1e-20:
            return False
    return True


def param_groups(model: nn.Module, depth: int | None = None) -> dict[str, str]:
    """Parameter name -> group: its owning module's path, cut to ``depth`` components if given."""
    out = {}
    for k in trainable(model):
        parts = k.split(".")[:-1] or [k]
        out[k] = ".".join(parts[:depth] if depth else parts)
    return out


class GradientVarianceEstimator:
    """Per-sample gradient variance of ``per_sample_loss(model, batch) -> (B,)``; see ``stats`` for the maths.

    Args:
        method: "auto", "hooks" (fast path), "vmap" (torch.func reference) or "loop" (one backward
            pass per sample).
        group_depth: per-group values over module paths cut to this many components (None: the module
            owning each parameter).
        ghost: Linear-weight ghost norms for the hook path: "auto", "always" or "never".
        vmap_chunk_size: samples per vmap chunk (None: all at once) to bound memory.
    """

    def __init__(
        self,
        method: str = "auto",
        group_depth: int | None = None,
        ghost: str = "auto",
        vmap_chunk_size: int | None = None,
    ) -> None:
        if method not in METHODS:
            raise ConfigError(f"method must be one of {METHODS}, got {method!r}")
        if ghost not in ("auto", "always", "never"):
            raise ConfigError(f"ghost must be 'auto', 'always' or 'never', got {ghost!r}")
        self.method = method
        self.group_depth = group_depth
        self.ghost = ghost
        self.vmap_chunk_size = vmap_chunk_size
        self.chosen: str | None = None if method == "auto" else method
        self._layout: Layout | None = None

    def _choose(self, model: nn.Module, fn: PerSampleLoss, batch: Any) -> str:
        n = batch_size(batch)
        two = slice_batch(batch, slice(0, 2), n)
        with _eval_mode(model):
            if hook_modules(model) is not None:
                layout = probe_batched(model, fn, batch)
                if layout is not None:
                    try:
                        ok = _agree(hook_stats(model, fn, two, layout), loop_stats(model, fn, two), 1e-3)
                    except Exception as err:  # noqa: BLE001 - any failure means: use the reference
                        log.warning("gradient variance: hook fast path failed (%s); trying vmap", err)
                        ok = False
                    if ok:
                        self._layout = layout
                        return "hooks"
                    log.warning("gradient variance: hook fast path disagrees with the loop; trying vmap")
            try:
                vmap_stats(model, fn, two, self.vmap_chunk_size)
                return "vmap"
            except Exception as err:  # noqa: BLE001
                log.warning("gradient variance: vmap cannot trace this model (%s); using the loop", err)
                return "loop"

    def _path(self, model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any) -> str:
        """The method for this call: the cached choice, re-made when the hook layout changed."""
        if batch_size(batch) < 2 and self.chosen in (None, "hooks"):
            raise ConfigError("the gradient variance needs a batch of at least 2 samples")
        if self.chosen == "hooks":
            # the layout (rows per sample, broadcast layers) is re-probed every call on 1 and 2 samples:
            # cheap, and a loss whose layout changed (SFT -> DPO) is checked against the loop again
            layout = probe_batched(model, per_sample_loss, batch)
            if layout is None or (self.method == "auto" and layout != self._layout):
                self.chosen = None if self.method == "auto" else "hooks"
            self._layout = layout
        if self.chosen is None:
            self.chosen = self._choose(model, per_sample_loss, batch)
            log.info("gradient variance: using the %r method for %s", self.chosen, type(model).__name__)
        if self.chosen == "hooks" and self._layout is None:
            raise ConfigError("the hook fast path cannot follow this batch layout; use method='vmap'")
        return self.chosen

    def stats(self, model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any) -> GradStats:
        """The additive sufficient statistics (sum over ranks before ``finalize``)."""
        path = self._path(model, per_sample_loss, batch)
        if path == "hooks":
            return hook_stats(model, per_sample_loss, batch, self._layout, self.ghost)
        if path == "vmap":
            return vmap_stats(model, per_sample_loss, batch, self.vmap_chunk_size)
        return loop_stats(model, per_sample_loss, batch)

    def per_sample_grads(self, model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any) -> Tensor:
        """``(n, P)`` float64: the gradient of each sample's loss, parameters flattened in the order of
        ``model.named_parameters()`` (trainable ones; tied weights once). Same path choice as ``stats``."""
        path = self._path(model, per_sample_loss, batch)
        if path == "hooks":
            out = hook_stats(model, per_sample_loss, batch, self._layout, sink=PerSampleGrads(batch_size(batch)))
        elif path == "vmap":
            out = vmap_stats(model, per_sample_loss, batch, self.vmap_chunk_size, sink=PerSampleGrads(batch_size(batch)))
        else:
            out = loop_grads(model, per_sample_loss, batch)
        return out.matrix(list(trainable(model)))

    def __call__(self, model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any) -> dict:
        stats = self.stats(model, per_sample_loss, batch)
        out = finalize(stats, param_groups(model, self.group_depth))
        out["method"] = self.chosen
        return out


def estimate_gradient_variance(
    model: nn.Module,
    per_sample_loss: PerSampleLoss,
    batch: Any,
    method: str = "auto",
    group_depth: int | None = None,
) -> dict:
    """Gradient variance of a batch: ``{"n", "trace", "grad_norm_sq", "grad_norm_sq_unbiased",
    "noise_scale", "noise_scale_plugin", "groups", "method"}``.

    ``per_sample_loss(model, batch)`` returns the ``(B,)`` losses l_i (each the loss of sample i alone);
    ``trace`` = tr(Sigma), the unbiased sum over parameters of the variance of the per-sample gradients
    g_i = grad l_i; ``grad_norm_sq`` = |mean_i g_i|^2; ``grad_norm_sq_unbiased`` = that minus trace / B, an
    unbiased |G|^2; ``noise_scale`` = trace / grad_norm_sq_unbiased (B_simple); ``noise_scale_plugin`` =
    trace / grad_norm_sq; ``groups`` has the same per module (see ``modules.components.grad_variance.stats``). Gradients are never written to ``.grad``. For repeated calls on one
    model keep a ``GradientVarianceEstimator`` so that the automatic choice is made once.
    """
    with torch.enable_grad():
        return GradientVarianceEstimator(method, group_depth)(model, per_sample_loss, batch)


def per_sample_gradients(
    model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any, method: str = "auto"
) -> Tensor:
    """``(B, P)`` float64 per-sample gradients g_i = grad l_i (trainable parameters, flattened in the order
    of ``named_parameters``), by the same paths as ``estimate_gradient_variance``; ``.grad`` untouched."""
    with torch.enable_grad():
        return GradientVarianceEstimator(method).per_sample_grads(model, per_sample_loss, batch)
