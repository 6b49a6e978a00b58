"""FRAC (paper 002-02): a selective SSM whose memory kernel is a power law, built from log-spaced exponential modes.

A Mamba-style selective SSM forgets exponentially: channel ``c`` keeps ``exp(-lambda_c sum_j Delta_j)`` of
what it wrote. FRAC replaces that by the kernel of fractional dynamics of order ``alpha_c``,
``tau^(alpha_c - 1) / Gamma(alpha_c)`` in the selective time ``tau = lambda_c sum_j Delta_j``, written as a
Laplace transform and discretised on ``K`` log-spaced rates ``s_k``::

    h_t[c, n, k] = exp(-Delta_t[c] s_k lambda_c) h_{t-1}[c, n, k] + Delta_t[c] B_t[n] x_t[c]
    y_t[c]       = sum_n C_t[n] sum_k w_k(alpha_c) h_t[c, n, k] + D[c] x_t[c]

with ``w_k(alpha) = frac_kernel_weights(alpha, rates)``: every mode is a diagonal linear recurrence, so
training and prefill use one chunked-parallel scan and decoding keeps ``C N K`` numbers per layer.
``alpha_c = sigmoid(raw_c)`` is learned per channel, the rates are fixed.

- ``FracSSMLM``: token sequences (delayed recall, MQAR, or plain next-token data); accuracy per lag bucket.
- ``FracSSMRegressor``: real-valued series (ARFIMA next-step prediction); MSE and its ratio to the optimal
  linear predictor's.

``kernel="exp"`` is the baseline: one mode of rate 1 (exponential forgetting) with ``d_state * n_modes``
states per channel, so both kernels hold the same number of state floats.

The functional API: ``frac_kernel_weights(alpha (C,), rates (K,)) -> (C, K)`` and
``frac_selective_scan(x, delta, Bm, Cm, rates, weights, lam=None, D=None) -> (B, L, C)`` (both in
``modules.components.ssm``, re-exported here).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import Metric

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.ssm import SelectiveSSMStack, frac_kernel_weights, selective_scan

__all__ = ["FracSSMLM", "FracSSMRegressor", "frac_kernel_weights", "frac_selective_scan", "LagAccuracy"]

#: lag buckets of the recall metrics: ``acc_lag<lo>_<hi>`` counts answers with ``lo <= lag < hi``
LAG_BUCKETS = ((1, 32), (32, 256), (256, 1024))


def frac_selective_scan(
    x: Tensor,
    delta: Tensor,
    Bm: Tensor,
    Cm: Tensor,
    rates: Tensor,
    weights: Tensor,
    lam: Tensor | None = None,
    D: Tensor | None = None,
) -> Tensor:
    """The FRAC scan ``(B, L, C)`` (module docstring), chunked-parallel, in the input's dtype.

    Args:
        x: inputs ``(B, L, C)``; delta: ``Delta >= 0 (B, L, C)``; Bm, Cm: ``(B, L, N)``; rates: ``s (K,) > 0``;
        weights: ``w (C, K)``; lam: ``lambda (C,) > 0`` (default 1); D: skip ``(C,)`` (default 0).
    """
    return selective_scan(x, delta, Bm, Cm, rates, weights, lam, D)


class LagAccuracy(Metric):
    """Accuracy over the answers whose lag lies in ``[lo, hi)`` (``hi = None``: no upper bound; the top
    bucket of ``LAG_BUCKETS`` is open too, so that no lag is dropped)."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, lo: int = 0, hi: int | None = None) -> None:
        super().__init__()
        self.lo, self.hi = lo, hi
        self.add_state("correct", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, lags: Tensor) -> None:
        keep = lags >= self.lo
        if self.hi is not None:
            keep &= lags < self.hi
        self.correct += (preds[keep] == target[keep]).sum()
        self.total += keep.sum()

    def compute(self) -> Tensor:
        return self.correct.float() / self.total.clamp_min(1)


class _FracSSMTask(PaperTask, abstract=True):
    """The SSM backbone and what both tasks share (arguments: see ``FracSSMLM``)."""

    paper_id = "002-02"

    def _build_backbone(self, d_model: int, n_layers: int, d_state: int, n_modes: int, s_min: float,
                        s_max: float, alpha_init: float, kernel: str, expand: int, d_conv: int, dt_min: float,
                        dt_max: float, lam_init: tuple[float, float], chunk_size: int) -> None:
        if kernel == "exp":  # equal state: K modes of N states become one mode of N K states
            d_state, n_modes = d_state * n_modes, 1
        elif n_modes < 2:
            raise ConfigError(f"kernel='frac' needs n_modes >= 2 (a quadrature in log s), got {n_modes}")
        self.d_model = d_model
        self.backbone = SelectiveSSMStack(
            d_model, n_layers, d_state=d_state, kernel=kernel, n_modes=n_modes, s_min=s_min, s_max=s_max,
            alpha_init=alpha_init, expand=expand, d_conv=d_conv, dt_min=dt_min, dt_max=dt_max,
            lam_init=tuple(lam_init), chunk_size=chunk_size,
        )

    def embed(self, inputs: Tensor) -> Tensor:
        raise NotImplementedError

    def memory_kernels(self, batch: Any) -> list[Tensor]:
        """``modules.protocols.MemoryKernels``: per layer, the log of every channel's realised memory kernel
        ``(C, L - 1)`` at lags ``1 .. L - 1`` under the ``Delta`` the layer computes on the batch (an impulse
        at the first position; ``SelectiveSSMBlock.log_memory_kernel``)."""
        was = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self.backbone.log_memory_kernels(self.embed(batch[0]))
        finally:
            self.train(was)

    def alphas(self) -> list[Tensor]:
        """``alpha_c`` of every layer (empty for the exponential kernel)."""
        return [a.detach() for b in self.backbone.blocks if (a := b.alpha()) is not None]

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {}
        if stage == "train" and self.alphas():
            out["train/alpha_mean"] = torch.cat(self.alphas()).mean()
        return out


class FracSSMLM(_FracSSMTask):
    """FRAC (or its exponential baseline) on token sequences.

    Batches ``(tokens (B, L), targets (B, L), lags (B, L))`` (``datamodules.long_memory``; targets -100 where
    no answer is due) or plain next-token ``(x (B, L), y (B, L))``. Loss: cross-entropy over the answered
    positions. Logs ``acc`` and, for recall batches, ``acc_lag1_32``, ``acc_lag32_256`` and
    ``acc_lag256_1024`` (answers with lag in [1, 32), [32, 256), >= 256).

    Args:
        d_model: residual width.
        n_layers: blocks (pre-norm ``h + Block(RMSNorm(h))``).
        d_state: N, states per channel and mode.
        n_modes: K, log-spaced rates in ``[s_min, s_max]`` (FRAC).
        s_min, s_max: the rate grid; the kernel is a power law for ``1/s_max << tau << 1/s_min``.
        alpha_init: initial fractional order of every channel, in (0, 1).
        kernel: ``frac`` or ``exp`` (the Mamba-style baseline: one mode, ``d_state * n_modes`` states).
        expand: inner channels ``C = expand * d_model``.
        d_conv: causal depthwise convolution width.
        dt_min, dt_max: initial ``Delta`` log-uniform in this range.
        lam_init: initial ``lambda_c`` log-uniform in this range (the same for both kernels).
        chunk_size: the scan's longest chunk.
        vocab_size: token vocabulary (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask`` (default AdamW, lr 1e-3).
    """

    monitor = "val/acc"
    monitor_mode = "max"

    def __init__(
        self,
        d_model: int = 128,
        n_layers: int = 4,
        d_state: int = 16,
        n_modes: int = 8,
        s_min: float = 1e-4,
        s_max: float = 1.0,
        alpha_init: float = 0.5,
        kernel: Literal["frac", "exp"] = "frac",
        expand: int = 2,
        d_conv: int = 4,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        lam_init: tuple[float, float] = (1.0, 16.0),
        chunk_size: int = 64,
        vocab_size: int = 64,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {"acc": LagAccuracy()}
        for lo, hi in LAG_BUCKETS:
            metrics[f"acc_lag{lo}_{hi}"] = LagAccuracy(lo, hi if hi != LAG_BUCKETS[-1][1] else None)
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        if vocab_size < 2:
            raise ConfigError(f"vocab_size must be >= 2, got {vocab_size}")
        self.vocab_size = vocab_size
        self._build_backbone(d_model, n_layers, d_state, n_modes, s_min, s_max, alpha_init, kernel, expand,
                             d_conv, dt_min, dt_max, lam_init, chunk_size)
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)

    def embed(self, tokens: Tensor) -> Tensor:
        tokens = tokens.long()
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ConfigError(f"tokens must lie in [0, {self.vocab_size}), got [{int(tokens.min())}, "
                              f"{int(tokens.max())}]: vocab_size does not match the data")
        return self.embedding(tokens)

    def head(self, h: Tensor) -> Tensor:
        return h @ self.embedding.weight.T  # tied embedding

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits ``(B, L, V)``."""
        return self.head(self.backbone(self.embed(tokens)))

    @torch.no_grad()
    def decode_logits(self, tokens: Tensor, prefix: int = 0) -> Tensor:
        """Logits ``(B, L, V)`` with the first ``prefix`` tokens prefilled by the parallel scan and the rest
        decoded one token at a time with the bounded recurrent state (equal to ``forward`` up to rounding)."""
        tokens = tokens.long()
        b, n_len = tokens.shape
        out = []
        if prefix > 0:
            h, states = self.backbone.prefill(self.embed(tokens[:, :prefix]))
            out.append(self.head(h))
        else:
            states = self.backbone.init_states(b, self.embedding.weight.dtype)
        for t in range(prefix, n_len):
            h_t, states = self.backbone.step(self.embed(tokens[:, t]), states)
            out.append(self.head(h_t)[:, None])
        return torch.cat(out, 1)

    def step(self, batch: tuple[Tensor, ...], stage: Stage) -> StepOutput:
        if len(batch) == 3:
            tokens, targets, lags = batch
        elif len(batch) == 2:
            (tokens, targets), lags = batch, None
        else:
            raise ConfigError(f"FracSSMLM takes (tokens, targets[, lags]) batches, got {len(batch)} tensors")
        targets = targets.long()
        h = self.backbone(self.embed(tokens))
        mask = targets != -100
        logits = self.head(h[mask])  # only where an answer is due
        y = targets[mask]
        loss = F.cross_entropy(logits, y)
        preds = logits.argmax(-1)
        lag = lags[mask].long() if lags is not None else None
        inputs: dict[str, Any] = {"acc": (preds, y, torch.zeros_like(y) if lag is None else lag)}
        for lo, hi in LAG_BUCKETS:
            inputs[f"acc_lag{lo}_{hi}"] = (preds, y, lag) if lag is not None else None
        return StepOutput(loss, n=int(y.numel()), inputs=inputs)


class FracSSMRegressor(_FracSSMTask):
    """FRAC (or its exponential baseline) for next-step prediction of real series (ARFIMA).

    Batches ``(x (B, L, 1), y (B, L)[, y_opt (B, L)])``: ``y_t`` is the value after ``x_t``; ``y_opt`` an
    optimal predictor's forecast. Loss: MSE over all positions. Logs ``mse``, ``mse_opt`` (the optimal
    predictor's MSE on the same batches) and ``mse_ratio = mse / mse_opt`` when ``y_opt`` is given.

    Args: as ``FracSSMLM`` (``input_shape`` is linked from the DataModule: ``(L, features)``).
    """

    monitor = "val/mse"
    monitor_mode = "min"

    def __init__(
        self,
        d_model: int = 128,
        n_layers: int = 4,
        d_state: int = 16,
        n_modes: int = 8,
        s_min: float = 1e-4,
        s_max: float = 1.0,
        alpha_init: float = 0.5,
        kernel: Literal["frac", "exp"] = "frac",
        expand: int = 2,
        d_conv: int = 4,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        lam_init: tuple[float, float] = (1.0, 16.0),
        chunk_size: int = 64,
        input_shape: tuple[int, ...] = (1100, 1),
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__(optimizer, lr_scheduler, metrics={"mse": WeightedMean(), "mse_opt": WeightedMean()})
        if len(input_shape) != 2:
            raise ConfigError(f"FracSSMRegressor needs series of shape (L, features), got input_shape {input_shape}")
        self.n_features = int(input_shape[-1])
        self._build_backbone(d_model, n_layers, d_state, n_modes, s_min, s_max, alpha_init, kernel, expand,
                             d_conv, dt_min, dt_max, lam_init, chunk_size)
        self.inp = nn.Linear(self.n_features, d_model)
        self.out = nn.Linear(d_model, 1)

    def embed(self, x: Tensor) -> Tensor:
        if x.dim() != 3 or x.shape[-1] != self.n_features:
            raise ConfigError(f"series must be (B, L, {self.n_features}), got {tuple(x.shape)}")
        return self.inp(x.float())

    def forward(self, x: Tensor) -> Tensor:
        """Predictions ``(B, L)`` of the next value."""
        return self.out(self.backbone(self.embed(x)))[..., 0]

    def step(self, batch: tuple[Tensor, ...], stage: Stage) -> StepOutput:
        x, y = batch[0], batch[1]
        pred = self(x)
        loss = F.mse_loss(pred, y)
        n = int(y.numel())
        inputs: dict[str, Any] = {"mse": (loss.detach(), n), "mse_opt": None}
        if len(batch) > 2:
            inputs["mse_opt"] = (F.mse_loss(batch[2], y), n)
        return StepOutput(loss, n=n, inputs=inputs)

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        out = super().extra_epoch_metrics(stage, values)
        if f"{stage}/mse_opt" in values:
            out[f"{stage}/mse_ratio"] = values[f"{stage}/mse"] / values[f"{stage}/mse_opt"]
        return out
