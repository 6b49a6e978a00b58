"""LMC-DM (paper 004-03): learn function-preserving transforms of two GPTs so that their linear path is flat.

``LMCEndpoint`` trains one endpoint (a ``TinyGPT(norm="rmsnorm", tie_weights=False)`` with a ReLU MLP on
characters). ``DualLMCAligner`` holds two fixed endpoints theta_A, theta_B and trains only transforms
T_phi (``symmetries``): minimise over phi

    E_{alpha ~ U[0, 1]} E_batch L((1 - alpha) T_A(theta_A) + alpha T_B(theta_B))      (``alpha_samples`` draws)

with ``mode``: ``naive`` (no transform at all: the raw weights), ``weight_matching`` (T_A = fold, T_B =
``weight_matching``: Procrustes rotation + Hungarian permutations; nothing trained), ``one_sided`` (T_A =
fold, T_B learned) and ``dual`` (both learned). Learned transforms start from weight matching (``init``).
Rotations are R0 exp(S - S^T); permutations are Sinkhorn-relaxed (temperature ``sinkhorn_tau``) while
training and hardened by the Hungarian algorithm for every evaluation; the QK/VO maps start at the identity.

Evaluation (val, test) uses the hardened transforms: the loss at 11 alphas 0, 0.1, ..., 1
(``<stage>/loss_at_<k>``, k = 10 alpha) and ``<stage>/barrier`` = max_alpha L(alpha) - chord. With
``ckpt_a``/``ckpt_b`` None one fit first trains both endpoints for ``endpoint_steps`` steps (A on the even
rows of each batch, B on the odd rows, from different initialisations), then aligns; the sweeps point the
two arguments at saved endpoints instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torch.func import functional_call

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.interpolation import interpolate, loss_barrier
from modules.components.lm_task import CausalLMTask, load_lm
from modules.components.supervised import NetFactory
from modules.components.tiny_gpt import TinyGPT
from modules.lmc_dual_merge.symmetries import apply_transforms, fold_norms, weight_matching
from tracking.figures import log_figure, new_figure

Mode = Literal["naive", "weight_matching", "one_sided", "dual"]
Symmetry = Literal["norm_absorb", "resid_rot", "head_perm", "head_qk", "head_vo", "ffn_perm"]
ALL_SYMMETRIES: list[str] = list(get_args(Symmetry))
EVAL_ALPHAS = [k / 10 for k in range(11)]


def endpoint_net(shape: tuple[int, ...], vocab: int) -> TinyGPT:
    """The paper's tiny endpoint: 2 layers, 4 heads, width 64, ReLU MLP, RMSNorm, untied head."""
    return TinyGPT(shape, vocab, n_layer=2, n_head=4, n_embd=64, activation="relu", norm="rmsnorm", tie_weights=False)


def architecture(net: nn.Module) -> dict[str, Any]:
    """The fields that make two TinyGPTs interpolable (compared field by field between the endpoints)."""
    if not isinstance(net, TinyGPT):
        raise ConfigError(f"LMC-DM aligns TinyGPT endpoints, got {type(net).__name__}")
    block = net.blocks[0]
    return {
        "vocab_size": net.vocab_size,
        "block_size": net.block_size,
        "n_layer": len(net.blocks),
        "n_head": block.attn.n_head,
        "n_embd": net.tok_emb.embedding_dim,
        "mlp_ratio": block.mlp.fc.out_features // net.tok_emb.embedding_dim,
        "activation": type(block.mlp.act).__name__,
        "norm": "rmsnorm" if isinstance(block.ln_1, nn.RMSNorm) else "layernorm",
        "tie_weights": net.head.weight is net.tok_emb.weight,
        "bias": block.attn.qkv.bias is not None,
    }


def check_endpoints(net_a: nn.Module, net_b: nn.Module) -> None:
    """Refuse endpoints that differ (naming the field) or that the transforms are not exact for."""
    arch_a, arch_b = architecture(net_a), architecture(net_b)
    for key, value in arch_a.items():
        if arch_b[key] != value:
            raise ConfigError(
                f"the endpoints differ in {key}: {value!r} (ckpt_a) vs {arch_b[key]!r} (ckpt_b); "
                "train both from one endpoint config"
            )
    if arch_a["norm"] != "rmsnorm":
        raise ConfigError(
            "the endpoints use norm='layernorm': residual rotations are exact only with RMSNorm; "
            "train them with --model.net.init_args.norm rmsnorm"
        )
    if arch_a["tie_weights"]:
        raise ConfigError(
            "the endpoints tie the head to the token embedding: train them with --model.net.init_args.tie_weights false"
        )


def sinkhorn(logits: Tensor, tau: float, iters: int = 20) -> Tensor:
    """A doubly stochastic relaxation of a permutation: Sinkhorn normalisation of exp(logits / tau) (log space)."""
    z = logits / tau
    for _ in range(iters):
        z = z - z.logsumexp(-1, keepdim=True)
        z = z - z.logsumexp(-2, keepdim=True)
    return z.exp()


def harden(logits: Tensor) -> Tensor:
    """The permutation matrix nearest to ``logits`` (Hungarian algorithm on each (n, n) slice)."""
    from scipy.optimize import linear_sum_assignment

    flat = logits.detach().reshape(-1, *logits.shape[-2:]).double().cpu().numpy()
    out = torch.zeros(flat.shape, dtype=logits.dtype)
    for i, m in enumerate(flat):
        rows, cols = linear_sum_assignment(m, maximize=True)
        out[i, torch.as_tensor(rows), torch.as_tensor(cols)] = 1
    return out.reshape(logits.shape).to(logits.device)


class EndpointTransform(nn.Module):
    """phi of one endpoint: the parameters of its function-preserving transform.

    Rotation R = R0 exp(S - S^T) (R0 from the initialisation, S trained from 0); head and FFN permutations
    as logits (one-hot at the initial permutation), Sinkhorn-relaxed while training, hardened to permutation
    matrices otherwise; QK/VO maps as matrices from the identity.
    """
    def __init__(self, n_layer: int, n_head: int, d: int, ffn: int, symmetries: list[str], tau: float) -> None:
        super().__init__()
        self.symmetries, self.n_head, self.tau = list(symmetries), n_head, tau
        dh = d // n_head
        if "resid_rot" in symmetries:
            self.skew = nn.Parameter(torch.zeros(d, d))
            self.register_buffer("rot0", torch.eye(d))
        if "head_perm" in symmetries:
            self.head_logits = nn.Parameter(torch.eye(n_head).repeat(n_layer, 1, 1))
        if "ffn_perm" in symmetries:
            self.ffn_logits = nn.Parameter(torch.eye(ffn).repeat(n_layer, 1, 1))
        if "head_qk" in symmetries:
            self.qk = nn.Parameter(torch.eye(dh).repeat(n_layer, n_head, 1, 1))
        if "head_vo" in symmetries:
            self.vo = nn.Parameter(torch.eye(dh).repeat(n_layer, n_head, 1, 1))

    @torch.no_grad()
    def initialise(self, start: dict[str, Any] | None) -> None:
        """Back to the identity, or to ``start`` (``weight_matching``'s rotation and permutations)."""
        for p in self.parameters():
            if p.dim() >= 2:
                p.copy_(torch.eye(p.shape[-1], dtype=p.dtype).expand_as(p))
        if "resid_rot" in self.symmetries:
            self.skew.zero_()
            self.rot0.copy_(start["rotation"] if start else torch.eye(self.rot0.shape[0]))
        for name, key in (("head_logits", "head_perm"), ("ffn_logits", "ffn_perm")):
            if key in self.symmetries and start:
                logits = getattr(self, name)
                for l, perm in enumerate(start[key]):
                    logits[l].zero_()
                    logits[l, torch.arange(len(perm)), perm] = 1.0

    def maps(self, hard: bool) -> dict[str, Any]:
        """``apply_transforms`` keyword arguments: relaxed (training) or hardened (exactly function-preserving)."""
        out: dict[str, Any] = {}
        if "resid_rot" in self.symmetries:
            skew = self.skew.double()
            out["rotation"] = self.rot0.double() @ torch.linalg.matrix_exp(skew - skew.T)
        for name, key in (("head_logits", "head_perm"), ("ffn_logits", "ffn_perm")):
            if key in self.symmetries:
                logits = getattr(self, name)
                out[key] = list(harden(logits) if hard else sinkhorn(logits, self.tau))
        if "head_qk" in self.symmetries:
            out["qk_maps"] = list(self.qk)
        if "head_vo" in self.symmetries:
            out["vo_maps"] = list(self.vo)
        return out

    def apply(self, sd: dict[str, Tensor], hard: bool) -> dict[str, Tensor]:
        dtype = next(iter(sd.values())).dtype
        maps = {
            k: v.to(dtype) if isinstance(v, Tensor) else [m.to(dtype) for m in v] for k, v in self.maps(hard).items()
        }
        return apply_transforms(sd, self.n_head, fold="norm_absorb" in self.symmetries, **maps)


def load_endpoint(path: str) -> TinyGPT:
    """A saved endpoint (an ``LMCEndpoint`` checkpoint) as its ``TinyGPT``."""
    if not Path(path).is_file():
        raise ConfigError(
            f"endpoint checkpoint {path!r} does not exist; train it with python main.py fit "
            "--config configs/lmc_dual_merge/endpoint.yaml (see docs/papers/lmc_dual_merge.md)"
        )
    return load_lm(path)


class LMCEndpoint(CausalLMTask):
    """One endpoint of LMC-DM: next-character training of a ``TinyGPT`` (``net``; see ``CausalLMTask``)."""
    paper_id = "004-03"
    monitor = "val/loss"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: NetFactory = endpoint_net,
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 128,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, input_shape, num_classes, optimizer, lr_scheduler)


class DualLMCAligner(PaperTask):
    """Transforms of two fixed endpoints trained on the interpolation loss (module docstring).

    Args:
        ckpt_a, ckpt_b: the endpoints' checkpoints (``LMCEndpoint`` fits; ``{seed}`` in a path is replaced by the
            run's seed); None: train both here first.
        mode: ``naive``, ``weight_matching``, ``one_sided`` (only T_B learned) or ``dual`` (T_A and T_B).
        symmetries: the transform families (``norm_absorb`` needed by ``resid_rot``, ``head_qk``, ``head_vo``).
        init: where learned transforms start: ``weight_matching`` (B's; A at the identity) or ``identity``.
        alpha_samples: alphas drawn per step for the path loss.
        sinkhorn_tau: temperature of the relaxed permutations.
        sinkhorn_iters: Sinkhorn normalisation rounds.
        net: the endpoints' architecture when ``ckpt_a``/``ckpt_b`` are None (saved endpoints bring their own).
        endpoint_steps: training steps of the endpoints when ``ckpt_a``/``ckpt_b`` are None.
        endpoint_lr: their AdamW learning rate.
        input_shape, num_classes: linked from the DataModule (context, vocabulary).
        optimizer, lr_scheduler: for phi (Adam, lr 1e-3 by default).
    """
    paper_id = "004-03"
    monitor = "val/barrier"
    monitor_mode = "min"
    vectorizable = False  # --run.seeds: it optimises manually (automatic_optimization = False)
    summary_metrics = ("val/barrier", "val/loss_at_05")

    def __init__(
        self,
        ckpt_a: str | None = None,
        ckpt_b: str | None = None,
        mode: Mode = "dual",
        symmetries: list[Symmetry] | None = None,
        init: Literal["weight_matching", "identity"] = "weight_matching",
        alpha_samples: int = 4,
        sinkhorn_tau: float = 0.1,
        sinkhorn_iters: int = 20,
        net: NetFactory = endpoint_net,
        endpoint_steps: int = 600,
        endpoint_lr: float = 3e-3,
        input_shape: tuple[int, ...] = (64,),
        num_classes: int = 128,
        optimizer: OptimizerCallable = lambda p: torch.optim.Adam(p, lr=1e-3),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {f"loss_at_{k:02d}": WeightedMean() for k in range(len(EVAL_ALPHAS))}
        metrics.update({"endpoint_loss": WeightedMean(), "path_loss": WeightedMean()})
        super().__init__(optimizer, lr_scheduler, metrics)
        symmetries = list(ALL_SYMMETRIES if symmetries is None else symmetries)
        unknown = [s for s in symmetries if s not in ALL_SYMMETRIES]
        if unknown:
            raise ConfigError(f"unknown symmetries {unknown}; choose from {ALL_SYMMETRIES}")
        needs_fold = [s for s in ("resid_rot", "head_qk", "head_vo") if s in symmetries]
        if needs_fold and "norm_absorb" not in symmetries:
            raise ConfigError(f"{needs_fold[0]} is exact only with unit norm gains: add norm_absorb to symmetries")
        if (ckpt_a is None) != (ckpt_b is None):
            raise ConfigError("give both ckpt_a and ckpt_b, or neither (then both endpoints are trained first)")
        if alpha_samples < 1 or sinkhorn_tau <= 0 or sinkhorn_iters < 1 or endpoint_steps < 0:
            raise ConfigError("need alpha_samples >= 1, sinkhorn_tau > 0, sinkhorn_iters >= 1, endpoint_steps >= 0")
        self.automatic_optimization = False
        self.mode, self.symmetries, self.init = mode, symmetries, init
        self.alpha_samples, self.sinkhorn_iters = alpha_samples, sinkhorn_iters
        self.endpoint_lr = endpoint_lr
        shape = tuple(input_shape)
        if ckpt_a is not None and ckpt_b is not None:
            # "{seed}" in a path is the run's seed: one sweep aligns a different endpoint pair per seed
            ckpt_a, ckpt_b = (c.replace("{seed}", str(self.run_seed)) for c in (ckpt_a, ckpt_b))
            self.net_a, self.net_b = load_endpoint(ckpt_a).train(), load_endpoint(ckpt_b).train()
            self.net_a.requires_grad_(False)
            self.net_b.requires_grad_(False)
        else:
            self.net_a, self.net_b = net(shape, num_classes), net(shape, num_classes)
        check_endpoints(self.net_a, self.net_b)
        arch = architecture(self.net_a)
        if arch["vocab_size"] != num_classes or arch["block_size"] < shape[0]:
            raise ConfigError(
                f"the endpoints (vocab_size {arch['vocab_size']}, block_size {arch['block_size']}) do not fit the "
                f"data (vocabulary {num_classes}, context {shape[0]}): align endpoints trained on this data"
            )
        self.endpoint_steps = 0 if ckpt_a is not None else endpoint_steps
        self.n_head = arch["n_head"]
        dims = (arch["n_layer"], arch["n_head"], arch["n_embd"], arch["n_embd"] * arch["mlp_ratio"])
        self.phi_a = EndpointTransform(*dims, symmetries, sinkhorn_tau)
        self.phi_b = EndpointTransform(*dims, symmetries, sinkhorn_tau)
        self.register_buffer("phi_ready", torch.tensor(False))
        self.curves: dict[str, list[float]] = {}
        self._path: list[dict[str, Tensor]] | None = None
        if self.endpoint_steps == 0:
            self.initialise_transforms()

    # --- the transforms ---------------------------------------------------------------------------------------
    def endpoint_state(self, net: nn.Module) -> dict[str, Tensor]:
        return {k: v.detach() for k, v in net.state_dict().items()}

    @torch.no_grad()
    def initialise_transforms(self) -> None:
        """phi_A at the identity; phi_B at weight matching (``init``) or the identity."""
        start = None
        if self.init == "weight_matching" or self.mode == "weight_matching":
            start = weight_matching(self.endpoint_state(self.net_a), self.endpoint_state(self.net_b), self.n_head)
        self.phi_a.initialise(None)
        self.phi_b.initialise(start)
        self.phi_ready.fill_(True)

    def transformed(self, hard: bool) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """T_A(theta_A), T_B(theta_B) for the mode. ``hard``: hardened permutations, computed in float64 and
        cast back, so that the evaluated networks are the endpoints' functions to float32 rounding."""
        sd_a, sd_b = self.endpoint_state(self.net_a), self.endpoint_state(self.net_b)
        if self.mode == "naive":
            return sd_a, sd_b
        dtype = sd_a["tok_emb.weight"].dtype
        if hard:
            sd_a, sd_b = ({k: v.double() for k, v in sd.items()} for sd in (sd_a, sd_b))
        fold = "norm_absorb" in self.symmetries
        ta = self.phi_a.apply(sd_a, hard) if self.mode == "dual" else (fold_norms(sd_a) if fold else sd_a)
        tb = self.phi_b.apply(sd_b, hard)
        if hard:
            ta, tb = ({k: v.to(dtype) for k, v in t.items()} for t in (ta, tb))
        return ta, tb

    def path_logits(self, ta: dict[str, Tensor], tb: dict[str, Tensor], alpha: float | Tensor, x: Tensor) -> Tensor:
        return functional_call(self.net_a, interpolate(ta, tb, alpha), (x,))

    def function_preservation(self, batch: Any) -> float:
        """``modules.protocols.FunctionPreservation``: max |f_T(theta)(x) - f_theta(x)| over both endpoints, with
        the hardened transforms the evaluation uses."""
        x = batch[0]
        with torch.no_grad():
            ta, tb = self.transformed(hard=True)
            diffs = [
                (functional_call(net, t, (x,)) - net(x)).abs().max() for net, t in ((self.net_a, ta), (self.net_b, tb))
            ]
        return float(torch.stack(diffs).max())

    # --- steps ------------------------------------------------------------------------------------------------
    @property
    def in_endpoint_stage(self) -> bool:
        return self.global_step < self.endpoint_steps

    def step(self, batch: tuple[Tensor, Tensor], stage: Stage) -> StepOutput:
        x, y = batch
        if stage == "train":
            return self.endpoint_step(x, y) if self.in_endpoint_stage else self.align_step(x, y)
        if self._path is None:
            self._path = self.eval_path()
        losses = [
            F.cross_entropy(functional_call(self.net_a, sd, (x,)).flatten(0, 1), y.flatten()) for sd in self._path
        ]
        n = y.numel()
        inputs = {f"loss_at_{k:02d}": (loss, n) for k, loss in enumerate(losses)}
        return StepOutput(torch.stack(losses).mean(), n=n, inputs={**inputs, "endpoint_loss": None, "path_loss": None})

    def _only(self, name: str, value: Tensor, n: int) -> dict[str, Any]:
        none = {k: None for k in self._metric_names}
        return {**none, name: (value.detach(), n)}

    def endpoint_step(self, x: Tensor, y: Tensor) -> StepOutput:
        """One AdamW step of each endpoint: A on the even rows, B on the odd rows (different data orders)."""
        if x.shape[0] < 2:
            raise ConfigError("endpoint training splits every batch between the two endpoints: batch_size >= 2")
        opt_end, _ = self.optimizers()
        losses = [
            F.cross_entropy(net(x[i::2]).flatten(0, 1), y[i::2].flatten())
            for i, net in enumerate((self.net_a, self.net_b))
        ]
        loss = losses[0] + losses[1]
        opt_end.zero_grad()
        self.manual_backward(loss)
        opt_end.step()
        return StepOutput(loss.detach() / 2, n=y.numel(), inputs=self._only("endpoint_loss", loss / 2, y.numel()))

    def align_step(self, x: Tensor, y: Tensor) -> StepOutput:
        """One step on the path loss, averaged over ``alpha_samples`` alphas ~ U[0, 1]."""
        if not bool(self.phi_ready):
            self.initialise_transforms()
        _, opt_phi = self.optimizers()
        learned = self.mode in ("one_sided", "dual")
        # naive and weight_matching train nothing: one alpha keeps train/path_loss comparable at a quarter the cost
        alphas = torch.rand(self.alpha_samples if learned else 1, device=x.device)
        with torch.set_grad_enabled(learned):
            ta, tb = self.transformed(hard=not learned)
            loss = torch.stack(
                [F.cross_entropy(self.path_logits(ta, tb, a, x).flatten(0, 1), y.flatten()) for a in alphas]
            ).mean()
        opt_phi.zero_grad()
        if learned:
            self.manual_backward(loss)
        opt_phi.step()  # naive and weight_matching: no gradients, nothing moves (the step keeps the count)
        return StepOutput(loss.detach(), n=y.numel(), inputs=self._only("path_loss", loss, y.numel()))

    # --- evaluation along the path ------------------------------------------------------------------------------
    @torch.no_grad()
    def eval_path(self) -> list[dict[str, Tensor]]:
        """The hardened path's state dicts at ``EVAL_ALPHAS``."""
        ta, tb = self.transformed(hard=True)
        return [interpolate(ta, tb, a) for a in EVAL_ALPHAS]

    def on_validation_epoch_start(self) -> None:
        self._path = None

    def on_test_epoch_start(self) -> None:
        self._path = None

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        keys = [f"{stage}/loss_at_{k:02d}" for k in range(len(EVAL_ALPHAS))]
        if stage == "train" or not all(k in values for k in keys):
            return {}
        curve = [float(values[k]) for k in keys]
        self.curves[stage] = curve
        return {f"{stage}/barrier": torch.tensor(loss_barrier(EVAL_ALPHAS, curve))}

    def configure_optimizers(self) -> Any:
        endpoints = torch.optim.AdamW(
            [*self.net_a.parameters(), *self.net_b.parameters()], lr=self.endpoint_lr, weight_decay=0.0
        )
        phi = self.optimizer_factory([*self.phi_a.parameters(), *self.phi_b.parameters()])
        return [endpoints, phi]

    # --- figure -----------------------------------------------------------------------------------------------
    def curve_figure(self) -> Any | None:
        if not self.curves:
            return None
        fig, ax = new_figure(figsize=(5, 3.5))
        for stage, curve in self.curves.items():
            ax.plot(EVAL_ALPHAS, curve, marker="o", label=f"{stage} (barrier {loss_barrier(EVAL_ALPHAS, curve):.3g})")
            ax.plot([0, 1], [curve[0], curve[-1]], ls="--", color="grey", lw=0.8)
        ax.set(xlabel="alpha", ylabel="loss (nats / char)", title=f"LMC-DM path, mode={self.mode}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        return fig

    def on_fit_end(self) -> None:
        fig = self.curve_figure()
        if fig is not None:
            log_figure(self.trainer, fig, "figures/barrier_curve.png")

    def on_test_end(self) -> None:
        fig = self.curve_figure()
        if fig is not None:
            log_figure(self.trainer, fig, "figures/barrier_curve_test.png")


__all__ = [
    "DualLMCAligner",
    "EndpointTransform",
    "LMCEndpoint",
    "architecture",
    "check_endpoints",
    "harden",
    "load_endpoint",
    "sinkhorn",
]
