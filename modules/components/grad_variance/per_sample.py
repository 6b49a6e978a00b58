"""Reference per-sample gradients: ``torch.func`` (vmap of grad) and a loop over single-sample batches.

Both materialise g_i for every parameter and reduce them to ``GradStats`` at once. The loop is the
fallback for modules vmap cannot trace (data-dependent control flow, ``.item()``, in-place on inputs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optree
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from errors import ConfigError
from modules.components.grad_variance.stats import GradStats, PerSampleGrads

PerSampleLoss = Callable[[nn.Module, Any], Tensor]


def batch_size(batch: Any) -> int:
    """Leading dimension of the first tensor in ``batch`` (any nesting of tuples, lists, dicts)."""
    for leaf in optree.tree_flatten(batch, none_is_leaf=True)[0]:
        if isinstance(leaf, Tensor) and leaf.dim() > 0:
            return int(leaf.shape[0])
    raise ConfigError("the batch holds no tensor with a batch dimension")


def slice_batch(batch: Any, index: slice, n: int) -> Any:
    """The samples ``index`` of every tensor whose leading dimension is the batch size ``n``."""
    leaves, spec = optree.tree_flatten(batch, none_is_leaf=True)
    out = [x[index] if isinstance(x, Tensor) and x.dim() > 0 and x.shape[0] == n else x for x in leaves]
    return optree.tree_unflatten(spec, out)


def check_losses(losses: Tensor, n: int) -> Tensor:
    if not isinstance(losses, Tensor) or losses.shape != (n,):
        shape = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
        raise ConfigError(
            f"per_sample_loss must return one loss per sample, shape ({n},), got {shape}; "
            "return the un-averaged loss of each sample (mean over its own tokens only)"
        )
    return losses


def trainable(model: nn.Module) -> dict[str, nn.Parameter]:
    """Parameters that require grad, tied ones once (under their first name)."""
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


class _LossAdapter(nn.Module):
    """Lets ``functional_call`` run an arbitrary ``per_sample_loss(model, batch)`` as a forward."""

    def __init__(self, model: nn.Module, fn: PerSampleLoss) -> None:
        super().__init__()
        self.model = model
        self.fn = fn

    def forward(self, batch: Any) -> Tensor:
        return self.fn(self.model, batch)


def vmap_stats(
    model: nn.Module,
    per_sample_loss: PerSampleLoss,
    batch: Any,
    chunk_size: int | None = None,
    sink: GradStats | PerSampleGrads | None = None,
) -> GradStats | PerSampleGrads:
    n = batch_size(batch)
    params = {"model." + k: p.detach() for k, p in trainable(model).items()}
    frozen = {"model." + k: p.detach() for k, p in model.named_parameters() if not p.requires_grad}
    buffers = {"model." + k: b for k, b in model.named_buffers()}
    adapter = _LossAdapter(model, per_sample_loss)
    leaves, spec = optree.tree_flatten(batch, none_is_leaf=True)
    dims = [0 if isinstance(x, Tensor) and x.dim() > 0 and x.shape[0] == n else None for x in leaves]

    def loss_one(p: dict[str, Tensor], *one: Any) -> Tensor:
        b = optree.tree_unflatten(spec, [x.unsqueeze(0) if d == 0 else x for x, d in zip(one, dims)])
        out = functional_call(adapter, (p, frozen, buffers), (b,))
        return check_losses(out, 1)[0]

    g = vmap(grad(loss_one), in_dims=(None, *dims), randomness="different", chunk_size=chunk_size)(
        params, *leaves
    )
    stats = GradStats(n=n) if sink is None else sink
    for k, v in g.items():
        stats.add_per_sample(k[len("model.") :], v)
    return stats


def loop_stats(model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any) -> GradStats:
    """One backward pass per sample; never touches ``.grad``."""
    n = batch_size(batch)
    params = trainable(model)
    names, tensors = list(params), list(params.values())
    sq = [torch.zeros((), dtype=torch.float64, device=p.device) for p in tensors]
    gs = [torch.zeros(p.numel(), dtype=torch.float64, device=p.device) for p in tensors]
    for i in range(n):
        loss = check_losses(per_sample_loss(model, slice_batch(batch, slice(i, i + 1), n)), 1)[0]
        grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        for j, gi in enumerate(grads):
            if gi is not None:
                gi = gi.detach().reshape(-1).to(torch.float64)
                sq[j] += gi.pow(2).sum()
                gs[j] += gi
    stats = GradStats(n=n)
    for j, k in enumerate(names):
        stats.add(k, sq[j], gs[j])
    return stats


def loop_grads(model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any) -> PerSampleGrads:
    """The per-sample gradients themselves, one backward pass per sample (the reference)."""
    n = batch_size(batch)
    params = trainable(model)
    names, tensors = list(params), list(params.values())
    rows: list[list[Tensor]] = []
    for i in range(n):
        loss = check_losses(per_sample_loss(model, slice_batch(batch, slice(i, i + 1), n)), 1)[0]
        grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        rows.append([torch.zeros(p.numel(), dtype=torch.float64, device=p.device) if gi is None
                     else gi.detach().reshape(-1).to(torch.float64) for gi, p in zip(grads, tensors)])
    out = PerSampleGrads(n=n)
    for j, k in enumerate(names):
        out.add_per_sample(k, torch.stack([r[j] for r in rows]))
    return out
