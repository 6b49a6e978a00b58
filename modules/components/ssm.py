"""Selective state-space building blocks: a chunked-parallel multi-mode selective scan and a Mamba-style block.

The recurrence (one channel ``c``, state index ``n``, mode ``k``; Mamba's layout with ``K`` decay modes)::

    h_t[c, n, k] = exp(-Delta_t[c] s_k lambda_c) h_{t-1}[c, n, k] + Delta_t[c] B_t[n] x_t[c],   h_0 = 0
    y_t[c]       = sum_n C_t[n] sum_k w[c, k] h_t[c, n, k] + D[c] x_t[c]

With one mode (``K = 1``, ``w = 1``) this is a selective SSM with one decay per channel (Mamba-2's scalar
``A``): exponential forgetting. With ``K`` log-spaced rates ``s_k`` and the fractional weights of
``frac_kernel_weights`` the impulse response of each channel is ``sum_k w_k exp(-s_k tau)``, a power law
``tau^(alpha - 1) / Gamma(alpha)`` in the selective time ``tau = lambda_c sum_j Delta_j`` (FRAC, paper 002-02).

``selective_scan`` is chunked-parallel (SSD style): inside a chunk of ``T`` steps the outputs are two batched
matrix products in the factorised form ``exp(R_t) exp(-R_s)`` of the decay from ``s`` to ``t``; the state is
carried between chunks by a short loop. The factorised form would overflow when a chunk decays by more than
``exp(-thr)``, so each mode runs with the longest chunk (a power of two, at most ``chunk_size``) over which
it decays by less than that. A mode that would need chunks shorter than ``segsum_chunk`` steps (8; one that
forgets much in a step somewhere in the batch, as a trained selective SSM does at the tokens it resets on)
takes the segment-sum form instead: every decay ``exp(-s_k sum_{s<j<=t} g_j)`` of a chunk is evaluated on
its own (Mamba-2's ``segsum``), which never overflows, at the cost of a ``T x T`` tensor per channel and
mode, so it serves only those modes. Every exponent the scan evaluates is <= ``thr``, so decays near 1
(slow modes) and near 0 (fast modes) are both exact to rounding. Float64 inputs are scanned in float64,
everything else in float32; the output has the input's dtype.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError

#: largest |exponent| of the factorised chunk form, per compute dtype (exp(thr) times the data stays finite)
_THRESHOLD = {torch.float32: 60.0, torch.float64: 600.0}


# --- kernel --------------------------------------------------------------------------------------------------
def log_spaced_rates(s_min: float, s_max: float, n_modes: int) -> Tensor:
    """``n_modes`` rates ``s_k = s_min (s_max / s_min)^(k / (K - 1))`` (float64); one mode is ``[s_max]``."""
    if not (0 < s_min <= s_max) or not (math.isfinite(s_min) and math.isfinite(s_max)):
        raise ConfigError(f"rates need 0 < s_min <= s_max < inf, got s_min={s_min}, s_max={s_max}")
    if n_modes < 1:
        raise ConfigError(f"n_modes must be >= 1, got {n_modes}")
    if n_modes == 1:
        return torch.tensor([float(s_max)], dtype=torch.float64)
    if s_min == s_max:
        raise ConfigError(f"{n_modes} modes need s_min < s_max, got both {s_min}")
    return torch.logspace(math.log10(s_min), math.log10(s_max), n_modes, dtype=torch.float64)


def _check_rates(rates: Tensor) -> None:
    if not isinstance(rates, Tensor) or rates.dim() != 1 or rates.numel() == 0:
        raise ConfigError(f"rates must be a non-empty 1-D tensor (K,), got {getattr(rates, 'shape', type(rates))}")
    if not torch.isfinite(rates).all() or (rates <= 0).any():
        raise ConfigError(f"rates must be finite and > 0, got min {rates.min().item():.3g}")


def log_cell_widths(rates: Tensor) -> Tensor:
    """Quadrature widths in ``log s`` of the nodes ``rates`` (any order): half the distance between the
    neighbouring nodes' logs; an end node gets the distance to its one neighbour (a uniform log grid: all
    equal to its spacing)."""
    _check_rates(rates)
    if rates.numel() < 2:
        raise ConfigError("the fractional kernel needs at least 2 rates (a quadrature in log s)")
    u = rates.log()
    order = torch.argsort(u)
    us = u[order]
    gaps = us[1:] - us[:-1]
    if (gaps <= 0).any():
        raise ConfigError("rates must be distinct")
    widths = torch.empty_like(us)
    widths[0], widths[-1] = gaps[0], gaps[-1]
    widths[1:-1] = 0.5 * (gaps[1:] + gaps[:-1])
    out = torch.empty_like(widths)
    out[order] = widths
    return out


def frac_kernel_weights(alpha: Tensor, rates: Tensor, tail: bool = True) -> Tensor:
    """Mode weights ``w (C, K)`` with ``sum_k w[c, k] exp(-s_k t) ~= t^(alpha_c - 1) / Gamma(alpha_c)``.

    The power law is a Laplace transform, ``t^(a-1)/Gamma(a) = (1/(Gamma(a)Gamma(1-a))) int_0^inf s^(-a)
    e^(-st) ds``; with ``ds = s dlog s`` and the quadrature widths ``h_k`` in ``log s`` of
    ``log_cell_widths``::

        w[c, k] = sin(pi alpha_c) / pi * s_k^(1 - alpha_c) * h_k        (Gamma(a) Gamma(1-a) = pi / sin(pi a))

    With ``tail`` (default) the slowest rate's cell reaches down to ``s = 0``: its weight is
    ``sin(pi a)/pi * e_0^(1-a) / (1-a)`` with ``e_0`` the cell's upper edge (the geometric midpoint to the
    next rate), i.e. the mass of all rates below the grid decays at the slowest rate. Without it the
    truncated integral loses a fraction ``~ (s_min t)^(1-a) / ((1-a) Gamma(1-a))`` of the kernel, 11 % at
    ``t = 100`` for ``a = 0.5`` on the default grid; with it the default grid (8 rates in [1e-4, 1]) is
    within 1.5 % of the power law for ``3 <= t <= 300`` and within 6 % up to ``t = 1000``
    (``0.2 <= a <= 0.8``). Unnormalised. Valid for
    ``1/s_max << t << 1/s_min``; a finer grid lowers the quadrature ripple. Differentiable in ``alpha``.

    Args:
        alpha: fractional orders ``(C,)`` in (0, 1).
        rates: ``(K,)`` positive, distinct decay rates ``s_k`` (K >= 2), any order.
        tail: give the slowest rate the mass below the grid (above).
    """
    if not isinstance(alpha, Tensor) or alpha.dim() != 1:
        raise ConfigError(f"alpha must be a 1-D tensor (C,), got {getattr(alpha, 'shape', type(alpha))}")
    h = log_cell_widths(rates)
    if not torch.isfinite(alpha).all() or (alpha <= 0).any() or (alpha >= 1).any():
        raise ConfigError("alpha must lie in the open interval (0, 1) (alpha = 1 is the exponential kernel)")
    dtype = torch.promote_types(alpha.dtype, rates.dtype)
    a = alpha.to(dtype)[:, None]
    u = rates.to(device=alpha.device, dtype=dtype).log()[None, :]
    w = torch.exp((1.0 - a) * u) * h.to(u)[None, :]
    if tail:
        slowest = int(torch.argmin(u))
        edge = u[0, slowest] + 0.5 * h[slowest].to(u)  # upper edge of the slowest rate's cell
        w = w.clone()
        w[:, slowest] = torch.exp((1.0 - a[:, 0]) * edge) / (1.0 - a[:, 0])
    return torch.sin(math.pi * a) / math.pi * w


def frac_kernel(t: Tensor, weights: Tensor, rates: Tensor) -> Tensor:
    """The mode sum ``sum_k w[c, k] exp(-s_k t)`` at times ``t (T,)``: ``(C, T)``."""
    return (weights[:, :, None] * torch.exp(-rates.to(weights)[None, :, None] * t.to(weights)[None, None, :])).sum(1)


# --- scan ----------------------------------------------------------------------------------------------------
def _check_scan(x: Tensor, delta: Tensor, Bm: Tensor, Cm: Tensor, rates: Tensor, weights: Tensor,
                lam: Tensor | None, D: Tensor | None) -> tuple[int, int, int, int, int]:
    if x.dim() != 3:
        raise ConfigError(f"x must be (B, L, C), got shape {tuple(x.shape)}")
    b, n_len, c = x.shape
    if delta.shape != x.shape:
        raise ConfigError(f"delta must have x's shape {tuple(x.shape)}, got {tuple(delta.shape)}")
    if Bm.dim() != 3 or Bm.shape[:2] != (b, n_len) or Cm.shape != Bm.shape:
        raise ConfigError(f"Bm and Cm must both be (B, L, N) with (B, L) = {(b, n_len)}, got "
                          f"{tuple(Bm.shape)} and {tuple(Cm.shape)}")
    _check_rates(rates)
    k = rates.numel()
    if weights.shape != (c, k):
        raise ConfigError(f"weights must be (C, K) = {(c, k)}, got {tuple(weights.shape)}")
    if lam is not None and (lam.shape != (c,) or (lam <= 0).any()):
        raise ConfigError(f"lam must be (C,) = ({c},) and > 0, got {tuple(lam.shape)}")
    if D is not None and D.shape != (c,):
        raise ConfigError(f"D must be (C,) = ({c},), got {tuple(D.shape)}")
    return b, n_len, c, Bm.shape[-1], k


def selective_scan(
    x: Tensor,
    delta: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    rates: Tensor,
    weights: Tensor,
    lam: Tensor | None = None,
    D: Tensor | None = None,
    *,
    chunk_size: int = 64,
    initial_state: Tensor | None = None,
    return_state: bool = False,
    segsum_chunk: int = 8,
) -> Tensor | tuple[Tensor, Tensor]:
    """The multi-mode selective scan (module docstring), chunked-parallel.

    Args:
        x: inputs ``(B, L, C)``.
        delta: step sizes ``Delta (B, L, C)``, >= 0.
        Bm, Cm: input and output projections ``(B, L, N)`` (shared by the channels).
        rates: decay rates ``s_k (K,)``, > 0.
        weights: readout weights ``w (C, K)``.
        lam: per-channel rate scale ``lambda (C,)`` (default 1).
        D: skip ``(C,)`` (default 0).
        chunk_size: the longest chunk; a power of two is not required.
        initial_state: ``h_0 (B, C, N, K)`` (default zeros), for a scan continued from a decoded prefix.
        return_state: also return the final state ``h_L (B, C, N, K)``.
        segsum_chunk: a mode whose factorised chunk would be shorter than this takes the segment-sum form
            with chunks of this length (1: never; such a mode then runs step by step).

    Returns:
        ``y (B, L, C)`` in ``x``'s dtype (and the final state in the compute dtype with ``return_state``).
    """
    b, n_len, c, n, k = _check_scan(x, delta, Bm, Cm, rates, weights, lam, D)
    if chunk_size < 1 or segsum_chunk < 1:
        raise ConfigError(f"chunk_size and segsum_chunk must be >= 1, got {chunk_size} and {segsum_chunk}")
    cdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    x_, delta_, B_, C_ = (t.to(cdt) for t in (x, delta, Bm, Cm))
    s = rates.to(device=x.device, dtype=cdt)
    w = weights.to(cdt)
    # selective time increments g_t[c] = lambda_c Delta_t[c]: mode k decays by exp(-s_k g_t[c]) at step t
    g = delta_ * lam.to(cdt) if lam is not None else delta_
    u = delta_ * x_
    h0 = None
    if initial_state is not None:
        if initial_state.shape != (b, c, n, k):
            raise ConfigError(f"initial_state must be (B, C, N, K) = {(b, c, n, k)}, got {tuple(initial_state.shape)}")
        h0 = initial_state.to(cdt).permute(0, 2, 1, 3)  # (B, N, C, K) inside
    groups = _mode_groups(g, s, chunk_size, _THRESHOLD[cdt], min(segsum_chunk, chunk_size))
    y, h_last = None, None
    for t_chunk, modes, segsum in groups:
        if len(groups) == 1:
            sel, w_sel, h_sel = s, w, h0
        else:
            idx = torch.tensor(modes, device=x.device)
            sel, w_sel = s.index_select(0, idx), w.index_select(-1, idx)
            h_sel = None if h0 is None else h0.index_select(-1, idx)
        scan = _segsum_scan if segsum else _chunked_scan
        yk, hk = scan(g, u, B_, C_, sel, w_sel, t_chunk, h_sel)
        y = yk if y is None else y + yk
        if return_state:
            if len(groups) == 1:
                h_last = hk
            else:
                h_last = torch.zeros(b, n, c, k, dtype=cdt, device=x.device) if h_last is None else h_last
                h_last = h_last.index_copy(-1, idx, hk)
    if D is not None:
        y = y + D.to(cdt) * x_
    y = y.to(x.dtype)
    return (y, h_last.permute(0, 2, 1, 3)) if return_state else y


def _chunk_view(t: Tensor, t_chunk: int) -> Tensor:
    """``(B, L, ...) -> (B, L / T, T, ...)``, zero-padded to whole chunks."""
    pad = (-t.shape[1]) % t_chunk
    if pad:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.reshape(t.shape[0], -1, t_chunk, *t.shape[2:])


def _mode_groups(g: Tensor, s: Tensor, chunk_size: int, thr: float,
                 segsum_chunk: int) -> list[tuple[int, list[int], bool]]:
    """``[(T, modes, segsum)]``: each mode with the longest chunk ``T <= chunk_size`` (halving) over which
    every chunk of every sequence and channel decays by less than ``exp(-thr)`` after its first step, or,
    if that chunk would be shorter than ``segsum_chunk``, the segment-sum form with chunks of ``segsum_chunk``."""
    with torch.no_grad():
        pending = list(range(s.numel()))
        groups: list[tuple[int, list[int], bool]] = []
        t_chunk = chunk_size
        while pending:
            if t_chunk < segsum_chunk or t_chunk == 1:
                groups.append((segsum_chunk, pending, True) if segsum_chunk > 1 else (1, pending, False))
                break
            worst = _chunk_view(g, t_chunk)[:, :, 1:].sum(2).amax().item()  # largest sum_{t>first} g
            ok = [m for m in pending if worst * s[m].item() <= thr]
            if ok:
                groups.append((t_chunk, ok, False))
            pending = [m for m in pending if m not in ok]
            t_chunk //= 2
        return groups


def _carry_states(a_chunk: Tensor, s_chunk: Tensor, h0: Tensor | None) -> Tensor:
    """The state entering every chunk ``(B, nc, N, C, K)``: ``h <- a_j h + s_j`` from ``h0`` (default 0), with
    ``a_chunk (B, nc, C, K)`` the whole-chunk decays and ``s_chunk (B, nc, N, C, K)`` each chunk's own writes."""
    b, _, n, c, k = s_chunk.shape
    h = h0 if h0 is not None else s_chunk.new_zeros(b, n, c, k)
    starts = []
    for a_j, s_j in zip(a_chunk.unbind(1), s_chunk.unbind(1)):
        starts.append(h)
        h = a_j[:, None] * h + s_j
    return torch.stack(starts, 1), h


def _causal_cb(Cc: Tensor, Bc: Tensor) -> Tensor:
    """``C_t . B_s`` of every chunk for ``s <= t``, 0 above the diagonal: ``(B, nc, T, T)``."""
    T = Cc.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool, device=Cc.device).tril()
    return torch.matmul(Cc, Bc.transpose(2, 3)).masked_fill(~causal, 0.0)


def _chunked_scan(g: Tensor, u: Tensor, Bm: Tensor, Cm: Tensor, s: Tensor, w: Tensor, t_chunk: int,
                  h0: Tensor | None) -> tuple[Tensor, Tensor]:
    """The scan of the modes ``s (K,)`` with chunks of ``t_chunk`` steps: ``(y (B, L, C), h_L (B, N, C, K))``.

    Padded steps (``g = u = B = C = 0``) neither decay nor write, so the state passes through them.
    """
    b, n_len, c = g.shape
    n, k = Bm.shape[-1], s.numel()
    T = t_chunk
    G = _chunk_view(g, T).cumsum(2)  # (B, nc, T, C) inclusive selective time inside each chunk
    nc = G.shape[1]
    uc = _chunk_view(u, T)[..., None]
    Bc, Cc = _chunk_view(Bm, T), _chunk_view(Cm, T)
    # R_t = -s_k (G_t - G_first) in [-thr, 0]: the decay from the chunk's first step to t
    grel = (G - G[:, :, :1])[..., None] * s
    v = torch.exp(grel) * uc  # exp(-R_s) u_s, <= exp(thr) |u|
    # intra-chunk: y_t <- sum_{s <= t} (C_t . B_s) exp(R_t - R_s) u_s = exp(R_t) [(C B^T, masked) @ v]_t
    cb = _causal_cb(Cc, Bc)
    v = v.reshape(b * nc, T, c * k)
    # each chunk's own writes at its end: exp(R_end) sum_s B_s exp(-R_s) u_s
    r_end = torch.exp(-grel[:, :, -1])  # (B, nc, C, K)
    s_chunk = torch.bmm(Bc.reshape(b * nc, T, n).transpose(1, 2), v).reshape(b, nc, n, c, k) * r_end[:, :, None]
    a_chunk = torch.exp(-G[:, :, -1, :, None] * s)  # whole-chunk decay (B, nc, C, K)
    first = torch.exp(-G[:, :, 0, :, None] * s)  # the first step's decay
    starts, h = _carry_states(a_chunk, s_chunk, h0)
    h_start = (starts * first[:, :, None]).reshape(b * nc, n, c * k)
    # carried state exp(-s G_first) C_t . h_start plus the intra-chunk sum, in one batched product
    total = torch.baddbmm(torch.bmm(Cc.reshape(b * nc, T, n), h_start), cb.reshape(b * nc, T, T), v)
    # read out: y_t = sum_k w_k exp(R_t) total_t (positive weights fold into the exponent: one pass less)
    readout = torch.exp(w.log() - grel) if bool((w > 0).all()) else torch.exp(-grel) * w
    y = (total.reshape(b, nc, T, c, k) * readout).sum(-1)
    return y.reshape(b, nc * T, c)[:, :n_len], h


def _segsum_scan(g: Tensor, u: Tensor, Bm: Tensor, Cm: Tensor, s: Tensor, w: Tensor, t_chunk: int,
                 h0: Tensor | None) -> tuple[Tensor, Tensor]:
    """As ``_chunked_scan``, but every decay inside a chunk is ``exp(-s_k seg[t, s'])`` with the segment sum
    ``seg[t, s'] = sum_{s' < j <= t} g_j`` built by a cumulative sum (no difference of large sums, no
    exponent above 0): exact for any decay, ``T x T`` numbers per channel and mode."""
    b, n_len, c = g.shape
    n, k = Bm.shape[-1], s.numel()
    T = t_chunk
    gc, uc = _chunk_view(g, T), _chunk_view(u, T)  # (B, nc, T, C)
    Bc, Cc = _chunk_view(Bm, T), _chunk_view(Cm, T)
    nc = gc.shape[1]
    later = torch.ones(T, T, dtype=torch.bool, device=u.device).tril(-1)  # t > s'
    seg = (gc[:, :, :, None] * later[:, :, None]).cumsum(2)  # (B, nc, T, T, C): [t, s'] for t >= s'
    decay = torch.exp(-seg[..., None] * s)  # (B, nc, T, T, C, K); above the diagonal masked by cb
    cb = _causal_cb(Cc, Bc)
    y = (decay * (cb[..., None] * uc[:, :, None])[..., None]).sum(3)  # (B, nc, T, C, K)
    # writes decayed to the chunk end: sum_s' B_s' exp(-s_k seg[T-1, s']) u_s'
    ends = (decay[:, :, -1] * uc[..., None]).reshape(b * nc, T, c * k)
    s_chunk = torch.bmm(Bc.reshape(b * nc, T, n).transpose(1, 2), ends).reshape(b, nc, n, c, k)
    carry = torch.exp(-gc.cumsum(2)[..., None] * s)  # (B, nc, T, C, K): decay of the entering state up to t
    starts, h = _carry_states(carry[:, :, -1], s_chunk, h0)
    read = torch.bmm(Cc.reshape(b * nc, T, n), starts.reshape(b * nc, n, c * k)).reshape(b, nc, T, c, k)
    return ((y + read * carry) * w).sum(-1).reshape(b, nc * T, c)[:, :n_len], h


def selective_scan_step(
    h: Tensor,
    x_t: Tensor,
    delta_t: Tensor,
    B_t: Tensor,
    C_t: Tensor,
    rates: Tensor,
    weights: Tensor,
    lam: Tensor | None = None,
    D: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One step of the recurrence (bounded-state decoding): ``(y_t (B, C), h_t (B, C, N, K))``.

    Args: ``h (B, C, N, K)`` the previous state, ``x_t, delta_t (B, C)``, ``B_t, C_t (B, N)``; the rest as
    in ``selective_scan``.
    """
    s = rates.to(h)
    scale = lam.to(h) if lam is not None else torch.ones(h.shape[1], dtype=h.dtype, device=h.device)
    decay = torch.exp(-delta_t.to(h)[..., None] * (scale[:, None] * s[None, :]))  # (B, C, K)
    write = (delta_t * x_t).to(h)[:, :, None, None] * B_t.to(h)[:, None, :, None]
    h = decay[:, :, None, :] * h + write
    y = torch.einsum("bcnk,bn,ck->bc", h, C_t.to(h), weights.to(h))
    if D is not None:
        y = y + D.to(h) * x_t.to(h)
    return y.to(x_t.dtype), h


# --- Mamba-style block ---------------------------------------------------------------------------------------
def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


class SelectiveSSMBlock(nn.Module):
    """Mamba-style mixer: ``in_proj -> causal depthwise conv -> SiLU -> selective scan -> * SiLU(z) -> out_proj``.

    ``Delta = softplus(dt_proj(x_proj(x)_dt))`` per channel, ``B``/``C`` from ``x_proj``, ``lambda_c = exp(.)``
    learnable per channel (initialised log-uniformly in ``lam_init``). Kernels:

    - ``frac``: ``n_modes`` fixed log-spaced rates in ``[s_min, s_max]``, weights
      ``frac_kernel_weights(alpha, rates)`` with ``alpha_c = sigmoid(raw_c)`` learnable per channel;
    - ``exp``: one mode, rate 1, weight 1 (exponential forgetting; a selective SSM with one decay per channel).

    Args:
        d_model: width of the residual stream.
        d_state: N, the state size per channel and mode.
        kernel, n_modes, s_min, s_max, alpha_init: the memory kernel (above); ``exp`` ignores the last four.
        expand: inner width ``C = expand * d_model``.
        d_conv: causal convolution width.
        dt_min, dt_max: initial ``Delta`` log-uniform in this range (Mamba's init).
        lam_init: initial ``lambda_c`` log-uniform in this range (Mamba-2's ``A`` init is [1, 16]).
        chunk_size: the scan's longest chunk.
    """

    def __init__(
        self,
        d_model: int,
        d_state: int = 16,
        kernel: Literal["frac", "exp"] = "frac",
        n_modes: int = 8,
        s_min: float = 1e-4,
        s_max: float = 1.0,
        alpha_init: float = 0.5,
        expand: int = 2,
        d_conv: int = 4,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        lam_init: tuple[float, float] = (1.0, 16.0),
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        if kernel not in ("frac", "exp"):
            raise ConfigError(f"kernel must be 'frac' or 'exp', got {kernel!r}")
        if min(d_model, d_state, expand, d_conv) < 1:
            raise ConfigError("d_model, d_state, expand and d_conv must be positive")
        if not 0 < alpha_init < 1:
            raise ConfigError(f"alpha_init must lie in (0, 1), got {alpha_init}")
        if not (0 < dt_min <= dt_max) or not (0 < lam_init[0] <= lam_init[1]):
            raise ConfigError(f"need 0 < dt_min <= dt_max and 0 < lam_init[0] <= lam_init[1], got "
                              f"{dt_min}, {dt_max}, {lam_init}")
        self.kernel = kernel
        self.d_state = d_state
        self.d_inner = ch = expand * d_model
        self.d_conv = d_conv
        self.dt_rank = dt_rank = math.ceil(d_model / 16)
        self.chunk_size = chunk_size
        self.in_proj = nn.Linear(d_model, 2 * ch, bias=False)
        self.conv = nn.Conv1d(ch, ch, d_conv, groups=ch, padding=d_conv - 1)
        self.x_proj = nn.Linear(ch, dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(dt_rank, ch)
        self.out_proj = nn.Linear(ch, d_model, bias=False)
        with torch.no_grad():
            nn.init.uniform_(self.dt_proj.weight, -(dt_rank**-0.5), dt_rank**-0.5)
            dt = torch.exp(torch.rand(ch) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
            self.dt_proj.bias.copy_(_inverse_softplus(dt))
        lo, hi = math.log(lam_init[0]), math.log(lam_init[1])
        self.log_lam = nn.Parameter(lo + torch.rand(ch) * (hi - lo))
        self.D = nn.Parameter(torch.ones(ch))
        if kernel == "frac":
            self.register_buffer("rates", log_spaced_rates(s_min, s_max, n_modes).float())
            self.alpha_raw = nn.Parameter(torch.full((ch,), math.log(alpha_init / (1 - alpha_init))))
        else:
            self.register_buffer("rates", torch.ones(1))
            self.alpha_raw = None

    @property
    def n_modes(self) -> int:
        return self.rates.numel()

    def alpha(self) -> Tensor | None:
        """``alpha_c = sigmoid(raw_c) (C,)`` (None for the exponential kernel)."""
        return torch.sigmoid(self.alpha_raw) if self.alpha_raw is not None else None

    def lam(self) -> Tensor:
        return torch.exp(self.log_lam)

    def weights(self) -> Tensor:
        """The readout weights ``w (C, K)``."""
        if self.alpha_raw is None:
            return torch.ones(self.d_inner, 1, dtype=self.D.dtype, device=self.D.device)
        return frac_kernel_weights(self.alpha(), self.rates).to(self.D.dtype)

    def _projections(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        dt, Bm, Cm = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return F.softplus(self.dt_proj(dt)), Bm, Cm

    def inner(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(x, z, delta, Bm, Cm)`` of a sequence ``u (B, L, d_model)`` (x after conv and SiLU)."""
        x, z = self.in_proj(u).chunk(2, dim=-1)
        x = F.silu(self.conv(x.transpose(1, 2))[..., : u.shape[1]].transpose(1, 2))
        delta, Bm, Cm = self._projections(x)
        return x, z, delta, Bm, Cm

    def forward(self, u: Tensor, return_state: bool = False) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
        """``u (B, L, d_model) -> (B, L, d_model)``; with ``return_state`` also the decode state after ``u``."""
        x, z, delta, Bm, Cm = self.inner(u)
        out = selective_scan(x, delta, Bm, Cm, self.rates, self.weights(), self.lam(), self.D,
                             chunk_size=self.chunk_size, return_state=return_state)
        y, h = out if return_state else (out, None)
        y = self.out_proj(y * F.silu(z))
        if not return_state:
            return y
        xin = self.in_proj(u)[..., : self.d_inner].transpose(1, 2)  # pre-conv inputs for the conv window
        conv = F.pad(xin, (max(0, self.d_conv - 1 - xin.shape[-1]), 0))[..., -(self.d_conv - 1):]
        return y, {"conv": conv, "ssm": h}

    def init_state(self, batch: int, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
        dev = self.D.device
        return {"conv": torch.zeros(batch, self.d_inner, self.d_conv - 1, dtype=dtype, device=dev),
                "ssm": torch.zeros(batch, self.d_inner, self.d_state, self.n_modes, dtype=dtype, device=dev)}

    def step(self, u_t: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """One decoding step ``u_t (B, d_model) -> (B, d_model)`` with a bounded state (conv window + ``h``)."""
        x, z = self.in_proj(u_t).chunk(2, dim=-1)
        window = torch.cat([state["conv"], x[..., None]], dim=-1)  # (B, C, d_conv)
        xc = (window * self.conv.weight[:, 0, :]).sum(-1) + self.conv.bias
        xc = F.silu(xc)
        delta, Bm, Cm = self._projections(xc)
        y, h = selective_scan_step(state["ssm"], xc, delta, Bm, Cm, self.rates, self.weights(), self.lam(), self.D)
        out = self.out_proj(y * F.silu(z))
        return out, {"conv": window[..., 1:], "ssm": h}

    def log_memory_kernel(self, delta: Tensor) -> Tensor:
        """Log of the realised memory kernel of every channel, ``(C, L - 1)``: for an impulse at the first
        position of each sequence, ``log mean_b sum_k w[c, k] exp(-lambda_c s_k sum_{j=1}^{t} Delta_j[b, c])``
        at lags ``t = 1 .. L - 1`` (the decay part of the impulse response, without ``C_t . B_0``)."""
        with torch.no_grad():
            d64 = delta.double()
            tau = d64[:, 1:].cumsum(1) * self.lam().double()  # selective time (B, L-1, C)
            logw = self.weights().double().clamp_min(1e-300).log()  # (C, K)
            s = self.rates.double()
            lk = torch.logsumexp(logw[None, None] - tau[..., None] * s, dim=-1)  # (B, L-1, C)
            return (torch.logsumexp(lk, dim=0) - math.log(lk.shape[0])).T


class RMSNorm(nn.Module):
    """``x / rms(x) * g`` over the last dimension."""

    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SelectiveSSMStack(nn.Module):
    """``n_layers`` pre-norm residual blocks ``h + Block(RMSNorm(h))`` and a final RMSNorm.

    Args: ``n_layers`` and the ``SelectiveSSMBlock`` arguments (``block_kwargs``).
    """

    def __init__(self, d_model: int, n_layers: int, **block_kwargs) -> None:
        super().__init__()
        if n_layers < 1:
            raise ConfigError(f"n_layers must be >= 1, got {n_layers}")
        self.norms = nn.ModuleList(RMSNorm(d_model) for _ in range(n_layers))
        self.blocks = nn.ModuleList(SelectiveSSMBlock(d_model, **block_kwargs) for _ in range(n_layers))
        self.norm_f = RMSNorm(d_model)

    def forward(self, h: Tensor) -> Tensor:
        for norm, block in zip(self.norms, self.blocks):
            h = h + block(norm(h))
        return self.norm_f(h)

    def prefill(self, h: Tensor) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """``forward`` that also returns every block's decode state after the sequence."""
        states = []
        for norm, block in zip(self.norms, self.blocks):
            out, st = block(norm(h), return_state=True)
            h = h + out
            states.append(st)
        return self.norm_f(h), states

    def init_states(self, batch: int, dtype: torch.dtype = torch.float32) -> list[dict[str, Tensor]]:
        return [block.init_state(batch, dtype) for block in self.blocks]

    def step(self, h_t: Tensor, states: list[dict[str, Tensor]]) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """One decoding step ``(B, d_model) -> (B, d_model)``."""
        new = []
        for norm, block, st in zip(self.norms, self.blocks, states):
            out, st = block.step(norm(h_t), st)
            h_t = h_t + out
            new.append(st)
        return self.norm_f(h_t), new

    def log_memory_kernels(self, h: Tensor) -> list[Tensor]:
        """Per block, ``log_memory_kernel`` under the ``Delta`` the block computes on ``h (B, L, d_model)``."""
        out = []
        with torch.no_grad():
            for norm, block in zip(self.norms, self.blocks):
                _, _, delta, _, _ = block.inner(norm(h))
                out.append(block.log_memory_kernel(delta))
                h = h + block(norm(h))
        return out
