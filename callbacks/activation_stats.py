"""Activation sparsity and spikes (paper 000-09), measured on what enters every linear/conv layer.

Forward pre-hooks on each weight layer read its input ``h`` on evaluation batches (the module in eval mode,
dropout off) and accumulate:

- ``sparsity``: the fraction of exact zeros in ``h`` (for a layer reading ReLU, the activation sparsity);
- ``max``: ``max |h|``, the activation-spike statistic of the authors' code (``max_input_value``);
- ``spike_ratio``: ``max |h|`` over the median of the non-zero ``|h|``;
- ``near_zero``: the fraction of ``|h| < near_zero_eps`` (exact zeros included). GELU and SiLU outputs are
  almost never exactly zero, so ``sparsity`` is ~0 for them by construction; this is the measure that can
  compare them with ReLU.

Forward pre-hooks on every activation module (a module with a ``positive_bias``, or a torch activation, see
``modules.components.activations.activation_bias``) read the activation's own input, the pre-activation
``z`` of ``h = phi(z)``, and accumulate

- ``pre_negative``: the fraction of ``z < 0``, the spec's sparsity measure for smooth activations (for ReLU it
  equals the ``sparsity`` of the layer reading it, up to exact zeros of ``z``).

Logged as ``diag/activations/<layer>/{sparsity,near_zero,max,spike_ratio}`` for every weight layer's input,
``diag/activations/<activation>/pre_negative`` for every activation module, plus averages over the layers
that read a positively biased activation, ``diag/activations/downstream_sparsity``, ``downstream_near_zero``
and ``downstream_max`` (the largest), and over the positively biased (symmetric) activations,
``downstream_pre_negative`` (``symmetric_pre_negative``, the control; roles as in ``callbacks.weight_drift``).

When (``schedule``): with ``at_validation`` on the first ``eval_batches`` batches of every validation run
(and the sanity check, which gives the initialisation), and at the schedule's training steps on the
current training batch through the module's ``diagnostic_forward(batch)`` (or ``forward(batch[0])``) in
eval mode.

DDP: zero, near-zero, negative and element counts and a log-spaced histogram of ``|h|`` (for the median) are summed over
ranks and maxima are max-reduced, so with the core's sharded loader the numbers equal the single-process
ones. The median is read from that histogram (bins 0.5% wide in ``log10 |h|``), not sorted exactly.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor, nn

from callbacks.diagnostic import Diagnostic, Moment, Schedule
from callbacks.weight_drift import InputSourceTracer, forward_on, weight_layers
from errors import ConfigError
from modules.components.activations import activation_bias
from tracking.figures import new_figure

PREFIX = "diag/activations"
_LOG_LO, _LOG_HI, _N_BINS = -10.0, 10.0, 4000  # log10|h| range of the median histogram (0.005 per bin)


def layer_input_stats(h: Tensor) -> tuple[int, int, float, Tensor]:
    """``(number of exact zeros, number of entries, max |h|, histogram of log10 |h| over non-zeros)``."""
    a = h.detach().abs().flatten().float()
    nz = a[a > 0]
    hist = torch.histc(nz.log10().clamp(_LOG_LO, _LOG_HI - 1e-6), bins=_N_BINS, min=_LOG_LO, max=_LOG_HI)
    return a.numel() - nz.numel(), a.numel(), (a.max().item() if a.numel() else 0.0), hist.double()


def near_zero_count(h: Tensor, eps: float) -> int:
    """The number of entries with ``|h| < eps``."""
    return int((h.detach().abs() < eps).sum().item())


def negative_count(z: Tensor) -> tuple[int, int]:
    """``(number of entries z < 0, number of entries)``."""
    return int((z.detach() < 0).sum().item()), z.numel()


def activation_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every activation module: a known ``activation_bias``, except plain
    ``nn.Identity`` (a shortcut, not an activation; the registry's ``identity`` is a subclass and counts)."""
    return [
        (n, m) for n, m in model.named_modules() if type(m) is not nn.Identity and activation_bias(m) is not None
    ]


def histogram_median(hist: Tensor) -> float:
    """The median of the values a log10 histogram counts (centre of the bin where the CDF crosses 1/2)."""
    total = hist.sum()
    if total <= 0:
        return 0.0
    k = int(torch.searchsorted(hist.cumsum(0), total / 2).item())
    width = (_LOG_HI - _LOG_LO) / _N_BINS
    return 10 ** (_LOG_LO + (min(k, _N_BINS - 1) + 0.5) * width)


class ActivationStats(Diagnostic):
    """Sparsity, near-zero fraction, maximum and spike ratio of the input of every linear/conv layer, and the
    fraction of negative pre-activations of every activation.

    Args:
        schedule: when to measure (default: at every validation run, on ``eval_batches`` batches; training
            steps in the schedule measure on the training batch).
        eval_batches: validation batches measured per validation run.
        exclude: skip layers (and activations) whose name contains any of these strings.
        near_zero_eps: the threshold of ``near_zero``, the fraction of ``|h| < near_zero_eps``.
        if_unsupported, plot, max_history: see ``Diagnostic``.
    """
    name = "activations"

    def __init__(
        self,
        schedule: Schedule = Schedule(at_fit_start=False, at_validation=True),
        eval_batches: int = 2,
        exclude: list[str] = [],  # noqa: B006 - jsonargparse shows the default in --help
        near_zero_eps: float = 1e-3,
        if_unsupported: Literal["error", "skip"] = "error",
        plot: bool = True,
        max_history: int = 10_000,
    ) -> None:
        super().__init__(schedule, if_unsupported, plot, max_history)
        if not near_zero_eps > 0:
            raise ConfigError(f"near_zero_eps must be positive, got {near_zero_eps}")
        if eval_batches < 0:
            raise ConfigError(f"eval_batches must be >= 0, got {eval_batches}")
        measures_val = schedule.at_validation and eval_batches > 0
        if not (measures_val or schedule.at_fit_start or schedule.every_n_steps or schedule.log_spaced):
            raise ConfigError(
                "ActivationStats would never measure: set eval_batches > 0 with at_validation, or every_n_steps"
            )
        self.eval_batches = eval_batches
        self.exclude = tuple(exclude)
        self.near_zero_eps = near_zero_eps
        self.roles: dict[str, str] = {}
        self._acc: dict[str, list[Any]] = {}
        self._pre: dict[str, list[int]] = {}  # activation name -> [negative count, element count]
        self._handles: list[Any] = []
        self._tracer: InputSourceTracer | None = None

    def unsupported_reason(self, trainer: L.Trainer, pl_module: L.LightningModule) -> str | None:
        if next(weight_layers(pl_module, self.exclude), None) is None:
            return f"ActivationStats found no Linear/Conv layers in {type(pl_module).__name__}"
        return None

    # --- hooks ------------------------------------------------------------------------------------------
    def _attach_hooks(self, model: nn.Module) -> None:
        if not self.roles:
            self._tracer = InputSourceTracer(model, self.exclude).__enter__()
        for name, m in weight_layers(model, self.exclude):
            self._handles.append(m.register_forward_pre_hook(self._hook(name)))
        for name, m in self._activations(model):
            self._handles.append(m.register_forward_pre_hook(self._pre_hook(name)))

    def _activations(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(n, m) for n, m in activation_modules(model) if not any(e in n for e in self.exclude)]

    def _detach_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._tracer is not None:
            self._tracer.__exit__()
            self.roles = {n: self._tracer.roles.get(n, "other") for n in self._acc}
            self._tracer = None

    def _hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if not (args and isinstance(args[0], Tensor)):
                return
            zeros, n, mx, hist = layer_input_stats(args[0])
            near = near_zero_count(args[0], self.near_zero_eps)
            acc = self._acc.get(name)
            if acc is None:
                self._acc[name] = [zeros, n, mx, hist, near]
            else:
                acc[0] += zeros
                acc[1] += n
                acc[2] = max(acc[2], mx)
                acc[3] += hist
                acc[4] += near

        return hook

    def _pre_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if not (args and isinstance(args[0], Tensor)):
                return
            neg, n = negative_count(args[0])
            acc = self._pre.setdefault(name, [0, 0])
            acc[0] += neg
            acc[1] += n

        return hook

    # --- measurement ------------------------------------------------------------------------------------
    def measure(self, trainer: L.Trainer, pl_module: L.LightningModule, moment: Moment) -> dict[str, Any] | None:
        if moment.batch is not None:  # a training batch (the first one at fit start), in eval mode
            was_training = pl_module.training
            pl_module.eval()
            try:
                self._attach_hooks(pl_module)
                with torch.no_grad():
                    forward_on(pl_module, moment.batch)
            finally:
                self._detach_hooks()
                pl_module.train(was_training)
        if not self._acc:
            return None
        names = [n for n, _ in weight_layers(pl_module, self.exclude)]
        counts = torch.zeros(len(names), 2 + _N_BINS, dtype=torch.float64)
        near = torch.zeros(len(names), dtype=torch.float64)
        maxima = torch.zeros(len(names), dtype=torch.float64)
        for i, n in enumerate(names):
            if n in self._acc:
                zeros, total, mx, hist, n_near = self._acc[n]
                counts[i, 0], counts[i, 1], maxima[i], near[i] = zeros, total, mx, n_near
                counts[i, 2:] = hist.cpu()
        acts = self._activations(pl_module)
        act_names = [n for n, _ in acts]
        pre = torch.tensor([self._pre.get(n, [0, 0]) for n in act_names], dtype=torch.float64).reshape(-1, 2)
        positive = [activation_bias(m) is True for _, m in acts]
        self._acc, self._pre = {}, {}
        return {"names": names, "counts": counts, "maxima": maxima, "near": near, "act_names": act_names,
                "act_positive": positive, "pre": pre}

    def reduction(self, key: str) -> Literal["sum", "max", "min"] | None:
        return {"counts": "sum", "maxima": "max", "near": "sum", "pre": "sum"}.get(key)

    def finalize(self, stats: dict[str, Any]) -> dict[str, float]:
        out = self.summarise(stats["names"], stats["counts"].cpu(), stats["maxima"].cpu(), stats["near"].cpu())
        out.update(self.summarise_pre(stats["act_names"], stats["pre"].cpu(), stats["act_positive"]))
        return out

    def summarise(
        self, layer_names: list[str], counts: Tensor, maxima: Tensor, near: Tensor | None = None
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        down_sp, down_mx, down_near = [], [], []
        for i, n in enumerate(layer_names):
            if counts[i, 1] == 0:
                continue
            sparsity = (counts[i, 0] / counts[i, 1]).item()
            mx = maxima[i].item()
            med = histogram_median(counts[i, 2:])
            out[f"{n}/sparsity"] = sparsity
            out[f"{n}/max"] = mx
            out[f"{n}/spike_ratio"] = mx / med if med > 0 else 0.0
            if near is not None:
                out[f"{n}/near_zero"] = (near[i] / counts[i, 1]).item()
            if self.roles.get(n) == "downstream":
                down_sp.append(sparsity)
                down_mx.append(mx)
                if near is not None:
                    down_near.append(out[f"{n}/near_zero"])
        if down_sp:
            out["downstream_sparsity"] = sum(down_sp) / len(down_sp)
            out["downstream_max"] = max(down_mx)
        if down_near:
            out["downstream_near_zero"] = sum(down_near) / len(down_near)
        return out

    @staticmethod
    def summarise_pre(act_names: list[str], pre: Tensor, positive: list[bool]) -> dict[str, float]:
        """``<activation>/pre_negative`` per activation, ``downstream_pre_negative`` (the mean over the positively
        biased ones) and ``symmetric_pre_negative`` (over the symmetric ones)."""
        out: dict[str, float] = {}
        groups: dict[str, list[float]] = {"downstream": [], "symmetric": []}
        for i, n in enumerate(act_names):
            if pre[i, 1] == 0:
                continue
            out[f"{n}/pre_negative"] = (pre[i, 0] / pre[i, 1]).item()
            groups["downstream" if positive[i] else "symmetric"].append(out[f"{n}/pre_negative"])
        for role, vals in groups.items():
            if vals:
                out[f"{role}_pre_negative"] = sum(vals) / len(vals)
        return out

    # --- validation batches -----------------------------------------------------------------------------
    def on_validation_batch_start(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.active and self.schedule.at_validation and batch_idx < self.eval_batches and dataloader_idx == 0:
            self._attach_hooks(pl_module)

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._detach_hooks()

    # --- state and figures ------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"roles": dict(self.roles)}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.roles = dict(state.get("roles", {}))

    def figure(self) -> Any:
        return activation_figure(list(self.history))


def activation_figure(history: list[dict[str, float]]) -> Any:
    """Sparsity heat map (layer x measurement) and max |h| per layer against step."""
    layers = sorted({k.rsplit("/", 1)[0] for h in history for k in h if k.endswith("/sparsity")})
    steps = [h["step"] for h in history]
    grid = [[h.get(f"{n}/sparsity", float("nan")) for h in history] for n in layers]
    fig, axes = new_figure(1, 2, figsize=(12, max(3.0, 0.25 * len(layers) + 1)))
    im = axes[0].imshow(grid, aspect="auto", vmin=0, vmax=1, cmap="viridis")
    axes[0].set_yticks(range(len(layers)), layers, fontsize=6)
    ticks = list(range(0, len(steps), max(1, len(steps) // 8)))
    axes[0].set_xticks(ticks, [int(steps[i]) for i in ticks])
    axes[0].set(xlabel="step", title="input sparsity (exact zeros)")
    fig.colorbar(im, ax=axes[0])
    for n in layers:
        axes[1].plot(steps, [h.get(f"{n}/max", float("nan")) for h in history], label=n, alpha=0.7)
    axes[1].set(xlabel="step", ylabel="max |h|", yscale="log", title="activation spikes")
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    return fig
