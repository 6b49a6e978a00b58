"""Attention hypernetwork for INRs that unrolls the INR's optimisation steps in token space (paper 004-01).

A hypernetwork reads an image and outputs the weights ``theta = {(W_l, b_l)}`` of a small coordinate MLP
(the INR) ``f_theta(gamma(x))``, with ``gamma`` random Fourier features, so that ``f_theta`` renders the
image, in one forward pass (no test-time optimisation). The paper's point: an optimisation-oriented
hypernetwork should mirror the chain rule of one gradient step on the INR, and doing so with attention over
*output-neuron tokens* costs a number of parameters independent of the INR's width W, where the MLP
instantiation (an MLP from ``flatten(W_l, G_l)`` to ``Delta W_l``) costs O(W^4).

One gradient step on ``l = (1/2P) sum_p |y_hat_p - y_p|^2`` (``inr_chain_rule_step``): forward
``z_l = W_l h_{l-1} + b_l``, ``h_l = sigma(z_l)`` (last layer linear), error ``e = y_hat - y``, deltas
``delta_L = e``, ``delta_l = (W_{l+1}^T delta_{l+1}) * sigma'(z_l)``, gradients
``G_l = (1/P) sum_p delta_{l,p} h_{l-1,p}^T``, update ``W_l <- W_l - eta G_l``.

Models (all ``HyperINRNet``: the same INR, Fourier features, coordinates and rendering):

- ``AttnOptHyperINR`` (ours, the wiring is inferred: the paper's text was not available). Layer ``l`` of the
  INR (``l = 0`` the d_0 Fourier channels, ``l = L`` the outputs) is a set of d_l tokens ``t^l_i`` in
  ``R^{d_model}``, one per output neuron. Initial tokens: a learned layer embedding plus a fixed (buffer)
  random code of the neuron's index, and for ``l = 0`` a learned linear map of the channel's frequency and
  phase: no parameter per neuron. Data tokens: 4 x 4 patches, linearly embedded, plus a Fourier encoding of
  the patch centre, then ``encoder_depth`` self-attention blocks. Weights are read out bilinearly,
  ``W_l[i, j] = <A_l t^l_i, B_l t^{l-1}_j> / sqrt(d_model) * g_l`` and ``b_l[i] = c_l . t^l_i`` (after a
  LayerNorm; the layer l-1 tokens centred over their layer, ``_center``; ``g_l = sqrt(2 / d_{l-1})`` for hidden layers, ``sqrt(1 / d_{l-1})`` for the last: a fixed
  fan-in scale (ours) that keeps the INR's activations O(1) at every width). One rollout step is five
  pre-norm cross-attention blocks (``modules.components.attention``), shared by all layers and all steps;
  each query lives where its output lives (the information-flow rule):

  1. forward: ``a^l = CA_fwd(t^l, [a^{l-1}; data])`` for l = 1..L (``a^0 = t^0``): activation summaries;
  2. error: ``d^L = CA_err(a^L, [data; a^L])``: output neurons read the targets;
  3. backprop: ``d^l = CA_bwd(a^l, values d^{l+1}, keys t^{l+1})`` for l = L-1..1: the keys are the layer
     l+1 neuron tokens, the transposed role of ``W_{l+1}^T delta_{l+1}``;
  4. gradient: ``g^l = CA_grad(d^l, [d^l; a^{l-1}])`` (``G_l`` pairs layer l's deltas with layer l-1's
     activations; its rows live on layer l's neurons);
  5. update: ``t^l <- CA_upd(g^l, t^l)``: the gradient tokens query the old tokens. The new token is the
     residual stream ``g^l_i + ...``, which carries ``t^l_i`` and every neuron-aligned increment of steps
     1-4 (ours; the spec's ``t^l + CA(t^l, g^l)`` passes on only what attention reads out of ``g^l``,
     near the mean over the layer's neurons at initialisation, and trained markedly slower in a pilot).

  After every step k = 1..K the weights ``theta_k`` are read out; training sums the MSE of every
  ``theta_k`` with rising weights. Parameter count: independent of the widths ``d_l`` (it depends on the
  number of layers through ``A_l, B_l, c_l`` and the layer embeddings).
- ``TransINRBaseline`` (Chen & Wang 2022, rebuilt from its description): one pass of ``depth``
  self-attention blocks over ``[data tokens; weight tokens]``, where the weight tokens of layer l are
  d_{l-1} + 1 learned tokens, one per *column* of ``[W_l | b_l]``, each mapped by a linear head to its
  column of d_l entries (the same fan-in scale ``g_l`` and centring over the layer's column tokens as ours).
  Count affine in W.
- ``MLPOptStepBaseline`` (the MLP instantiation the abstract criticises): learned initial INR weights
  ``theta_0``, then K true chain-rule steps: ``G_l`` from ``inr_chain_rule_step`` on the image, and
  ``W_l <- W_l + MLP_l(flatten(W_l, G_l))`` with ``MLP_l: 2 n_l -> n_l -> n_l``, ``n_l = d_l d_{l-1}``;
  ``b_l <- b_l - eta_l grad_b`` with a learned ``eta_l``. About ``3 n_l^2 ~ 3 W^4`` parameters per W x W
  layer, so widths above 64 are refused (``mlp_opt_parameter_count`` counts without building).

``HyperINRTask(net)`` trains any of them on image batches ``(images (B, C, H, W),)`` and logs the PSNR of
the last step and of every rollout step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn

from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.attention import CrossAttentionBlock
from modules.components.inr import Activation, FourierFeatures, activation_fn, batched_mlp_forward
from modules.components.metrics import count_parameters, psnr_from_mse

PAPER_ID = "004-01"
#: ``[(W_l (B, d_l, d_{l-1}), b_l (B, d_l))]``, l = 1..L
INRParams = list[tuple[Tensor, Tensor]]
MLP_OPT_MAX_WIDTH = 64


# --- one gradient step on a batch of INRs, by the chain rule ---------------------------------------------
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


# --- the INR every hypernetwork generates ---------------------------------------------------------------
class HyperINRNet(nn.Module):
    """What the three hypernetworks share: the INR ``[d_0 = fourier_dim, *inr_widths, out_dim]`` over the
    Fourier features of the pixel centres, its rendering, and the input checks.

    Subclasses implement ``rollout(images, steps) -> [theta_1, ..., theta_K]``; ``generate`` is its last item.
    """

    #: rollout steps (1 for a single-pass hypernetwork)
    rollout_steps: int = 1

    def __init__(self, inr_widths: Sequence[int], fourier_dim: int, fourier_scale: float, out_dim: int,
                 patch_size: int, image_size: int, in_channels: int, activation: Activation) -> None:
        super().__init__()
        inr_widths = list(inr_widths)
        if not inr_widths:
            raise ConfigError("inr_widths is empty: give the INR's hidden widths, e.g. inr_widths: [32, 32, 32]")
        if any(int(w) < 1 for w in inr_widths):
            raise ConfigError(f"inr_widths must be positive, got {inr_widths}")
        if fourier_dim < 2 or fourier_dim % 2:
            raise ConfigError(f"fourier_dim (= 2 x frequencies, cos and sin) must be even and >= 2, got {fourier_dim}")
        if out_dim < 1 or in_channels < 1:
            raise ConfigError(f"out_dim and in_channels must be positive, got {out_dim}, {in_channels}")
        if patch_size < 1 or image_size < 1 or image_size % patch_size:
            raise ConfigError(f"image_size ({image_size}) must be a positive multiple of patch_size ({patch_size}): "
                              "change model.net.patch_size or the data's size")
        activation_fn(activation)  # checks the name
        self.inr_widths = [int(w) for w in inr_widths]
        self.fourier_dim, self.fourier_scale, self.out_dim = fourier_dim, fourier_scale, out_dim
        self.patch_size, self.image_size, self.in_channels = patch_size, image_size, in_channels
        self.activation: Activation = activation
        self.dims = [fourier_dim, *self.inr_widths, out_dim]
        # the same frequencies (seed 0) in every model, so the INRs are identical across hypernetworks
        self.encoding = FourierFeatures(2, fourier_dim // 2, fourier_scale, seed=0)
        c = (torch.arange(image_size, dtype=torch.float32) + 0.5) / image_size
        yy, xx = torch.meshgrid(c, c, indexing="ij")
        self.register_buffer("coords", torch.stack([xx, yy], -1).reshape(-1, 2), persistent=False)

    @property
    def n_layers(self) -> int:
        return len(self.dims) - 1

    def fan_in_gain(self, l: int) -> float:
        """g_l for layer l = 1..L: sqrt(2 / d_{l-1}) for hidden (relu) layers, sqrt(1 / d_{l-1}) otherwise."""
        hidden = l < self.n_layers and self.activation == "relu"
        return math.sqrt((2.0 if hidden else 1.0) / self.dims[l - 1])

    def check_images(self, images: Tensor) -> None:
        if images.dim() != 4:
            raise ConfigError(f"images must be (B, C, H, W), got {tuple(images.shape)}")
        _, c, h, w = images.shape
        if c != self.in_channels:
            raise ConfigError(f"the images have {c} channels, the hypernetwork was built for in_channels="
                              f"{self.in_channels}: set model.net.in_channels (and out_dim) to {c}")
        if h != self.image_size or w != self.image_size:
            raise ConfigError(f"the images are {h} x {w}, the hypernetwork was built for image_size={self.image_size}: "
                              "set model.net.image_size")

    def features(self) -> Tensor:
        """gamma(x) of the pixel centres, ``(P, d_0)`` (P = H W, row-major)."""
        return self.encoding(self.coords)

    def render(self, params: INRParams, x: Tensor | None = None) -> Tensor:
        """``f_theta(gamma(x))`` for every signal: ``(B, P, out_dim)`` (default x: the pixel centres)."""
        feats = self.features() if x is None else self.encoding(x)
        b = params[0][0].shape[0]
        w, bias = zip(*params)
        return batched_mlp_forward(feats.to(w[0].dtype).expand(b, -1, -1), w, bias, self.activation)[1][-1]

    def pixels(self, images: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> targets ``(B, P, C)`` in the rendering's order."""
        return images.flatten(2).transpose(1, 2)

    def rollout(self, images: Tensor, steps: int | None = None) -> list[INRParams]:
        raise NotImplementedError

    def _steps(self, steps: int | None) -> int:
        steps = self.rollout_steps if steps is None else steps
        if not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"steps must be an integer >= 1, got {steps!r}")
        return steps

    def generate(self, images: Tensor, steps: int | None = None) -> INRParams:
        """The INR weights for ``images (B, C, H, W)``: ``[(W_l (B, d_l, d_{l-1}), b_l (B, d_l))]``, l = 1..L."""
        return self.rollout(images, steps)[-1]

    def forward(self, images: Tensor) -> Tensor:
        """The reconstruction ``(B, C, H, W)`` of the last step."""
        y = self.render(self.generate(images))
        return y.transpose(1, 2).reshape(images.shape[0], self.out_dim, self.image_size, self.image_size)


class PatchTokens(nn.Module):
    """Data tokens: non-overlapping p x p patches ``(B, C, H, W) -> (B, (H/p)(W/p), d_model)``, a linear
    embedding of the pixels plus a linear map of a Fourier encoding of the patch centre."""

    def __init__(self, in_channels: int, patch_size: int, image_size: int, d_model: int, fourier_scale: float) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.embed = nn.Linear(in_channels * patch_size**2, d_model)
        n = image_size // patch_size
        c = (torch.arange(n, dtype=torch.float32) + 0.5) / n
        yy, xx = torch.meshgrid(c, c, indexing="ij")
        enc = FourierFeatures(2, 16, min(fourier_scale, n / 2.0), seed=1)(torch.stack([xx, yy], -1).reshape(-1, 2))
        self.register_buffer("pos_features", enc, persistent=False)
        self.pos = nn.Linear(enc.shape[1], d_model)

    def forward(self, images: Tensor) -> Tensor:
        patches = F.unfold(images, self.patch_size, stride=self.patch_size).transpose(1, 2)  # (B, N, C p p)
        return self.embed(patches) + self.pos(self.pos_features)


def _center(tokens: Tensor) -> Tensor:
    """Tokens ``(B, n, D)`` minus their mean over the n tokens of the layer (ours, on the input side of both
    readouts): the part every input neuron's token shares would otherwise give ``W_l`` a dominant rank-one
    component ``u 1^T``, a sum over the inputs that grows the INR's activations with the width."""
    return tokens - tokens.mean(1, keepdim=True)


def _index_codes(n_layers: int, max_width: int, d_model: int, seed: int = 0) -> Tensor:
    """Fixed random codes ``(n_layers, max_width, d_model)``, N(0, 1): a neuron's index, per layer."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n_layers, max_width, d_model, generator=gen)


# --- ours -------------------------------------------------------------------------------------------------
class AttnOptHyperINR(HyperINRNet):
    """Output-neuron tokens + a K-step token-space rollout of five cross-attentions (module docstring).

    Args:
        inr_widths: hidden widths of the INR (``[32, 32, 32]``: three hidden layers of 32).
        fourier_dim: d_0, the Fourier features (``fourier_dim / 2`` frequencies, cos and sin).
        fourier_scale: standard deviation of the frequencies (cycles per image side).
        out_dim: d_L (3 for RGB; must equal the images' channels).
        d_model: token width.
        n_heads: attention heads.
        rollout_steps: K, the default number of rollout steps.
        patch_size: data patches are p x p.
        image_size: side of the (square) images.
        in_channels: channels of the images.
        activation: the INR's hidden sigma, ``relu`` or ``sine`` (sin z).
        encoder_depth: self-attention blocks over the data tokens before the rollout.
        mlp_ratio: MLP width of every block, in units of d_model.
    """

    def __init__(self, inr_widths: list[int] = [32, 32, 32], fourier_dim: int = 32,  # noqa: B006 - jsonargparse reads it
                 fourier_scale: float = 10.0, out_dim: int = 3, d_model: int = 64, n_heads: int = 4,
                 rollout_steps: int = 3, patch_size: int = 4, image_size: int = 32, in_channels: int = 3,
                 activation: Activation = "relu", encoder_depth: int = 1, mlp_ratio: int = 2) -> None:
        super().__init__(inr_widths, fourier_dim, fourier_scale, out_dim, patch_size, image_size, in_channels, activation)
        if not isinstance(rollout_steps, int) or rollout_steps < 1:
            raise ConfigError(f"rollout_steps must be an integer >= 1, got {rollout_steps!r}")
        if encoder_depth < 0:
            raise ConfigError(f"encoder_depth must be >= 0, got {encoder_depth}")
        self.rollout_steps, self.d_model = rollout_steps, d_model
        n_tok = self.n_layers + 1  # token sets l = 0..L
        self.data = PatchTokens(in_channels, patch_size, image_size, d_model, fourier_scale)
        self.encoder = nn.ModuleList(CrossAttentionBlock(d_model, n_heads, mlp_ratio) for _ in range(encoder_depth))
        self.layer_embedding = nn.Parameter(torch.randn(n_tok, d_model) * 0.02)
        self.register_buffer("codes", _index_codes(n_tok, max(self.dims), d_model), persistent=False)
        # layer 0: channel j is cos or sin of 2 pi B_m . x: its frequency and phase, mapped to a token
        freqs = self.encoding.B / fourier_scale
        half = freqs.shape[0]
        desc = torch.cat([torch.cat([freqs, torch.zeros(half, 1)], 1), torch.cat([freqs, torch.ones(half, 1)], 1)])
        self.register_buffer("input_descriptor", desc, persistent=False)
        self.input_map = nn.Linear(3, d_model)
        names = ("fwd", "err", "bwd", "grad", "upd")
        self.blocks = nn.ModuleDict({n: CrossAttentionBlock(d_model, n_heads, mlp_ratio, separate_key_norm=n == "bwd")
                                     for n in names})
        self.readout_norm = nn.LayerNorm(d_model)
        self.read_a = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(self.n_layers))
        self.read_b = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(self.n_layers))
        self.read_c = nn.ModuleList(nn.Linear(d_model, 1) for _ in range(self.n_layers))
        for lin in (*self.read_a, *self.read_b):
            nn.init.normal_(lin.weight, std=d_model**-0.5)
        for lin in self.read_c:
            nn.init.normal_(lin.weight, std=0.1 * d_model**-0.5)
            nn.init.zeros_(lin.bias)

    def initial_tokens(self, batch: int) -> list[Tensor]:
        """``t^l`` for l = 0..L, each ``(B, d_l, d_model)``: layer embedding + fixed index code (+ for l = 0
        the channel's frequency and phase)."""
        out = []
        for l, d in enumerate(self.dims):
            t = self.layer_embedding[l] + self.codes[l, :d]
            if l == 0:
                t = t + self.input_map(self.input_descriptor)
            out.append(t.expand(batch, -1, -1))
        return out

    def read_out(self, tokens: Sequence[Tensor]) -> INRParams:
        """``W_l[i, j] = <A_l t^l_i, B_l t^{l-1}_j> / sqrt(d_model) g_l``, ``b_l[i] = c_l . t^l_i`` (l = 1..L), with
        ``t`` the LayerNormed tokens and those of layer l-1 centred over their layer."""
        normed = [self.readout_norm(t) for t in tokens]
        params = []
        for l in range(1, self.n_layers + 1):
            a, b = self.read_a[l - 1](normed[l]), self.read_b[l - 1](_center(normed[l - 1]))
            w = torch.bmm(a, b.transpose(1, 2)) * (self.fan_in_gain(l) / math.sqrt(self.d_model))
            params.append((w, self.read_c[l - 1](normed[l]).squeeze(-1)))
        return params

    def rollout_step(self, tokens: list[Tensor], data: Tensor) -> list[Tensor]:
        """One token-space optimisation step: forward, error, backprop, gradient, update (module docstring)."""
        blk, n = self.blocks, self.n_layers
        a = [tokens[0]]
        for l in range(1, n + 1):
            a.append(blk["fwd"](tokens[l], torch.cat([a[l - 1], data], 1)))
        d: list[Tensor | None] = [None] * (n + 1)
        d[n] = blk["err"](a[n], torch.cat([data, a[n]], 1))
        for l in range(n - 1, 0, -1):
            d[l] = blk["bwd"](a[l], d[l + 1], key_context=tokens[l + 1])
        new = [tokens[0]]
        for l in range(1, n + 1):
            g = blk["grad"](d[l], torch.cat([d[l], a[l - 1]], 1))
            new.append(blk["upd"](g, tokens[l]))
        return new

    def encode(self, images: Tensor) -> Tensor:
        """Data tokens ``(B, N, d_model)``."""
        self.check_images(images)
        x = self.data(images)
        for block in self.encoder:
            x = block(x, x)
        return x

    def rollout(self, images: Tensor, steps: int | None = None, include_initial: bool = False) -> list[INRParams]:
        """``[theta_1, ..., theta_K]`` (``[theta_0, ...]`` with ``include_initial``: the tokens before any step)."""
        steps = self._steps(steps)
        data = self.encode(images)
        tokens = self.initial_tokens(images.shape[0])
        out = [self.read_out(tokens)] if include_initial else []
        for _ in range(steps):
            tokens = self.rollout_step(tokens, data)
            out.append(self.read_out(tokens))
        return out


# --- baselines --------------------------------------------------------------------------------------------
class TransINRBaseline(HyperINRNet):
    """Trans-INR: one pass of ``depth`` self-attention blocks over [data tokens; column tokens] (module docstring).

    Args: as ``AttnOptHyperINR`` (no rollout), plus ``depth``, the transformer blocks.
    """

    def __init__(self, inr_widths: list[int] = [32, 32, 32], fourier_dim: int = 32,  # noqa: B006
                 fourier_scale: float = 10.0, out_dim: int = 3, d_model: int = 64, n_heads: int = 4,
                 depth: int = 6, patch_size: int = 4, image_size: int = 32, in_channels: int = 3,
                 activation: Activation = "relu", mlp_ratio: int = 2) -> None:
        super().__init__(inr_widths, fourier_dim, fourier_scale, out_dim, patch_size, image_size, in_channels, activation)
        if depth < 1:
            raise ConfigError(f"depth must be >= 1, got {depth}")
        self.d_model = d_model
        self.data = PatchTokens(in_channels, patch_size, image_size, d_model, fourier_scale)
        self.blocks = nn.ModuleList(CrossAttentionBlock(d_model, n_heads, mlp_ratio) for _ in range(depth))
        # one learned token per column of [W_l | b_l]: d_{l-1} + 1 tokens for layer l
        self.column_tokens = nn.ParameterList(
            nn.Parameter(torch.randn(d_in + 1, d_model)) for d_in in self.dims[:-1])
        self.norm = nn.LayerNorm(d_model)
        self.heads = nn.ModuleList(nn.Linear(d_model, d_out) for d_out in self.dims[1:])
        for head in self.heads:
            nn.init.normal_(head.weight, std=d_model**-0.5)
            nn.init.zeros_(head.bias)

    def rollout(self, images: Tensor, steps: int | None = None) -> list[INRParams]:
        """A single pass: ``[theta]`` (``steps`` must be 1 or None)."""
        if self._steps(1 if steps is None else steps) != 1:
            raise ConfigError("TransINRBaseline is a single-pass hypernetwork: steps must be 1")
        self.check_images(images)
        b = images.shape[0]
        data = self.data(images)
        sizes = [t.shape[0] for t in self.column_tokens]
        z = torch.cat([data, *(t.expand(b, -1, -1) for t in self.column_tokens)], 1)
        for block in self.blocks:
            z = block(z, z)
        cols = self.norm(z[:, data.shape[1]:]).split(sizes, 1)
        params = []
        for l, (c, head) in enumerate(zip(cols, self.heads), start=1):
            w = head(_center(c[:, :-1])).transpose(1, 2)  # (B, d_l, d_{l-1}): column j from token j
            params.append((w * self.fan_in_gain(l), head(c[:, -1])))
        return [params]


class MLPOptStepBaseline(HyperINRNet):
    """K true chain-rule steps whose weight update is an MLP of ``flatten(W_l, G_l)`` (module docstring).

    Args: as ``AttnOptHyperINR``'s INR arguments, plus ``rollout_steps`` (K) and ``mlp_activation``. Widths
    above 64 are refused: the count is ``mlp_opt_parameter_count`` (about 3 W^4 per W x W layer).
    """

    def __init__(self, inr_widths: list[int] = [16, 16], fourier_dim: int = 32,  # noqa: B006
                 fourier_scale: float = 10.0, out_dim: int = 3, rollout_steps: int = 3, patch_size: int = 4,
                 image_size: int = 32, in_channels: int = 3, activation: Activation = "relu",
                 mlp_activation: str = "gelu", base_lr: float = 1.0) -> None:
        super().__init__(inr_widths, fourier_dim, fourier_scale, out_dim, patch_size, image_size, in_channels, activation)
        if max(self.inr_widths) > MLP_OPT_MAX_WIDTH:
            raise ConfigError(f"MLPOptStepBaseline has ~3 W^4 parameters per layer: widths above {MLP_OPT_MAX_WIDTH} are "
                              f"refused (got {self.inr_widths}); count larger ones with mlp_opt_parameter_count")
        if not isinstance(rollout_steps, int) or rollout_steps < 1:
            raise ConfigError(f"rollout_steps must be an integer >= 1, got {rollout_steps!r}")
        from modules.components.activations import get_activation

        self.rollout_steps = rollout_steps
        self.w0 = nn.ParameterList()
        self.b0 = nn.ParameterList()
        self.updates = nn.ModuleList()
        self.log_lr_b = nn.Parameter(torch.full((self.n_layers,), math.log(base_lr)))
        for l, (d_in, d_out) in enumerate(zip(self.dims[:-1], self.dims[1:]), start=1):
            self.w0.append(nn.Parameter(torch.randn(d_out, d_in) * self.fan_in_gain(l)))
            self.b0.append(nn.Parameter(torch.zeros(d_out)))
            n = d_in * d_out
            mlp = nn.Sequential(nn.Linear(2 * n, n), get_activation(mlp_activation), nn.Linear(n, n))
            nn.init.zeros_(mlp[2].weight)  # starts as the identity step, W <- W
            nn.init.zeros_(mlp[2].bias)
            self.updates.append(mlp)

    def rollout(self, images: Tensor, steps: int | None = None, include_initial: bool = False) -> list[INRParams]:
        """``[theta_1, ..., theta_K]`` (``[theta_0, ...]`` with ``include_initial``: the learned initial weights)."""
        steps = self._steps(steps)
        self.check_images(images)
        b = images.shape[0]
        x = self.features().expand(b, -1, -1)
        y = self.pixels(images)
        ws = [w.expand(b, -1, -1) for w in self.w0]
        bs = [bias.expand(b, -1) for bias in self.b0]
        out = [list(zip(ws, bs))] if include_initial else []
        for _ in range(steps):
            chain = inr_chain_rule_step(ws, bs, x, y, self.activation)
            ws = [w + mlp(torch.cat([w.flatten(1), g.flatten(1)], 1)).view_as(w)
                  for w, g, mlp in zip(ws, chain["grad_w"], self.updates)]
            bs = [bias - self.log_lr_b[l].exp() * g for l, (bias, g) in enumerate(zip(bs, chain["grad_b"]))]
            out.append(list(zip(ws, bs)))
        return out


# --- the task ---------------------------------------------------------------------------------------------
def psnr(pred: Tensor, target: Tensor) -> Tensor:
    """Per-signal PSNR in dB for values in [0, 1]: ``-10 log10(MSE)`` over all but the first dimension."""
    return psnr_from_mse((pred.clamp(0, 1) - target).square().flatten(1).mean(1))


def step_weights(kind: Literal["linear", "uniform", "last"], k: int) -> Tensor:
    """Weights of the K step losses, summing to 1: ``linear`` k / sum(k), ``uniform``, or ``last`` only."""
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


NET_CLASSES = {"AttnOptHyperINR": AttnOptHyperINR, "TransINRBaseline": TransINRBaseline,
               "MLPOptStepBaseline": MLPOptStepBaseline}


class HyperINRTask(PaperTask):
    """Trains a hypernetwork ``net`` (a ``HyperINRNet``) to reconstruct images through the INR it generates.

    Loss: ``sum_k w_k MSE(f_{theta_k}, image)`` over the rollout steps k = 1..K (rising weights ``linear``
    by default; a single-pass net has K = 1). Metrics: ``psnr`` (the last step's per-image PSNR, averaged
    over images; the checkpoint monitor), ``mse``, and ``psnr_step<k>`` for k = 1..K.

    Args:
        net: the hypernetwork (``class_path`` of ``AttnOptHyperINR``, ``TransINRBaseline`` or
            ``MLPOptStepBaseline`` with its ``init_args``; default ``AttnOptHyperINR()``). Its
            ``in_channels``/``out_dim``/``image_size`` must match the data.
        step_loss_weights: ``linear`` (w_k proportional to k), ``uniform`` or ``last``.
        input_shape: one image's ``(C, H, W)`` (linked from the DataModule).
        optimizer, lr_scheduler: see ``PaperTask``; the scheduler steps once per optimiser step.
    """

    paper_id = PAPER_ID
    monitor = "val/psnr"
    monitor_mode = "max"
    scheduler_interval = "step"

    def __init__(
        self,
        net: nn.Module | None = None,
        step_loss_weights: Literal["linear", "uniform", "last"] = "linear",
        input_shape: tuple[int, ...] = (3, 32, 32),
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-4, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        net = AttnOptHyperINR() if net is None else net
        if not isinstance(net, HyperINRNet):
            raise ConfigError(f"net must be one of {sorted(NET_CLASSES)} (modules.attn_hyper_inr), got {type(net).__name__}")
        k = net.rollout_steps
        metrics = {"psnr": WeightedMean(), "mse": WeightedMean(), **{f"psnr_step{i}": WeightedMean() for i in range(1, k + 1)}}
        super().__init__(optimizer, lr_scheduler, metrics=metrics)
        shape = tuple(input_shape)
        if len(shape) != 3:
            raise ConfigError(f"input_shape must be (C, H, W), got {shape}")
        if shape[0] != net.in_channels or shape[0] != net.out_dim:
            raise ConfigError(f"channel mismatch: the data has {shape[0]} channels, the net has in_channels="
                              f"{net.in_channels}, out_dim={net.out_dim}: set model.net.in_channels and "
                              f"model.net.out_dim to {shape[0]}")
        if shape[1] != net.image_size or shape[2] != net.image_size:
            raise ConfigError(f"the data's images are {shape[1]} x {shape[2]}, the net has image_size={net.image_size}: "
                              "set model.net.image_size")
        self.net = net
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
            if isinstance(self.net, AttnOptHyperINR | MLPOptStepBaseline):
                thetas = self.net.rollout(images, include_initial=True)
                return torch.stack([psnr(self.net.render(t), target) for t in thetas], 1)
            values = [psnr(self.net.render(t), target) for t in self.net.rollout(images)]
            return torch.stack([torch.full_like(values[0], float("nan")), *values], 1)

    def param_scaling(self, widths: Sequence[int]) -> dict[str, list[int]]:
        """``modules.protocols.ProvidesParameterScaling``: trainable counts of the three hypernetworks when the INR's
        hidden widths are all W, for each W, with this net's other INR settings, d_model (and depth, for a
        Trans-INR net); the others at their defaults; MLPOptStepBaseline counted without building it."""
        net = self.net
        depth = len(net.inr_widths)
        common = {"fourier_dim": net.fourier_dim, "fourier_scale": net.fourier_scale, "out_dim": net.out_dim,
                  "patch_size": net.patch_size, "image_size": net.image_size, "in_channels": net.in_channels}
        attn = {k: getattr(net, k) for k in ("d_model",) if hasattr(net, k)}
        trans = {**attn, "depth": len(net.blocks)} if isinstance(net, TransINRBaseline) else attn
        out: dict[str, list[int]] = {"AttnOptHyperINR": [], "TransINRBaseline": [], "MLPOptStepBaseline": []}
        for w in widths:
            hidden = [int(w)] * depth
            out["AttnOptHyperINR"].append(count_parameters(AttnOptHyperINR(hidden, **common, **attn)))
            out["TransINRBaseline"].append(count_parameters(TransINRBaseline(hidden, **common, **trans)))
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
        return StepOutput(loss, n=n, inputs=inputs)

    def extra_epoch_metrics(self, stage: Stage, values: dict[str, Tensor]) -> dict[str, Tensor]:
        if stage == "test":
            return {"test/n_params": torch.tensor(float(count_parameters(self.net)))}
        return {}


__all__ = [
    "AttnOptHyperINR",
    "HyperINRNet",
    "HyperINRTask",
    "MLPOptStepBaseline",
    "TransINRBaseline",
    "count_parameters",
    "inr_chain_rule_step",
    "mlp_opt_parameter_count",
    "psnr",
]
