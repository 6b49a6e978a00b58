"""Fast path: per-sample gradient statistics from one forward and one activation-only backward.

Forward hooks record, for every ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm`` and ``nn.RMSNorm``
call, the layer input a and output z; one ``torch.autograd.grad`` of sum_i l_i with respect to the
outputs z gives d = dl_i/dz for each sample (samples do not interact, so d of sample i only carries
l_i). Weight gradients are never formed by autograd (they are not requested); each layer's per-sample
gradient follows from (a, d):
  Linear      G_i = sum_t d_{i,t} a_{i,t}^T,  bias sum_t d_{i,t}
              or, without materialising G_i (ghost norm, BackPACK's BatchL2Grad / Opacus ghost
              clipping): |G_i|^2 = sum_{t,t'} (a_t . a_t')(d_t . d_t')
  Embedding   G_i[v] = sum_{t: idx_t = v} d_{i,t}
  LayerNorm   G_i = sum_t d_{i,t} * xhat_{i,t},  bias sum_t d_{i,t}
A layer called on an input without the batch dimension (a positional embedding of ``arange(T)``) has
its output broadcast over the batch: the hook returns it expanded to (B, ...) so that d is per sample.
Parameters shared between layers (tied embeddings) get their contributions summed before squaring.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.components.grad_variance.per_sample import PerSampleLoss, batch_size, check_losses, trainable
from modules.components.grad_variance.stats import GradStats, PerSampleGrads

SUPPORTED = (nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm)


def _supported(m: nn.Module) -> bool:
    if isinstance(m, nn.Embedding):
        return m.max_norm is None
    return isinstance(m, SUPPORTED)


def hook_modules(model: nn.Module) -> list[nn.Module] | None:
    """The supported layers owning every trainable parameter, or None if some parameter is not covered."""
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in model.modules()):
        return None  # batch statistics couple the samples: per-sample gradients are not those of l_i
    mods = [m for m in model.modules() if _supported(m) and any(True for _ in m.parameters(recurse=False))]
    covered = {id(p) for m in mods for p in m.parameters(recurse=False)}
    if any(id(p) not in covered for p in trainable(model).values()):
        return None
    return mods


Layout = dict[int, tuple[bool, int]]


def probe_batched(model: nn.Module, per_sample_loss: PerSampleLoss, batch: Any) -> Layout | None:
    """For each hooked layer: (batched, k), from forward passes on sub-batches of 1 and 2 samples.

    A batched call has k and 2k rows: k rows per sample, which must be sample-major (row = i * k + j,
    as ``reshape(n, k, ...)`` reads them; the one-time check against the loop catches any other order).
    A call without the batch dimension (a positional embedding of ``arange(T)``) has the same leading
    size both times; its output is broadcast against the rows of the batched call before it, k per
    sample, so the fast path expands it to k * n rows. Returns None for anything else.
    """
    from modules.components.grad_variance.per_sample import slice_batch

    mods = hook_modules(model) or []
    n = batch_size(batch)
    calls: list[list[tuple[int, int]]] = [[], []]
    for size in (1, 2):
        handles = []
        for m in mods:

            def rec(mod: nn.Module, inp: tuple, out: Tensor, size: int = size) -> None:
                calls[size - 1].append((id(mod), out.shape[0] if out.dim() > 0 else 0))

            handles.append(m.register_forward_hook(rec))
        try:
            with torch.no_grad():
                per_sample_loss(model, slice_batch(batch, slice(0, size), n))
        finally:
            for h in handles:
                h.remove()
    if [c[0] for c in calls[0]] != [c[0] for c in calls[1]]:
        return None
    out: Layout = {}
    k_prev = 1
    for (mid, a), (_, b) in zip(*calls):
        if b == 2 * a and a > 0:
            layout = (True, a)
            k_prev = a
        elif b == a:
            layout = (False, k_prev)
        else:
            return None
        if out.setdefault(mid, layout) != layout:
            return None
    return out


def _per_sample_grads(m: nn.Module, a: Tensor, d: Tensor, n: int) -> dict[str, Tensor]:
    """Per-sample gradients ``(n, *param.shape)`` of the parameters of layer ``m`` from input a, grad d."""
    if isinstance(m, nn.Linear):
        a3, d3 = a.reshape(n, -1, a.shape[-1]), d.reshape(n, -1, d.shape[-1])
        out = {"weight": torch.bmm(d3.transpose(1, 2), a3)}
        if m.bias is not None:
            out["bias"] = d3.sum(1)
        return out
    if isinstance(m, nn.Embedding):
        idx = a.reshape(n, -1)
        d3 = d.reshape(n, idx.shape[1], -1)
        g = torch.zeros(n, m.num_embeddings, d3.shape[-1], dtype=d.dtype, device=d.device)
        g.scatter_add_(1, idx.unsqueeze(-1).expand_as(d3), d3)
        if m.padding_idx is not None:
            g[:, m.padding_idx] = 0
        return {"weight": g}
    shape = tuple(m.normalized_shape)
    if isinstance(m, nn.LayerNorm):
        xhat = F.layer_norm(a, shape, None, None, m.eps)
    else:
        xhat = F.rms_norm(a, shape, None, m.eps)
    d3 = d.reshape(n, -1, *shape)
    out = {"weight": (d3 * xhat.reshape(d3.shape)).sum(1)}
    if getattr(m, "bias", None) is not None:
        out["bias"] = d3.sum(1)
    return out


def _ghost_linear(a: Tensor, d: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """(sum_i |G_i|^2, sum_i G_i) of a Linear weight without forming G_i."""
    a3, d3 = a.reshape(n, -1, a.shape[-1]), d.reshape(n, -1, d.shape[-1])
    sq = (torch.bmm(a3, a3.transpose(1, 2)) * torch.bmm(d3, d3.transpose(1, 2))).sum()
    return sq, d3.reshape(-1, d3.shape[-1]).T @ a3.reshape(-1, a3.shape[-1])


def hook_stats(
    model: nn.Module,
    per_sample_loss: PerSampleLoss,
    batch: Any,
    batched: Layout,
    ghost: str = "auto",
    max_materialize_bytes: int = 256 * 2**20,
    sink: GradStats | PerSampleGrads | None = None,
) -> GradStats | PerSampleGrads:
    """Statistics for every trainable parameter; requires ``hook_modules(model)`` to be not None.

    ``ghost``: "never", "always" or "auto" (ghost norms for Linear weights whose per-sample gradients
    would exceed ``max_materialize_bytes``); tied weights are always materialised. ``sink``: where the
    per-sample gradients go (default a fresh ``GradStats``; a ``PerSampleGrads`` keeps them, ghost off).
    """
    mods = hook_modules(model)
    if mods is None:
        raise ConfigError("hook_stats: some trainable parameter is not owned by a supported layer")
    n = batch_size(batch)
    names = {id(p): k for k, p in trainable(model).items()}
    owners: dict[int, int] = {}
    for m in mods:
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    records: list[tuple[nn.Module, Tensor, Tensor]] = []

    def rec(mod: nn.Module, inp: tuple, out: Tensor) -> Tensor | None:
        if not out.requires_grad:
            return None
        a = inp[0]
        is_batched, k = batched.get(id(mod), (True, 1))
        if not is_batched:
            a, out = a.expand(k * n, *a.shape), out.expand(k * n, *out.shape)
            records.append((mod, a, out))
            return out
        records.append((mod, a, out))
        return None

    handles = [m.register_forward_hook(rec) for m in mods]
    try:
        losses = check_losses(per_sample_loss(model, batch), n)
    finally:
        for h in handles:
            h.remove()
    grads = torch.autograd.grad(losses.sum(), [r[2] for r in records], allow_unused=True)
    stats = GradStats(n=n) if sink is None else sink
    if isinstance(stats, PerSampleGrads):
        ghost = "never"
    shared: dict[int, Tensor] = {}
    calls: dict[int, int] = {}
    for m, _, _ in records:
        calls[id(m)] = calls.get(id(m), 0) + 1
    for (m, a, _), d in zip(records, grads):
        if d is None:
            continue
        a = a.detach()
        use_ghost = False
        single = owners.get(id(getattr(m, "weight", None)), 0) == 1 and calls[id(m)] == 1
        if isinstance(m, nn.Linear) and m.weight.requires_grad and single:
            size = n * m.weight.numel() * m.weight.element_size()
            use_ghost = ghost == "always" or (ghost == "auto" and size > max_materialize_bytes)
        if use_ghost:
            sq, g_sum = _ghost_linear(a, d, n)
            stats.add(names[id(m.weight)], sq, g_sum)
            if m.bias is not None and m.bias.requires_grad:
                stats.add_per_sample(names[id(m.bias)], d.reshape(n, -1, d.shape[-1]).sum(1))
            continue
        for pname, g in _per_sample_grads(m, a, d, n).items():
            p = getattr(m, pname)
            if not p.requires_grad:
                continue
            if owners[id(p)] > 1 or calls[id(m)] > 1:
                shared[id(p)] = shared[id(p)] + g if id(p) in shared else g
            else:
                stats.add_per_sample(names[id(p)], g)
    for pid, g in shared.items():
        stats.add_per_sample(names[pid], g)
    for k, p in trainable(model).items():
        if k not in stats:  # unused by this loss: zero gradient for every sample
            stats.add(k, torch.zeros((), device=p.device), torch.zeros(p.numel(), device=p.device))
    return stats
