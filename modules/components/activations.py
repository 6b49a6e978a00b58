"""Activation functions selectable by name from a config.

Besides the standard ones, the squared activations of paper 000-09 (Bug or Feature²):
``relu2(x) = relu(x)^2``, ``gelu2(x) = gelu(x)^2`` and their clipped variants ``min(phi(x)^2, c)``
(c = 50 in the authors' code). Clipping is on the squared output, and the gradient is zero where the clip
is active, which is what ``torch.clamp`` gives.

Every activation class says whether it is *positively biased* (``positive_bias``): ``E[phi(z)] > 0`` for
``z ~ N(0, 1)``, which is what makes the weights reading it drift negative (paper 000-09). Diagnostics read
the attribute through ``activation_bias``; a new activation is classified by setting it on its class.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError

DEFAULT_CLIP = 50.0


class ReLU(nn.ReLU):
    positive_bias: ClassVar[bool] = True


class GELU(nn.GELU):
    positive_bias: ClassVar[bool] = True


class SiLU(nn.SiLU):
    positive_bias: ClassVar[bool] = True


class Tanh(nn.Tanh):
    positive_bias: ClassVar[bool] = False


class Identity(nn.Identity):
    positive_bias: ClassVar[bool] = False


class _Squared(nn.Module):
    """``base(x)^2``, clipped at ``clip`` when ``clip`` is not None: ``min(base(x)^2, clip)``."""

    base = staticmethod(torch.relu)
    positive_bias: ClassVar[bool] = True

    def __init__(self, clip: float | None = None) -> None:
        super().__init__()
        if clip is not None and clip <= 0:
            raise ConfigError(f"clip must be positive, got {clip}")
        self.clip = clip

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x).square()
        return y if self.clip is None else torch.clamp(y, max=self.clip)

    def extra_repr(self) -> str:
        return f"clip={self.clip}"


class ReLU2(_Squared):
    """``relu(x)^2``, clipped at ``clip`` when ``clip`` is not None: ``min(relu(x)^2, clip)``."""

    base = staticmethod(torch.relu)


class GELU2(_Squared):
    """``gelu(x)^2`` (exact erf GELU), clipped at ``clip`` when ``clip`` is not None."""

    base = staticmethod(F.gelu)


class QuantileReLU(nn.Module):
    """``relu(x - q_s(x))`` with ``q_s`` the per-sample ``sparsity``-quantile over the last dimension.

    Forces a fraction ``sparsity`` of exact zeros in every sample (the authors' QuantileReLU sweeps); the
    threshold is treated as a constant in the backward pass.
    """

    positive_bias: ClassVar[bool] = True

    def __init__(self, sparsity: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= sparsity < 1.0:
            raise ConfigError(f"sparsity must be in [0, 1), got {sparsity}")
        self.sparsity = sparsity

    def forward(self, x: Tensor) -> Tensor:
        if self.sparsity == 0.0:
            return torch.relu(x - x.detach().amin(dim=-1, keepdim=True))
        q = torch.quantile(x.detach().float(), self.sparsity, dim=-1, keepdim=True).to(x.dtype)
        return torch.relu(x - q)

    def extra_repr(self) -> str:
        return f"sparsity={self.sparsity}"


_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "relu": ReLU,
    "gelu": GELU,
    "silu": SiLU,
    "tanh": Tanh,
    "identity": Identity,
    "relu2": lambda: ReLU2(None),
    "relu2_clip": lambda clip=DEFAULT_CLIP: ReLU2(clip),
    "gelu2": lambda: GELU2(None),
    "gelu2_clip": lambda clip=DEFAULT_CLIP: GELU2(clip),
    "quantile_relu": lambda sparsity=0.5: QuantileReLU(sparsity),
}

# torch's own activation classes, for modules built without this registry (positive_bias of each).
_TORCH_BIAS: dict[type[nn.Module], bool] = {
    nn.ReLU: True, nn.GELU: True, nn.SiLU: True, nn.ReLU6: True, nn.Softplus: True, nn.ELU: True,
    nn.Tanh: False, nn.Identity: False, nn.Hardtanh: False, nn.Softsign: False,
}


def activation_names() -> list[str]:
    return sorted(_REGISTRY)


def get_activation(name: str, clip: float | None = None, sparsity: float | None = None) -> nn.Module:
    """A fresh activation module by name (see ``activation_names()``).

    ``clip`` sets the clip value of ``relu2_clip`` / ``gelu2_clip`` (default 50) and ``sparsity`` the forced
    zero fraction of ``quantile_relu`` (default 0.5); other names reject them.
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown activation {name!r}; choose one of {activation_names()}") from None
    if clip is not None and not name.endswith("_clip"):
        raise ConfigError(f"clip={clip} only applies to relu2_clip / gelu2_clip, not {name!r}")
    if sparsity is not None and name != "quantile_relu":
        raise ConfigError(f"sparsity={sparsity} only applies to quantile_relu, not {name!r}")
    if clip is not None:
        return factory(clip)
    if sparsity is not None:
        return factory(sparsity)
    return factory()


#: the keyword arguments an activation takes from a config's ``activation_args``
ACTIVATION_ARGS = ("clip", "sparsity")


def make_activation(name: str, args: Mapping[str, float] | None = None) -> nn.Module:
    """``get_activation(name, **args)`` for the ``activation_args`` mapping of a config
    (``{clip: 8.0}`` for ``relu2_clip`` / ``gelu2_clip``, ``{sparsity: 0.9}`` for ``quantile_relu``)."""
    args = dict(args or {})
    unknown = sorted(set(args) - set(ACTIVATION_ARGS))
    if unknown:
        raise ConfigError(
            f"activation_args {unknown} unknown: an activation takes {list(ACTIVATION_ARGS)} "
            "(clip for relu2_clip / gelu2_clip, sparsity for quantile_relu)"
        )
    return get_activation(name, **{k: float(v) for k, v in args.items()})


def activation_bias(module: nn.Module) -> bool | None:
    """True for an activation with ``E[phi(z)] > 0`` under symmetric ``z`` (relu, gelu, silu, squares),
    False for a symmetric one (tanh, identity), None when ``module`` is not a known activation."""
    declared = getattr(type(module), "positive_bias", None)
    if declared is not None:
        return bool(declared)
    for cls in type(module).__mro__:
        if cls in _TORCH_BIAS:
            return _TORCH_BIAS[cls]
    return None


def is_positively_biased(module: nn.Module) -> bool:
    """Whether ``module`` is an activation with E[phi(z)] > 0 for symmetric z (relu, gelu, silu, squares)."""
    return activation_bias(module) is True
