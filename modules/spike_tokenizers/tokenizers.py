"""The five tokenizers T1-T5 of the benchmark (paper 002-08; the list is the spec's inference from the abstract).

Each maps counts ``(B, T, U)`` (U unit slots, ``unit_mask (B, U)``) to tokens and back to log rates ``(B, T, U)``;
all are trained on the Poisson NLL of the counts only. What each returns (``TokenOutput``):

- ``log_rates``: the reconstruction;
- ``features``: the tokens as the probes see them, one vector per bin: ``(B, T, F)`` for population tokenizers
  (a patch's token repeated over its bins), ``(B, T, U, D)`` per unit for single-neuron ones (the probe reduces
  them, ``modules.spike_tokenizers.probes``);
- ``codes``: the discrete token ids of the batch (flat, valid units only) or None for continuous tokens;
- ``aux_loss``: what the tokenizer adds to the NLL (the VQ commitment term).

T1 ``count``     single-neuron discrete: each unit's count per bin clipped to {0..7} is a token id; token =
                 count embedding + unit embedding (NDT-style); a per-token MLP gives the log rate.
T2 ``patch``     single-neuron continuous: each unit's patch of ``patch_len`` bins -> linear patch embedding
                 (+ unit embedding) = token -> GELU -> linear head -> the patch's log rates (PatchTST-style).
T3 ``pop_ae``    population continuous: the population vector of a bin -> MLP -> token -> MLP -> log rates.
T4 ``vqvae``     population discrete: a population patch (units x ``patch_len`` bins) -> MLP -> EMA vector
                 quantiser (K codes, beta = 0.25, dead-code reset) -> MLP -> the patch's log rates.
T5 ``event``     event-based (POYO-style): every (unit, bin) with spikes is an event token, unit embedding rotated
                 by its time in the window (rotary) plus its multiplicity's embedding; ``n_latents`` learned
                 queries pool a window of ``window`` bins by cross-attention; a decoder reads each unit's log
                 rate as (latent + time embedding) MLP . unit read-out + unit bias.

Units are addressed by slot (the DataModule's padding order): a held-out session's units reuse the slots of
other neurons, which is what makes population read-ins session-specific.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

from modules.components.attention import CrossAttentionBlock
from modules.components.vector_quantizer import EMAVectorQuantizer

Kind = Literal["count", "patch", "pop_ae", "vqvae", "event"]
COUNT_LEVELS = 8  # T1's ids: counts clipped to 0..7
BIN_S = 0.02


class TokenOutput(NamedTuple):
    log_rates: Tensor
    features: Tensor
    codes: Tensor | None
    aux_loss: Tensor


def _mlp(d_in: int, hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_out))


def _patches(x: Tensor, patch_len: int) -> Tensor:
    """``(B, T, U) -> (B, T', U, P)``, T' = ceil(T / P), the tail zero-padded."""
    b, t, u = x.shape
    pad = (-t) % patch_len
    x = nn.functional.pad(x, (0, 0, 0, pad))
    return x.view(b, (t + pad) // patch_len, patch_len, u).transpose(2, 3)


def _unpatch(x: Tensor, t: int) -> Tensor:
    """``(B, T', U, P) -> (B, T, U)``: the inverse of ``_patches``, tail dropped."""
    b, n, u, p = x.shape
    return x.transpose(2, 3).reshape(b, n * p, u)[:, :t]


def _repeat_bins(tokens: Tensor, patch_len: int, t: int) -> Tensor:
    """A patch's token on each of its bins: ``(B, T', ...) -> (B, T, ...)``."""
    return tokens.repeat_interleave(patch_len, dim=1)[:, :t]


def rotary(x: Tensor, positions: Tensor, base: float = 100.0) -> Tensor:
    """Rotate consecutive pairs of the last dim of ``x (..., D)`` by ``position * base^(-2i/D)``; ``positions``
    broadcasts against ``x[..., 0]``."""
    d = x.shape[-1]
    freq = base ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angle = positions[..., None].to(x.dtype) * freq
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class CountTokenizer(nn.Module):
    """T1: count id + unit embedding -> MLP -> log rate. A token depends only on (id, unit), so the MLP runs once
    on the (levels x units) table and the batch gathers from it (the same function, ~B T / levels times cheaper)."""

    per_neuron = True

    def __init__(self, max_units: int, d_token: int) -> None:
        super().__init__()
        self.count_emb = nn.Embedding(COUNT_LEVELS, d_token)
        self.unit_emb = nn.Embedding(max_units, d_token)
        self.head = _mlp(d_token, d_token, 1)

    def table(self) -> Tensor:
        """Every token ``(levels, U, D)``."""
        return self.count_emb.weight[:, None, :] + self.unit_emb.weight[None, :, :]

    def forward(self, counts: Tensor, mask: Tensor, with_features: bool = True) -> TokenOutput:
        ids = counts.clamp(0, COUNT_LEVELS - 1).long()
        table = self.table()
        log_table = self.head(table).squeeze(-1)  # (levels, U)
        units = torch.arange(counts.shape[-1], device=counts.device).expand_as(ids)
        log_rates = log_table[ids, units]
        features = table[ids, units] if with_features else counts.new_zeros(())
        codes = ids[mask[:, None, :].expand_as(ids)]
        return TokenOutput(log_rates, features, codes, counts.new_zeros(()))


class PatchTokenizer(nn.Module):
    """T2: one unit's ``patch_len`` bins -> linear embedding (+ unit embedding) -> GELU -> linear head -> its log
    rates. Linear in and out as PatchTST's patch embedding and flatten head: a single-neuron tokenizer makes U
    times more tokens than a population one, and a hidden layer per token would dominate the run."""

    per_neuron = True

    def __init__(self, max_units: int, d_token: int, patch_len: int) -> None:
        super().__init__()
        self.patch_len = patch_len
        self.encoder = nn.Linear(patch_len, d_token)
        self.unit_emb = nn.Embedding(max_units, d_token)
        self.decoder = nn.Sequential(nn.GELU(), nn.Linear(d_token, patch_len))

    def forward(self, counts: Tensor, mask: Tensor, with_features: bool = True) -> TokenOutput:
        t = counts.shape[1]
        tokens = self.encoder(_patches(torch.log1p(counts), self.patch_len)) + self.unit_emb.weight  # (B, T', U, D)
        log_rates = _unpatch(self.decoder(tokens), t)
        features = _repeat_bins(tokens, self.patch_len, t) if with_features else counts.new_zeros(())
        return TokenOutput(log_rates, features, None, counts.new_zeros(()))


class PopulationAE(nn.Module):
    """T3: a bin's population vector -> MLP -> token -> MLP -> log rates of every unit slot."""

    per_neuron = False

    def __init__(self, max_units: int, d_token: int, hidden: int) -> None:
        super().__init__()
        self.encoder = _mlp(max_units, hidden, d_token)
        self.decoder = _mlp(d_token, hidden, max_units)

    def forward(self, counts: Tensor, mask: Tensor, with_features: bool = True) -> TokenOutput:
        tokens = self.encoder(torch.log1p(counts))
        return TokenOutput(self.decoder(tokens), tokens, None, counts.new_zeros(()))


class PopulationVQVAE(nn.Module):
    """T4: a population patch (units x ``patch_len``) -> MLP -> quantised token -> MLP -> the patch's log rates."""

    per_neuron = False

    def __init__(self, max_units: int, d_token: int, hidden: int, patch_len: int, codebook_size: int,
                 beta: float) -> None:
        super().__init__()
        self.patch_len = patch_len
        self.encoder = _mlp(max_units * patch_len, hidden, d_token)
        self.quantizer = EMAVectorQuantizer(codebook_size, d_token, beta=beta)
        self.decoder = _mlp(d_token, hidden, max_units * patch_len)

    def forward(self, counts: Tensor, mask: Tensor, with_features: bool = True) -> TokenOutput:
        b, t, u = counts.shape
        patches = _patches(torch.log1p(counts), self.patch_len)  # (B, T', U, P)
        n = patches.shape[1]
        z_e = self.encoder(patches.reshape(b * n, u * self.patch_len))
        z_q, codes, commitment = self.quantizer(z_e)
        log_rates = _unpatch(self.decoder(z_q).view(b, n, u, self.patch_len), t)
        features = _repeat_bins(z_q.view(b, n, -1), self.patch_len, t)
        return TokenOutput(log_rates, features, codes, commitment)


class EventTokenizer(nn.Module):
    """T5: event tokens of a window pooled by learned latent queries (POYO-style); see the module docstring."""

    per_neuron = False

    def __init__(self, max_units: int, d_token: int, window: int, n_latents: int, n_heads: int = 4) -> None:
        super().__init__()
        self.window, self.n_latents = window, n_latents
        self.unit_emb = nn.Embedding(max_units, d_token)
        self.count_emb = nn.Embedding(COUNT_LEVELS, d_token)
        self.null = nn.Parameter(torch.zeros(1, 1, d_token))  # always attendable: a window may hold no spike
        self.latents = nn.Parameter(torch.randn(1, n_latents, d_token) * 0.02)
        self.pool = CrossAttentionBlock(d_token, n_heads=n_heads, mlp_ratio=2)
        self.time_emb = nn.Embedding(window, d_token)
        self.decoder = _mlp(n_latents * d_token + d_token, d_token, d_token)
        self.readout = nn.Embedding(max_units, d_token)
        self.unit_bias = nn.Parameter(torch.full((max_units,), math.log(0.2)))
        nn.init.normal_(self.readout.weight, std=0.02)

    def forward(self, counts: Tensor, mask: Tensor, with_features: bool = True) -> TokenOutput:
        b, t, u = counts.shape
        w, d = self.window, self.unit_emb.weight.shape[1]
        windows = _patches(counts, w).flatten(2)  # (B, W', U * w), entry = unit * w + offset
        n = windows.shape[1]
        attend = ((windows > 0) & mask[:, None, :, None].expand(b, n, u, w).flatten(2)).reshape(b * n, u * w)
        # Only the events are tokens: gather each window's occupied (unit, offset) entries to the front, padded to
        # the busiest window (about a quarter of the dense U x w grid at 5-20 Hz).
        n_max = max(int(attend.sum(1).max()), 1)
        idx = (~attend).to(torch.int8).argsort(dim=1, stable=True)[:, :n_max]
        valid = attend.gather(1, idx)
        unit, offset = idx // w, idx % w
        ids = windows.reshape(b * n, u * w).gather(1, idx).clamp(0, COUNT_LEVELS - 1).long()
        offsets = torch.arange(w, device=counts.device)
        table = rotary(self.unit_emb.weight[:, None, :].expand(u, w, d), offsets[None, :])  # (U, w, D), once
        context = table[unit, offset] + self.count_emb(ids)  # (B W', n_max, D)
        context = torch.cat([self.null.expand(b * n, 1, d), context], dim=1)
        valid = torch.cat([valid.new_ones(b * n, 1), valid], dim=1)
        pooled = self.pool(self.latents.expand(b * n, -1, -1), context, context_mask=valid)  # (B W', L, D)
        tokens = pooled.reshape(b, n, self.n_latents * d)
        h = self.decoder(torch.cat([tokens[:, :, None, :].expand(b, n, w, -1),
                                    self.time_emb.weight[None, None].expand(b, n, w, d)], dim=-1))  # (B, W', w, D)
        log_rates = (h @ self.readout.weight.T + self.unit_bias).reshape(b, n * w, u)[:, :t]
        return TokenOutput(log_rates, _repeat_bins(tokens, w, t), None, counts.new_zeros(()))


def build_tokenizer(kind: Kind, max_units: int, d_token: int, codebook_size: int, patch_len: int | None,
                    hidden: int, window: int, n_latents: int, beta: float) -> nn.Module:
    """The tokenizer of ``kind`` (``patch_len`` None: 8 bins for ``patch``, 4 for ``vqvae``)."""
    if kind == "count":
        return CountTokenizer(max_units, d_token)
    if kind == "patch":
        return PatchTokenizer(max_units, d_token, patch_len or 8)
    if kind == "pop_ae":
        return PopulationAE(max_units, d_token, hidden)
    if kind == "vqvae":
        return PopulationVQVAE(max_units, d_token, hidden, patch_len or 4, codebook_size, beta)
    return EventTokenizer(max_units, d_token, window, n_latents)


def token_bits_per_second(kind: Kind, n_units: int, d_token: int, codebook_size: int, patch_len: int | None,
                          window: int, n_latents: int) -> tuple[float, float]:
    """``(tokens per second, bits per token)`` of a kind's token stream for ``n_units`` units: a discrete token
    costs log2 of its alphabet, a continuous one 32 bits per float."""
    if kind == "count":
        return n_units / BIN_S, math.log2(COUNT_LEVELS)
    if kind == "patch":
        return n_units / ((patch_len or 8) * BIN_S), 32.0 * d_token
    if kind == "pop_ae":
        return 1 / BIN_S, 32.0 * d_token
    if kind == "vqvae":
        return 1 / ((patch_len or 4) * BIN_S), math.log2(codebook_size)
    return n_latents / (window * BIN_S), 32.0 * d_token
