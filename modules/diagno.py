"""DIAGNO (paper 002-12): a spherical neural operator whose spectral layer mixes harmonics along the diagonals of the
``(l, m)`` triangle, against SFNO's per-degree weights.

The paper's text was not found; this is the issue's reading of its abstract (marked "inference" below).

- ``diagonal_mix(a, w_sfno, w_intra, w_inter)``: the spectral layer, on coefficients ``a (B, C_in, L, L)``
  (``0 <= m <= l < L``; ``modules.components.spherical.sht``)::

      out[o, l, m] = sum_c [ w_sfno[o, c, l] a[c, l, m]
                             + sum_j w_intra[o, c, l - m, j + k_i] a[c, l + j, m + j]     (|j| <= k_i)
                             + sum_j w_inter[o, c, m, j + k_e] a[c, l + j, m] ]            (|j| <= k_e)

  terms whose source lies outside ``0 <= m <= l < L`` dropped, zero above the diagonal. Inference: the diagonal
  ``d = l - m`` counts the latitudinal zeros of ``P_l^m``; the *intra*-diagonal term moves energy along a
  diagonal, between zonal wavenumbers ``m`` and ``m + j`` (east-west transfer: it does not commute with rolls
  in longitude, which multiply ``a_lm`` by ``exp(-i m dphi)``); the *inter*-diagonal term couples degrees at
  a fixed ``m`` (north-south structure: it commutes with rolls but not with rotations that tilt the axis);
  ``w_sfno`` alone is SFNO's per-degree layer, equivariant to every rotation. Weights are complex.
- ``DIAGNO`` and ``SFNO``: task networks ``(in_shape, out_ch, ...)`` of the same shape: a pointwise lift to
  ``width`` channels, ``n_layers`` blocks ``x + MLP(gelu(isht(mix(sht(x))) + skip(x)))`` (``skip`` a pointwise
  linear map, ``MLP`` pointwise ``width -> 2 width -> width``), a pointwise projection to ``out_ch``. Only the
  spectral mix differs; SFNO reaches DIAGNO's parameter count by its width (``matched_sfno_width``).
- ``SphereForecastTask(net)``: one-step forecasts ``x_{t+1} = x_t + net(x_t)`` trained on the
  latitude-weighted MSE; validation and test roll the net out autoregressively over the data's windows and log,
  per rollout step k, the quadrature-weighted relative L2 error ``rollout<k>_rel_l2`` and the anomaly
  correlation ``rollout<k>_acc`` (the data's climatology is zero), and in test the longitude-roll commutator of
  the net (``roll_commutator``, in float64) and its parameter count.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.metrics import count_parameters
from modules.components.spherical import grid, isht, sht

PAPER_ID = "002-12"


# --- the spectral layer -------------------------------------------------------------------------------------
def _check_weight(name: str, w: Tensor | None, shape: tuple[int, ...], odd_last: bool = False) -> None:
    if w is None:
        return
    if not isinstance(w, Tensor) or not (w.is_floating_point() or w.is_complex()):
        raise ConfigError(f"{name} must be a float or complex tensor, got {type(w).__name__}")
    if odd_last:
        ok = w.dim() == 4 and tuple(w.shape[:3]) == shape and w.shape[3] % 2 == 1
        want = f"{(*shape, '2k+1')}"
    else:
        ok = tuple(w.shape) == shape
        want = f"{shape}"
    if not ok:
        raise ConfigError(f"{name} must have shape {want} (C_out, C_in, L[, 2k+1]), got {tuple(w.shape)}")


def diagonal_mix(a: Tensor, w_sfno: Tensor | None, w_intra: Tensor | None = None,
                 w_inter: Tensor | None = None) -> Tensor:
    """The diagonal spectral mix of complex coefficients ``a (B, C_in, L, L)`` (module docstring): complex
    ``(B, C_out, L, L)``, zero above the diagonal. ``w_sfno (C_out, C_in, L)``, ``w_intra (C_out, C_in, L,
    2 k_i + 1)`` (indexed by the diagonal ``l - m``), ``w_inter (C_out, C_in, L, 2 k_e + 1)`` (indexed by ``m``);
    each may be None (left out), real or complex; at least one is given."""
    if not isinstance(a, Tensor) or not a.is_complex() or a.dim() != 4 or a.shape[-1] != a.shape[-2]:
        got = f"{a.dtype} of shape {tuple(a.shape)}" if isinstance(a, Tensor) else type(a).__name__
        raise ConfigError(f"diagonal_mix takes complex coefficients (B, C_in, L, L) from sht, got {got}")
    given = [w for w in (w_sfno, w_intra, w_inter) if w is not None]
    if not given:
        raise ConfigError("diagonal_mix needs at least one of w_sfno, w_intra, w_inter")
    _, c_in, size, _ = a.shape
    c_out = given[0].shape[0]
    _check_weight("w_sfno", w_sfno, (c_out, c_in, size))
    _check_weight("w_intra", w_intra, (c_out, c_in, size), odd_last=True)
    _check_weight("w_inter", w_inter, (c_out, c_in, size), odd_last=True)
    lower = torch.tril(torch.ones(size, size, dtype=torch.bool, device=a.device))
    a = a * lower  # sources above the diagonal are not coefficients: zero, so shifts onto them drop out
    out = torch.zeros(a.shape[0], c_out, size, size, dtype=a.dtype, device=a.device)
    if w_sfno is not None:
        out = out + torch.einsum("bclm,ocl->bolm", a, w_sfno.to(a.dtype))
    if w_intra is not None:
        k = (w_intra.shape[-1] - 1) // 2
        padded = F.pad(a, (k, k, k, k))  # zeros outside 0 <= l, m < L
        shifted = torch.stack([padded[..., k + j : k + j + size, k + j : k + j + size] for j in range(-k, k + 1)], -1)
        d = (torch.arange(size)[:, None] - torch.arange(size)[None, :]).clamp_min(0).to(a.device)  # l - m
        out = out + torch.einsum("bclmj,oclmj->bolm", shifted, w_intra.to(a.dtype)[:, :, d])
    if w_inter is not None:
        k = (w_inter.shape[-1] - 1) // 2
        padded = F.pad(a, (0, 0, k, k))
        shifted = torch.stack([padded[..., k + j : k + j + size, :] for j in range(-k, k + 1)], -1)
        out = out + torch.einsum("bclmj,ocmj->bolm", shifted, w_inter.to(a.dtype))
    return out * lower


# --- networks -----------------------------------------------------------------------------------------------
def _complex_weight(*shape: int, fan_in: int) -> nn.Parameter:
    """A complex weight stored as real pairs ``(..., 2)`` (``torch.view_as_complex``), variance ``1 / fan_in``."""
    return nn.Parameter(torch.randn(*shape, 2) / math.sqrt(2.0 * fan_in))


class SpectralBlock(nn.Module):
    """``x + MLP(gelu(isht(mix(sht(x))) + skip(x)))`` on ``(B, width, nlat, nlon)``; ``mix`` is ``diagonal_mix``
    with the weights this block holds (``k_intra`` or ``k_inter`` None: that term left out)."""

    def __init__(self, width: int, lmax: int, sfno_path: bool, k_intra: int | None, k_inter: int | None) -> None:
        super().__init__()
        self.lmax = lmax
        taps = int(sfno_path) + (0 if k_intra is None else 2 * k_intra + 1) + (0 if k_inter is None else 2 * k_inter + 1)
        fan = width * taps
        self.w_sfno = _complex_weight(width, width, lmax, fan_in=fan) if sfno_path else None
        self.w_intra = None if k_intra is None else _complex_weight(width, width, lmax, 2 * k_intra + 1, fan_in=fan)
        self.w_inter = None if k_inter is None else _complex_weight(width, width, lmax, 2 * k_inter + 1, fan_in=fan)
        self.skip = nn.Conv2d(width, width, 1)
        self.mlp = nn.Sequential(nn.Conv2d(width, 2 * width, 1), nn.GELU(), nn.Conv2d(2 * width, width, 1))

    def forward(self, x: Tensor) -> Tensor:
        def cplx(w: nn.Parameter | None) -> Tensor | None:
            return None if w is None else torch.view_as_complex(w)

        a = sht(x, self.lmax)
        y = isht(diagonal_mix(a, cplx(self.w_sfno), cplx(self.w_intra), cplx(self.w_inter)), *x.shape[-2:])
        return x + self.mlp(F.gelu(y + self.skip(x)))


class _SphericalOperator(nn.Module):
    """Lift, ``n_layers`` spectral blocks, projection; checks the grid against ``lmax`` once."""

    def __init__(self, in_shape: tuple[int, ...], out_ch: int, width: int, n_layers: int, lmax: int,
                 blocks: Callable[[], SpectralBlock]) -> None:
        super().__init__()
        shape = tuple(int(s) for s in in_shape)
        if len(shape) != 3:
            raise ConfigError(f"in_shape must be (C, nlat, nlon), got {shape}")
        c, nlat, nlon = shape
        if min(width, n_layers, out_ch) < 1:
            raise ConfigError(f"width, n_layers and out_ch must be >= 1, got {width}, {n_layers}, {out_ch}")
        if not 1 <= lmax <= nlat:
            raise ConfigError(f"lmax={lmax} must lie in [1, nlat={nlat}] (the Gauss grid resolves degrees < nlat)")
        if nlon < 2 * lmax - 1:
            raise ConfigError(f"nlon={nlon} aliases orders below lmax={lmax}: lower lmax to <= {(nlon + 1) // 2}")
        self.in_shape, self.out_ch, self.width, self.n_layers, self.lmax = shape, out_ch, width, n_layers, lmax
        self.lift = nn.Conv2d(c, width, 1)
        self.blocks = nn.ModuleList(blocks() for _ in range(n_layers))
        self.proj = nn.Conv2d(width, out_ch, 1)
        # zero output at initialisation: a residual forecaster starts as persistence, x_{t+1} = x_t
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: Tensor) -> Tensor:
        h = self.lift(x)
        for block in self.blocks:
            h = block(h)
        return self.proj(h)


class DIAGNO(_SphericalOperator):
    """The diagonal spherical operator (module docstring).

    Args:
        in_shape: one sample's ``(C, nlat, nlon)`` (linked from the data).
        out_ch: output channels.
        width: channels of the hidden fields.
        n_layers: spectral blocks.
        lmax: degrees ``l < lmax`` mixed in spectral space (``<= nlat``, ``nlon >= 2 lmax - 1``).
        k_intra: half-width of the intra-diagonal (zonal) kernel, ``m -> m + j``, ``|j| <= k_intra``.
        k_inter: half-width of the inter-diagonal (meridional) kernel, ``l -> l + j`` at fixed ``m``.
        keep_sfno_path: keep SFNO's per-degree weights as a third term.
    """

    def __init__(self, in_shape: tuple[int, ...], out_ch: int, width: int = 32, n_layers: int = 4, lmax: int = 16,
                 k_intra: int = 3, k_inter: int = 2, keep_sfno_path: bool = True) -> None:
        if min(k_intra, k_inter) < 0:
            raise ConfigError(f"k_intra and k_inter must be >= 0, got {k_intra}, {k_inter}")
        super().__init__(in_shape, out_ch, width, n_layers, lmax,
                         lambda: SpectralBlock(width, lmax, keep_sfno_path, k_intra, k_inter))


class SFNO(_SphericalOperator):
    """The spherical Fourier neural operator with per-degree weights (``diagonal_mix`` with ``w_sfno`` only);
    arguments as ``DIAGNO``'s. ``matched_sfno_width`` gives the width that matches a DIAGNO's parameters."""

    def __init__(self, in_shape: tuple[int, ...], out_ch: int, width: int = 32, n_layers: int = 4,
                 lmax: int = 16) -> None:
        super().__init__(in_shape, out_ch, width, n_layers, lmax, lambda: SpectralBlock(width, lmax, True, None, None))


def matched_sfno_width(net: DIAGNO) -> int:
    """The SFNO width (same depth, ``lmax`` and shapes) whose parameter count is closest to ``net``'s."""
    target = count_parameters(net)

    def count(width: int) -> int:
        return count_parameters(SFNO(net.in_shape, net.out_ch, width, net.n_layers, net.lmax))

    width = net.width
    while count(width + 1) <= target:
        width += 1
    return width if target - count(width) <= count(width + 1) - target else width + 1


# --- the task -----------------------------------------------------------------------------------------------
#: builds a task network from one sample's shape ``(C, nlat, nlon)`` and the output channels
NetFactory = Callable[[tuple[int, ...], int], nn.Module]


def weighted_scores(pred: Tensor, target: Tensor, lat_weights: Tensor) -> tuple[Tensor, Tensor]:
    """Per-sample ``(relative L2, ACC)`` of fields ``(B, C, nlat, nlon)`` under latitude weights ``(nlat,)``: the
    quadrature-weighted ``||p - t|| / ||t||`` and ``<p, t> / (||p|| ||t||)`` (anomalies about the zero
    climatology of the data)."""
    w = lat_weights.to(pred.dtype)[:, None]

    def dot(u: Tensor, v: Tensor) -> Tensor:
        return (u * v * w).sum(dim=(1, 2, 3))

    tt = dot(target, target)
    rel = (dot(pred - target, pred - target) / tt.clamp_min(1e-30)).sqrt()
    acc = dot(pred, target) / (dot(pred, pred) * tt).sqrt().clamp_min(1e-30)
    return rel, acc


class SphereForecastTask(PaperTask):
    """One-step forecasts on the sphere, tested by autoregressive rollouts (module docstring).

    Args:
        net: the task network, ``net(input_shape, C)`` (``DIAGNO`` or ``SFNO`` with their other arguments).
        residual: predict the increment, ``x_{t+1} = x_t + net(x_t)``.
        rollout_steps: the longest rollout evaluated (the data's windows may be shorter).
        input_shape: one sample's ``(C, nlat, nlon)`` (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask``.
    """

    paper_id = PAPER_ID
    monitor = "val/rel_l2"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: NetFactory = lambda shape, out_ch: DIAGNO(shape, out_ch),
        residual: bool = True,
        rollout_steps: int = 5,
        input_shape: tuple[int, ...] = (1, 32, 64),
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        shape = tuple(int(s) for s in input_shape)
        if len(shape) != 3:
            raise ConfigError(f"input_shape must be (C, nlat, nlon), got {shape}")
        if rollout_steps < 1:
            raise ConfigError(f"rollout_steps must be >= 1, got {rollout_steps}")
        metrics: dict[str, WeightedMean] = {"rel_l2": WeightedMean(), "acc": WeightedMean()}
        for k in range(1, rollout_steps + 1):
            metrics[f"rollout{k}_rel_l2"] = WeightedMean()
            metrics[f"rollout{k}_acc"] = WeightedMean()
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        self.net = net(shape, shape[0])
        self.residual, self.rollout_steps, self.input_shape = residual, rollout_steps, shape
        _, _, weights = grid(shape[1], shape[2])
        lat = weights[:, 0] / weights[:, 0].mean()  # mean 1: the weighted MSE is on the scale of the plain one
        self.register_buffer("lat_weights", lat.float(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """The next state ``x_{t+1}`` of ``x_t (B, C, nlat, nlon)``."""
        out = self.net(x)
        return x + out if self.residual else out

    def rollout(self, x: Tensor, steps: int) -> Tensor:
        """``(B, steps, C, nlat, nlon)``: the states after 1..steps autoregressive forecasts from ``x``."""
        states = []
        for _ in range(steps):
            x = self(x)
            states.append(x)
        return torch.stack(states, 1)

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        x, targets = batch[0], batch[1]
        n = x.shape[0]
        ones = torch.ones(n, device=x.device)
        if stage == "train":
            pred = self(x)
            loss = ((pred - targets[:, 0]).square() * self.lat_weights[:, None]).mean()
            rel, acc = weighted_scores(pred.detach(), targets[:, 0], self.lat_weights)
            return StepOutput(loss, n=n, inputs={"rel_l2": (rel, ones), "acc": (acc, ones)})
        horizon = min(targets.shape[1], self.rollout_steps)
        preds = self.rollout(x, horizon)
        loss = ((preds[:, 0] - targets[:, 0]).square() * self.lat_weights[:, None]).mean()
        inputs: dict[str, Any] = {}
        for k in range(horizon):
            rel, acc = weighted_scores(preds[:, k], targets[:, k], self.lat_weights)
            inputs[f"rollout{k + 1}_rel_l2"], inputs[f"rollout{k + 1}_acc"] = (rel, ones), (acc, ones)
        inputs["rel_l2"], inputs["acc"] = inputs["rollout1_rel_l2"], inputs["rollout1_acc"]
        if stage == "test" and getattr(self, "_commutator", None) is None:
            self._commutator = self.roll_commutator(x)
        return StepOutput(loss, n=n, inputs=inputs)

    def roll_commutator(self, x: Tensor, shift: int | None = None) -> Tensor:
        """``||net(roll x) - roll net(x)|| / ||net(x)||`` (plain norms, in float64 on a copy of the net) for a
        roll of ``shift`` whole longitude cells (default: an eighth of the circle)."""
        shift = x.shape[-1] // 8 if shift is None else shift
        net = copy.deepcopy(self.net).double().eval()
        xd = x.detach().double()
        with torch.no_grad():
            out = net(xd)
            rolled = net(torch.roll(xd, shift, dims=-1))
        return (rolled - torch.roll(out, shift, dims=-1)).norm() / out.norm().clamp_min(1e-300)

    def spectrum(self, batch: Any, source: Literal["prediction", "target"] = "prediction") -> Tensor:
        """``modules.protocols.SphericalSpectrum``: complex ``(B, C, L, L)`` (``L = nlat``) coefficients of the
        one-step forecast of the batch's states, or of the true next states."""
        x, targets = batch[0], batch[1]
        with torch.no_grad():
            field = self(x) if source == "prediction" else targets[:, 0]
        return sht(field.float())

    def on_test_epoch_start(self) -> None:
        self._commutator: Tensor | None = None

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage != "test":
            return {}
        out = {"test/n_params": torch.tensor(float(count_parameters(self.net)))}
        if getattr(self, "_commutator", None) is not None:
            out["test/roll_commutator"] = self._commutator.float()
        return out


__all__ = ["DIAGNO", "PAPER_ID", "SFNO", "SpectralBlock", "SphereForecastTask", "diagonal_mix", "matched_sfno_width",
           "weighted_scores"]
