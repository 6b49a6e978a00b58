"""Gradient and model compressors of the communication-efficient distributed methods.

Unbiased compressors C (E C(x) = x, E|C(x) - x|^2 <= omega |x|^2):

- ``rand_k(x, k)``: k of the d coordinates, uniformly without replacement, scaled by d/k;
  E|C(x) - x|^2 = (d/k - 1)|x|^2 exactly.
- ``perm_k(x)`` (Szlendak, Tyurin & Richtarik 2022, the correlated compressor of MARINA-P): one uniformly
  random permutation of the d coordinates, padded with n q - d empty slots to n q (q = ceil(d/n)) and cut
  into n blocks of q slots; worker i keeps the real coordinates of block i, times n. Every coordinate lands
  in block i with probability q / (n q) = 1/n, so each worker's output is unbiased with
  E|C_i(x_i) - x_i|^2 = (n - 1)|x_i|^2, and the blocks are disjoint and cover [d]: for a shared input
  (every row x) the workers' mean is x exactly, for every draw.
- ``natural_compression(x)`` (Horvath et al. 2019): each nonzero x_j rounded at random to one of the two
  powers of 2 around |x_j| (to 2^(e+1) with probability |x_j| / 2^e - 1, with 2^e <= |x_j| < 2^(e+1)),
  sign kept; omega = 1/8.
- ``natural_dithering(x, s)`` (Horvath et al. 2019): u_j = |x_j| / |x|_2 rounded at random to one of the
  two neighbouring levels of {0, 2^(1-s), 2^(2-s), ..., 1/2, 1}; output sign(x_j) |x|_2 level_j.

Biased (contractive): ``top_k(x, k)``, the k largest |x_j| kept, unscaled (|C(x) - x|^2 <= (1 - k/d)|x|^2).

Every function takes an optional ``torch.Generator`` (shared randomness: the same generator state gives the
same coordinates on every worker) and returns a new tensor of x's shape and dtype. ``compress(name, x, ...)``
dispatches by name (``COMPRESSORS``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from errors import ConfigError

COMPRESSORS = ("none", "randk", "permk", "topk", "natural", "dithering")


def _check_k(k: int, d: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= d:
        raise ConfigError(f"k must be an integer in [1, d] = [1, {d}], got {k!r}")


def _flat(x: Tensor, name: str) -> Tensor:
    if x.dim() != 1:
        raise ConfigError(f"{name} takes a vector x of shape (d,), got shape {tuple(x.shape)}")
    return x


def rand_k(x: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Rand-K: k uniformly random coordinates of ``x`` (d,), times d/k; zeros elsewhere."""
    x = _flat(x, "rand_k")
    d = x.numel()
    _check_k(k, d)
    idx = torch.randperm(d, generator=generator)[:k]
    out = torch.zeros_like(x)
    out[idx] = x[idx] * (d / k)
    return out


def rand_k_rows(x: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """``rand_k`` applied to every row of ``x`` (n, d) with independent coordinates per row (n workers'
    independent Rand-K compressors at once)."""
    if x.dim() != 2:
        raise ConfigError(f"rand_k_rows takes x of shape (n, d), got shape {tuple(x.shape)}")
    n, d = x.shape
    _check_k(k, d)
    idx = torch.rand(n, d, generator=generator).topk(k, dim=1).indices  # a uniform k-subset per row
    out = torch.zeros_like(x)
    out.scatter_(1, idx, x.gather(1, idx) * (d / k))
    return out


def perm_k_blocks(n: int, d: int, generator: torch.Generator | None = None) -> Tensor:
    """Perm-K's assignment: ``(d,)`` long, the worker (0..n-1) that keeps each coordinate (see the module
    docstring: a random permutation of n ceil(d/n) slots, slot s in block s // ceil(d/n))."""
    if n < 1 or d < 1:
        raise ConfigError(f"perm_k needs n >= 1 workers and d >= 1 coordinates, got n={n}, d={d}")
    q = math.ceil(d / n)
    slots = torch.randperm(n * q, generator=generator)[:d]  # coordinate j sits at slot slots[j]
    return slots // q


def perm_k(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Perm-K over n workers: ``x`` (n, d), row i worker i's input; row i of the output is n x_i on block i
    of one shared random permutation (padded to a multiple of n), zero elsewhere."""
    if x.dim() != 2:
        raise ConfigError(f"perm_k takes x of shape (n, d), one row per worker, got shape {tuple(x.shape)}")
    n, d = x.shape
    owner = perm_k_blocks(n, d, generator)
    mask = owner[None, :] == torch.arange(n)[:, None]
    return torch.where(mask, x * n, torch.zeros_like(x))


def top_k(x: Tensor, k: int) -> Tensor:
    """Top-K: the k coordinates of largest magnitude, unscaled (ties to the lower index)."""
    x = _flat(x, "top_k")
    _check_k(k, x.numel())
    idx = torch.topk(x.abs(), k, sorted=False).indices
    out = torch.zeros_like(x)
    out[idx] = x[idx]
    return out


def natural_compression(x: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Natural compression: every nonzero entry rounded without bias to a neighbouring power of 2."""
    a = x.abs()
    nonzero = a > 0
    safe = torch.where(nonzero, a, torch.ones_like(a))
    low = torch.exp2(torch.floor(torch.log2(safe)))
    # float rounding of log2 at exact powers of 2: keep low <= |x| < 2 low
    low = torch.where(low > safe, low / 2, low)
    low = torch.where(2 * low <= safe, 2 * low, low)
    prob_up = (safe - low) / low
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype)
    mag = torch.where(u < prob_up, 2 * low, low)
    return torch.where(nonzero, torch.sign(x) * mag, torch.zeros_like(x))


def natural_dithering(x: Tensor, s: int = 8, generator: torch.Generator | None = None) -> Tensor:
    """Natural dithering with s levels: |x_j| / |x|_2 rounded without bias within {0, 2^(1-s), ..., 1/2, 1},
    output sign(x_j) |x|_2 level."""
    if isinstance(s, bool) or not isinstance(s, int) or s < 1:
        raise ConfigError(f"natural_dithering needs an integer number of levels s >= 1, got {s!r}")
    norm = torch.linalg.vector_norm(x)
    if float(norm) == 0.0:
        return torch.zeros_like(x)
    u = (x.abs() / norm).clamp(max=1.0)
    smallest = 2.0 ** (1 - s)
    # the level just below u: 0 under the smallest nonzero level, else the power of 2 at or below u
    e = torch.floor(torch.log2(torch.where(u > 0, u, torch.ones_like(u))))
    below = torch.where(u >= smallest, torch.exp2(e), torch.zeros_like(u))
    below = torch.where(below > u, below / 2, below)
    above = torch.where(u >= smallest, torch.clamp(2 * below, max=1.0), torch.full_like(u, smallest))
    above = torch.where(below == 1.0, below, above)
    gap = above - below
    prob_up = torch.where(gap > 0, (u - below) / torch.where(gap > 0, gap, torch.ones_like(gap)), torch.zeros_like(u))
    r = torch.rand(x.shape, generator=generator, dtype=x.dtype)
    level = torch.where(r < prob_up, above, below)
    return torch.sign(x) * norm * level


def compress(name: str, x: Tensor, k: int | None = None, s: int = 8, generator: torch.Generator | None = None) -> Tensor:
    """Apply the compressor ``name`` (``COMPRESSORS``) to a vector ``x`` (d,); ``k`` for randk/topk, ``s``
    for dithering. ``permk`` needs the n workers' rows at once: call ``perm_k`` on an (n, d) tensor."""
    if name == "none":
        return x.clone()
    if name == "randk":
        return rand_k(x, int(k) if k is not None else 0, generator)
    if name == "topk":
        return top_k(x, int(k) if k is not None else 0)
    if name == "natural":
        return natural_compression(x, generator)
    if name == "dithering":
        return natural_dithering(x, s, generator)
    if name == "permk":
        raise ConfigError("permk compresses the n workers' vectors together: call perm_k(x (n, d))")
    raise ConfigError(f"unknown compressor {name!r}: choose one of {', '.join(COMPRESSORS)}")
