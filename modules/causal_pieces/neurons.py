"""First-spike times of current-based integrate-and-fire neurons with exponential synapses.

Notation (paper 000-01, Dold & Petersen): input spike times ``t_i`` (one per presynaptic neuron, ``inf`` when
it does not spike), weights ``w_ij``, synaptic time constant ``tau_s``, threshold ``theta``, membrane time
constant ``tau_m`` (``None`` = no leak, the nLIF neuron). With ``C = 1``

    I_j(t) = sum_i w_ij H(t - t_i) exp(-(t - t_i) / tau_s),     du_j/dt = -u_j / tau_m + I_j(t),  u_j(0) = 0,

and neuron ``j`` fires once, at the first ``t`` with ``u_j(t) = theta``. On the interval between the k-th
and (k+1)-th sorted input the causal set ``C = {first k inputs}`` is fixed, so ``u`` is a known smooth
function there and the first crossing has a closed form:

* nLIF (``tau_m = inf``): ``t = tau_s ln( sum_C w e^{t_i/tau_s} / (sum_C w - theta/tau_s) )``. The current is
  ``A e^{-t/tau_s}`` with one sign per interval, so ``u`` is monotone there and crosses at most once: the
  first interval whose candidate lies inside it gives the exact first spike, inhibitory weights included.
* ``tau_m = tau_s``: ``t = tau_s (b/a - W0(-(theta/(tau_s a)) e^{b/a}))`` with ``a = sum_C w e^{t_i/tau_s}``,
  ``b = sum_C w (t_i/tau_s) e^{t_i/tau_s}`` and the principal Lambert-W branch (Goeltz et al. 2021).
* ``tau_m = 2 tau_s``: ``u = 2 tau_s (A x - B x^2)`` with ``x = e^{-t/tau_m}``, ``A = sum_C w e^{t_i/tau_m}``,
  ``B = sum_C w e^{t_i/tau_s}``; the first crossing is the larger root ``x``.

For finite ``tau_m`` the membrane is not monotone between inputs, but it starts each interval below
``theta`` (no earlier spike), so the earlier root of the interval's equation is the first crossing exactly
when it lies inside the interval; that is the validity test used.

All closed forms take one sort, cumulative sums and a ``gather`` of the first valid candidate, and are
differentiable by autograd inside a causal piece. A per-sample reference time (the first input) is
subtracted inside every ``exp`` so that late spikes do not overflow.

``grid_first_spike_times`` simulates the same neuron on a ``dt`` grid (the standard time-stepped
single-spike LIF): the state ``(I, u)`` is propagated exactly from grid point to grid point, inputs are
injected with the exact contribution of the part of the step after their arrival, and the threshold
crossing is located by linear interpolation between the two grid points around it. It is the oracle the
closed forms are tested against.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from errors import ConfigError

#: slack on the lower end of an interval, so that a crossing at an input time is not lost to rounding
_TOL = 1e-10


def check_layer_inputs(t_in: Tensor, w: Tensor) -> None:
    """Raise a ``ValueError`` naming the fix for malformed spike times or weights."""
    if not torch.is_tensor(t_in) or not torch.is_tensor(w):
        raise ConfigError("input spike times and weights must be torch tensors")
    if t_in.dim() != 2:
        raise ConfigError(f"input spike times must have shape (B, N_in), got {tuple(t_in.shape)}")
    if w.dim() != 2 or w.shape[0] != t_in.shape[1]:
        raise ConfigError(
            f"weights of shape {tuple(w.shape)} do not fit {t_in.shape[1]} inputs: pass weights of shape "
            f"(N_in={t_in.shape[1]}, N_out)"
        )
    if torch.isnan(t_in).any():
        raise ConfigError("input spike times contain NaN: encode 'no spike' as +inf, not NaN")
    if torch.isneginf(t_in).any():
        raise ConfigError("input spike times contain -inf: spike times must be finite or +inf (no spike)")
    if torch.isnan(w).any():
        raise ConfigError("weights contain NaN: check the learning rate or the initialisation")


def _sorted_inputs(t_in: Tensor, w: Tensor):
    """Inputs sorted by time (ties by index) and the cumulative-sum layout ``(N_out, B, N_in)``.

    Returns the shifted sorted times ``s`` (B, N), their finiteness, the reference time ``ref`` (B, 1), the
    sorted weights ``ws`` (M, B, N) and the shifted start of the next interval ``s_next`` (B, N). The
    ``(M, B, N)`` layout keeps the scans over inputs contiguous in memory.
    """
    w = w.to(t_in.dtype)
    t_sorted, order = torch.sort(t_in, dim=1, stable=True)
    finite = torch.isfinite(t_sorted)
    # The result does not depend on the reference time, so it carries no gradient.
    ref = torch.where(finite[:, :1], t_sorted[:, :1], torch.zeros_like(t_sorted[:, :1])).detach()
    s = torch.where(finite, t_sorted - ref, torch.zeros_like(t_sorted))  # finite everywhere
    # Prefix sums up to a valid candidate never reach the (sorted-last) silent inputs, so their weights
    # can stay in ``ws``; only their exp terms must be zeroed (``inf * 0`` would be NaN).
    ws = w.t()[:, order]
    s_next = torch.cat([s[:, 1:], torch.full_like(s[:, :1], math.inf)], dim=1)
    s_next = torch.where(torch.cat([finite[:, 1:], torch.zeros_like(finite[:, :1])], 1), s_next, math.inf)
    return s, finite, ref, ws, s_next


def _first_index(ok: Tensor) -> tuple[Tensor, Tensor]:
    """Index of the first True along the last axis (argmax returns the first maximum) and whether any."""
    return ok.to(torch.uint8).argmax(dim=-1, keepdim=True), ok.any(dim=-1)


def _first_valid(cand: Tensor, ok: Tensor, s: Tensor, s_next: Tensor, finite: Tensor, ref: Tensor) -> Tensor:
    """The first candidate (``cand``, ``ok``: (M, B, N)) inside its own interval, as times (B, M), else ``inf``."""
    ok = ok & finite & (cand >= s - _TOL) & (cand < s_next)
    idx, has = _first_index(ok)
    t = cand.gather(-1, idx).squeeze(-1) + ref.t()
    return torch.where(has, t, torch.full_like(t, math.inf)).t()


def nlif_first_spike_times(t_in: Tensor, w: Tensor, tau_s: float = 1.0, theta: float = 1.0) -> Tensor:
    """Exact first-spike times of non-leaky IF neurons (``tau_m = inf``) with exponential synapses.

    Args:
        t_in: input spike times ``(B, N_in)``; ``inf`` = the input does not spike.
        w: weights ``(N_in, N_out)``, any sign.
        tau_s: synaptic time constant.
        theta: firing threshold.

    Returns:
        output spike times ``(B, N_out)``, ``inf`` where the neuron does not spike.
    """
    check_layer_inputs(t_in, w)
    s, finite, ref, ws, s_next = _sorted_inputs(t_in, w)
    e = torch.where(finite, torch.exp(s / tau_s), torch.zeros_like(s))
    # Interval ends as exponentials: [e_lo, e_hi) with a rounding slack below; +inf at a silent input makes
    # its candidate invalid, and an open last interval has e_hi = +inf.
    e_lo = torch.where(finite, e * (1.0 - 1e-12), math.inf)
    e_hi = torch.cat([e[:, 1:], torch.full_like(e[:, :1], math.inf)], dim=1)
    e_hi = torch.where(torch.isfinite(s_next), e_hi, math.inf)
    W = torch.cumsum(ws, dim=-1)
    A = torch.cumsum(ws * e, dim=-1)
    D = W - theta / tau_s
    # Candidate t = tau_s ln(A / D) lies in [s_k, s_k+1) iff D e^{s_k} <= A < D e^{s_k+1}, tested before any
    # logarithm. This implies D > 0 (for D <= 0 the range is empty, or NaN from 0 * inf, which compares
    # False) and A > 0; A <= 0 with D > 0 means u only falls towards its asymptote: no crossing.
    ok = (A >= D * e_lo) & (A < D * e_hi)
    idx = ok.view(torch.uint8).argmax(dim=-1, keepdim=True)  # the first True
    has = ok.gather(-1, idx).squeeze(-1)
    a_sel = A.gather(-1, idx).squeeze(-1)
    d_sel = D.gather(-1, idx).squeeze(-1)
    ratio = torch.where(has, a_sel / torch.where(has, d_sel, torch.ones_like(d_sel)), torch.ones_like(a_sel))
    t = ref.t() + tau_s * torch.log(ratio)
    return torch.where(has, t, torch.full_like(t, math.inf)).t()


def lambertw0(x: Tensor, iters: int = 12) -> Tensor:
    """Principal branch ``W0(x)`` for real ``x >= -1/e`` (Halley's method), with its autograd derivative.

    At most ``iters`` Halley steps, fewer once every step is below ``1e-13 (1 + |W|)`` (Halley converges
    cubically: the next step would be at rounding level). Entries below ``-1/e`` return ``nan``; callers mask
    them out.
    """
    with torch.no_grad():
        xd = x.detach()
        p = torch.sqrt(torch.clamp(2.0 * (math.e * xd + 1.0), min=0.0))
        near_branch = -1.0 + p - p * p / 3.0 + 11.0 / 72.0 * p**3
        w = torch.where(xd < -0.25, near_branch, torch.where(xd < 1.0, xd - xd * xd + 1.5 * xd**3, torch.log1p(xd)))
        for _ in range(iters):
            ew = torch.exp(w)
            f = w * ew - xd
            wp1 = w + 1.0
            denom = ew * wp1 - (w + 2.0) * f / (2.0 * torch.where(wp1.abs() < 1e-300, 1e-300, wp1))
            step = torch.where(denom != 0, f / denom, torch.zeros_like(f))
            w = w - step
            done = (step.abs() <= 1e-13 * (1.0 + w.abs())) | ~torch.isfinite(step)
            if bool(done.all()):
                break
        w = torch.where(xd < -1.0 / math.e, torch.full_like(w, math.nan), w)
        # dW/dx = 1 / (e^W (1 + W)), finite at x = 0 and infinite only at the branch point
        dw = 1.0 / (torch.exp(w) * torch.clamp(w + 1.0, min=1e-12))
    return w + (x - xd) * dw


def lif_first_spike_times(
    t_in: Tensor, w: Tensor, tau_s: float = 1.0, theta: float = 1.0, tau_m: float = 1.0
) -> Tensor:
    """Exact first-spike times of leaky IF neurons for ``tau_m = tau_s`` (Lambert W) or ``2 tau_s`` (quadratic).

    Same arguments and return value as :func:`nlif_first_spike_times`, plus the membrane time constant.
    """
    check_layer_inputs(t_in, w)
    if math.isclose(tau_m, tau_s, rel_tol=1e-12):
        s, finite, ref, ws, s_next = _sorted_inputs(t_in, w)
        e = torch.where(finite, torch.exp(s / tau_s), torch.zeros_like(s))
        a = torch.cumsum(ws * e, dim=-1)
        b = torch.cumsum(ws * (e * s / tau_s), dim=-1)
        # On interval k, u(t) = tau_s e^{-t/tau_s} (a t/tau_s - b): one critical point, at t*/tau_s = 1 + b/a,
        # a maximum for a > 0 (for a <= 0, u stays below max(u(s_k), 0) < theta). u(s_k) < theta, so the interval
        # holds the first crossing iff s_k <= t* and u(min(t*, s_k+1)) >= theta: a test without Lambert W, which
        # is then evaluated only at the selected interval of each (sample, neuron).
        pos = a > 0
        a_safe = torch.where(pos, a, torch.ones_like(a))
        ba = b / a_safe
        t_peak = tau_s * (1.0 + ba)
        t_end = torch.minimum(t_peak, s_next)
        u_end = tau_s * torch.exp(-t_end / tau_s) * (a * t_end / tau_s - b)
        ok = pos & finite & (s <= t_peak + _TOL) & (u_end >= theta)
        idx, has = _first_index(ok)
        a_sel, ba_sel = a_safe.gather(-1, idx).squeeze(-1), ba.gather(-1, idx).squeeze(-1)
        ba_sel = torch.where(has, ba_sel, torch.zeros_like(ba_sel))
        # exp(b/a) could overflow only where the peak is below theta: that never reaches the selected entries
        arg = -(theta / tau_s) / torch.where(has, a_sel, torch.ones_like(a_sel)) * torch.exp(ba_sel)
        # rounding can put a peak that touches theta a hair below the branch point -1/e
        arg = torch.where(has, arg.clamp(min=-1.0 / math.e), torch.zeros_like(arg))
        t = tau_s * (ba_sel - lambertw0(arg)) + ref.t()
        return torch.where(has, t, torch.full_like(t, math.inf)).t()
    if math.isclose(tau_m, 2.0 * tau_s, rel_tol=1e-12):
        s, finite, ref, ws, s_next = _sorted_inputs(t_in, w)
        A = torch.cumsum(ws * torch.where(finite, torch.exp(s / tau_m), torch.zeros_like(s)), dim=-1)
        B = torch.cumsum(ws * torch.where(finite, torch.exp(s / tau_s), torch.zeros_like(s)), dim=-1)
        c = theta / (2.0 * tau_s)
        D = A * A - 4.0 * B * c
        # B <= 0 makes u decrease inside the interval (no upward crossing); the earlier root is the larger x
        ok = (B > 0) & (A > 0) & (D >= 0)
        sq = torch.sqrt(torch.where(ok, D, torch.ones_like(D)))
        x = torch.where(ok, (A + sq) / (2.0 * torch.where(ok, B, torch.ones_like(B))), torch.ones_like(A))
        return _first_valid(-tau_m * torch.log(x), ok, s, s_next, finite, ref)
    raise ConfigError(
        f"closed-form LIF spike times exist here for tau_m = tau_s or tau_m = 2 tau_s (got tau_m={tau_m}, "
        f"tau_s={tau_s}); use neuron='lif_grid' for other membrane time constants or neuron='nlif' for no leak"
    )


def _psp_kernel(d: Tensor | float, tau_s: float, tau_m: float | None):
    """Membrane response at time ``d`` after a unit current step that then decays with ``tau_s`` (u(0) = 0)."""
    d = torch.as_tensor(d, dtype=torch.float64)
    if tau_m is None or math.isinf(tau_m):
        return tau_s * (1.0 - torch.exp(-d / tau_s))
    if math.isclose(tau_m, tau_s, rel_tol=1e-12):
        return d * torch.exp(-d / tau_s)
    return tau_m * tau_s / (tau_m - tau_s) * (torch.exp(-d / tau_m) - torch.exp(-d / tau_s))


def grid_first_spike_times(
    t_in: Tensor,
    w: Tensor,
    tau_s: float = 1.0,
    theta: float = 1.0,
    tau_m: float | None = None,
    dt: float = 0.01,
    t_max: float = 8.0,
    interpolate: bool = True,
    stop_early: bool = True,
) -> Tensor:
    """First-spike times from a time-stepped simulation on the grid ``0, dt, ..., t_max``.

    Args:
        t_in, w, tau_s, theta: as in :func:`nlif_first_spike_times` (input times must be >= 0).
        tau_m: membrane time constant, ``None`` for no leak.
        dt: grid step.
        t_max: end of the simulation; neurons that cross later count as silent.
        interpolate: place the spike by linear interpolation of ``u`` between the grid points around the
            crossing (differentiable in ``w``); otherwise at the first grid point with ``u >= theta``.
        stop_early: end the simulation once every neuron has spiked (same result, fewer steps).
    """
    check_layer_inputs(t_in, w)
    if dt <= 0 or t_max <= 0:
        raise ConfigError(f"dt and t_max must be positive, got dt={dt}, t_max={t_max}")
    if (t_in < 0).any():
        raise ConfigError("the grid simulation starts at t = 0: shift input spike times to be >= 0")
    w = w.to(t_in.dtype)
    n_steps = int(math.ceil(t_max / dt - 1e-9))
    finite = torch.isfinite(t_in) & (t_in <= n_steps * dt)
    step_in = torch.where(finite, torch.ceil(t_in / dt - 1e-9), torch.full_like(t_in, -1.0)).long()
    delta = torch.where(finite, step_in * dt - t_in, torch.zeros_like(t_in)).clamp(min=0.0)
    inj_i = torch.where(finite, torch.exp(-delta / tau_s), torch.zeros_like(delta))
    inj_u = torch.where(finite, _psp_kernel(delta, tau_s, tau_m).to(t_in.dtype), torch.zeros_like(delta))
    decay_i = math.exp(-dt / tau_s)
    decay_u = 1.0 if tau_m is None or math.isinf(tau_m) else math.exp(-dt / tau_m)
    k_dt = float(_psp_kernel(dt, tau_s, tau_m))
    B, M = t_in.shape[0], w.shape[1]
    cur = t_in.new_zeros(B, M)
    u = t_in.new_zeros(B, M)
    t_out = t_in.new_full((B, M), math.inf)
    pending = torch.ones(B, M, dtype=torch.bool, device=t_in.device)
    # In-place updates when no graph is needed: the step loop is the whole cost of this simulation.
    inplace = not (torch.is_grad_enabled() and (w.requires_grad or t_in.requires_grad))
    active_steps = set(step_in[finite].tolist())
    for n in range(n_steps + 1):
        u_prev = u.clone() if (interpolate and inplace) else u
        if n > 0:
            if inplace:
                if decay_u != 1.0:
                    u.mul_(decay_u)
                u.add_(cur, alpha=k_dt)
                cur.mul_(decay_i)
            else:
                u = u * decay_u + cur * k_dt
                cur = cur * decay_i
        if n in active_steps:
            arrive = (step_in == n).to(t_in.dtype)
            if inplace:
                cur.add_((arrive * inj_i) @ w)
                u.add_((arrive * inj_u) @ w)
            else:
                cur = cur + (arrive * inj_i) @ w
                u = u + (arrive * inj_u) @ w
        # Like any time-stepped simulator, only grid points are checked: a crossing that an input arriving
        # later in the same step undoes is missed (rare; an O(dt) discretisation effect the tests allow for).
        cross = (u >= theta) & pending
        if cross.any():
            if interpolate and n > 0:
                frac = (theta - u_prev) / torch.where(cross, u - u_prev, torch.ones_like(u))
                t_now = (n - 1) * dt + dt * frac.clamp(0.0, 1.0)
            else:
                t_now = torch.full_like(u, n * dt)
            t_out = torch.where(cross, t_now, t_out)
            pending &= ~cross
            if stop_early and not pending.any():
                break
    return t_out
