"""CRAFT's closed-form server aggregation and the FedAvg baseline, as plain functions on tensors.

Notation (Wang, Liu, Thuerey, "CRAFT: Conflict-Resolved Aggregation for Federated Training", arXiv
2605.21317): a round has ``m`` client updates ``g_i = theta - theta_i`` (global minus local weights, a
descent direction) with data-fraction weights ``w_i``. For one layer group, ``U`` stacks the unit rows
``u_i = g_i / |g_i|`` and ``r`` is the unit reference direction (the previous round's aggregate; 0 in the
first round). CRAFT's direction is the update closest to ``r`` that is aligned with every client in
proportion to its weight::

    g* = argmin_g |g - r|^2  subject to  U g = w      =>      g* = r + pinv(U) (w - U r).

When ``m <= d`` and ``U`` has full row rank the constraints hold exactly, so ``cos(g*, g_i) = w_i / |g*| > 0``
for every client: no client's update is opposed. With ``m > d`` (or dependent rows) ``pinv`` gives the
least-squares compromise ``r + argmin_v {|v| : v minimises |U (r + v) - w|}``, and positivity is no longer
guaranteed. The layer-wise variant solves one such problem per layer group; CRAFT-global solves one for
the whole model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from errors import ConfigError

#: module types whose parameters join the preceding layer's group (a norm layer rescales its conv's output)
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.GroupNorm,
    nn.LayerNorm,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)


def check_weights(weights: Tensor, m: int) -> Tensor:
    """``weights`` as a float64 vector of ``m`` non-negative finite entries with a positive sum."""
    w = torch.as_tensor(weights)
    if w.dim() != 1 or w.numel() != m:
        raise ConfigError(f"weights must be a vector of one weight per client ({m}), got shape {tuple(w.shape)}")
    w = w.double()
    if not torch.isfinite(w).all():
        raise ConfigError(f"weights must be finite, got {w.tolist()}")
    if (w < 0).any() or w.sum() <= 0:
        raise ConfigError(f"weights must be non-negative with a positive sum (client data fractions), got {w.tolist()}")
    return w


def _check_updates(updates: Tensor) -> None:
    if updates.dim() != 2:
        raise ConfigError(f"updates must be a matrix (m clients, d coordinates), got shape {tuple(updates.shape)}")
    bad = (~torch.isfinite(updates)).any(dim=1)
    if bad.any():
        raise ConfigError(
            f"client update(s) {bad.nonzero().flatten().tolist()} contain NaN or inf: the local training diverged "
            "(lower the client learning rate)"
        )


def craft_direction(updates: Tensor, weights: Tensor, reference: Tensor | None = None) -> Tensor:
    """CRAFT's aggregate ``g* = r + pinv(U) (w - U r)`` for one layer group.

    Args:
        updates: ``(m, d)`` client updates ``g_i`` (rows).
        weights: ``(m,)`` non-negative client weights (data fractions); renormalised to sum 1 over the
            clients whose update is non-zero.
        reference: ``(d,)`` reference direction ``r``, used as a unit vector (None or zero: ``r = 0``, the
            minimum-norm solution of ``U g = w``).

    Returns:
        ``(d,)``, the minimiser of ``|g - r|^2`` subject to ``U g = w`` (least squares when infeasible).
        Zero rows are dropped first; with one non-zero row left that client's raw update is returned (the
        authors' convention), with none a zero vector. Computed in float64, returned in ``updates.dtype``.
    """
    _check_updates(updates)
    m, d = updates.shape
    w = check_weights(weights, m)
    if reference is not None:
        reference = torch.as_tensor(reference)
        if reference.shape != (d,):
            raise ConfigError(f"reference must have shape ({d},) like one update, got {tuple(reference.shape)}")
        if not torch.isfinite(reference).all():
            raise ConfigError("reference contains NaN or inf")
    g = updates.double()
    norms = g.norm(dim=1)
    keep = norms > 0
    if int(keep.sum()) == 0 or w[keep].sum() <= 0:
        return torch.zeros(d, dtype=updates.dtype, device=updates.device)
    if int(keep.sum()) == 1:
        return updates[keep][0].clone()
    u = g[keep] / norms[keep, None]
    w = w[keep] / w[keep].sum()
    r = torch.zeros(d, dtype=torch.float64, device=updates.device)
    if reference is not None:
        ref = reference.to(device=updates.device, dtype=torch.float64)
        ref_norm = ref.norm()
        if ref_norm > 0:
            r = ref / ref_norm
    out = r + torch.linalg.pinv(u) @ (w - u @ r)
    return out.to(updates.dtype)


def fedavg_direction(updates: Tensor, weights: Tensor) -> Tensor:
    """FedAvg's aggregate ``sum_i w_i g_i`` with the weights normalised to sum 1 (McMahan et al. 2017)."""
    _check_updates(updates)
    w = check_weights(weights, updates.shape[0])
    return ((w / w.sum()).to(updates.dtype) @ updates).to(updates.dtype)


def default_groups(keys: Sequence[str], shapes: Mapping[str, Sequence[int]] | None = None) -> list[list[str]]:
    """Layer groups from parameter names alone: one group per module (the name up to its last dot).

    A module whose tensors are all vectors (a norm layer's scale and shift: ``shapes`` tells) joins the
    preceding group, as the authors attach a GroupNorm/LayerNorm to the convolution before it. With a model
    at hand, ``layer_groups(model)`` decides by module type instead; the two agree on MLPs and on
    ResNets whose norm layers follow their convolution.
    """
    order: list[str] = []
    members: dict[str, list[str]] = {}
    for key in keys:
        prefix = key.rpartition(".")[0]
        if prefix not in members:
            order.append(prefix)
            members[prefix] = []
        members[prefix].append(key)
    groups: list[list[str]] = []
    for prefix in order:
        names = members[prefix]
        vector_only = shapes is not None and all(len(shapes[k]) <= 1 for k in names)
        if vector_only and groups and prefix:
            groups[-1].extend(names)
        else:
            groups.append(list(names))
    return groups


def layer_groups(model: nn.Module) -> list[list[str]]:
    """CRAFT's layer groups of ``model``: each module's own parameters (weight and bias) form one group; a
    norm layer (``NORM_TYPES``) joins the group of the layer before it. Names are ``named_parameters`` keys."""
    groups: list[list[str]] = []
    for prefix, module in model.named_modules():
        names = [f"{prefix}.{n}" if prefix else n for n, _ in module.named_parameters(recurse=False)]
        if not names:
            continue
        if isinstance(module, NORM_TYPES) and groups:
            groups[-1].extend(names)
        else:
            groups.append(names)
    return groups


def check_groups(groups: Sequence[Sequence[str]], keys: Sequence[str]) -> list[list[str]]:
    """``groups`` must partition ``keys``: every key in exactly one group, no unknown key, no empty group."""
    seen: dict[str, int] = {}
    for i, group in enumerate(groups):
        if not group:
            raise ConfigError(f"layer group {i} is empty")
        for k in group:
            if k in seen:
                raise ConfigError(f"parameter {k!r} is in layer groups {seen[k]} and {i}: each belongs to one group")
            seen[k] = i
    unknown = sorted(set(seen) - set(keys))
    missing = [k for k in keys if k not in seen]
    if unknown or missing:
        raise ConfigError(
            f"layer groups must cover the updates' keys exactly: unknown {unknown}, missing {missing}"
        )
    return [list(g) for g in groups]


def craft_aggregate(
    updates: Mapping[str, Tensor],
    weights: Tensor,
    reference: Mapping[str, Tensor] | None = None,
    groups: Sequence[Sequence[str]] | None = None,
) -> dict[str, Tensor]:
    """Layer-wise CRAFT: ``craft_direction`` on each layer group alone.

    Args:
        updates: ``{name: (m, *shape)}``, every client's update of each parameter (same ``m`` throughout).
        weights: ``(m,)`` client weights.
        reference: ``{name: (*shape)}``, the previous aggregate (None: ``r = 0`` in every group).
        groups: lists of names solved together (default ``default_groups``: one module's parameters, a norm
            layer with the preceding one); ``[list(updates)]`` is CRAFT-global.

    Returns:
        ``{name: (*shape)}``, the aggregate direction (the server steps ``theta -= eta_s g``).
    """
    keys = list(updates)
    if not keys:
        raise ConfigError("updates is empty: no parameters to aggregate")
    m = updates[keys[0]].shape[0]
    for k in keys:
        if updates[k].dim() < 1 or updates[k].shape[0] != m:
            raise ConfigError(f"updates[{k!r}] has shape {tuple(updates[k].shape)}: every entry needs the {m} clients first")
    if reference is not None:
        for k in keys:
            if k not in reference or tuple(reference[k].shape) != tuple(updates[k].shape[1:]):
                got = tuple(reference[k].shape) if k in reference else "missing"
                raise ConfigError(f"reference[{k!r}] must have shape {tuple(updates[k].shape[1:])}, got {got}")
    shapes = {k: tuple(updates[k].shape[1:]) for k in keys}
    groups = check_groups(groups, keys) if groups is not None else default_groups(keys, shapes)
    out: dict[str, Tensor] = {}
    for group in groups:
        u = torch.cat([updates[k].reshape(m, -1) for k in group], dim=1)
        r = torch.cat([reference[k].reshape(-1) for k in group]) if reference is not None else None
        g = craft_direction(u, weights, r)
        offset = 0
        for k in group:
            size = int(torch.Size(shapes[k]).numel())
            out[k] = g[offset : offset + size].reshape(shapes[k])
            offset += size
    return {k: out[k] for k in keys}
