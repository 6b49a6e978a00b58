"""Paper 002-05 (FLIP): fast, tight upper bounds on the l2 Lipschitz constant of feedforward nets.

The bounds live in ``modules.components.lipschitz`` (shared with the ``LipschitzBound`` diagnostic): the product of
spectral norms, ECLipsE-Fast, the best one-multiplier-per-layer LipSDP bound (``flip_bound``: the problem FLIP's
layer-wise secant sweeps approximate, solved here to a certified gap), LipSDP-Neuron through cvxpy
(``lipsdp_bound``) and a Jacobian lower bound. Two tasks use them:

- ``LipschitzProbeMLP``: an MLP trained on digits, its bounds followed during training by ``LipschitzBound``;
- ``RandomNetLipschitzStudy``: random Gaussian nets (weights ``N(0, 1/fan_in)``) of every depth x width x seed,
  no parameters and no optimizer: ``fit`` measures on the training split, ``test`` on the test split (only the
  lower bound, the largest Jacobian norm at the split's points, depends on the data).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput
from modules.components.activations import activation_spec
from modules.components.lipschitz import (
    LipschitzCertificate,
    check_slopes,
    eclipse_fast_bound,
    flip_bound,
    jacobian_lower_bound,
    lipsdp_bound,
    net_weights,
    trivial_bound,
)
from modules.components.mlp import MLP
from modules.components.mlp_analysis import activation_name, affine_layers, random_mlp
from modules.components.supervised import NetFactory, SupervisedTask

__all__ = ["LipschitzProbeMLP", "RandomNetLipschitzStudy", "lipsdp_bound", "flip_bound", "LipschitzCertificate"]


class LipschitzProbeMLP(SupervisedTask):
    """A ReLU (or tanh) MLP trained with cross-entropy whose Lipschitz bounds ``LipschitzBound`` logs; it offers
    ``affine_layers()`` (protocol ``modules.protocols.AffineLayers``). Args: see ``SupervisedTask``; ``net`` must
    build a ``modules.components.mlp.MLP`` with an activation whose slopes lie in [0, 1]."""

    paper_id = "002-05"
    monitor = "val/acc"
    monitor_mode = "max"
    vectorizable = True  # SupervisedTask's pure step; its bounds are a callback's, read after training

    def __init__(
        self,
        net: NetFactory = lambda shape, n: MLP(shape, n, hidden=[128, 128, 128], activation="relu"),
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 10,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=1e-4),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, "ce", input_shape, num_classes, optimizer, lr_scheduler)
        if not isinstance(self.net, MLP):
            raise ConfigError("LipschitzProbeMLP needs model.net.class_path: modules.components.mlp.MLP")
        name = activation_name(self.net)
        check_slopes(name, activation_spec(name).slope_bounds)

    def affine_layers(self) -> list[tuple[Tensor, Tensor]]:
        """``[(W_i, b_i)]`` input to output, detached, in float64."""
        return [(w.detach().double(), b.detach().double()) for w, b in affine_layers(self.net)]


def _ordered(values: Sequence[float], rel: float = 1e-7) -> bool:
    return all(a <= b * (1 + rel) for a, b in zip(values, values[1:]))


class RandomNetLipschitzStudy(PaperTask):
    """Bounds of random nets ``d -> width x (depth - 1) -> out_dim`` (``depth`` weight matrices, ``d`` the data's
    dimension), weights ``N(0, 1/fan_in)`` drawn from each seed.

    Per ``<stage>`` and size ``d<depth>_w<width>`` (means over seeds unless said): ``flip``, ``eclipse_fast``,
    ``trivial``, ``lower``, ``lipsdp`` (when ``lipsdp_max_neurons`` allows), ``flip_over_eclipse_max`` (the worst
    seed), ``trivial_over_flip_min``, ``trivial_over_lower``, ``flip_over_lower``, ``seconds_flip_max``,
    ``seconds_eclipse_max``, ``seconds_lipsdp_max``, ``seconds_flip_over_eclipse_max`` (the worst seed's ratio of
    the two wall times); and over all nets ``ordering_violations`` (nets where
    lower <= LipSDP <= FLIP <= ECLipsE-Fast <= trivial fails) and ``flip_gap_max`` (the certified gap).

    Args:
        depths, widths, seeds: the grid of nets.
        out_dim: outputs of every net.
        activation: ``relu`` or ``tanh`` (slopes in [0, 1]).
        lower_steps: steps of the lower bound's search along top singular vectors.
        lipsdp_max_neurons: run LipSDP-Neuron (cvxpy + SCS) on nets with at most this many hidden neurons (0: never).
        input_shape: linked from the DataModule (``gaussian_inputs``).
    """

    paper_id = "002-05"
    monitor = "val/ordering_violations"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it optimises manually (automatic_optimization = False)

    def __init__(
        self,
        depths: Sequence[int] = (2, 4, 8),
        widths: Sequence[int] = (64, 256),
        seeds: Sequence[int] = (0, 1, 2, 3, 4),
        out_dim: int = 1,
        activation: str = "relu",
        lower_steps: int = 3,
        lipsdp_max_neurons: int = 0,
        input_shape: tuple[int, ...] = (64,),
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        if not depths or not widths or not seeds or min(depths) < 1 or min(widths) < 1 or out_dim < 1:
            raise ConfigError(f"need depths >= 1, widths >= 1, out_dim >= 1 and seeds, got {depths}, {widths}, {seeds}")
        check_slopes(activation, activation_spec(activation).slope_bounds)
        if len(input_shape) != 1:
            raise ConfigError(f"RandomNetLipschitzStudy needs flat inputs (d,), got {tuple(input_shape)}")
        self.grid = [(int(d), int(w), int(s)) for d in depths for w in widths for s in seeds]
        self.out_dim, self.activation, self.lower_steps = out_dim, activation, lower_steps
        self.lipsdp_max_neurons = lipsdp_max_neurons
        self.in_dim = int(input_shape[0])
        self._upper: dict[tuple[int, int, int], dict[str, float]] = {}
        self._lower: dict[tuple[int, int, int], float] = {}

    def net(self, depth: int, width: int, seed: int) -> MLP:
        # built outside inference mode (Lightning's test loop), so that the lower bound can differentiate it
        with torch.inference_mode(False):
            return random_mlp([self.in_dim] + [width] * (depth - 1) + [self.out_dim], self.activation, seed=seed)

    def configure_optimizers(self) -> Any:
        return None  # nothing is trained: the study measures fixed random nets

    def upper_bounds(self, key: tuple[int, int, int]) -> dict[str, float]:
        """The net's data-free bounds and their wall times, computed once."""
        if key not in self._upper:
            ws = net_weights(self.net(*key))
            flip, ecl = flip_bound(ws), eclipse_fast_bound(ws)
            out = {"flip": flip.bound, "eclipse_fast": ecl.bound, "trivial": trivial_bound(ws),
                   "seconds_flip": flip.seconds, "seconds_eclipse": ecl.seconds, "flip_gap": flip.gap}
            if 0 < sum(w.shape[0] for w in ws[:-1]) <= self.lipsdp_max_neurons:
                sdp = lipsdp_bound(ws)
                out.update(lipsdp=sdp.bound, seconds_lipsdp=sdp.seconds)
            self._upper[key] = out
        return self._upper[key]

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        with torch.inference_mode(False):
            x = batch[0].clone()
        for key in self.grid:
            low = jacobian_lower_bound(self.net(*key), x.reshape(len(x), -1), n_steps=self.lower_steps)
            self._lower[key] = max(self._lower.get(key, 0.0), low)
        return StepOutput(torch.zeros((), dtype=torch.float64), n=len(x))

    def training_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
        self._run_step(batch, "train")

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if not self._lower:
            return {}
        out: dict[str, float] = {}
        violations, gap = 0, 0.0
        sizes = sorted({(d, w) for d, w, _ in self.grid})
        for d, w in sizes:
            rows = []
            for key in [k for k in self.grid if k[:2] == (d, w)]:
                r = dict(self.upper_bounds(key), lower=self._lower[key])
                chain = [r["lower"]] + ([r["lipsdp"]] if "lipsdp" in r else []) + [r["flip"], r["eclipse_fast"], r["trivial"]]
                violations += not _ordered(chain)
                gap = max(gap, r["flip_gap"])
                rows.append(r)
            tag = f"{stage}/d{d}_w{w}"
            for name in ("flip", "eclipse_fast", "trivial", "lower", "lipsdp"):
                if all(name in r for r in rows):
                    out[f"{tag}/{name}"] = sum(r[name] for r in rows) / len(rows)
            out[f"{tag}/flip_over_eclipse_max"] = max(r["flip"] / r["eclipse_fast"] for r in rows)
            out[f"{tag}/trivial_over_flip_min"] = min(r["trivial"] / r["flip"] for r in rows)
            out[f"{tag}/trivial_over_lower"] = sum(r["trivial"] / r["lower"] for r in rows) / len(rows)
            out[f"{tag}/flip_over_lower"] = sum(r["flip"] / r["lower"] for r in rows) / len(rows)
            for name in ("seconds_flip", "seconds_eclipse", "seconds_lipsdp"):
                if all(name in r for r in rows):
                    out[f"{tag}/{name}_max"] = max(r[name] for r in rows)
            # both timed in this process on the same net: a machine-load-robust measure of the solver's cost
            out[f"{tag}/seconds_flip_over_eclipse_max"] = max(r["seconds_flip"] / r["seconds_eclipse"] for r in rows)
        out[f"{stage}/ordering_violations"] = float(violations)
        out[f"{stage}/flip_gap_max"] = gap
        self._lower = {}
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in out.items()}
