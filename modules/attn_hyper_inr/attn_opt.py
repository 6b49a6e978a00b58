"""``AttnOptHyperINR`` (paper 004-01, ours; the wiring is inferred: the paper's text was not available).

Layer ``l`` of the INR (``l = 0`` the d_0 Fourier channels, ``l = L`` the outputs) is a set of d_l tokens
``t^l_i`` in ``R^{d_model}``, one per output neuron. Initial tokens: a learned layer embedding plus a fixed
(buffer) random code of the neuron's index, and for ``l = 0`` a learned linear map of the channel's frequency
and phase: no parameter per neuron. Data tokens: 4 x 4 patches, linearly embedded, plus a Fourier encoding
of the patch centre, then ``encoder_depth`` self-attention blocks. Weights are read out bilinearly,
``W_l[i, j] = <A_l t^l_i, B_l t^{l-1}_j> / sqrt(d_model) * g_l`` and ``b_l[i] = c_l . t^l_i`` (after a
LayerNorm; the layer l-1 tokens centred over their layer, ``center_tokens``; ``g_l = sqrt(2 / d_{l-1})`` for
hidden layers, ``sqrt(1 / d_{l-1})`` for the last: a fixed fan-in scale (ours) that keeps the INR's
activations O(1) at every width). One rollout step is five pre-norm cross-attention blocks
(``modules.components.attention``), shared by all layers and all steps; each query lives where its output
lives (the information-flow rule):

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

After every step k = 1..K the weights ``theta_k`` are read out. Parameter count: independent of the widths
``d_l`` (it depends on the number of layers through ``A_l, B_l, c_l`` and the layer embeddings).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.attn_hyper_inr.functional import INRParams
from modules.attn_hyper_inr.hyper_inr_net import HyperINRNet, PatchTokens, center_tokens
from modules.components.attention import CrossAttentionBlock
from modules.components.inr import Activation


def _index_codes(n_layers: int, max_width: int, d_model: int, seed: int = 0) -> Tensor:
    """Fixed random codes ``(n_layers, max_width, d_model)``, N(0, 1): a neuron's index, per layer."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n_layers, max_width, d_model, generator=gen)


class AttnOptHyperINR(HyperINRNet):
    """Output-neuron tokens + a K-step token-space rollout of five cross-attentions (module docstring).

    A task network: ``HyperINRTask`` builds it as ``AttnOptHyperINR(input_shape, out_dim, **init_args)`` with
    the two sizes from the data; a config names only the other arguments.

    Args:
        input_shape: one image's ``(C, H, W)``, square: C channels of side ``image_size`` = H = W.
        out_dim: d_L (3 for RGB; the images' channels).
        inr_widths: hidden widths of the INR (``[32, 32, 32]``: three hidden layers of 32).
        fourier_dim: d_0, the Fourier features (``fourier_dim / 2`` frequencies, cos and sin).
        fourier_scale: standard deviation of the frequencies (cycles per image side).
        d_model: token width.
        n_heads: attention heads.
        rollout_steps: K, the default number of rollout steps.
        patch_size: data patches are p x p (``image_size`` must be a multiple of p).
        activation: the INR's hidden sigma, ``relu`` or ``sine`` (sin z).
        encoder_depth: self-attention blocks over the data tokens before the rollout.
        mlp_ratio: MLP width of every block, in units of d_model.
    """

    has_initial_weights: ClassVar[bool] = True

    def __init__(self, input_shape: Sequence[int] = (3, 32, 32), out_dim: int = 3,
                 inr_widths: list[int] = [32, 32, 32], fourier_dim: int = 32,  # noqa: B006 - jsonargparse reads it
                 fourier_scale: float = 10.0, d_model: int = 64, n_heads: int = 4, rollout_steps: int = 3,
                 patch_size: int = 4, activation: Activation = "relu", encoder_depth: int = 1,
                 mlp_ratio: int = 2) -> None:
        super().__init__(input_shape, out_dim, inr_widths, fourier_dim, fourier_scale, patch_size, activation)
        if not isinstance(rollout_steps, int) or rollout_steps < 1:
            raise ConfigError(f"rollout_steps must be an integer >= 1, got {rollout_steps!r}")
        if encoder_depth < 0:
            raise ConfigError(f"encoder_depth must be >= 0, got {encoder_depth}")
        self.rollout_steps, self.d_model = rollout_steps, d_model
        n_tok = self.n_layers + 1  # token sets l = 0..L
        self.data = PatchTokens(self.in_channels, patch_size, self.image_size, d_model, fourier_scale)
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
            a, b = self.read_a[l - 1](normed[l]), self.read_b[l - 1](center_tokens(normed[l - 1]))
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


__all__ = ["AttnOptHyperINR"]
