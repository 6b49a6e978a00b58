"""Label-skewed client partitions for federated learning: the Dirichlet split of Hsu et al. (2019).

For every class ``c`` the clients' shares ``p_c ~ Dir(alpha 1_n)`` are drawn independently, and the class's
samples (in a random order) are cut into ``n`` consecutive pieces of sizes ``floor(N_c cumsum(p_c))``
differences, so every sample goes to exactly one client. Small ``alpha`` gives each client a few classes
(``alpha = 0.1`` is the usual "strongly non-IID" setting); large ``alpha`` approaches an IID split. Each
share has mean ``1/n`` and variance ``(n - 1) / (n^2 (n alpha + 1))`` (a ``Beta(alpha, (n - 1) alpha)``
marginal).

``min_size`` redraws the whole partition until every client holds at least that many samples (the
rejection step of the NIID-Bench code). This conditions the shares, so the variance above holds for
``min_size = 0`` only. No balancing trick (capping clients that already hold ``N / n`` samples) is applied.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import LongTensor, Tensor

from errors import ConfigError

#: redraws before ``min_size`` is declared unreachable
MAX_DRAWS = 1000


def _numpy_rng(generator: torch.Generator | None) -> np.random.Generator:
    """A numpy generator seeded from ``generator`` (or torch's global RNG): numpy has the Dirichlet sampler."""
    seed = int(torch.randint(0, 2**62, (), generator=generator).item())
    return np.random.default_rng(seed)


def dirichlet_partition(
    labels: Tensor,
    n_clients: int,
    alpha: float,
    min_size: int = 0,
    generator: torch.Generator | None = None,
) -> list[LongTensor]:
    """Split sample indices ``0..N-1`` among ``n_clients`` with per-class shares ``~ Dir(alpha 1_n)``.

    Args:
        labels: ``(N,)`` integer class labels.
        n_clients: number of clients ``n``.
        alpha: Dirichlet concentration (> 0); smaller is more skewed.
        min_size: every client gets at least this many samples (the partition is redrawn until it does).
        generator: torch generator making the split reproducible (default: torch's global RNG).

    Returns:
        ``n_clients`` sorted ``LongTensor`` index sets, disjoint, whose union is ``range(N)``.
    """
    labels = torch.as_tensor(labels)
    if labels.dim() != 1 or labels.is_floating_point() or labels.is_complex():
        raise ConfigError(f"labels must be a 1-D integer tensor, got dtype {labels.dtype} and shape {tuple(labels.shape)}")
    if n_clients < 1:
        raise ConfigError(f"n_clients must be at least 1, got {n_clients}")
    if not (alpha > 0 and np.isfinite(alpha)):
        raise ConfigError(f"alpha must be a positive finite Dirichlet concentration, got {alpha}")
    if min_size < 0:
        raise ConfigError(f"min_size must be >= 0, got {min_size}")
    n = labels.numel()
    if n == 0:
        raise ConfigError("labels is empty: there is nothing to partition")
    if n_clients * min_size > n:
        raise ConfigError(
            f"min_size={min_size} is unreachable: {n_clients} clients x {min_size} > {n} samples; "
            "lower min_size or n_clients"
        )
    rng = _numpy_rng(generator)
    y = labels.cpu().numpy()
    by_class = [np.flatnonzero(y == c) for c in np.unique(y)]
    for _ in range(MAX_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            shares = rng.dirichlet(np.full(n_clients, float(alpha)))
            cuts = np.floor(np.cumsum(shares) * len(idx)).astype(np.int64)
            cuts[-1] = len(idx)  # the cumulative sum may fall short of 1 by rounding
            for client, piece in enumerate(np.split(idx, cuts[:-1])):
                parts[client].append(piece)
        sizes = [sum(len(p) for p in ps) for ps in parts]
        if min(sizes) >= min_size:
            return [torch.from_numpy(np.sort(np.concatenate(ps))).long() for ps in parts]
    raise ConfigError(
        f"min_size={min_size} was not reached in {MAX_DRAWS} Dirichlet draws (alpha={alpha}, {n_clients} clients, "
        f"{n} samples); lower min_size or n_clients, or raise alpha"
    )
