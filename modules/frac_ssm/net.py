"""FRAC's sequence network (paper 002-02): in -> a stack of selective-SSM blocks -> out, a task network.

The equal-state rule of the paper's comparison lives here: ``kernel="exp"`` (the Mamba-style baseline) turns
FRAC's ``K`` modes of ``N`` states into one mode of ``N K`` states, so both kernels hold the same state.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Literal

from torch import Tensor, nn

from errors import ConfigError
from modules.components.ssm import SelectiveSSMStack

Kernel = Literal["frac", "exp"]


class FracSSMNet(nn.Module):
    """``embed -> SelectiveSSMStack -> head``, a task network ``(in_shape, out_dim, ...)`` over sequences.

    What goes in and out follows ``in_shape`` (one sample's shape; its length ``L`` is not used: the scan takes
    sequences of any length, as a length curriculum feeds them):

    - ``(L,)``: token ids in ``[0, out_dim)`` (next-token and recall data: the vocabulary is the output
      classes); an ``N(0, 0.02)`` embedding in, the tied embedding out: logits ``(B, L, out_dim)``;
    - ``(L, F)``: real series of ``F`` features; ``Linear(F, d_model)`` in, ``Linear(d_model, out_dim)`` out:
      ``(B, L, out_dim)``.

    Args:
        in_shape, out_dim: sizes (linked from the DataModule through the task).
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
    """

    def __init__(
        self,
        in_shape: int | Sequence[int],
        out_dim: int,
        d_model: int = 128,
        n_layers: int = 4,
        d_state: int = 16,
        n_modes: int = 8,
        s_min: float = 1e-4,
        s_max: float = 1.0,
        alpha_init: float = 0.5,
        kernel: Kernel = "frac",
        expand: int = 2,
        d_conv: int = 4,
        dt_min: float = 1e-3,
        dt_max: float = 1e-1,
        lam_init: tuple[float, float] = (1.0, 16.0),
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        shape = (in_shape,) if isinstance(in_shape, int) else tuple(in_shape)
        if len(shape) not in (1, 2) or out_dim < 1:
            raise ConfigError(f"FracSSMNet takes token sequences (L,) or series (L, features) and out_dim >= 1, got "
                              f"in_shape {shape}, out_dim {out_dim}")
        # built in Python the Literal is not checked by the CLI: say the choices here
        if kernel not in typing.get_args(Kernel):
            raise ConfigError(f"kernel must be one of {list(typing.get_args(Kernel))}, got {kernel!r}")
        if kernel == "exp":  # equal state: K modes of N states become one mode of N K states
            d_state, n_modes = d_state * n_modes, 1
        elif n_modes < 2:
            raise ConfigError(f"kernel='frac' needs n_modes >= 2 (a quadrature in log s), got {n_modes}")
        self.d_model, self.out_dim = d_model, out_dim
        # built before the input and output layers: the order the initialisation draws its numbers in
        self.backbone = SelectiveSSMStack(
            d_model, n_layers, d_state=d_state, kernel=kernel, n_modes=n_modes, s_min=s_min, s_max=s_max,
            alpha_init=alpha_init, expand=expand, d_conv=d_conv, dt_min=dt_min, dt_max=dt_max,
            lam_init=tuple(lam_init), chunk_size=chunk_size,
        )
        self.tokens = len(shape) == 1
        if self.tokens:
            self.embedding = nn.Embedding(out_dim, d_model)
            nn.init.normal_(self.embedding.weight, std=0.02)
        else:
            self.n_features = int(shape[-1])
            self.inp = nn.Linear(self.n_features, d_model)
            self.out = nn.Linear(d_model, out_dim)

    def embed(self, x: Tensor) -> Tensor:
        """Tokens ``(B, L)`` or series ``(B, L, F)`` (any length L) -> ``(B, L, d_model)``."""
        if self.tokens:
            tokens = x.long()
            if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.out_dim):
                raise ConfigError(f"tokens must lie in [0, {self.out_dim}), got [{int(tokens.min())}, "
                                  f"{int(tokens.max())}]: vocab_size does not match the data")
            return self.embedding(tokens)
        if x.dim() != 3 or x.shape[-1] != self.n_features:
            raise ConfigError(f"series must be (B, L, {self.n_features}), got {tuple(x.shape)}")
        return self.inp(x.float())

    def head(self, h: Tensor) -> Tensor:
        """``(..., d_model) -> (..., out_dim)``: the tied embedding for tokens, a linear layer for series."""
        return h @ self.embedding.weight.T if self.tokens else self.out(h)

    def hidden(self, x: Tensor) -> Tensor:
        """The backbone's output ``(B, L, d_model)`` (before the head)."""
        return self.backbone(self.embed(x))

    def forward(self, x: Tensor) -> Tensor:
        """``(B, L, out_dim)``."""
        return self.head(self.hidden(x))
