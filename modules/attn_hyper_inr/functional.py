"""The maths the hypernetworks and the task share: one chain-rule step on a batch of INRs, the MLP-opt-step
baseline's parameter count, per-signal PSNR and the weights of the K rollout-step losses (paper 004-01).

One gradient step on ``l = (1/2P) sum_p |y_hat_p - y_p|^2`` (``inr_chain_rule_step``): forward
``z_l = W_l h_{l-1} + b_l``, ``h_l = sigma(z_l)`` (last layer linear), error ``e = y_hat - y``, deltas
``delta_L = e``, ``delta_l = (W_{l+1}^T delta_{l+1}) * sigma'(z_l)``, gradients
``G_l = (1/P) sum_p delta_{l,p} h_{l-1,p}^T``, update ``W_l <- W_l - eta G_l``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from errors import ConfigError
from modules.components.inr import Activation, activation_fn, batched_mlp_forward
from modules.components.metrics import psnr_from_mse

#: ``[(W_l (B, d_l, d_{l-1}), b_l (B, d_l))]``, l = 1..L
INRParams = list[tuple[Tensor, Tensor]]


def inr_chain_rule_step(weights: Sequence[Tensor], biases: Sequence[Tensor], x: Tensor, y: Tensor,
                        activation: Activation = "relu", lr: float | None = None) -> dict[str, Any]:
    """One gradient step on ``l = (1/2P) sum_p |y_hat_p - y_p|^2`` per signal, by the chain rule (no autograd).

    Args:
        weights: ``W_l (B, d_l, d_{l-1})``, l = 1..L.
        biases: ``b_l (B, d_l)``.
        x: inputs ``(B, P, d_0)`` (the Fourier features of P coordinates).
        y: targets ``(B, P, d_out)``.
        activation: sigma of the hidden layers, ``relu`` or ``sine`` (sin z); the last layer is linear.
        lr: eta; when given, also the updated weights.

    Returns:
        ``{"z": [z_1..z_L], "h": [x, h_1, ..., y_hat], "e": y_hat - y, "loss": (B,), "delta": [delta_1..delta_L],
        "grad_w": [G_l (B, d_l, d_{l-1})], "grad_b": [(B, d_l)]}`` (per-sample rows ``(B, P, d_l)``), and with
        ``lr`` ``"new_w"``, ``"new_b"`` = ``W_l - lr G_l``, ``b_l - lr grad_b_l``.
    """
    if x.dim() != 3 or y.dim() != 3 or x.shape[:2] != y.shape[:2]:
        raise ConfigError(f"need x (B, P, d_0) and y (B, P, d_out) with the same B and P, got {tuple(x.shape)}, {tuple(y.shape)}")
    zs, hs = batched_mlp_forward(x, weights, biases, activation)
    if hs[-1].shape != y.shape:
        raise ConfigError(f"the INR outputs {tuple(hs[-1].shape)}, the targets are {tuple(y.shape)}")
    _, dsigma = activation_fn(activation)
    n_points = x.shape[1]
    e = hs[-1] - y
    deltas = [e]
    for l in range(len(weights) - 1, 0, -1):  # delta_l from delta_{l+1}: rows (B, P, d_{l+1}) @ W_{l+1}
        deltas.insert(0, torch.bmm(deltas[0], weights[l]) * dsigma(zs[l - 1]))
    grad_w = [torch.bmm(d.transpose(1, 2), h) / n_points for d, h in zip(deltas, hs[:-1])]
    grad_b = [d.mean(1) for d in deltas]
    out: dict[str, Any] = {"z": zs, "h": hs, "e": e, "loss": 0.5 * e.square().sum(-1).mean(1),
                           "delta": deltas, "grad_w": grad_w, "grad_b": grad_b}
    if lr is not None:
        out["new_w"] = [w - lr * g for w, g in zip(weights, grad_w)]
        out["new_b"] = [b - lr * g for b, g in zip(biases, grad_b)]
    return out


def mlp_opt_parameter_count(inr_widths: Sequence[int], fourier_dim: int = 32, out_dim: int = 3) -> int:
    """``MLPOptStepBaseline``'s trainable count without building it: per layer with ``n = d_l d_{l-1}``,
    ``theta_0`` (n + d_l), ``MLP_l`` ((2n n + n) + (n n + n)) and eta_l (1)."""
    dims = [fourier_dim, *inr_widths, out_dim]
    total = 0
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        n = d_in * d_out
        total += n + d_out + (2 * n * n + n) + (n * n + n) + 1
    return total


def psnr(pred: Tensor, target: Tensor) -> Tensor:
    """Per-signal PSNR in dB for values in [0, 1]: ``-10 log10(MSE)`` over all but the first dimension."""
    return psnr_from_mse((pred.clamp(0, 1) - target).square().flatten(1).mean(1))


def mean_colour_psnr(pixels: Tensor) -> Tensor:
    """Per-signal PSNR of the constant rendering at the signal's own mean colour: ``pixels (B, P, C)`` in
    [0, 1] against their per-channel mean over the P pixels, ``(B,)``."""
    return psnr(pixels.mean(1, keepdim=True).expand_as(pixels), pixels)


def step_weights(kind: Literal["linear", "uniform", "last"], k: int) -> Tensor:
    """Weights ``w_k`` of the K step losses, summing to 1: ``linear`` k / sum(k), ``uniform``, or ``last`` only."""
    if kind == "linear":
        w = torch.arange(1, k + 1, dtype=torch.float32)
    elif kind == "uniform":
        w = torch.ones(k)
    elif kind == "last":
        w = torch.zeros(k)
        w[-1] = 1.0
    else:
        raise ConfigError(f"step_loss_weights must be linear, uniform or last, got {kind!r}")
    return w / w.sum()


__all__ = ["INRParams", "inr_chain_rule_step", "mean_colour_psnr", "mlp_opt_parameter_count", "psnr", "step_weights"]
