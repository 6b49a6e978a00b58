"""What the three hypernetworks of paper 004-01 share: the INR they generate, its rendering, the data tokens.

The INR is ``f_theta(gamma(x))``, a coordinate MLP ``[d_0 = fourier_dim, *inr_widths, out_dim]`` over random
Fourier features ``gamma`` of the pixel centres, ReLU (or sin) hidden, last layer linear. A hypernetwork is a
*task network* (``docs/design.md``): its first two arguments are one image's shape ``(C, H, W)`` and the
INR's outputs, ``net(input_shape, out_dim, ...)``, both given by ``HyperINRTask`` from the data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError
from modules.attn_hyper_inr.functional import INRParams
from modules.components.inr import Activation, FourierFeatures, activation_fn, batched_mlp_forward


class HyperINRNet(nn.Module):
    """The INR ``[d_0 = fourier_dim, *inr_widths, out_dim]`` over the Fourier features of the pixel centres,
    its rendering, and the input checks.

    Subclasses implement ``rollout(images, steps, include_initial) -> [theta_1, ..., theta_K]``; ``generate``
    is its last item.

    Args:
        input_shape: one image's ``(C, H, W)``, square (``H = W``): C input channels, H = W = ``image_size``.
        out_dim: d_L, the INR's outputs (the images' channels, for reconstruction).
        inr_widths, fourier_dim, fourier_scale, patch_size, activation: see ``AttnOptHyperINR``.
    """

    #: rollout steps K (1 for a single-pass hypernetwork)
    rollout_steps: int = 1
    #: token width of an attention hypernetwork (None: the net has no tokens)
    d_model: int | None = None
    #: whether ``rollout(..., include_initial=True)`` has weights theta_0 from before any step
    has_initial_weights: ClassVar[bool] = False

    def __init__(self, input_shape: Sequence[int], out_dim: int, inr_widths: Sequence[int], fourier_dim: int,
                 fourier_scale: float, patch_size: int, activation: Activation) -> None:
        super().__init__()
        shape = tuple(int(s) for s in input_shape)
        if len(shape) != 3:
            raise ConfigError(f"input_shape must be one image's (C, H, W), got {shape}")
        in_channels, image_size, width = shape
        if image_size != width:
            raise ConfigError(f"the hypernetworks render square images, the data's are {image_size} x {width}")
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
        self.input_shape = shape
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
                              f"{self.in_channels} (input_shape {self.input_shape}, the data's)")
        if h != self.image_size or w != self.image_size:
            raise ConfigError(f"the images are {h} x {w}, the hypernetwork was built for image_size={self.image_size} "
                              f"(input_shape {self.input_shape}, the data's)")

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

    def rollout(self, images: Tensor, steps: int | None = None, include_initial: bool = False) -> list[INRParams]:
        """``[theta_1, ..., theta_K]`` (``[theta_0, ...]`` with ``include_initial``, when ``has_initial_weights``)."""
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


def center_tokens(tokens: Tensor) -> Tensor:
    """Tokens ``(B, n, D)`` minus their mean over the n tokens of the layer (ours, on the input side of both
    readouts): the part every input neuron's token shares would otherwise give ``W_l`` a dominant rank-one
    component ``u 1^T``, a sum over the inputs that grows the INR's activations with the width."""
    return tokens - tokens.mean(1, keepdim=True)


__all__ = ["HyperINRNet", "PatchTokens", "center_tokens"]
