"""Implicit neural representations (INRs): Fourier features, SIREN, coordinate MLPs, batched functional MLPs.

- ``gaussian_frequencies`` / ``FourierFeatures``: gamma(x) = [cos 2 pi B x, sin 2 pi B x] with B ~ N(0, s^2)
  (Tancik et al. 2020). ``sort_by_norm`` + a fixed ``pool`` gives nested frequency sets: the first m of a
  sorted pool of ``pool`` draws, so level m's features are a prefix of level m' > m's (a bandwidth ladder).
- ``siren_init_``: the SIREN initialisation (Sitzmann et al. 2020) of a layer followed by ``Sine``, sin(w0 z)
  (the registry's ``sine``, defined in ``modules.components.activations`` and importable from here).
- ``CoordinateMLP``: an ``MLP`` over coordinates of any leading shape, optionally Fourier-encoded, with the
  SIREN initialisation when its activation is ``sine``.
- ``batched_mlp_forward``: an MLP whose weights differ per signal (``W_l (B, d_l, d_{l-1})``), as a
  hypernetwork generates them; returns every pre-activation and activation, what a chain-rule step needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.components.activations import Sine as Sine  # re-exported: its import path before the registry
from modules.components.mlp import MLP


def gaussian_frequencies(n: int, in_dim: int = 2, scale: float = 10.0, seed: int = 0,
                         sort_by_norm: bool = False, pool: int | None = None) -> Tensor:
    """``n`` frequencies ``(n, in_dim)`` ~ N(0, scale^2 I), seeded.

    With ``pool`` (>= n), ``pool`` frequencies are drawn and the first ``n`` kept (after sorting by norm when
    ``sort_by_norm``), so that for a fixed pool the sets for increasing ``n`` are nested.
    """
    if n < 1 or in_dim < 1:
        raise ConfigError(f"need n >= 1 frequencies and in_dim >= 1, got n={n}, in_dim={in_dim}")
    if scale <= 0:
        raise ConfigError(f"the Fourier-feature scale must be positive, got {scale}")
    pool = n if pool is None else pool
    if pool < n:
        raise ConfigError(f"the frequency pool ({pool}) is smaller than the number of frequencies ({n})")
    gen = torch.Generator().manual_seed(int(seed))
    b = torch.randn(pool, in_dim, generator=gen, dtype=torch.float64) * scale
    if sort_by_norm:
        b = b[b.norm(dim=1).argsort(stable=True)]
    return b[:n].float()


class FourierFeatures(nn.Module):
    """gamma(x) = [cos(2 pi x B^T), sin(2 pi x B^T)]: ``(..., in_dim)`` -> ``(..., 2 n)``.

    Args:
        in_dim: coordinate dimension.
        n_frequencies: n, rows of B (the output has 2 n features).
        scale: standard deviation s of B's entries (cycles per unit of x).
        seed, sort_by_norm, pool: see ``gaussian_frequencies``.
        frequencies: an explicit B ``(n, in_dim)`` instead of a draw.
    """

    def __init__(self, in_dim: int = 2, n_frequencies: int = 16, scale: float = 10.0, seed: int = 0,
                 sort_by_norm: bool = False, pool: int | None = None, frequencies: Tensor | None = None) -> None:
        super().__init__()
        if frequencies is None:
            frequencies = gaussian_frequencies(n_frequencies, in_dim, scale, seed, sort_by_norm, pool)
        self.register_buffer("B", frequencies.float().clone())

    @property
    def out_dim(self) -> int:
        return 2 * self.B.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        proj = 2 * math.pi * (x @ self.B.to(x.dtype).T)
        return torch.cat([torch.cos(proj), torch.sin(proj)], dim=-1)


@torch.no_grad()
def siren_init_(layer: nn.Linear, w0: float = 30.0, first: bool = False) -> nn.Linear:
    """SIREN initialisation: U(-1/n, 1/n) for the first layer, U(-sqrt(6/n)/w0, sqrt(6/n)/w0) after it."""
    n = layer.in_features
    bound = 1.0 / n if first else math.sqrt(6.0 / n) / w0
    layer.weight.uniform_(-bound, bound)
    if layer.bias is not None:
        layer.bias.uniform_(-bound, bound)
    return layer


class CoordinateMLP(nn.Module):
    """f(x) = W_L sigma(... sigma(W_1 gamma(x) + b_1) ...) + b_L over coordinates ``x (..., in_dim)``.

    What differs from ``MLP``: coordinates of any leading shape (not flattened samples), an optional Fourier
    encoding ``gamma``, and the SIREN initialisation of every layer when ``activation`` is ``sine``.

    Args:
        in_dim: coordinate dimension.
        hidden: hidden widths (empty: a linear readout of the encoding).
        out_dim: output channels.
        activation: ``sine`` (SIREN: sin(w0 z), SIREN init) or any other registered activation name.
        encoding: ``none`` or ``fourier`` (``FourierFeatures`` with ``n_frequencies``, ``scale``, ``seed``).
        w0: the SIREN frequency factor.
    """

    def __init__(self, in_dim: int = 2, hidden: Sequence[int] = (64, 64), out_dim: int = 1,
                 activation: str = "relu", encoding: Literal["none", "fourier"] = "none",
                 n_frequencies: int = 16, scale: float = 10.0, seed: int = 0, w0: float = 30.0) -> None:
        super().__init__()
        if encoding not in ("none", "fourier"):
            raise ConfigError(f"encoding must be 'none' or 'fourier', got {encoding!r}")
        if any(h < 1 for h in hidden):
            raise ConfigError(f"hidden widths must be positive, got {list(hidden)}")
        self.encoding = FourierFeatures(in_dim, n_frequencies, scale, seed) if encoding == "fourier" else None
        d = self.encoding.out_dim if self.encoding is not None else in_dim
        siren = activation == "sine"  # SIREN's initialisation belongs to its activation: w0 sets both
        self.mlp = MLP(d, out_dim, hidden, activation, activation_args={"w0": w0} if siren else None)
        if siren and hidden:
            linears = [m for m in self.mlp.layers if isinstance(m, nn.Linear)]
            for i, lin in enumerate(linears):
                siren_init_(lin, w0, first=i == 0 and self.encoding is None)

    def forward(self, x: Tensor) -> Tensor:
        h = self.encoding(x) if self.encoding is not None else x
        return self.mlp(h.reshape(-1, h.shape[-1])).reshape(*h.shape[:-1], -1)


Activation = Literal["relu", "sine"]


def activation_fn(name: Activation) -> tuple:
    """``(sigma, sigma')`` for the batched INR: relu or sine = sin z."""
    if name == "relu":
        return torch.relu, lambda z: (z > 0).to(z.dtype)
    if name == "sine":
        return torch.sin, torch.cos
    raise ConfigError(f"activation must be 'relu' or 'sine', got {name!r}")


def batched_mlp_forward(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Tensor],
                        activation: Activation = "relu") -> tuple[list[Tensor], list[Tensor]]:
    """Per-signal MLPs: ``x (B, P, d_0)``, ``W_l (B, d_l, d_{l-1})``, ``b_l (B, d_l)``.

    z_l = h_{l-1} W_l^T + b_l, h_l = sigma(z_l) for hidden layers, the last layer linear (h_L = z_L).
    Returns ``(zs [z_1..z_L], hs [h_0 = x, h_1, ..., h_L = y_hat])``, each ``(B, P, d_l)``.
    """
    if len(weights) != len(biases) or not weights:
        raise ConfigError(f"need as many weights as biases, at least one layer; got {len(weights)}, {len(biases)}")
    sigma, _ = activation_fn(activation)
    hs, zs = [x], []
    h = x
    for l, (w, b) in enumerate(zip(weights, biases)):
        if w.dim() != 3 or b.dim() != 2 or w.shape[0] != h.shape[0] or w.shape[2] != h.shape[-1] or b.shape != w.shape[:2]:
            raise ConfigError(
                f"layer {l + 1}: W {tuple(w.shape)} and b {tuple(b.shape)} do not fit inputs {tuple(h.shape)} "
                "(need W (B, d_l, d_l-1), b (B, d_l))"
            )
        z = torch.baddbmm(b[:, None, :], h, w.transpose(1, 2))
        zs.append(z)
        h = sigma(z) if l < len(weights) - 1 else z
        hs.append(h)
    return zs, hs
