"""Count the causal pieces (spiking nets) or linear regions (ReLU nets) a model realises on a data split.

Causal pieces (paper 000-01, Dold & Petersen). For neuron ``j`` of layer ``l`` on input ``x`` the causal set
is ``C_j(x) = {i : t_i(x) < t_j(x)}`` (empty when ``j`` is silent). In ``mode="path"`` (default) only the
output's causal path counts: the relevant neurons of the last layer are the output neurons that spike, a
neuron of layer ``l - 1`` is relevant when it is in the causal set of a relevant neuron of layer ``l``, and
the causal sets of irrelevant neurons are blanked. ``mode="full"`` keeps every causal set. The piece of
``x`` is the tuple of all (kept) causal sets; the count is the number of distinct pieces over the split.

Protocols the model may expose (the callback never imports a method):

* ``spike_times(batch)`` (``modules.protocols.SpikeTimes``): ``[(t_pre (B, N_in), t_post (B, N_out)),
  ...]`` per layer, ``inf`` = no spike. Layer ``l``'s inputs are layer ``l - 1``'s outputs, optionally
  followed by extra (bias) inputs.
* ``activation_patterns(batch)`` (``modules.protocols.ActivationPatterns``): ``[bool (B, width), ...]``,
  the activation pattern of a piecewise-linear network (its linear region).
* neither: forward hooks on every ``nn.ReLU`` / ``nn.LeakyReLU`` record ``pre-activation > 0`` (linear
  regions of a ReLU network).

Keys: each sample's bits are packed into bytes; ``key="exact"`` counts with ``torch.unique`` on the packed
rows, ``key="hash128"`` on two independent 64-bit linear hashes ``sum_k byte_k r_k`` (``r_k < 2^31``
random, exact integer arithmetic, collision probability below ``2^-62`` per pair), ``key="auto"`` stays
exact until the stored keys pass ``max_exact_bytes``. Under DDP the ranks' distinct keys are gathered and
the union is counted (never a sum of per-rank counts).

Logged: ``diag/causal_pieces/count``, ``/fraction`` (count / samples; 1 = saturated), ``/entropy`` (bits,
of the piece-occupancy histogram), ``/layer{l}_distinct_sets`` (distinct per-layer patterns),
``/relevant_neurons_mean``, and at fit start ``/count_init``; with a ``ProvidesPlaneGrid`` DataModule also
``/grid_count_{init,final}`` (pieces on a dense grid of the input plane, which does not saturate at the
number of samples); with ``lines > 0`` also ``/line_pieces`` and ``/line_pieces_init`` (mean pieces crossed
along straight segments between pairs of samples, ``line_piece_counts``). In ``mode="full"`` every key is ``diag/causal_pieces/full/<key>`` instead, so a path
and a full counter can watch one run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import move_data_to_device
from torch import Tensor, nn
from torchmetrics import Metric

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from errors import ConfigError
from modules.protocols import ActivationPatterns, ProvidesPlaneGrid, SpikeTimes
from tracking.figures import new_figure

PREFIX = "diag/causal_pieces"
# (x * _BYTE_MAGIC) >> 56 gathers the low bits of the 8 bytes of x into one byte (x's bytes are 0 or 1)
_BYTE_MAGIC = 0x0102040810204080


def pack_bits(bits: Tensor) -> Tensor:
    """Bool ``(B, n)`` -> uint8 ``(B, 8 * ceil(n / 64))`` (little-endian in each byte, zero padding), so that the
    rows also view as int64 words: exact counting on a few words per row is much faster than on bytes."""
    b, n = bits.shape
    pad = (-n) % 64
    if pad:
        bits = torch.cat([bits, bits.new_zeros(b, pad)], dim=1)
    octets = bits.contiguous().view(torch.uint8).view(torch.int64)  # 8 bools (bytes 0/1) per int64
    return (((octets * _BYTE_MAGIC) >> 56) & 0xFF).to(torch.uint8)


def unique_rows(keys: Tensor) -> tuple[Tensor, Tensor]:
    """Distinct rows of an integer matrix and their multiplicities (``torch.unique(dim=0)``, about 2x faster):
    a lexicographic order from stable 1-D argsorts, column by column from the last."""
    n = keys.shape[0]
    idx = torch.arange(n, device=keys.device)
    for c in range(keys.shape[1] - 1, -1, -1):
        idx = idx[torch.argsort(keys[idx, c], stable=True)]
    ordered = keys[idx]
    new = torch.ones(n, dtype=torch.bool, device=keys.device)
    new[1:] = (ordered[1:] != ordered[:-1]).any(1)
    starts = new.nonzero().squeeze(1)
    counts = torch.diff(torch.cat([starts, torch.tensor([n], device=keys.device)]))
    return ordered[starts], counts


def causal_bits(pairs: list[tuple[Tensor, Tensor]], mode: str = "path") -> tuple[list[Tensor], Tensor]:
    """Per layer the flattened causal-set masks ``(B, N_in * N_out)`` and the number of relevant neurons.

    A column that must stay empty (silent neuron, or irrelevant in path mode) gets ``t_post = -inf``, so one
    comparison ``t_pre < t_post`` builds the masked causal sets.
    """
    n_layers = len(pairs)
    masks: list[Tensor] = [None] * n_layers  # type: ignore[list-item]
    if mode == "path":
        relevant_total = torch.zeros(pairs[0][0].shape[0], device=pairs[0][0].device)
        rel = torch.isfinite(pairs[-1][1])
        for l in range(n_layers - 1, -1, -1):
            t_pre, t_post = pairs[l]
            masks[l] = t_pre.unsqueeze(2) < torch.where(rel, t_post, -math.inf).unsqueeze(1)
            relevant_total = relevant_total + rel.sum(1)
            if l > 0:
                # extra (bias) inputs after the previous layer's outputs are not neurons of that layer
                rel = masks[l].any(2)[:, : pairs[l - 1][1].shape[1]]
    else:
        for l, (t_pre, t_post) in enumerate(pairs):
            masks[l] = t_pre.unsqueeze(2) < torch.where(torch.isfinite(t_post), t_post, -math.inf).unsqueeze(1)
        relevant_total = sum(torch.isfinite(t_post).sum(1) for _, t_post in pairs)
    return [m.flatten(1) for m in masks], relevant_total.float()


# Leaf modules that keep a ReLU network piecewise linear in its input (batch norm in eval mode is affine).
_PIECEWISE_LINEAR = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ReLU, nn.LeakyReLU, nn.Identity, nn.Flatten,
                     nn.Dropout, nn.BatchNorm1d, nn.BatchNorm2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.MaxPool2d)


def is_piecewise_linear_relu(module: nn.Module) -> bool:
    """Whether every leaf of ``module`` is a linear/conv layer, a ReLU or a shape/affine op, with a ReLU:
    then its activation patterns are its linear regions. (A transformer's ReLUs are not.)"""
    leaves = [m for m in module.modules() if not any(True for _ in m.children()) and not isinstance(m, Metric)]
    relus = any(isinstance(m, nn.ReLU | nn.LeakyReLU) for m in leaves)
    return relus and all(isinstance(m, _PIECEWISE_LINEAR) for m in leaves)


def relu_patterns(module: nn.Module, batch) -> list[Tensor]:
    """Activation patterns ``pre-activation > 0`` of every ReLU / LeakyReLU layer, found with forward hooks."""
    acts = [m for m in module.modules() if isinstance(m, (nn.ReLU, nn.LeakyReLU))]
    if not acts:
        raise ConfigError(
            f"{type(module).__name__} has no spike_times(batch) or activation_patterns(batch) method and no "
            "nn.ReLU/nn.LeakyReLU layers: expose one of these protocols to count its pieces"
        )
    found: list[Tensor] = []
    hooks = [a.register_forward_hook(lambda _m, inp, _out: found.append(inp[0].flatten(1) > 0)) for a in acts]
    try:
        module(batch[0] if isinstance(batch, (tuple, list)) else batch)
    finally:
        for h in hooks:
            h.remove()
    return found


def piece_bits(module: nn.Module, batch, mode: str = "path") -> tuple[list[Tensor], Tensor | None]:
    """The per-layer key bits of every sample of ``batch`` through whichever protocol ``module`` offers."""
    if isinstance(module, SpikeTimes):
        return causal_bits(module.spike_times(batch), mode)
    if isinstance(module, ActivationPatterns):
        return [p.flatten(1).bool() for p in module.activation_patterns(batch)], None
    return relu_patterns(module, batch), None


@dataclass
class PieceCount:
    """Result of one count; ``keys``/``counts`` are the distinct piece keys and their occupancy."""
    count: int
    samples: int
    entropy: float
    layer_distinct: list[int]
    relevant_mean: float | None
    keys: Tensor = field(repr=False)
    counts: Tensor = field(repr=False)

    @property
    def fraction(self) -> float:
        return self.count / self.samples

    def metrics(self) -> dict[str, float]:
        """The logged values, without the ``diag/causal_pieces/`` prefix."""
        out = {"count": float(self.count), "fraction": self.fraction, "entropy": self.entropy}
        out.update({f"layer{l}_distinct_sets": float(n) for l, n in enumerate(self.layer_distinct)})
        if self.relevant_mean is not None:
            out["relevant_neurons_mean"] = self.relevant_mean
        return out


class _Accumulator:
    """Distinct keys over batches: exact packed rows, switching to 128-bit hashes past a memory budget."""
    def __init__(self, key: str, max_exact_bytes: int) -> None:
        if key not in ("auto", "exact", "hash128"):
            raise ConfigError(f"key must be 'auto', 'exact' or 'hash128', got {key!r}")
        self.key, self.max_exact_bytes = key, max_exact_bytes
        self.hashing = key == "hash128"
        self.layers: list[list[Tensor]] = []  # per layer, chunks of packed rows or of hashes
        self.full: list[Tensor] = []
        self.samples, self.relevant = 0, 0.0
        self._r: list[Tensor] = []
        self.nbytes = 0

    def _proj(self, l: int, width: int) -> Tensor:
        while len(self._r) <= l:
            gen = torch.Generator().manual_seed(0x5EED + 7919 * len(self._r))  # same on every rank
            self._r.append(torch.randint(0, 2**31, (width, 2), generator=gen, dtype=torch.int64))
        return self._r[l]

    def _hash(self, l: int, packed: Tensor) -> Tensor:
        packed = packed.contiguous().view(torch.uint8)  # exact keys are stored as int64 words
        r = self._proj(l, packed.shape[1]).to(packed.device)
        return packed.long() @ r

    def _to_hash(self) -> None:
        for l, chunks in enumerate(self.layers):
            self.layers[l] = [self._hash(l, c) for c in chunks]
        self.full = [sum(parts) for parts in zip(*self.layers)] if self.layers else []
        self.hashing = True

    def add(self, bits: list[Tensor], relevant: Tensor | None) -> None:
        packed = [pack_bits(b) for b in bits]
        if not self.layers:
            self.layers = [[] for _ in packed]
        if len(packed) != len(self.layers):
            raise ConfigError("the model returned a different number of layers for different batches")
        self.samples += packed[0].shape[0]
        if relevant is not None:
            self.relevant += float(relevant.sum())
        if not self.hashing:
            self.nbytes += sum(p.numel() for p in packed)
            if self.key == "auto" and self.nbytes > self.max_exact_bytes:
                self._to_hash()
        if self.hashing:
            hashes = [self._hash(l, p) for l, p in enumerate(packed)]
            for l, h in enumerate(hashes):
                self.layers[l].append(h)
            self.full.append(sum(hashes))
        else:
            words = [p.view(torch.int64) for p in packed]
            for l, wd in enumerate(words):
                self.layers[l].append(wd)
            self.full.append(torch.cat(words, dim=1))

    def distinct(self) -> tuple[Tensor, Tensor, list[Tensor]]:
        """Local distinct full keys with their counts, and the distinct keys of every layer."""
        keys, counts = unique_rows(torch.cat(self.full))
        layers = [unique_rows(torch.cat(chunks))[0] for chunks in self.layers]
        return keys, counts, layers


def _gather_rows(trainer: L.Trainer, rows: Tensor) -> Tensor:
    """Concatenate ``rows`` (n_r, d) over all ranks (sizes may differ)."""
    n = torch.tensor([rows.shape[0]], device=rows.device)
    sizes = trainer.strategy.all_gather(n).flatten().tolist()
    padded = rows.new_zeros((max(sizes),) + tuple(rows.shape[1:]))
    padded[: rows.shape[0]] = rows
    gathered = trainer.strategy.all_gather(padded)
    return torch.cat([gathered[r, :s] for r, s in enumerate(sizes)])


def count_pieces(
    module: nn.Module,
    batches: Iterable,
    mode: str = "path",
    key: str = "auto",
    max_samples: int | None = None,
    max_exact_bytes: int = 2**28,
    trainer: L.Trainer | None = None,
) -> PieceCount:
    """Count the distinct pieces ``module`` realises on ``batches`` (in eval mode, without gradients).

    With a multi-process ``trainer`` every rank passes its own shard and gets the count of the union.
    """
    if mode not in ("path", "full"):
        raise ConfigError(f"mode must be 'path' or 'full', got {mode!r}")
    acc = _Accumulator(key, max_exact_bytes)
    device = next(iter(module.parameters()), torch.zeros(0)).device
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                if max_samples is not None and acc.samples >= max_samples:
                    break
                bits, relevant = piece_bits(module, move_data_to_device(batch, device), mode)
                acc.add(bits, relevant)
    finally:
        module.train(was_training)
    distributed = trainer is not None and trainer.world_size > 1
    if distributed:
        # all ranks must use the same key type before their keys can be merged
        flag = trainer.strategy.reduce(torch.tensor(float(acc.hashing), device=device), reduce_op="max")
        if flag.item() > 0 and not acc.hashing and acc.layers:
            acc._to_hash()
        total = trainer.strategy.reduce(torch.tensor(float(acc.samples), device=device), reduce_op="sum")
        samples = int(round(total.item()))
        rel = trainer.strategy.reduce(torch.tensor(acc.relevant, device=device), reduce_op="sum").item()
    else:
        samples, rel = acc.samples, acc.relevant
    if samples == 0 or not acc.layers:
        raise ConfigError("the data split has no samples: count pieces on a split that has data (split='train')")
    keys, counts, layers = acc.distinct()
    if distributed:
        keys_all = _gather_rows(trainer, keys)
        counts_all = _gather_rows(trainer, counts[:, None])[:, 0]
        keys, inverse = torch.unique(keys_all, dim=0, return_inverse=True)  # once, on the few distinct keys
        counts = torch.zeros(keys.shape[0], dtype=counts_all.dtype, device=keys.device).index_add_(
            0, inverse, counts_all
        )
        layers = [unique_rows(_gather_rows(trainer, k))[0] for k in layers]
    p = counts.double() / counts.sum()
    entropy = float(-(p * torch.log2(p)).sum())
    has_rel = isinstance(module, SpikeTimes)
    return PieceCount(
        count=int(keys.shape[0]),
        samples=samples,
        entropy=entropy,
        layer_distinct=[int(k.shape[0]) for k in layers],
        relevant_mean=rel / samples if has_rel else None,
        keys=keys,
        counts=counts,
    )


def piece_ids(module: nn.Module, inputs: Tensor, mode: str = "path", batch_size: int = 4096) -> Tensor:
    """A piece index per input row (equal index = same piece), for piece maps."""
    batches = [(x,) for x in inputs.split(batch_size)]
    acc = _Accumulator("hash128", 0)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            for b in batches:
                acc.add(*piece_bits(module, move_data_to_device(b, inputs.device), mode))
    finally:
        module.train(was_training)
    return torch.unique(torch.cat(acc.full), dim=0, return_inverse=True)[1]


def line_piece_counts(
    module: nn.Module, starts: Tensor, ends: Tensor, points: int = 256, mode: str = "path", batch_size: int = 4096
) -> Tensor:
    """Pieces crossed along straight segments of input space: ``(P,)`` counts for ``starts``, ``ends`` (P, N_in).

    Each segment ``x(s) = (1 - s) start + s end`` is sampled at ``points`` equally spaced ``s`` in [0, 1]; the
    count is 1 + the number of consecutive points that lie in different pieces (a lower bound on the pieces the
    segment crosses, exact once no piece is thinner than the spacing; the analogue of counting linear regions
    along a line, Hanin & Rolnick 2019). Unlike the count over a data set it does not saturate at the number of
    samples. An input that does not spike (``inf``) at one end and does at the other switches at ``s = 1/2``.
    """
    if points < 2:
        raise ConfigError(f"line_points must be >= 2, got {points}")
    if starts.shape != ends.shape or starts.dim() != 2:
        raise ConfigError(f"segment ends must both have shape (P, N_in), got {tuple(starts.shape)} and {tuple(ends.shape)}")
    s = torch.linspace(0.0, 1.0, points, dtype=starts.dtype, device=starts.device)[None, :, None]
    a, b = starts[:, None, :], ends[:, None, :]
    both = torch.isfinite(a) & torch.isfinite(b)
    x = torch.where(both, a + s * torch.where(both, b - a, torch.zeros_like(a)), torch.where(s < 0.5, a, b))
    ids = piece_ids(module, x.reshape(-1, x.shape[-1]), mode, batch_size).view(x.shape[0], points)
    return (ids[:, 1:] != ids[:, :-1]).sum(1) + 1


def piece_map_figure(points: Tensor, ids: Tensor, classes: Tensor | None = None, title: str = ""):
    """Scatter of the input plane coloured by piece (random colours), with the class boundary overlaid."""
    gen = torch.Generator().manual_seed(0)
    palette = torch.rand(int(ids.max()) + 1, 3, generator=gen).numpy()
    fig, ax = new_figure(figsize=(5, 5))
    pts = points.cpu().numpy()
    ax.scatter(pts[:, 0], pts[:, 1], c=palette[ids.cpu().numpy()], s=2, marker="s", linewidths=0)
    if classes is not None:
        ax.tricontour(pts[:, 0], pts[:, 1], classes.cpu().numpy(), levels=[0.5, 1.5], colors="k", linewidths=0.8)
    ax.set_aspect("equal")
    ax.set_title(title or f"{int(ids.max()) + 1} pieces")
    return fig


class CausalPieceCounter(Diagnostic):
    """Logs the number of causal pieces (or linear regions) on a data split at fit start and every N epochs.

    Args:
        schedule: when to count (default: at initialisation, as ``count_init``, and after every epoch).
        split: data split to count on (``"train"``, ``"val"`` or ``"test"``), through the DataModule.
        max_samples: stop after about this many samples per rank (``None``: the whole split).
        mode: ``"path"`` (only the output's causal path) or ``"full"`` (every neuron's causal set).
        key: ``"auto"``, ``"exact"`` or ``"hash128"`` (see the module docstring).
        max_exact_bytes: memory budget of exact keys before ``key="auto"`` switches to hashes.
        piece_map: at fit start and end, log a piece map of the input plane as an MLflow figure when the
            DataModule is ``ProvidesPlaneGrid`` (``plane_grid(resolution) -> (points, inputs, classes)``).
        piece_map_resolution: points per side of the piece-map grid.
        lines: also count the pieces along this many straight segments between pairs of the split's first
            ``2 lines`` samples (kept for the whole run), logged as ``line_pieces`` (mean over segments) and
            ``line_pieces_init``; 0 = off. See ``line_piece_counts``; it does not saturate at the number of
            samples as the count over the split does (every digit sits in a piece of its own).
        line_points: points per segment.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "causal_pieces"

    def __init__(
        self,
        schedule: Schedule = Schedule(every_n_epochs=1),
        split: Literal["train", "val", "test"] = "train",
        max_samples: int | None = None,
        mode: Literal["path", "full"] = "path",
        key: Literal["auto", "exact", "hash128"] = "auto",
        max_exact_bytes: int = 2**28,
        piece_map: bool = True,
        piece_map_resolution: int = 200,
        lines: int = 0,
        line_points: int = 256,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if mode not in ("path", "full"):
            raise ConfigError(f"mode must be 'path' or 'full', got {mode!r}")
        if key not in ("auto", "exact", "hash128"):
            raise ConfigError(f"key must be 'auto', 'exact' or 'hash128', got {key!r}")
        self.split, self.max_samples = split, max_samples
        self.mode, self.key = mode, key
        self.max_exact_bytes, self.piece_map, self.piece_map_resolution = (
            max_exact_bytes,
            piece_map,
            piece_map_resolution,
        )
        if lines < 0 or line_points < 2:
            raise ConfigError(f"lines must be >= 0 and line_points >= 2, got lines={lines}, line_points={line_points}")
        self.lines, self.line_points = lines, line_points
        self._segments: tuple[Tensor, Tensor] | None = None

    def unsupported_reason(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        if isinstance(pl_module, SpikeTimes | ActivationPatterns) or is_piecewise_linear_relu(pl_module):
            return None
        return (
            f"CausalPieceCounter needs {type(pl_module).__name__}.spike_times(batch) (spiking networks) or "
            ".activation_patterns(batch) (piecewise-linear networks), or a network of only linear/conv layers "
            "and ReLUs to hook"
        )

    def _loader(self, trainer: L.Trainer):
        dm = trainer.datamodule
        make = getattr(dm, f"{self.split}_dataloader", None) if dm is not None else None
        if make is None:
            raise ConfigError(
                f"CausalPieceCounter reads the {self.split!r} split through the DataModule: pass a DataModule "
                f"with a {self.split}_dataloader() method to the Trainer (or choose another split)"
            )
        return make()

    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, float]:
        """The count of the union over ranks (every rank returns the same values)."""
        per_rank = None if self.max_samples is None else math.ceil(self.max_samples / trainer.world_size)
        result = count_pieces(
            pl_module, self._loader(trainer), self.mode, self.key, per_rank, self.max_exact_bytes, trainer
        )
        values = result.metrics()
        if moment.kind == "fit_start":
            values["count_init"] = float(result.count)
        if self.lines:
            starts, ends = self._line_segments(trainer, pl_module)
            counts = line_piece_counts(pl_module, starts, ends, self.line_points, self.mode)
            values["line_pieces_sum"], values["line_pieces_n"] = float(counts.sum()), float(counts.numel())
            if moment.kind == "fit_start":
                values["line_pieces_init_sum"], values["line_pieces_init_n"] = values["line_pieces_sum"], values["line_pieces_n"]
        return {self._key(k): v for k, v in values.items()}

    def reduction(self, key: str):
        """The piece counts are already those of the union over ranks; segment sums add up."""
        return "sum" if key.endswith(("_sum", "_n")) else None

    def finalize(self, stats: dict) -> dict[str, float]:
        out = {k: float(v) for k, v in stats.items() if not k.endswith(("_sum", "_n"))}
        for k in stats:
            if k.endswith("_sum"):
                out[k[: -len("_sum")]] = float(stats[k]) / float(stats[k[: -len("_sum")] + "_n"])
        return out

    def _line_segments(self, trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[Tensor, Tensor]:
        """Pairs (i, i + P) of this rank's first ``2 P`` samples of the split, picked once per run."""
        if self._segments is None:
            xs, n = [], 0
            for batch in self._loader(trainer):
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                xs.append(x.flatten(1))
                n += x.shape[0]
                if n >= 2 * self.lines:
                    break
            x = torch.cat(xs)
            p = min(self.lines, x.shape[0] // 2)
            if p < 1:
                raise ConfigError(f"line pieces need at least 2 samples in the {self.split!r} split")
            self._segments = (x[:p], x[p : 2 * p])
        return tuple(t.to(pl_module.device) for t in self._segments)

    def _key(self, key: str) -> str:
        """Path mode logs ``diag/causal_pieces/<key>``, full mode ``diag/causal_pieces/full/<key>``, so that two
        counters (one per mode) in one run do not overwrite each other's metrics."""
        return key if self.mode == "path" else f"full/{key}"

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        if self.active and trainer.global_step == 0:
            self._log_piece_map(trainer, pl_module, "init")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.active:
            self._log_piece_map(trainer, pl_module, "final")

    def _log_piece_map(self, trainer: L.Trainer, pl_module: L.LightningModule, tag: str) -> None:
        dm = trainer.datamodule
        if not (self.piece_map and self.plot) or not isinstance(dm, ProvidesPlaneGrid):
            return
        if trainer.global_rank != 0 or not trainer.loggers:
            return
        points, inputs, classes = dm.plane_grid(self.piece_map_resolution)
        ids = piece_ids(pl_module, inputs.to(pl_module.device), self.mode)
        n = int(ids.max()) + 1
        self.emit(trainer, {self._key(f"grid_count_{tag}"): float(n)}, trainer.global_step)
        fig = piece_map_figure(points, ids, classes, f"{tag}: {n} causal pieces on the input plane ({self.mode})")
        suffix = "" if self.mode == "path" else "_full"
        self.log_figure(trainer, fig, f"figures/causal_pieces/piece_map_{tag}{suffix}.png")
