"""Vector quantisation with an exponential-moving-average codebook (VQ-VAE v2 style) and dead-code reset.

``EMAVectorQuantizer(K, D)`` maps encoder outputs ``z_e (N, D)`` to their nearest code ``e_k`` (squared Euclidean
distance) and returns ``z_q`` with the straight-through gradient ``z_e + sg(e_k - z_e)``, the code ids and the
commitment loss ``beta ||z_e - sg(e_k)||^2`` (mean over entries). The codebook receives no gradient: in training
mode each forward updates, with decay ``gamma``,

    N_k <- gamma N_k + (1 - gamma) n_k,            m_k <- gamma m_k + (1 - gamma) sum_{i: k_i = k} z_e,i,
    e_k = m_k / N~_k,  N~_k = (N_k + eps) / (sum N + K eps) * sum N      (Laplace smoothing of the counts),

and every code whose usage ``N_k`` fell below ``dead_threshold`` is moved onto a random encoder output of the
batch (usage reset to 1), so that a collapsed codebook does not masquerade as a poor tokenizer. The codebook starts
on random encoder outputs of the first training batch (a random normal codebook far from the encoder's outputs
collapses onto its one nearest code at once).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from errors import ConfigError


class EMAVectorQuantizer(nn.Module):
    """Nearest-code quantiser with an EMA codebook (see the module docstring).

    Args:
        codebook_size: K, the number of codes.
        dim: D, the width of a code.
        beta: commitment weight.
        decay: gamma, the EMA decay of the code statistics.
        eps: Laplace smoothing of the cluster sizes.
        dead_threshold: a code whose EMA usage is below this is reset onto a batch vector (0: never).
    """

    def __init__(self, codebook_size: int, dim: int, beta: float = 0.25, decay: float = 0.99, eps: float = 1e-5,
                 dead_threshold: float = 0.03) -> None:
        super().__init__()
        if codebook_size < 1 or dim < 1:
            raise ConfigError(f"the codebook needs codebook_size >= 1 and dim >= 1, got {codebook_size}, {dim}")
        if not 0.0 <= decay < 1.0:
            raise ConfigError(f"the EMA decay must lie in [0, 1), got {decay}")
        self.beta, self.decay, self.eps, self.dead_threshold = beta, decay, eps, dead_threshold
        init = torch.randn(codebook_size, dim)
        self.register_buffer("codebook", init.clone())
        self.register_buffer("cluster_size", torch.ones(codebook_size))
        self.register_buffer("embed_sum", init.clone())
        self.register_buffer("resets", torch.zeros((), dtype=torch.long))
        self.register_buffer("initialised", torch.zeros((), dtype=torch.bool))

    @property
    def codebook_size(self) -> int:
        return int(self.codebook.shape[0])

    def assign(self, z: Tensor) -> Tensor:
        """The nearest code's id for each row of ``z (N, D)``."""
        d = z.pow(2).sum(1, keepdim=True) - 2 * z @ self.codebook.T + self.codebook.pow(2).sum(1)[None, :]
        return d.argmin(dim=1)

    @torch.no_grad()
    def init_from(self, z: Tensor, generator: torch.Generator | None = None) -> None:
        """Codes on random rows of ``z (N, D)`` (drawn with replacement when N < K), usage 1 each."""
        k = self.codebook_size
        pick = torch.randperm(z.shape[0], generator=generator, device=z.device)[:k] if z.shape[0] >= k else \
            torch.randint(0, z.shape[0], (k,), generator=generator, device=z.device)
        self.codebook.copy_(z[pick])
        self.embed_sum.copy_(z[pick])
        self.cluster_size.fill_(1.0)
        self.initialised.fill_(True)

    @torch.no_grad()
    def ema_update(self, z: Tensor, codes: Tensor, generator: torch.Generator | None = None) -> None:
        """One EMA step of the code statistics on ``z (N, D)`` with its ``codes (N,)``, then dead-code reset."""
        k = self.codebook_size
        onehot = torch.zeros(z.shape[0], k, dtype=z.dtype, device=z.device)
        onehot.scatter_(1, codes[:, None], 1.0)
        self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
        self.embed_sum.mul_(self.decay).add_(onehot.T @ z, alpha=1 - self.decay)
        total = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.eps) / (total + k * self.eps) * total
        self.codebook.copy_(self.embed_sum / smoothed[:, None])
        if self.dead_threshold > 0:
            dead = (self.cluster_size < self.dead_threshold).nonzero().flatten()
            if len(dead):
                pick = torch.randint(0, z.shape[0], (len(dead),), generator=generator, device=z.device)
                self.codebook[dead] = z[pick]
                self.embed_sum[dead] = z[pick]
                self.cluster_size[dead] = 1.0
                self.resets += len(dead)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``z_e (N, D) -> (z_q (N, D) straight-through, codes (N,), commitment loss ())``."""
        if z.dim() != 2 or z.shape[1] != self.codebook.shape[1]:
            raise ConfigError(f"the quantiser takes (N, {self.codebook.shape[1]}) vectors, got {tuple(z.shape)}")
        if self.training and not bool(self.initialised):
            self.init_from(z.detach())
        codes = self.assign(z.detach())
        e = self.codebook[codes].clone()  # the code the vector was assigned to, before this step's update
        if self.training:
            self.ema_update(z.detach(), codes)
        commitment = self.beta * (z - e.detach()).pow(2).mean()
        return z + (e - z).detach(), codes, commitment


def codebook_perplexity(counts: Tensor) -> float:
    """``exp(-sum p log p)`` of the code frequencies ``counts / sum(counts)`` (0 log 0 = 0): K for uniform use of
    K codes, 1 for a collapsed codebook, 0 for no code at all."""
    total = float(counts.sum())
    if total <= 0:
        return 0.0
    p = counts.double()[counts > 0] / total
    return math.exp(float(-(p * p.log()).sum()))


__all__ = ["EMAVectorQuantizer", "codebook_perplexity"]
