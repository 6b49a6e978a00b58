"""Compressive parameterisations of 2-D signals at a compression level: grids, Fourier features, hash grids, CP.

Each family renders S signals at once on the H x W pixel grid and holds one parameter set per signal, so
fitting S signals together is S independent fits (every loss term depends on one signal's parameters and
Adam is per coordinate). Pixel (i, j) sits at (x, y) = (j / (W - 1), i / (H - 1)) in [0, 1]^2: corners
aligned, as ``F.interpolate(..., align_corners=True)``.

| family | level | parameters per signal and channel | nested levels |
|---|---|---|---|
| ``grid`` | r: an r x r node grid, bilinear interpolation | r^2 | r = 2^j + 1 |
| ``fourier`` | m: Fourier features of the m lowest integer frequencies (or of a seeded Gaussian pool), linear (or MLP) readout | 2m + 1 | always (prefix) |
| ``hash`` | log2 T: a multi-resolution hash grid (Instant-NGP) with tables of T entries, MLP decoder | L T F + decoder | tables that double |
| ``cp`` | R: rank-R CP factorisation U diag(z_c) V^T | (H + W + C) R | always |

``warm_start(coarser)`` makes a field start from a coarser fit of the same family: exactly the same
function when the levels are nested (grid prolongation, zero new Fourier weights, hash entries copied
vertex by vertex, zero new CP columns), the nearest thing otherwise. ``solve_*`` are direct least-squares
fits (``grid``, linear ``fourier``, ``cp``) used by ``modules.compression_error.fitting.fit_level``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.components.inr import gaussian_frequencies
from modules.compression_error.sparse import sparse_matmul

Family = Literal["grid", "fourier", "hash", "cp"]
FAMILIES: tuple[str, ...] = ("grid", "fourier", "hash", "cp")
FOURIER_POOL = 16384  # fixed pool of frequencies: the levels' frequency sets are its sorted prefixes
HASH_PRIMES = (1, 2654435761)  # Instant-NGP's spatial hash, pi_1 = 1


def pixel_coords(height: int, width: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``(H W, 2)`` coordinates ``(x, y)`` in [0, 1], row-major (corners aligned)."""
    ys = torch.linspace(0, 1, height, dtype=dtype)
    xs = torch.linspace(0, 1, width, dtype=dtype)
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx.reshape(-1), yy.reshape(-1)], 1)


def interp_matrix(n: int, r: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """A ``(n, r)``: 1-D linear interpolation of r nodes to n samples, corners aligned (what
    ``F.interpolate(align_corners=True)`` does along one axis), so a grid G renders as A_H G A_W^T."""
    eye = torch.eye(r, dtype=dtype)[:, None, :]  # (r, 1, r): row k is node k's indicator
    return F.interpolate(eye, size=n, mode="linear", align_corners=True)[:, 0, :].T.contiguous()


def check_level(family: str, level: int, height: int, width: int, **options: Any) -> None:
    """Raise ``ConfigError`` when ``level`` is not a valid compression level of ``family`` for H x W."""
    if family not in FAMILIES:
        raise ConfigError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    if not isinstance(level, int) or isinstance(level, bool):
        raise ConfigError(f"a compression level is an integer, got {level!r}")
    if family == "grid" and not 2 <= level <= min(height, width):
        raise ConfigError(f"grid level r must be in [2, {min(height, width)}] (nodes per side, at most the "
                          f"signal size {height} x {width}), got {level}")
    if family == "fourier" and not 1 <= level <= min(FOURIER_POOL, (height * width - 1) // 2):
        raise ConfigError(f"fourier level m (frequencies) must be in [1, {min(FOURIER_POOL, (height * width - 1) // 2)}] "
                          f"for a {height} x {width} signal, got {level}")
    if family == "hash" and not 1 <= level <= 24:
        raise ConfigError(f"hash level is log2 of the table size, in [1, 24], got {level}")
    if family == "cp" and not 1 <= level <= min(height, width):
        raise ConfigError(f"cp level R (rank) must be in [1, {min(height, width)}], got {level}")


class SignalField(nn.Module):
    """Base of the four families: ``forward() -> (S, H, W, C)``, ``warm_start(coarser)``."""

    family: ClassVar[str]

    def __init__(self, level: int, num_signals: int, height: int, width: int, channels: int) -> None:
        super().__init__()
        check_level(self.family, level, height, width)
        if num_signals < 1 or channels < 1:
            raise ConfigError(f"need num_signals >= 1 and channels >= 1, got {num_signals}, {channels}")
        self.level, self.S, self.H, self.W, self.C = level, num_signals, height, width, channels

    def warm_start(self, coarser: SignalField) -> None:
        raise NotImplementedError

    def parameters_per_signal(self) -> int:
        return sum(p.numel() for p in self.parameters()) // self.S


class GridField(SignalField):
    """An r x r node grid per signal and channel, bilinearly interpolated: f = A_H G A_W^T."""

    family = "grid"

    def __init__(self, level: int, num_signals: int, height: int, width: int, channels: int = 1, **_: Any) -> None:
        super().__init__(level, num_signals, height, width, channels)
        self.G = nn.Parameter(torch.zeros(num_signals, channels, level, level))

    def forward(self) -> Tensor:
        out = F.interpolate(self.G, size=(self.H, self.W), mode="bilinear", align_corners=True)
        return out.permute(0, 2, 3, 1)

    @torch.no_grad()
    def warm_start(self, coarser: SignalField) -> None:
        """Prolongation: the coarse grid interpolated to this grid's nodes (exact for r' = 2 r - 1)."""
        if not isinstance(coarser, GridField):
            raise ConfigError("a grid warm-starts from a grid")
        self.G.copy_(F.interpolate(coarser.G, size=(self.level, self.level), mode="bilinear", align_corners=True))


def solve_grid(signal: Tensor, r: int) -> Tensor:
    """Least-squares grid fit of ``signal (H, W, C)``: G_c = A_H^+ F_c (A_W^+)^T, rendered ``(H, W, C)``."""
    h, w, _ = signal.shape
    check_level("grid", r, h, w)
    a_h, a_w = interp_matrix(h, r), interp_matrix(w, r)
    f = signal.double().permute(2, 0, 1)  # (C, H, W)
    g = torch.linalg.pinv(a_h) @ f @ torch.linalg.pinv(a_w).T  # (C, r, r): the Kronecker system's solution
    out = a_h @ g @ a_w.T
    return out.permute(1, 2, 0).to(signal.dtype)


def lattice_frequencies(height: int, width: int) -> Tensor:
    """Every integer frequency ``(k_x, k_y)`` of the H x W periodic grid below Nyquist, one of each +-k pair
    (the half plane k_y > 0, or k_y = 0 and k_x > 0), sorted by |k| then by angle: ``(n, 2)``."""
    kx = torch.arange(-(width // 2) + 1 if width % 2 == 0 else -(width // 2), width // 2 + (width % 2))
    ky = torch.arange(-(height // 2) + 1 if height % 2 == 0 else -(height // 2), height // 2 + (height % 2))
    yy, xx = torch.meshgrid(ky, kx, indexing="ij")
    k = torch.stack([xx.reshape(-1), yy.reshape(-1)], 1)
    half = (k[:, 1] > 0) | ((k[:, 1] == 0) & (k[:, 0] > 0))
    k = k[half]
    norm = k.double().norm(dim=1)
    angle = torch.atan2(k[:, 1].double(), k[:, 0].double())
    order = sorted(range(len(k)), key=lambda i: (round(float(norm[i]), 9), float(angle[i])))
    return k[order]


def fourier_frequencies(kind: str, m: int, height: int, width: int, scale: float = 16.0, seed: int = 0) -> Tensor:
    """The m frequencies ``(m, 2)`` (cycles per unit; the signal spans [0, 1)) of a Fourier field level:
    ``lattice``: the m lowest of ``lattice_frequencies``; ``gaussian``: the m lowest-norm of a fixed seeded
    pool of ``FOURIER_POOL`` N(0, scale^2) draws. Both are prefixes of a fixed order, so levels are nested."""
    if kind == "lattice":
        k = lattice_frequencies(height, width)
        if m > len(k):
            raise ConfigError(f"fourier level m = {m} exceeds the {len(k)} lattice frequencies of {height} x {width}")
        return k[:m].float()
    if kind == "gaussian":
        return gaussian_frequencies(m, 2, scale, seed, sort_by_norm=True, pool=FOURIER_POOL)
    raise ConfigError(f"fourier frequencies must be 'lattice' or 'gaussian', got {kind!r}")


def periodic_coords(height: int, width: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``(H W, 2)`` coordinates ``(j / W, i / H)`` of the periodic pixel grid, row-major."""
    ys = torch.arange(height, dtype=dtype) / height
    xs = torch.arange(width, dtype=dtype) / width
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx.reshape(-1), yy.reshape(-1)], 1)


class FourierField(SignalField):
    """Fourier-feature model: f(x) = readout(gamma(x)), gamma(x) = [cos 2 pi B_m x, sin 2 pi B_m x], x on the
    periodic pixel grid (j / W, i / H).

    B_m: the m lowest frequencies of the integer lattice (``frequencies="lattice"``, default) or of a seeded
    Gaussian pool (``"gaussian"``). The readout is linear with a bias (``hidden=()``, default), or an MLP with
    ReLU hidden layers. Lattice features are orthogonal on the pixel grid, so the linear model's least-squares
    fit is the truncated Fourier series (rendered by one inverse FFT); levels are nested least squares.

    Args:
        level: m, the number of frequencies (2m features + bias).
        frequencies: ``lattice`` or ``gaussian``.
        scale: standard deviation of the Gaussian pool (cycles per unit).
        hidden: hidden widths of an MLP readout (empty: linear).
        seed: seed of the Gaussian pool and of the MLP's initialisation.
    """

    family = "fourier"

    def __init__(self, level: int, num_signals: int, height: int, width: int, channels: int = 1,
                 frequencies: Literal["lattice", "gaussian"] = "lattice", scale: float = 16.0,
                 hidden: Sequence[int] = (), seed: int = 0, **_: Any) -> None:
        super().__init__(level, num_signals, height, width, channels)
        self.kind, self.scale, self.hidden, self.seed = frequencies, scale, tuple(hidden), seed
        self.register_buffer("B", fourier_frequencies(frequencies, level, height, width, scale, seed))
        self.fast = self.kind == "lattice" and not self.hidden
        if self.fast:
            k = self.B.long()
            pos = (k[:, 1] % height) * width + (k[:, 0] % width)
            neg = ((-k[:, 1]) % height) * width + ((-k[:, 0]) % width)
            self.register_buffer("pos", pos, persistent=False)
            self.register_buffer("neg", neg, persistent=False)
            self.a = nn.Parameter(torch.zeros(num_signals, channels, level))
            self.b = nn.Parameter(torch.zeros(num_signals, channels, level))
            self.bias = nn.Parameter(torch.zeros(num_signals, channels))
            return
        self.register_buffer("coords", periodic_coords(height, width), persistent=False)
        dims = [2 * level, *self.hidden, channels]
        gen = torch.Generator().manual_seed(int(seed) + 1)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for i, (d_in, d_out) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == len(dims) - 2
            bound = 1.0 / math.sqrt(d_in)
            w = torch.zeros(num_signals, d_in, d_out) if last else \
                (torch.rand(num_signals, d_in, d_out, generator=gen) * 2 - 1) * bound
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.zeros(num_signals, 1, d_out)))

    @property
    def is_linear(self) -> bool:
        return not self.hidden

    def features(self) -> Tensor:
        proj = 2 * math.pi * self.coords @ self.B.T  # (P, m)
        return torch.cat([torch.cos(proj), torch.sin(proj)], 1)

    def forward(self) -> Tensor:
        if self.fast:
            # a cos t + b sin t = ((a - ib)/2) e^{it} + ((a + ib)/2) e^{-it}; f = Re IFFT2(X) with X[k] = HW (a - ib)/2
            hw = self.H * self.W
            half = torch.complex(self.a, -self.b) * (hw / 2)
            x = torch.zeros(self.S, self.C, hw, dtype=half.dtype, device=half.device)
            x = x.index_add(2, self.pos, half).index_add(2, self.neg, half.conj())
            x[..., 0] = self.bias * hw
            f = torch.fft.ifft2(x.reshape(self.S, self.C, self.H, self.W)).real
            return f.permute(0, 2, 3, 1)
        h = self.features()[None].expand(self.S, -1, -1)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            h = torch.baddbmm(b, h, w)
            if i < len(self.weights) - 1:
                h = torch.relu(h)
        return h.reshape(self.S, self.H, self.W, self.C)

    @torch.no_grad()
    def warm_start(self, coarser: SignalField) -> None:
        """The coarser field's weights on its m frequencies, zero on the new ones: exact."""
        if not isinstance(coarser, FourierField) or coarser.hidden != self.hidden or coarser.kind != self.kind:
            raise ConfigError("a Fourier field warm-starts from a Fourier field with the same frequencies and readout")
        k = min(coarser.level, self.level)
        if self.fast:
            for mine, theirs in ((self.a, coarser.a), (self.b, coarser.b)):
                mine.zero_()
                mine[..., :k] = theirs[..., :k]
            self.bias.copy_(coarser.bias)
            return
        m0, m = coarser.level, self.level
        w_new, w_old = self.weights[0], coarser.weights[0]
        w_new.zero_()
        w_new[:, :k] = w_old[:, :k]
        w_new[:, m : m + k] = w_old[:, m0 : m0 + k]
        self.biases[0].copy_(coarser.biases[0])
        for a, b in zip(list(self.weights)[1:], list(coarser.weights)[1:]):
            a.copy_(b)
        for a, b in zip(list(self.biases)[1:], list(coarser.biases)[1:]):
            a.copy_(b)


def solve_fourier(signal: Tensor, m: int, frequencies: str = "lattice", scale: float = 16.0, seed: int = 0) -> Tensor:
    """Least-squares fit of ``signal (H, W, C)`` by the linear Fourier-feature model with m frequencies:
    the truncated Fourier series (DFT coefficients at the m frequencies, their conjugates and 0) on the
    lattice, ``lstsq`` on the explicit features for Gaussian frequencies."""
    h, w, c = signal.shape
    check_level("fourier", m, h, w)
    b = fourier_frequencies(frequencies, m, h, w, scale, seed)
    f = signal.double()
    if frequencies == "lattice":
        k = b.long()
        keep = torch.zeros(h, w, dtype=torch.bool)
        keep[k[:, 1] % h, k[:, 0] % w] = True
        keep[(-k[:, 1]) % h, (-k[:, 0]) % w] = True
        keep[0, 0] = True
        spec = torch.fft.fft2(f, dim=(0, 1)) * keep[..., None]
        return torch.fft.ifft2(spec, dim=(0, 1)).real.to(signal.dtype)
    proj = 2 * math.pi * periodic_coords(h, w, torch.float64) @ b.double().T
    phi = torch.cat([torch.cos(proj), torch.sin(proj), torch.ones(h * w, 1, dtype=torch.float64)], 1)
    coef = torch.linalg.lstsq(phi, f.reshape(-1, c), driver="gelsd").solution
    return (phi @ coef).reshape(h, w, c).to(signal.dtype)


# --- multi-resolution hash grid -----------------------------------------------------------------------------
def hash_resolutions(n_levels: int, base: int, finest: int) -> list[int]:
    """N_l = floor(N_min b^l), b = exp((ln N_max - ln N_min) / (L - 1)) (Instant-NGP's geometric series)."""
    if n_levels < 1 or base < 1 or finest < base:
        raise ConfigError(f"need n_levels >= 1 and 1 <= base_resolution <= finest_resolution, got "
                          f"{n_levels}, {base}, {finest}")
    if n_levels == 1:
        return [base]
    growth = math.exp((math.log(finest) - math.log(base)) / (n_levels - 1))
    return [int(math.floor(base * growth**l + 1e-9)) for l in range(n_levels)]


def hash_vertex_index(ix: Tensor, iy: Tensor, resolution: int, table_size: int) -> Tensor:
    """Table index of integer vertex (ix, iy) of a level with ``resolution`` cells per side: dense
    ``ix + (N + 1) iy`` when the (N + 1)^2 vertices fit in the table, else the spatial hash
    ``(ix * 1 XOR iy * 2654435761) mod T`` (T a power of two)."""
    if (resolution + 1) ** 2 <= table_size:
        return ix + (resolution + 1) * iy
    return ((ix * HASH_PRIMES[0]) ^ (iy * HASH_PRIMES[1])) & (table_size - 1)


def hash_corners(coords: Tensor, resolution: int, table_size: int) -> tuple[Tensor, Tensor]:
    """``(index (P, 4), weight (P, 4))``: the four vertices around each point of ``coords (P, 2)`` in [0, 1]
    and their bilinear weights, corners ordered (0,0), (1,0), (0,1), (1,1)."""
    pos = coords.double() * resolution
    base = pos.floor().clamp(max=resolution - 1)
    frac = pos - base
    ix, iy = base[:, 0].long(), base[:, 1].long()
    fx, fy = frac[:, 0], frac[:, 1]
    idx = torch.stack([hash_vertex_index(ix + dx, iy + dy, resolution, table_size) for dy in (0, 1) for dx in (0, 1)], 1)
    # the list above runs dx fastest: (0,0), (1,0), (0,1), (1,1)
    w = torch.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], 1)
    return idx, w.float()



class HashField(SignalField):
    """Multi-resolution hash encoding (Instant-NGP, 2-D) with a small MLP decoder, one per signal.

    Level l of ``n_levels`` has N_l cells per side (geometric from ``base_resolution`` to
    ``finest_resolution``), a table of T = 2^level entries of ``n_features`` features each; the features of
    the four surrounding vertices are bilinearly interpolated, concatenated over levels and decoded by an
    MLP with ``hidden`` ReLU units (0: linear).

    Args:
        level: log2 of the table size T.
        n_levels, n_features, base_resolution, finest_resolution (default: half the signal size), hidden:
            the encoding and decoder.
        seed: seed of the tables' U(-1e-4, 1e-4) and the decoder's initialisation.
    """

    family = "hash"

    def __init__(self, level: int, num_signals: int, height: int, width: int, channels: int = 1,
                 n_levels: int = 8, n_features: int = 2, base_resolution: int = 4,
                 finest_resolution: int | None = None, hidden: int = 32, seed: int = 0, **_: Any) -> None:
        super().__init__(level, num_signals, height, width, channels)
        finest = finest_resolution if finest_resolution is not None else max(base_resolution, min(height, width) // 2)
        self.resolutions = hash_resolutions(n_levels, base_resolution, finest)
        self.table_size = 2**level
        self.n_features, self.hidden = n_features, hidden
        gen = torch.Generator().manual_seed(int(seed) + 2)
        self.tables = nn.Parameter((torch.rand(num_signals, n_levels, self.table_size, n_features, generator=gen)
                                    * 2 - 1) * 1e-4)
        coords = pixel_coords(height, width)
        idx, wts = zip(*(hash_corners(coords, n, self.table_size) for n in self.resolutions))
        self.register_buffer("idx", torch.stack(idx), persistent=False)  # (L, P, 4)
        self.register_buffer("wts", torch.stack(wts), persistent=False)  # (L, P, 4)
        self._interp: tuple[Tensor, Tensor] | None = None
        dims = [n_levels * n_features, *([hidden] if hidden else []), channels]
        self.dec_w = nn.ParameterList()
        self.dec_b = nn.ParameterList()
        for d_in, d_out in zip(dims[:-1], dims[1:]):
            bound = 1.0 / math.sqrt(d_in)
            self.dec_w.append(nn.Parameter((torch.rand(num_signals, d_in, d_out, generator=gen) * 2 - 1) * bound))
            self.dec_b.append(nn.Parameter(torch.zeros(num_signals, 1, d_out)))

    def interpolation(self) -> tuple[Tensor, Tensor]:
        """The sparse ``(P L, L T)`` matrix M (and its transpose) with four bilinear weights per row: row
        ``p L + l`` reads point p's four vertices in level l's table. Built once per device."""
        if self._interp is None or self._interp[0].device != self.idx.device:
            n_levels, p = self.idx.shape[:2]
            rows = (torch.arange(p, device=self.idx.device)[None, :, None] * n_levels
                    + torch.arange(n_levels, device=self.idx.device)[:, None, None]).expand(-1, -1, 4)
            cols = self.idx + (torch.arange(n_levels, device=self.idx.device) * self.table_size)[:, None, None]
            m = torch.sparse_coo_tensor(torch.stack([rows.reshape(-1), cols.reshape(-1)]), self.wts.reshape(-1),
                                        (p * n_levels, n_levels * self.table_size), check_invariants=True).coalesce()
            with warnings.catch_warnings():  # "sparse CSR support is in beta": matmul with a dense matrix is all we use
                warnings.simplefilter("ignore", UserWarning)
                self._interp = (m.to_sparse_csr(), m.t().coalesce().to_sparse_csr())
        return self._interp

    def encode(self) -> Tensor:
        """Interpolated features ``(S, P, L F)``: one sparse product for all levels and signals."""
        m, mt = self.interpolation()
        s, n_levels, t, f = self.tables.shape
        flat = self.tables.permute(1, 2, 0, 3).reshape(n_levels * t, s * f)
        feats = sparse_matmul(m, mt, flat)  # (P L, S F)
        return feats.reshape(-1, n_levels, s, f).permute(2, 0, 1, 3).reshape(s, -1, n_levels * f)

    def forward(self) -> Tensor:
        h = self.encode()
        for i, (w, b) in enumerate(zip(self.dec_w, self.dec_b)):
            h = torch.baddbmm(b, h, w)
            if i < len(self.dec_w) - 1:
                h = torch.relu(h)
        return h.reshape(self.S, self.H, self.W, self.C)

    @torch.no_grad()
    def warm_start(self, coarser: SignalField) -> None:
        """Every vertex of every level takes the entry it had in the coarser table; the decoder is copied.

        With T' = 2^a T (both powers of two) the fine hash is the coarse one modulo T, so vertices that
        collide in the fine table collide in the coarse one too, and the warm-started field equals the coarse
        field exactly.
        """
        if not isinstance(coarser, HashField) or coarser.resolutions != self.resolutions or \
                coarser.n_features != self.n_features or coarser.hidden != self.hidden:
            raise ConfigError("a hash field warm-starts from a hash field with the same levels and decoder")
        for l, n in enumerate(self.resolutions):
            v = torch.arange(n + 1)
            iy, ix = torch.meshgrid(v, v, indexing="ij")
            ix, iy = ix.reshape(-1), iy.reshape(-1)
            new = hash_vertex_index(ix, iy, n, self.table_size)
            old = hash_vertex_index(ix, iy, n, coarser.table_size)
            self.tables[:, l, new] = coarser.tables[:, l, old]
        for a, b in zip(list(self.dec_w) + list(self.dec_b), list(coarser.dec_w) + list(coarser.dec_b)):
            a.copy_(b)


# --- CP factorisation -------------------------------------------------------------------------------------
class CPField(SignalField):
    """Rank-R CP factorisation of the (H, W, C) signal: f[h, w, c] = sum_r U[h, r] V[w, r] Z[c, r].

    For one channel this is a rank-R matrix, whose least-squares optimum is the truncated SVD (nested in R).
    """

    family = "cp"

    def __init__(self, level: int, num_signals: int, height: int, width: int, channels: int = 1,
                 seed: int = 0, **_: Any) -> None:
        super().__init__(level, num_signals, height, width, channels)
        gen = torch.Generator().manual_seed(int(seed) + 3)
        self.U = nn.Parameter(torch.randn(num_signals, height, level, generator=gen) * 0.1)
        self.V = nn.Parameter(torch.randn(num_signals, width, level, generator=gen) * 0.1)
        self.Z = nn.Parameter(torch.ones(num_signals, channels, level))

    def forward(self) -> Tensor:
        vt = self.V.transpose(1, 2)
        return torch.stack([torch.bmm(self.U * self.Z[:, c, None, :], vt) for c in range(self.C)], -1)

    @torch.no_grad()
    def warm_start(self, coarser: SignalField) -> None:
        """The coarse factors in the first R columns; new columns U = 0 (the function is unchanged), V small
        random (so U's gradient is not zero), Z = 1."""
        if not isinstance(coarser, CPField):
            raise ConfigError("a CP field warm-starts from a CP field")
        k = min(coarser.level, self.level)
        self.U.zero_()
        self.U[..., :k] = coarser.U[..., :k]
        self.V[..., :k] = coarser.V[..., :k]
        self.Z.fill_(1.0)
        self.Z[..., :k] = coarser.Z[..., :k]


def solve_cp(signal: Tensor, rank: int, iters: int = 200) -> Tensor:
    """Least-squares rank-R fit of ``signal (H, W, C)``: the truncated SVD for C = 1 (Eckart-Young), CP by
    alternating least squares from the unfolding's SVD otherwise (a local optimum)."""
    h, w, c = signal.shape
    check_level("cp", rank, h, w)
    f = signal.double()
    if c == 1:
        u, s, vh = torch.linalg.svd(f[..., 0], full_matrices=False)
        return ((u[:, :rank] * s[:rank]) @ vh[:rank])[..., None].to(signal.dtype)
    u0, _, _ = torch.linalg.svd(f.reshape(h, -1), full_matrices=False)
    a = u0[:, :rank]
    v0, _, _ = torch.linalg.svd(f.permute(1, 0, 2).reshape(w, -1), full_matrices=False)
    b = v0[:, :rank]
    z = torch.ones(c, rank, dtype=torch.float64)
    for _ in range(iters):
        # each factor in turn by least squares, the others fixed (Khatri-Rao normal equations)
        a = torch.einsum("hwc,wr,cr->hr", f, b, z) @ torch.linalg.pinv((b.T @ b) * (z.T @ z))
        b = torch.einsum("hwc,hr,cr->wr", f, a, z) @ torch.linalg.pinv((a.T @ a) * (z.T @ z))
        z = torch.einsum("hwc,hr,wr->cr", f, a, b) @ torch.linalg.pinv((a.T @ a) * (b.T @ b))
    return torch.einsum("hr,wr,cr->hwc", a, b, z).to(signal.dtype)


FIELDS: dict[str, type[SignalField]] = {"grid": GridField, "fourier": FourierField, "hash": HashField, "cp": CPField}


def make_field(family: str, level: int, num_signals: int, height: int, width: int, channels: int = 1,
               **options: Any) -> SignalField:
    """A field of ``family`` at ``level`` for S signals of H x W x C; ``options`` go to the family."""
    if family not in FIELDS:
        raise ConfigError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    return FIELDS[family](level, num_signals, height, width, channels, **options)


def is_nested_least_squares(field: SignalField) -> bool:
    """Whether fits at rising levels of this field are least squares over nested linear subspaces of the
    signal (grids, linear Fourier features, single-channel CP = truncated SVD): then f_k - f_{k+1} is
    orthogonal to f_{k+1} - f*."""
    if isinstance(field, FourierField):
        return field.is_linear
    if isinstance(field, CPField):
        return field.C == 1
    return isinstance(field, GridField)
