"""What diagnostics may ask of a module: capabilities as runtime-checkable protocols.

A diagnostic names the protocols it needs (``Diagnostic.requires``); at ``setup`` it checks the module with
``isinstance`` and, when a method is missing, fails with one line that names the method to implement. A
diagnostic never imports a method: this file is the whole interface between them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class SpikeTimes(Protocol):
    """Spiking networks: ``[(t_pre (B, N_in), t_post (B, N_out)), ...]`` per layer on a batch, ``inf`` = no spike.

    Layer ``l``'s inputs are layer ``l - 1``'s outputs, optionally followed by extra (bias) inputs.
    """

    def spike_times(self, batch: Any) -> list[tuple[Tensor, Tensor]]: ...


@runtime_checkable
class ProvidesPlaneGrid(Protocol):
    """DataModules of points in a plane (Yin-Yang): a grid of the plane inside the data's support, for piece
    maps: its points ``(G, 2)``, their encoded inputs ``(G, N_in)`` and their classes ``(G,)``."""

    def plane_grid(self, resolution: int = 200) -> tuple[Tensor, Tensor, Tensor]: ...


@runtime_checkable
class ActivationPatterns(Protocol):
    """Piecewise-linear networks: one boolean activation pattern ``(B, width)`` per layer on a batch."""

    def activation_patterns(self, batch: Any) -> list[Tensor]: ...


@runtime_checkable
class PerSampleLoss(Protocol):
    """``(B,)`` losses, one per sample alone, whose mean is the training loss."""

    def per_sample_loss(self, batch: Any) -> Tensor: ...


@runtime_checkable
class DiagnosticForward(Protocol):
    """The module's forward pass on a whole batch (whatever its structure), for activation hooks."""

    def diagnostic_forward(self, batch: Any) -> Any: ...


@runtime_checkable
class MemoryKernels(Protocol):
    """Recurrent sequence models: per layer, the log of each channel's realised memory kernel ``(C, L - 1)`` at lags ``1 .. L - 1`` on a batch.

    The kernel is what the layer's state keeps of an impulse at the first position after ``t`` steps of the
    batch's own inputs (for a selective SSM: the decay part, under the input-dependent step sizes).
    """

    def memory_kernels(self, batch: Any) -> list[Tensor]: ...


@runtime_checkable
class ProvidesErrorLadder(Protocol):
    """Compression ladders: true errors, bounds and predictions of every fitted level on a batch of signals.

    Returns ``{"levels", "true" (S, n), "calib" (S,), "d", "bound", "pred_self", "pred_calib" (S, n - 1),
    "summary" {name: value}, "maps" {"true", "pred"} (n - 1, H, W)}`` (``d`` onward only when n >= 2).
    """

    def error_ladder(self, batch: Any) -> dict[str, Any]: ...


class ClientRound(NamedTuple):
    """One federated round as the server saw it (flat parameter vectors of length P).

    Args:
        round: the optimiser step this round produced (1 for the first round).
        updates: ``(m, P)`` the participating clients' updates ``g_i = theta - theta_i``.
        weights: ``(m,)`` their aggregation weights (summing to 1).
        aggregate: ``(P,)`` the aggregated direction ``g``.
        step: ``(P,)`` the server's actual move ``theta_t - theta_{t+1}`` (``eta_s g``, or with momentum).
        groups: ``(name, start, stop)`` of each layer group's coordinates in the flat vectors.
    """

    round: int
    updates: Tensor
    weights: Tensor
    aggregate: Tensor
    step: Tensor
    groups: list[tuple[str, int, int]]


@runtime_checkable
class ClientUpdates(Protocol):
    """Federated methods: the last round's client updates and aggregate (a ``ClientRound``; None before one)."""

    def client_round(self, batch: Any = None) -> ClientRound | None: ...


def method_of(protocol: type) -> str:
    """The method a protocol asks for, with its signature as written in the protocol."""
    names = [n for n in vars(protocol) if not n.startswith("_")]
    return f"{names[0]}(batch)" if names else protocol.__name__


@runtime_checkable
class SimulatedClockSource(Protocol):
    """Simulated distributed training: ``{"seconds": t, ...}`` now (optionally ``coords_up``, ``coords_down``,
    ``grad_norm_sq``, ``target``), implemented by a module or by its strategy."""

    def sim_clock(self) -> dict[str, float]: ...


@runtime_checkable
class HasRolloutPSNR(Protocol):
    """Iterative hypernetworks: per-signal PSNR ``(B, K)`` (or ``(B, K + 1)`` with the step-0 weights first)
    of the weights after each rollout step on a batch."""

    def rollout_psnr(self, batch: Any) -> Tensor: ...


@runtime_checkable
class ProvidesParameterScaling(Protocol):
    """Hypernetworks: ``{model name: [trainable parameters at each target width W]}`` for the given widths
    (counting only)."""

    def param_scaling(self, widths: Any) -> dict[str, list[int]]: ...


@runtime_checkable
class ProvidesProblem(Protocol):
    """DataModules of the simulated distributed methods: the optimisation problem for ``n_workers`` workers
    (``datamodules.dist_problems.DistributedProblem``), built when the task knows its number of workers."""

    def build_problem(self, n_workers: int) -> Any: ...


@runtime_checkable
class FunctionPreservation(Protocol):
    """Methods that transform a network's weights: max |f_T(theta)(x) - f_theta(x)| over the batch's outputs
    (0 for an exactly function-preserving transform, up to rounding)."""

    def function_preservation(self, batch: Any) -> float: ...


@runtime_checkable
class ProvidesTokenBytes(Protocol):
    """Token data (``datamodules.bpe_text``): the byte string of every id of each tokenizer, in the batch's order."""

    def token_bytes(self) -> list[list[bytes]]: ...


@runtime_checkable
class AlignedChunks(Protocol):
    """Cross-tokenizer distillation: on a batch, ``{"chunk_lengths": (n,) bytes between consecutive offsets
    where both tokenizations start a token, "boundary_mass_teacher" / "boundary_mass_student": (m,) the
    token-ending mass fraction at each inside-token byte}``."""

    def aligned_chunks(self, batch: Any) -> dict[str, Tensor]: ...


@runtime_checkable
class TokenBudget(Protocol):
    """Data-constrained scaling runs: ``{"n_params": N (non-embedding), "unique": U (distinct training tokens),
    "seen": D (training tokens processed so far)}``, on this rank."""

    def token_budget(self) -> dict[str, int]: ...


@runtime_checkable
class AffineLayers(Protocol):
    """Feedforward nets analysed layer by layer (paper 002-05): ``[(W_i, b_i)]`` input to output, ``W_i`` in
    ``nn.Linear``'s layout ``(n_{i+1}, n_i)``, with activations whose slopes lie in [0, 1] between them."""

    def affine_layers(self) -> list[tuple[Tensor, Tensor]]: ...


@runtime_checkable
class LaplaceEvidenceSource(Protocol):
    """EB-Laplace on a ReLU net (paper 004-10): on a batch (the training set), ``{"<arm>/log_evidence": log Z at
    delta*, "<arm>/log_delta": log delta*}`` for standard EB (arm ``standard``) and each gamma-canonical arm."""

    def laplace_evidence(self, batch: Any) -> dict[str, float]: ...


@runtime_checkable
class PredictiveMoments(Protocol):
    """Gaussian moment propagation: the output law ``(mean (B, K), cov (B, K, K))`` on a batch by ``method`` (the
    module's propagation methods, e.g. ``exact``, ``diag``), or its Monte Carlo reference for ``method = "mc"``."""

    def predictive_moments(self, batch: Any, method: str) -> tuple[Tensor, Tensor]: ...


@runtime_checkable
class CertificateReport(Protocol):
    """Certificate searches (004-14 MonoBarrier): the state after the last verification, ``{"certified" (0/1),
    "violations" (failed exact checks), "cells" (partition size), "queries" (simulator queries so far), ...}``."""

    def certificate_report(self) -> dict[str, float]: ...


@runtime_checkable
class MemoryUsage(Protocol):
    """Multi-timescale memories (004-05 ELM-Net): on a batch, ``(tau_m (N, d_m), mean |m| (N, d_m))``: each memory
    unit's time constant and its mean absolute value over the batch's samples and steps."""

    def memory_usage(self, batch: Any) -> tuple[Tensor, Tensor]: ...


@runtime_checkable
class CrossAttentionShare(Protocol):
    """Decoders whose neural data enter through cross-attention (004-02 BeeMO): on a batch, per block, the norm of
    the cross-attention residual relative to the norm of the block's input to that sublayer, ``(n_layers,)``."""

    def cross_attention_share(self, batch: Any) -> Tensor: ...


@runtime_checkable
class ProvidesPairedTrials(Protocol):
    """A DataModule with paired neural-behaviour training trials of one target session (004-02): ``(session (n,),
    counts (n, T, U), behaviour (n, T, D))``, what a closed-form baseline (the Wiener filter) fits."""

    def paired_training_set(self) -> tuple[Tensor, Tensor, Tensor]: ...


@runtime_checkable
class SphericalSpectrum(Protocol):
    """Spherical forecasters: complex spherical-harmonic coefficients ``(B, C, L, L)`` (``[l, m]``, zero above the
    diagonal; ``modules.components.spherical.sht``) of the module's forecast of a batch (``source="prediction"``)
    or of the batch's true next state (``source="target"``)."""

    def spectrum(self, batch: Any, source: str = "prediction") -> Tensor: ...


@runtime_checkable
class CodebookCounts(Protocol):
    """Discrete tokenizers (paper 002-08): how often each code of the codebook is used on a batch, ``LongTensor
    (K,)``; an empty tensor for a tokenizer whose tokens are continuous."""

    def codebook_counts(self, batch: Any) -> Tensor: ...
