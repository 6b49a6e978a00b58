"""Normalisation layers selectable by name: one ``Norm`` literal, one ``make_norm``.

Two families, by what they normalise:

- ``TokenNorm``, the features of tokens ``(..., dim)``: ``layernorm`` (``nn.LayerNorm``: subtract the mean,
  divide by the std, a gain and optionally a bias) and ``rmsnorm`` (``nn.RMSNorm``: divide by the root mean
  square, a gain only). The transformers (``TinyGPT``, ``ViT``) take these.
- ``ChannelNorm``, the channels of images ``(B, C, H, W)``: ``batch`` (``nn.BatchNorm2d``, running statistics)
  and ``group`` (``nn.GroupNorm``, per-sample statistics over groups of channels: no running statistics, which
  is federated learning's choice). ``ResNet`` takes these.

A network names the family it accepts (``make_norm(..., choices=TokenNorm)``), so that a norm that makes no
sense for it fails with the choices named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from torch import nn

from errors import ConfigError

TokenNorm = Literal["layernorm", "rmsnorm"]
ChannelNorm = Literal["batch", "group"]
Norm = Literal[TokenNorm, ChannelNorm]


def _group_norm(channels: int, bias: bool, groups: int) -> nn.Module:
    if channels % groups:
        raise ConfigError(f"GroupNorm: {channels} channels do not split into norm_groups={groups} groups")
    return nn.GroupNorm(groups, channels)


# norm -> (dim, bias, groups) -> module; every norm takes all three arguments and uses those it has
_BUILDERS: dict[str, Callable[[int, bool, int], nn.Module]] = {
    "layernorm": lambda dim, bias, groups: nn.LayerNorm(dim, bias=bias),
    "rmsnorm": lambda dim, bias, groups: nn.RMSNorm(dim),
    "batch": lambda dim, bias, groups: nn.BatchNorm2d(dim),
    "group": _group_norm,
}


def make_norm(norm: Norm, dim: int, *, bias: bool = True, groups: int = 2, choices: Any = Norm) -> nn.Module:
    """A fresh norm layer over ``dim`` features (tokens) or channels (images).

    Args:
        norm: ``layernorm`` (with a bias when ``bias``), ``rmsnorm`` (a gain, no bias), ``batch`` or ``group``
            (``groups`` groups, which must divide ``dim``).
        dim: the normalised size: a token's features or an image's channels.
        bias: LayerNorm's bias (the others ignore it).
        groups: GroupNorm's number of groups (the others ignore it).
        choices: the ``Literal`` of the norms the caller accepts (``TokenNorm``, ``ChannelNorm``; default all).
    """
    allowed = get_args(choices)
    if norm not in allowed:
        names = [repr(n) for n in allowed]
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise ConfigError(f"norm must be {listed}, got {norm!r}")
    return _BUILDERS[norm](dim, bias, groups)
