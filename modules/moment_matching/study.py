"""``MomentPropagationStudy``: how far each propagation method's Gaussian is from the Monte Carlo one (paper 002-06).

Nothing trains: every batch is a set of input laws ``N(mu, s^2 R R^T / d)`` (``datamodules/gaussian_inputs.py``);
each law goes through each of ``n_nets`` random residual nets, by Monte Carlo (``mc_samples`` draws, the ground
truth) and by every method, and the study records ``KL(N_MC || N_method)``. ``fit`` measures the training split,
``test`` the test split. At each epoch end it logs, per method and input scale s:

- ``<stage>/kl/<method>/s_<s>``: the geometric mean of the KL over laws and nets (KLs span decades);
- ``<stage>/kl_ratio/<method>/s_<s>`` and ``kl_ratio_min/...``: the geometric mean and the minimum over laws and
  nets of ``KL(method) / KL(exact)`` (the paired ratio the claim is about);
- ``<stage>/kl_slope/<method>``: the least-squares slope of log KL against log s over the scales where the
  method's KL is at least ``10 x`` the Monte Carlo floor (and ``kl_slope_points/<method>``: how many);
- ``<stage>/kl_floor``: ``d (d + 3) / (4 N)``, the KL a Gaussian fitted to N draws of a Gaussian has on average.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput
from modules.components.gaussian import gaussian_kl, kl_floor
from modules.moment_matching.functional import Activation
from modules.moment_matching.nets import METHODS, Method, ResidualNet, mc_moments, propagate

SLOPE_FLOOR_FACTOR = 10.0


class MomentPropagationStudy(PaperTask):
    """KL of each method's propagated Gaussian to the Monte Carlo Gaussian (module docstring).

    Args:
        depth: blocks per net.
        hidden: width inside a block (default: the input width d).
        activation: probit, heaviside, gelu, relu or sine.
        residual: residual blocks ``y = x + B phi(C x + d)`` (True) or plain ``y = B phi(C x + d)``.
        n_nets: random nets, seeds ``net_seed .. net_seed + n_nets - 1``; every law goes through each.
        net_seed: the first net's seed (None: the run's seed).
        bias_scale: standard deviation of the block biases.
        methods: the methods compared (exact is always computed: the ratios are to it).
        mc_samples: Monte Carlo draws per law and net.
        mc_chunk: draws pushed through a net at once (memory).
        input_shape: linked from the DataModule (the input width d).
    """

    paper_id = "002-06"
    monitor = "train/loss"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it optimises manually (automatic_optimization = False)
    summary_metrics = ("test/kl/exact/s_0.1", "test/kl/linearize/s_0.1", "test/kl/diag/s_0.1")

    def __init__(
        self,
        depth: int = 4,
        hidden: int | None = None,
        activation: Activation = "gelu",
        residual: bool = True,
        n_nets: int = 5,
        net_seed: int | None = None,
        bias_scale: float = 0.0,
        methods: Sequence[Method] = METHODS,
        mc_samples: int = 400_000,
        mc_chunk: int = 50_000,
        input_shape: tuple[int, ...] = (32,),
    ) -> None:
        super().__init__()
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        if n_nets < 1 or mc_samples < 2 or mc_chunk < 1:
            raise ConfigError(f"need n_nets >= 1, mc_samples >= 2, mc_chunk >= 1; got {n_nets}, {mc_samples}, {mc_chunk}")
        if len(input_shape) != 1:
            raise ConfigError(f"the study takes flat input laws (d,), got input shape {tuple(input_shape)}")
        self.automatic_optimization = False
        self.methods: tuple[str, ...] = ("exact", *(m for m in methods if m != "exact"))
        self.mc_samples, self.mc_chunk = mc_samples, mc_chunk
        self.dim = int(input_shape[0])
        seed0 = self.seed_or_run(net_seed)
        self.nets = torch.nn.ModuleList(
            ResidualNet(self.dim, depth, hidden, activation, residual, seed0 + i, bias_scale) for i in range(n_nets)
        )
        self.records: dict[str, list[dict[str, Any]]] = {s: [] for s in ("train", "val", "test")}
        self._gen: dict[str, torch.Generator] = {}

    # --- the measurement ------------------------------------------------------------------------------------------
    def _generator(self, stage: str) -> torch.Generator:
        if stage not in self._gen:
            self._gen[stage] = torch.Generator().manual_seed(self.run_seed * 7919 + ("train", "val", "test").index(stage))
        return self._gen[stage]

    def measure(self, mean: Tensor, cov: Tensor, net: ResidualNet, generator: torch.Generator) -> dict[str, Tensor]:
        """``{method: KL(N_MC || N_method) (B,)}`` for a batch of laws through one net."""
        mean, cov = mean.double().cpu(), cov.double().cpu()
        preds = {m: propagate(net, mean, cov, m) for m in self.methods}  # type: ignore[arg-type]
        mc = mc_moments(net, mean, cov, self.mc_samples, generator, shift=preds["exact"][0], chunk=self.mc_chunk)
        return {m: gaussian_kl(*mc, *p) for m, p in preds.items()}

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        mean, cov, scale = batch
        gen = self._generator(stage)
        exact = []
        with torch.no_grad():
            for i, net in enumerate(self.nets):
                kls = self.measure(mean, cov, net.cpu(), gen)
                exact.append(kls["exact"])
                for row in range(mean.shape[0]):
                    self.records[stage].append(
                        {"scale": float(scale[row]), "net": i, **{m: float(v[row]) for m, v in kls.items()}}
                    )
        loss = torch.stack(exact).mean()
        return StepOutput(loss, n=mean.shape[0] * len(self.nets))

    def predictive_moments(self, batch: Any, method: str) -> tuple[Tensor, Tensor]:
        """``modules.protocols.PredictiveMoments``: the output law of the first net on a batch of input laws, by
        ``method`` or by Monte Carlo (``"mc"``)."""
        mean, cov = batch[0].double().cpu(), batch[1].double().cpu()
        if method == "mc":
            gen = torch.Generator().manual_seed(self.run_seed)
            return mc_moments(self.nets[0], mean, cov, self.mc_samples, gen, chunk=self.mc_chunk)
        return propagate(self.nets[0], mean, cov, method)  # type: ignore[arg-type]

    # --- epoch summaries --------------------------------------------------------------------------------------------
    def summarise(self, records: list[dict[str, Any]], stage: str) -> dict[str, float]:
        out: dict[str, float] = {}
        floor = kl_floor(self.dim, self.mc_samples)
        out[f"{stage}/kl_floor"] = floor
        scales = sorted({r["scale"] for r in records})
        for method in self.methods:
            geo = []
            for s in scales:
                rows = [r for r in records if r["scale"] == s]
                kl = np.array([r[method] for r in rows])
                g = float(np.exp(np.log(kl).mean())) if np.all(np.isfinite(kl)) and np.all(kl > 0) else math.inf
                geo.append(g)
                out[f"{stage}/kl/{method}/s_{s:g}"] = g
                if method != "exact":
                    ratio = kl / np.array([r["exact"] for r in rows])
                    out[f"{stage}/kl_ratio/{method}/s_{s:g}"] = float(np.exp(np.log(ratio).mean()))
                    out[f"{stage}/kl_ratio_min/{method}/s_{s:g}"] = float(ratio.min())
            usable = [(s, g) for s, g in zip(scales, geo, strict=True) if math.isfinite(g) and g >= SLOPE_FLOOR_FACTOR * floor]
            out[f"{stage}/kl_slope_points/{method}"] = float(len(usable))
            if len(usable) >= 2:
                xs, ys = np.log([u[0] for u in usable]), np.log([u[1] for u in usable])
                out[f"{stage}/kl_slope/{method}"] = float(np.polyfit(xs, ys, 1)[0])
        return out

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        records, self.records[stage] = self.records[stage], []
        if not records:
            return {}
        return {k: torch.tensor(v) for k, v in self.summarise(records, stage).items()}

    def table_rows(self, stage: str = "test") -> list[dict[str, Any]]:
        return list(self.records[stage])

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self._run_step(batch, "train").loss  # manual optimisation: nothing to step

    def configure_optimizers(self) -> Any:
        return None  # parameter-free: the nets' weights are buffers


__all__ = ["MomentPropagationStudy"]
