"""``HyperINRTask``: trains a hypernetwork of paper 004-01 to reconstruct images through the INR it generates.

The hypernetwork is a task network (``docs/design.md``): the task builds it as ``net(input_shape, out_dim)``
with one image's ``(C, H, W)`` linked from the DataModule and ``out_dim = C`` (the INR renders the image it
read), so a config names the class and its other arguments only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from errors import ConfigError
from modules.attn_hyper_inr.attn_opt import AttnOptHyperINR
from modules.attn_hyper_inr.functional import mean_colour_psnr, mlp_opt_parameter_count, psnr, step_weights
from modules.attn_hyper_inr.hyper_inr_net import HyperINRNet
from modules.attn_hyper_inr.mlp_opt import MLPOptStepBaseline
from modules.attn_hyper_inr.trans_inr import TransINRBaseline
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.metrics import count_parameters

PAPER_ID = "004-01"
#: builds a hypernetwork from one image's shape ``(C, H, W)`` and the INR's outputs
HyperINRFactory = Callable[[tuple[int, ...], int], HyperINRNet]
NET_CLASSES = {"AttnOptHyperINR": AttnOptHyperINR, "TransINRBaseline": TransINRBaseline,
               "MLPOptStepBaseline": MLPOptStepBaseline}


class HyperINRTask(PaperTask):
    """Trains a hypernetwork ``net`` (a ``HyperINRNet``) to reconstruct images through the INR it generates.

    Loss: ``sum_k w_k MSE(f_{theta_k}, image)`` over the rollout steps k = 1..K (rising weights ``linear``
    by default; a single-pass net has K = 1). Metrics: ``psnr`` (the last step's per-image PSNR, averaged
    over images; the checkpoint monitor), ``mse``, ``psnr_step<k>`` for k = 1..K and, in validation and
    test, ``psnr_mean_colour``: the PSNR of each image rendered as its own mean colour (the per-channel mean
    over its pixels), the floor a reconstruction must clear to show any structure, and
    ``psnr_over_mean_colour`` = ``psnr - psnr_mean_colour`` (both averaged over the same images).

    Args:
        net: the hypernetwork, ``net(input_shape, out_dim) -> HyperINRNet`` (``class_path`` of
            ``AttnOptHyperINR``, ``TransINRBaseline`` or ``MLPOptStepBaseline`` with its ``init_args``, without
            the two sizes; default ``AttnOptHyperINR`` at its defaults). Built with ``out_dim = C``.
        step_loss_weights: ``linear`` (w_k proportional to k), ``uniform`` or ``last``.
        input_shape: one image's ``(C, H, W)`` (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask``; the scheduler steps once per optimiser step.
    """

    paper_id = PAPER_ID
    monitor = "val/psnr"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet
    scheduler_interval = "step"

    def __init__(
        self,
        net: HyperINRFactory = lambda shape, out_dim: AttnOptHyperINR(shape, out_dim),
        step_loss_weights: Literal["linear", "uniform", "last"] = "linear",
        input_shape: tuple[int, ...] = (3, 32, 32),
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        shape = tuple(int(s) for s in input_shape)
        if len(shape) != 3:
            raise ConfigError(f"input_shape must be (C, H, W), got {shape}")
        built = net(shape, shape[0])
        if not isinstance(built, HyperINRNet):
            raise ConfigError(f"net must build one of {sorted(NET_CLASSES)} (modules.attn_hyper_inr), got "
                              f"{type(built).__name__}")
        # a factory that ignores the sizes it is given (a lambda around a built net) could mismatch the data
        if shape[0] != built.in_channels or shape[0] != built.out_dim:
            raise ConfigError(f"channel mismatch: the data has {shape[0]} channels, the net has in_channels="
                              f"{built.in_channels}, out_dim={built.out_dim}: build it with net(input_shape, out_dim)")
        if shape[1] != built.image_size or shape[2] != built.image_size:
            raise ConfigError(f"the data's images are {shape[1]} x {shape[2]}, the net has image_size={built.image_size}: "
                              "build it with net(input_shape, out_dim)")
        k = built.rollout_steps
        metrics = {"psnr": WeightedMean(), "mse": WeightedMean(), "psnr_mean_colour": WeightedMean(),
                   **{f"psnr_step{i}": WeightedMean() for i in range(1, k + 1)}}
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        self.net = built
        self.input_shape = shape
        self.register_buffer("loss_weights", step_weights(step_loss_weights, k), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def rollout_psnr(self, batch: Any) -> Tensor:
        """``modules.protocols.HasRolloutPSNR``: per-image PSNR ``(B, K + 1)`` of the weights before any step
        (column 0; NaN for a single-pass net, which has none) and after each rollout step k = 1..K."""
        images = batch[0] if isinstance(batch, list | tuple) else batch
        with torch.no_grad():
            target = self.net.pixels(images)
            if self.net.has_initial_weights:
                thetas = self.net.rollout(images, include_initial=True)
                return torch.stack([psnr(self.net.render(t), target) for t in thetas], 1)
            values = [psnr(self.net.render(t), target) for t in self.net.rollout(images)]
            return torch.stack([torch.full_like(values[0], float("nan")), *values], 1)

    def param_scaling(self, widths: Sequence[int]) -> dict[str, list[int]]:
        """``modules.protocols.ProvidesParameterScaling``: trainable counts of the three hypernetworks when the INR's
        hidden widths are all W, for each W, with this net's image shape, other INR settings, d_model (and depth,
        for a Trans-INR net); the others at their defaults; MLPOptStepBaseline counted without building it."""
        net = self.net
        depth = len(net.inr_widths)
        sizes = (net.input_shape, net.out_dim)
        common = {"fourier_dim": net.fourier_dim, "fourier_scale": net.fourier_scale, "patch_size": net.patch_size}
        attn = {} if net.d_model is None else {"d_model": net.d_model}
        trans = {**attn, "depth": net.depth} if isinstance(net, TransINRBaseline) else attn
        out: dict[str, list[int]] = {"AttnOptHyperINR": [], "TransINRBaseline": [], "MLPOptStepBaseline": []}
        for w in widths:
            hidden = [int(w)] * depth
            out["AttnOptHyperINR"].append(count_parameters(AttnOptHyperINR(*sizes, hidden, **common, **attn)))
            out["TransINRBaseline"].append(count_parameters(TransINRBaseline(*sizes, hidden, **common, **trans)))
            out["MLPOptStepBaseline"].append(mlp_opt_parameter_count(hidden, net.fourier_dim, net.out_dim))
        return out

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        images = batch[0] if isinstance(batch, list | tuple) else batch
        target = self.net.pixels(images)
        preds = [self.net.render(t) for t in self.net.rollout(images)]
        mses = torch.stack([(p - target).square().mean() for p in preds])
        loss = (self.loss_weights.to(mses.dtype) * mses).sum()
        n = images.shape[0]
        ones = torch.ones(n, device=images.device)
        # training logs the last step only; evaluation every step k
        logged = preds if stage != "train" else preds[-1:]
        per_step = [psnr(p.detach(), target) for p in logged]
        inputs: dict[str, Any] = {"psnr": (per_step[-1], ones), "mse": (mses[-1].detach(), n)}
        if stage != "train":
            inputs.update({f"psnr_step{i}": (p, ones) for i, p in enumerate(per_step, start=1)})
            inputs["psnr_mean_colour"] = (mean_colour_psnr(target), ones)
        return StepOutput(loss, n=n, inputs=inputs)

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        psnr_key, floor_key = f"{stage}/psnr", f"{stage}/psnr_mean_colour"
        if psnr_key in values and floor_key in values:
            # the margin over the floor as a metric of its own, so that compare gives it an interval per seed
            out[f"{stage}/psnr_over_mean_colour"] = values[psnr_key] - values[floor_key]
        if stage == "test":
            out["test/n_params"] = torch.tensor(float(count_parameters(self.net)))
        return out


__all__ = ["PAPER_ID", "HyperINRFactory", "HyperINRTask"]
