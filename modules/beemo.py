"""BeeMO (paper 004-02): a behaviour decoder pretrained on unpaired movements, neural data entering by cross-attention.

Only the abstract is known; the design is the spec's inference (docs/papers/beemo.md):

- behaviour tokens, one per 20 ms bin: ``value(v_t) + time_t + session`` where the bin is visible, ``[MASK] +
  time_t + session`` where it is masked (the masked value never enters: it is zeroed before the projection);
- neural tokens, one per bin: ``sum_u count[t, u] E[session, u] + time_t + session`` (POYO-style unit embeddings);
- ``n_layers`` pre-norm blocks ``x += CausalSelfAttn(LN x)``; ``x += CrossAttn(LN x, LN neural)`` only when
  counts are given (an unpaired batch skips the sublayer); ``x += MLP(LN x)``; a linear read-out of velocity;
- objective: MSE on the masked bins; a training sample masks a fraction ``r ~ U(mask_ratio_range)`` of its bins,
  a paired one all of them with probability ``p_full_mask_paired``; evaluation masks every bin, so ground-truth
  behaviour never enters a test prediction.

``BeeMOTask`` trains in one fit: ``pretrain_steps`` behaviour-only steps on the unpaired stream, then (optimizer
state reset) ``finetune_steps`` paired steps on the target session; ``pretrain_ckpt`` starts from saved weights
and skips the first stage (BVPO's ``init_ckpt`` pattern). ``SingleSessionDecoder`` is the same network without
the first stage. Every test also reports the prior-only control (``test/prior_r2``: all masked, no counts) and a
Wiener filter (``test/wiener_r2``: ridge regression of velocity on the last ``wiener_lags`` bins of counts, fit on
the target session's paired training trials, its penalty chosen on a held-out fifth of them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import Metric

from errors import ConfigError
from modules import protocols
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.attention import MultiHeadCrossAttention
from modules.components.neural_metrics import decoding_r2, lagged_counts, ridge_fit, ridge_predict
from modules.components.tiny_gpt import SelfAttention

WIENER_ALPHAS = (1.0, 10.0, 100.0, 1000.0, 10000.0)


class VarianceWeightedR2(Metric):
    """``decoding_r2`` accumulated over batches: ``1 - SSE / sum_d sum (y_d - mean_d)^2`` over all bins (scikit-learn's
    ``variance_weighted``), from running sums, so the epoch value equals the value on all bins at once."""

    full_state_update = False

    def __init__(self, dim: int = 2) -> None:
        super().__init__()
        self.add_state("sse", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(dim, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total_sq", torch.zeros(dim, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("n", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor) -> None:
        p = pred.reshape(-1, pred.shape[-1]).double()
        y = target.reshape(-1, target.shape[-1]).double()
        self.sse += (p - y).square().sum()
        self.total += y.sum(0)
        self.total_sq += y.square().sum(0)
        self.n += y.shape[0]

    def compute(self) -> Tensor:
        spread = (self.total_sq - self.total.square() / self.n).sum()
        return 1 - self.sse / spread


def sinusoidal_clock(n_bins: int, dim: int) -> Tensor:
    """``(n_bins, dim)`` time codes: ``sin(t w_i)`` and ``cos(t w_i)`` at ``dim // 2`` geometric frequencies (periods
    from 2 to about 4 n_bins bins), so a shift by k bins is the same rotation at every t."""
    half = dim // 2
    periods = 2.0 * (2.0 * n_bins) ** (torch.arange(half, dtype=torch.float64) / max(half - 1, 1))
    angle = torch.arange(n_bins, dtype=torch.float64)[:, None] * (2 * torch.pi / periods)
    out = torch.zeros(n_bins, dim, dtype=torch.float64)
    out[:, 0 : 2 * half : 2], out[:, 1 : 2 * half : 2] = angle.sin(), angle.cos()
    return out.float()


class BeeMOBlock(nn.Module):
    """Pre-norm block: causal self-attention over behaviour tokens, cross-attention to neural tokens (skipped
    without them), MLP. ``forward(x, neural)`` returns ``(x_out, cross-attention residual or None)``."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.ln_self = nn.LayerNorm(d_model)
        self.self_attn = SelfAttention(d_model, n_heads, bias=True, causal=True)
        self.ln_query = nn.LayerNorm(d_model)
        self.ln_neural = nn.LayerNorm(d_model)
        self.cross_attn = MultiHeadCrossAttention(d_model, n_heads)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, mlp_ratio * d_model), nn.GELU(), nn.Linear(mlp_ratio * d_model, d_model))

    def forward(self, x: Tensor, neural: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor]:
        x = x + self.self_attn(self.ln_self(x))
        before = x
        residual = None
        if neural is not None:
            context = self.ln_neural(neural)
            residual = self.cross_attn(self.ln_query(x), context, context)
            x = x + residual
        return x + self.mlp(self.ln_mlp(x)), residual, before


class BeeMO(nn.Module):
    """The BeeMO network (module docstring).

    Args:
        d_model, n_layers, n_heads: token width, blocks, attention heads.
        mask_ratio_range: ``(lo, hi)``: a training sample masks a fraction ``r ~ U(lo, hi)`` of its bins.
        p_full_mask_paired: probability that a paired training sample has every bin masked.
        max_units: units a session may have (rows of its unit-embedding table).
        max_sessions: sessions (ids 0..max_sessions - 1).
        max_bins: bins a window may have (the time embedding).
    """

    def __init__(
        self,
        d_model: int = 64,
        n_layers: int = 4,
        n_heads: int = 4,
        mask_ratio_range: tuple[float, float] = (0.15, 1.0),
        p_full_mask_paired: float = 0.5,
        max_units: int = 256,
        max_sessions: int = 16,
        max_bins: int = 64,
    ) -> None:
        super().__init__()
        lo, hi = mask_ratio_range
        if not 0.0 < lo <= hi <= 1.0:
            raise ConfigError(f"mask_ratio_range must be (lo, hi) with 0 < lo <= hi <= 1, got {mask_ratio_range}")
        if not 0.0 <= p_full_mask_paired <= 1.0:
            raise ConfigError(f"p_full_mask_paired must be in [0, 1], got {p_full_mask_paired}")
        if min(d_model, n_layers, n_heads, max_units, max_sessions, max_bins) < 1:
            raise ConfigError("d_model, n_layers, n_heads, max_units, max_sessions and max_bins must be positive")
        if d_model % n_heads:
            raise ConfigError(f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})")
        self.mask_ratio_range, self.p_full_mask_paired = (lo, hi), p_full_mask_paired
        self.max_units, self.max_sessions, self.max_bins = max_units, max_sessions, max_bins
        self.value = nn.Linear(2, d_model)
        self.mask_token = nn.Parameter(torch.randn(d_model) * 0.02)
        # one fixed sinusoidal clock for both streams: a query reaches the neural bins a fixed lag away by a
        # linear map of its time code (learned absolute embeddings made that lag slow to find)
        self.register_buffer("clock", sinusoidal_clock(max_bins, d_model), persistent=False)
        self.session = nn.Embedding(max_sessions, d_model)
        # zero: a session not seen in pretraining (the target) starts from the pretrained context, not from noise
        nn.init.zeros_(self.session.weight)
        self.unit = nn.Parameter(torch.randn(max_sessions, max_units, d_model) * 0.1)
        self.neural_session = nn.Embedding(max_sessions, d_model)
        self.blocks = nn.ModuleList(BeeMOBlock(d_model, n_heads) for _ in range(n_layers))
        self.ln_out = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 2)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def _check(self, session: Tensor, counts: Tensor | None, behaviour: Tensor | None, mask: Tensor | None) -> int:
        """Validate the inputs; the window length T."""
        if session.dim() != 1 or session.dtype != torch.long:
            raise ConfigError(f"session must be a (B,) long tensor, got {tuple(session.shape)} {session.dtype}")
        if session.numel() and (int(session.max()) >= self.max_sessions or int(session.min()) < 0):
            raise ConfigError(f"session ids must lie in [0, {self.max_sessions}); raise max_sessions")
        b = session.shape[0]
        lengths = []
        if counts is not None:
            if counts.dim() != 3 or counts.shape[0] != b:
                raise ConfigError(f"counts must be (B, T, U) with B = {b}, got {tuple(counts.shape)}")
            if counts.shape[2] > self.max_units:
                raise ConfigError(f"counts has {counts.shape[2]} units, more than max_units={self.max_units}; raise it")
            lengths.append(counts.shape[1])
        if behaviour is not None:
            if behaviour.dim() != 3 or behaviour.shape[0] != b or behaviour.shape[2] != 2:
                raise ConfigError(f"behaviour must be (B, T, 2) with B = {b}, got {tuple(behaviour.shape)}")
            lengths.append(behaviour.shape[1])
        if mask is not None:
            if mask.dim() != 2 or mask.shape[0] != b or mask.dtype != torch.bool:
                raise ConfigError(f"mask must be a (B, T) bool tensor with B = {b}, got {tuple(mask.shape)} {mask.dtype}")
            lengths.append(mask.shape[1])
        if not lengths:
            raise ConfigError("decode needs counts or behaviour (any values, masked) to know the window length")
        if len(set(lengths)) > 1:
            raise ConfigError(f"counts, behaviour and mask disagree on the number of bins: {lengths}")
        if lengths[0] > self.max_bins:
            raise ConfigError(f"{lengths[0]} bins exceed max_bins={self.max_bins}; raise it")
        return lengths[0]

    def neural_tokens(self, session: Tensor, counts: Tensor) -> Tensor:
        """``(B, T, D)``: ``sum_u count[t, u] E[session, u] + time_t + session``."""
        emb = self.unit[session, : counts.shape[2]]  # (B, U, D)
        t = torch.arange(counts.shape[1], device=counts.device)
        return torch.einsum("btu,bud->btd", counts, emb) + self.clock[t] + self.neural_session(session)[:, None]

    def run(self, session: Tensor, counts: Tensor | None, behaviour: Tensor | None = None,
            mask: Tensor | None = None) -> tuple[Tensor, list[tuple[Tensor | None, Tensor]]]:
        """``decode`` plus, per block, ``(cross-attention residual or None, its input)``."""
        t_len = self._check(session, counts, behaviour, mask)
        b = session.shape[0]
        if behaviour is None or mask is None:
            mask = torch.ones(b, t_len, dtype=torch.bool, device=session.device)
            behaviour = None
        t = torch.arange(t_len, device=session.device)
        masked = mask[..., None]
        if behaviour is None:
            x = self.mask_token.expand(b, t_len, -1)
        else:
            # zeroed first, so that a masked value (even NaN) reaches neither the output nor a gradient
            x = torch.where(masked, self.mask_token, self.value(behaviour.masked_fill(masked, 0.0)))
        x = x + self.clock[t] + self.session(session)[:, None]
        neural = None if counts is None else self.neural_tokens(session, counts)
        parts = []
        for block in self.blocks:
            x, residual, before = block(x, neural)
            parts.append((residual, before))
        return self.head(self.ln_out(x)), parts

    def decode(self, session: Tensor, counts: Tensor | None, behaviour: Tensor | None = None,
               mask: Tensor | None = None) -> Tensor:
        """Velocity ``(B, T, 2)`` from ``session (B,)``, ``counts (B, T, U)`` (None: unpaired) and ``behaviour (B, T,
        2)`` visible where ``mask (B, T)`` is False (True = masked; either None: every bin masked)."""
        return self.run(session, counts, behaviour, mask)[0]

    forward = decode

    def draw_mask(self, b: int, t_len: int, paired: bool, generator: torch.Generator | None = None,
                  device: torch.device | None = None) -> Tensor:
        """Training mask ``(b, t_len)``: ratio ``r ~ U(mask_ratio_range)`` per sample, at least one bin masked; a
        paired sample is fully masked with probability ``p_full_mask_paired``."""
        lo, hi = self.mask_ratio_range
        ratio = lo + (hi - lo) * torch.rand(b, 1, generator=generator, device=device)
        mask = torch.rand(b, t_len, generator=generator, device=device) < ratio
        one = torch.randint(t_len, (b,), generator=generator, device=device)
        mask[torch.arange(b, device=device), one] = True
        if paired:
            full = torch.rand(b, generator=generator, device=device) < self.p_full_mask_paired
            mask |= full[:, None]
        return mask


def masked_mse(pred: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Mean squared error over the masked bins and both velocity components."""
    weight = mask[..., None].to(pred.dtype)
    return ((pred - target).square() * weight).sum() / (weight.sum() * pred.shape[-1]).clamp_min(1.0)


def wiener_filter(counts: Tensor, vel: Tensor, lags: int, alphas: tuple[float, ...] = WIENER_ALPHAS
                  ) -> tuple[Tensor, Tensor, float]:
    """A Wiener filter ``v_t = sum_k W_k n_{t-k} + c``: ridge on ``lagged_counts``, penalty picked on the last fifth
    of the trials (fit on the rest), then refit on all. ``(weights, intercept, alpha)``."""
    x, y = lagged_counts(counts.double(), lags), vel.double()
    n = counts.shape[0]
    hold = max(1, n // 5)
    if n - hold < 1:
        raise ConfigError("the Wiener filter needs at least 2 paired training trials")
    best, best_alpha = -float("inf"), alphas[0]
    for alpha in alphas:
        w, c = ridge_fit(x[:-hold].reshape(-1, x.shape[-1]), y[:-hold].reshape(-1, 2), alpha)
        score = float(decoding_r2(ridge_predict(x[-hold:], w, c), y[-hold:]))
        if score > best:
            best, best_alpha = score, alpha
    w, c = ridge_fit(x.reshape(-1, x.shape[-1]), y.reshape(-1, 2), best_alpha)
    return w, c, best_alpha


class BeeMOTask(PaperTask):
    """Behaviour-only pretraining, then paired fine-tuning, of a ``BeeMO`` network (module docstring).

    Args:
        net: the network, ``net() -> BeeMO`` (``class_path: modules.beemo.BeeMO`` with its ``init_args``).
        pretrain_steps: behaviour-only steps on unpaired batches before the paired stage.
        finetune_steps: paired steps on the target session; the fit stops after both stages.
        pretrain_ckpt: weights to start from (a ``.ckpt`` of this task or a ``BeeMO`` state dict); skips the
            behaviour-only stage.
        wiener_lags: bins of counts the Wiener-filter baseline reads at each bin.
        optimizer, lr_scheduler: AdamW at 1e-3 by default; its state is reset when the paired stage starts.
    """

    paper_id = "004-02"
    monitor = "val/r2"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet
    summary_metrics = ("test/r2", "test/prior_r2", "test/wiener_r2")

    def __init__(
        self,
        net: Callable[[], BeeMO] = lambda: BeeMO(),
        pretrain_steps: int = 1000,
        finetune_steps: int = 1000,
        pretrain_ckpt: str | None = None,
        wiener_lags: int = 10,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {"r2": VarianceWeightedR2(), "prior_r2": VarianceWeightedR2(), "wiener_r2": VarianceWeightedR2(),
                   "mse": WeightedMean()}
        super().__init__(optimizer, lr_scheduler, metrics)
        if pretrain_steps < 0 or finetune_steps < 0:
            raise ConfigError(f"pretrain_steps and finetune_steps must be >= 0, got {pretrain_steps}, {finetune_steps}")
        if wiener_lags < 1:
            raise ConfigError(f"wiener_lags must be >= 1, got {wiener_lags}")
        self.net = net()
        if not isinstance(self.net, BeeMO):
            raise ConfigError(f"net must build a modules.beemo.BeeMO, got {type(self.net).__name__}")
        self.pretrain_steps = 0 if pretrain_ckpt is not None else pretrain_steps
        self.finetune_steps, self.wiener_lags = finetune_steps, wiener_lags
        if pretrain_ckpt is not None:
            self._load_net(pretrain_ckpt)
        self.register_buffer("paired_stage", torch.tensor(self.pretrain_steps == 0))
        self.wiener: tuple[Tensor, Tensor] | None = None

    def _load_net(self, path: str) -> None:
        if not Path(path).is_file():
            raise ConfigError(f"pretrain_ckpt {path!r} does not exist; fit with pretrain_steps > 0 first (beemo.md)")
        state = torch.load(path, map_location="cpu", weights_only=False)
        if "state_dict" in state:
            state = {k[4:]: v for k, v in state["state_dict"].items() if k.startswith("net.")}
        self.net.load_state_dict(state)

    # --- training ----------------------------------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        if self.global_step >= self.pretrain_steps + self.finetune_steps:
            self.trainer.should_stop = True  # both stages done: end the fit (-1 alone ends only this epoch)
            return -1
        if not bool(self.paired_stage) and self.global_step >= self.pretrain_steps:
            self.paired_stage.fill_(True)
            for opt in self.trainer.optimizers:  # the paired stage starts from a fresh AdamW state
                opt.state.clear()
        return None

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        if stage == "train":
            return self._train(batch)
        return self._evaluate(batch, stage)

    def _train(self, batch: Any) -> StepOutput:
        u_session, u_vel, p_session, p_counts, p_vel = batch
        paired = bool(self.paired_stage)
        session, counts, vel = (p_session, p_counts, p_vel) if paired else (u_session, None, u_vel)
        mask = self.net.draw_mask(vel.shape[0], vel.shape[1], paired, device=vel.device)
        pred = self.net.decode(session, counts, vel, mask)
        loss = masked_mse(pred, vel, mask)
        return StepOutput(loss, n=vel.shape[0], inputs={"r2": None, "prior_r2": None, "wiener_r2": None,
                                                         "mse": None})

    def _evaluate(self, batch: Any, stage: Stage) -> StepOutput:
        session, counts, vel = batch
        pred = self.net.decode(session, counts)
        prior = self.net.decode(session, None, vel, torch.ones_like(vel[..., 0], dtype=torch.bool))
        mse = (pred - vel).square().mean()
        inputs: dict[str, Any] = {"r2": (pred, vel), "prior_r2": (prior, vel), "mse": (mse, vel.shape[0]),
                                  "wiener_r2": None}
        if stage == "test" and self.wiener is not None:
            w, c = self.wiener
            inputs["wiener_r2"] = (ridge_predict(lagged_counts(counts.double(), self.wiener_lags), w, c), vel)
        return StepOutput(mse, n=vel.shape[0], inputs=inputs)

    def on_test_epoch_start(self) -> None:
        trainer = self.attached_trainer()
        data = None if trainer is None else trainer.datamodule
        if isinstance(data, protocols.ProvidesPairedTrials):
            _, counts, vel = data.paired_training_set()
            w, c, _ = wiener_filter(counts, vel, self.wiener_lags)
            self.wiener = (w.to(self.device), c.to(self.device))

    # --- diagnostics -------------------------------------------------------------------------------------
    @torch.no_grad()
    def cross_attention_share(self, batch: Any) -> Tensor:
        """Per block, ``||cross-attention residual|| / ||its input||`` (Frobenius over the batch), all bins masked,
        on a paired batch (the paired half of a training batch) (``protocols.CrossAttentionShare``)."""
        session, counts, vel = batch[2:] if len(batch) == 5 else batch
        _, parts = self.net.run(session.to(self.device), counts.to(self.device))
        return torch.stack([res.norm() / before.norm().clamp_min(1e-12) for res, before in parts
                            if res is not None])


class SingleSessionDecoder(BeeMOTask):
    """The baseline: the same network trained on the target session's paired trials only (no behaviour-only stage).

    Args:
        net, finetune_steps, wiener_lags, optimizer, lr_scheduler: see ``BeeMOTask``.
    """

    paper_id = "004-02"
    monitor = "val/r2"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: its step has not been checked under torch.func.vmap yet

    def __init__(
        self,
        net: Callable[[], BeeMO] = lambda: BeeMO(),
        finetune_steps: int = 1000,
        wiener_lags: int = 10,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(net, pretrain_steps=0, finetune_steps=finetune_steps, pretrain_ckpt=None,
                         wiener_lags=wiener_lags, optimizer=optimizer, lr_scheduler=lr_scheduler)


# --- analysis over the claim runs: python -m modules.beemo gain_shrink ------------------------------------------
def gain_shrink(rows: list[dict[str, float]]) -> dict[str, float]:
    """Per seed, the gain ``g(n) = R^2(pretrained) - R^2(no pretraining)`` at the smallest and the largest paired
    budget n of ``rows`` (each ``{"seed", "n", "pretrain_steps", "r2"}``), and the shrink ``g(n_min) - g(n_max)``:
    means and 95 % t-intervals over seeds (paired by seed)."""
    from scipy import stats

    budgets = sorted({r["n"] for r in rows})
    if len(budgets) < 2:
        raise ConfigError(f"gain_shrink needs runs at 2 or more paired budgets, got {budgets}")
    lo, hi = budgets[0], budgets[-1]
    table = {(r["seed"], r["n"], r["pretrain_steps"] > 0): r["r2"] for r in rows}
    seeds = sorted({s for s, n, p in table if all((s, b, q) in table for b in (lo, hi) for q in (False, True))})
    if len(seeds) < 2:
        raise ConfigError(f"gain_shrink needs 2 or more seeds with all four arms, got {seeds}")
    gains = {b: np.array([table[(s, b, True)] - table[(s, b, False)] for s in seeds]) for b in (lo, hi)}
    out: dict[str, float] = {"seeds": float(len(seeds)), "n_low": lo, "n_high": hi}
    for name, values in (("gain_low", gains[lo]), ("gain_high", gains[hi]), ("shrink", gains[lo] - gains[hi])):
        half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))
        out.update({name: float(values.mean()), f"{name}_lo": float(values.mean()) - half,
                    f"{name}_hi": float(values.mean()) + half})
    return out


def gain_shrink_analysis(sweep: str = "paired", metric: str = "test/r2", tracking_uri: str | None = None,
                         experiment: str = "beemo") -> dict[str, Any]:
    """Read the FINISHED child runs of sweep ``sweep`` (newest per run name), compute ``gain_shrink`` of ``metric``
    and log it as a run ``gain_shrink <sweep>`` of the experiment (params: the sweep, its parent run, the metric)."""
    import mlflow

    from tracking.analysis_run import analysis_run, finished_sweep_runs, log_metrics
    from tracking.uri import default_tracking_uri

    client = mlflow.MlflowClient(tracking_uri or default_tracking_uri())
    parent_id, children = finished_sweep_runs(client, experiment, sweep)
    rows: dict[str, dict[str, float]] = {}
    for run in children:
        name = run.info.run_name or run.info.run_id
        if metric not in run.data.metrics:
            continue
        p = run.data.params
        rows[name] = {"seed": float(p["seed_everything"]), "n": float(p["data.init_args.n_target_train"]),
                      "pretrain_steps": float(p["model.init_args.pretrain_steps"]), "r2": float(run.data.metrics[metric])}
    result: dict[str, Any] = dict(gain_shrink(list(rows.values())))
    tags = {"analysis": "gain_shrink", "paper": BeeMOTask.paper_id, "method": experiment}
    params = {"sweep": sweep, "sweep_parent": parent_id, "metric": metric}
    with analysis_run(client, experiment, f"gain_shrink {sweep}", tags, params) as run_id:
        log_metrics(client, run_id, {f"gain_shrink/{k}": v for k, v in result.items()})
        client.log_dict(run_id, {"runs": sorted(rows.values(), key=lambda r: (r["n"], r["pretrain_steps"], r["seed"]))},
                        "tables/gain_shrink_runs.json")
    result["run_id"] = run_id
    return result


def main(argv: list[str]) -> int:
    from tracking.analysis_run import sweep_analysis_main

    def describe(r: dict[str, float], sweep: str, metric: str) -> str:
        return (f"{metric} gain of pretraining over {int(r['seeds'])} seeds of sweep {sweep!r}: "
                f"{r['gain_low']:.4g} [{r['gain_low_lo']:.4g}, {r['gain_low_hi']:.4g}] at n = {int(r['n_low'])}, "
                f"{r['gain_high']:.4g} [{r['gain_high_lo']:.4g}, {r['gain_high_hi']:.4g}] at n = {int(r['n_high'])}; "
                f"shrink {r['shrink']:.4g} [{r['shrink_lo']:.4g}, {r['shrink_hi']:.4g}] (95 %); MLflow run {r['run_id']}")

    return sweep_analysis_main(argv, "python -m modules.beemo", "gain_shrink",
                               "the pretraining gain at the smallest minus the largest paired budget",
                               ("paired", "test/r2"), gain_shrink_analysis, describe)



__all__ = ["BeeMO", "BeeMOTask", "SingleSessionDecoder", "VarianceWeightedR2", "masked_mse",
           "gain_shrink", "gain_shrink_analysis", "wiener_filter"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
