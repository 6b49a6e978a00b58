"""The activation registry: every activation a config can name, built by ``get_activation`` / ``make_activation``.

Registered (``activation_names()``):

- the standard ones: ``relu``, ``gelu``, ``silu``, ``tanh``, ``identity``;
- the squared activations of paper 000-09 (Bug or Feature²): ``relu2(x) = relu(x)^2``, ``gelu2(x) = gelu(x)^2``
  and their clipped variants ``min(phi(x)^2, c)`` (c = 50 in the authors' code). Clipping is on the squared
  output, and the gradient is zero where the clip is active, which is what ``torch.clamp`` gives;
- ``quantile_relu``: a ReLU that forces a fraction of exact zeros per sample;
- the local-basis activations of paper 000-02: ``cauchy`` (``CauchyAct``, XNet's Cauchy activation) and
  ``gaussian`` (``GaussianAct``), both with trainable shape parameters;
- ``sine``: SIREN's ``sin(w0 z)`` (``Sine``).

An entry is a factory (a class, or a ``functools.partial`` of one) and what is known about the function it
builds, declared on the class as class attributes and read by the registry:

- ``positive_bias``: ``E[phi(z)] > 0`` for ``z ~ N(0, 1)``, which is what makes the weights reading it drift
  negative (paper 000-09); False for a symmetric activation, None when it has no fixed sign (it depends on
  trainable parameters). Diagnostics read it through ``activation_bias``.
- ``slope_bounds``: global bounds ``(lo, hi)`` with ``lo <= phi'(x) <= hi`` for every x, for Lipschitz
  arguments (read through ``activation_slope_bounds``); None when there is none the class can state (an
  unbounded slope, as for the squares, or one that depends on the instance's parameters, as for ``sine``).
- ``shape_parameters``: the names of the scalar shape parameters a diagnostic may track (``CauchyAct``'s
  ``lambda1, lambda2, d``), read through ``declared_shape_parameters``.

The keyword arguments a name takes from a config (``activation_args``) are its factory's parameters.
``register_activation`` adds an activation.
"""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from errors import ConfigError

DEFAULT_CLIP = 50.0
D_MIN = 1e-3

#: global bounds ``(lo, hi)`` on an activation's derivative
SlopeBounds = tuple[float, float]


# --- softplus-parametrised positive parameters (the widths of CauchyAct, GaussianAct and the local bases) ------


def inverse_softplus(y: float) -> float:
    """``x`` with ``softplus(x) = y`` (y > 0)."""
    if y <= 0:
        raise ConfigError(f"a softplus-parametrised width must start positive, got {y}")
    return y + math.log(-math.expm1(-y))


def positive(raw: Tensor) -> Tensor:
    """``softplus(raw) + 1e-3``: a width that stays away from zero."""
    return F.softplus(raw) + D_MIN


# --- the activation classes ---------------------------------------------------------------------------------


class ReLU(nn.ReLU):
    """``max(x, 0)``."""

    positive_bias: ClassVar[bool | None] = True
    slope_bounds: ClassVar[SlopeBounds | None] = (0.0, 1.0)

    def __init__(self) -> None:  # no argument: a config's relu is torch's, out of place
        super().__init__()


class GELU(nn.GELU):
    """``x Phi(x)`` (exact erf GELU)."""

    positive_bias: ClassVar[bool | None] = True
    # bounded (gelu' lies in about [-0.17, 1.13]) but its extremes have no closed form: none is declared
    slope_bounds: ClassVar[SlopeBounds | None] = None

    def __init__(self) -> None:  # no argument: a config's gelu is the exact one, not the tanh approximation
        super().__init__()


class SiLU(nn.SiLU):
    """``x sigmoid(x)``."""

    positive_bias: ClassVar[bool | None] = True
    # bounded (silu' lies in about [-0.10, 1.10]) but, as for GELU, its extremes have no closed form
    slope_bounds: ClassVar[SlopeBounds | None] = None

    def __init__(self) -> None:  # no argument: a config's silu is torch's, out of place
        super().__init__()


class Tanh(nn.Tanh):
    """``tanh(x)``; ``tanh' = 1 - tanh^2`` lies in ``(0, 1]``."""

    positive_bias: ClassVar[bool | None] = False
    slope_bounds: ClassVar[SlopeBounds | None] = (0.0, 1.0)


class Identity(nn.Identity):
    """``x``: a linear network (the registry's ``identity``; a plain ``nn.Identity`` is a shortcut)."""

    positive_bias: ClassVar[bool | None] = False
    slope_bounds: ClassVar[SlopeBounds | None] = (1.0, 1.0)


class _Squared(nn.Module):
    """``base(x)^2``, clipped at ``clip`` when ``clip`` is not None: ``min(base(x)^2, clip)``."""

    base = staticmethod(torch.relu)
    positive_bias: ClassVar[bool | None] = True
    # the slope of a square grows without bound, and a clip's bound would depend on the instance's clip
    slope_bounds: ClassVar[SlopeBounds | None] = None

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

    positive_bias: ClassVar[bool | None] = True
    # not element-wise (the threshold depends on the whole sample), so no bound on a scalar derivative
    slope_bounds: ClassVar[SlopeBounds | None] = None

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


class CauchyAct(nn.Module):
    """``phi(x) = (lambda1 x + lambda2) / (x^2 + d^2)``, ``d = softplus(raw_d) + 1e-3``, element-wise: the Cauchy
    activation of XNet (Li, Xia, Zhang, arXiv 2409.19221).

    Args:
        lambda1, lambda2, d: initial values of the three trainable scalars (XNet: all 1).
    """

    # E[phi(z)] = lambda2 E[1 / (z^2 + d^2)] takes the sign of a trainable lambda2, and the slope scales with
    # lambda1 / d^2: neither is a property of the class
    positive_bias: ClassVar[bool | None] = None
    slope_bounds: ClassVar[SlopeBounds | None] = None
    shape_parameters: ClassVar[tuple[str, ...]] = ("lambda1", "lambda2", "d")

    def __init__(self, lambda1: float = 1.0, lambda2: float = 1.0, d: float = 1.0) -> None:
        super().__init__()
        if d <= D_MIN:
            raise ConfigError(f"CauchyAct's d must start above {D_MIN}, got {d}")
        self.lambda1 = nn.Parameter(torch.tensor(float(lambda1)))
        self.lambda2 = nn.Parameter(torch.tensor(float(lambda2)))
        self.raw_d = nn.Parameter(torch.tensor(inverse_softplus(d - D_MIN)))

    @property
    def d(self) -> Tensor:
        return positive(self.raw_d)

    def forward(self, x: Tensor) -> Tensor:
        d = self.d
        return (self.lambda1 * x + self.lambda2) / (x * x + d * d)

    def extra_repr(self) -> str:
        return f"lambda1={self.lambda1.item():.3g}, lambda2={self.lambda2.item():.3g}, d={self.d.item():.3g}"


class GaussianAct(nn.Module):
    """``exp(-x^2 / (2 a^2))`` with ``a = softplus(raw_a) + 1e-3`` (trainable unless ``trainable=False``)."""

    positive_bias: ClassVar[bool | None] = True
    # |phi'| <= 1 / (a sqrt(e)) (at x = +-a): a bound of the instance's trainable width, not of the class
    slope_bounds: ClassVar[SlopeBounds | None] = None
    shape_parameters: ClassVar[tuple[str, ...]] = ("a",)

    def __init__(self, a: float = 1.0, trainable: bool = True) -> None:
        super().__init__()
        raw = torch.tensor(inverse_softplus(a - D_MIN))
        if trainable:
            self.raw_a = nn.Parameter(raw)
        else:
            self.register_buffer("raw_a", raw)

    @property
    def a(self) -> Tensor:
        return positive(self.raw_a)

    def forward(self, x: Tensor) -> Tensor:
        return torch.exp(-0.5 * (x / self.a).square())


class Sine(nn.Module):
    """``sin(w0 z)``, SIREN's activation (Sitzmann et al. 2020)."""

    positive_bias: ClassVar[bool | None] = False  # odd, so symmetric: E[sin(w0 z)] = 0
    # w0 cos(w0 z) lies in [-w0, w0]: a bound of the instance's w0, not of the class
    slope_bounds: ClassVar[SlopeBounds | None] = None

    def __init__(self, w0: float = 30.0) -> None:
        super().__init__()
        self.w0 = w0

    def forward(self, z: Tensor) -> Tensor:
        return torch.sin(self.w0 * z)

    def extra_repr(self) -> str:
        return f"w0={self.w0}"


# --- what is known about classes that declare nothing (torch's own, or registered with explicit values) -------


class ActivationTraits(NamedTuple):
    """What an activation class is known to satisfy (see the module docstring)."""

    positive_bias: bool | None
    slope_bounds: SlopeBounds | None


# torch's own activation classes, for modules built without the registry. Slopes: relu6 and hardtanh are 1
# between their kinks and 0 outside, softsign' = 1 / (1 + |x|)^2; elu's and softplus's depend on alpha / beta.
_CLASS_TRAITS: dict[type[nn.Module], ActivationTraits] = {
    nn.ReLU: ActivationTraits(True, (0.0, 1.0)),
    nn.GELU: ActivationTraits(True, None),
    nn.SiLU: ActivationTraits(True, None),
    nn.ReLU6: ActivationTraits(True, (0.0, 1.0)),
    nn.Softplus: ActivationTraits(True, None),
    nn.ELU: ActivationTraits(True, None),
    nn.Tanh: ActivationTraits(False, (0.0, 1.0)),
    nn.Identity: ActivationTraits(False, (1.0, 1.0)),
    nn.Hardtanh: ActivationTraits(False, (0.0, 1.0)),
    nn.Softsign: ActivationTraits(False, (0.0, 1.0)),
}


def _trait(cls: type, name: str) -> typing.Any:
    """``cls``'s declared class attribute ``name``, else the value ``_CLASS_TRAITS`` records for it or a base,
    else None."""
    declared = getattr(cls, name, None)
    if declared is not None:
        return declared
    for base in cls.__mro__:
        if base in _CLASS_TRAITS:
            return getattr(_CLASS_TRAITS[base], name)
    return None


def activation_bias(module: nn.Module) -> bool | None:
    """True for an activation with ``E[phi(z)] > 0`` under symmetric ``z`` (relu, gelu, silu, squares),
    False for a symmetric one (tanh, identity), None when ``module`` is not a known activation."""
    bias = _trait(type(module), "positive_bias")
    return None if bias is None else bool(bias)


def is_positively_biased(module: nn.Module) -> bool:
    """Whether ``module`` is an activation with E[phi(z)] > 0 for symmetric z (relu, gelu, silu, squares)."""
    return activation_bias(module) is True


def activation_slope_bounds(module: nn.Module) -> SlopeBounds | None:
    """``(lo, hi)`` with ``lo <= phi'(x) <= hi`` for all x (relu ``(0, 1)``, identity ``(1, 1)``), None when
    ``module`` is not a known activation or its class states no bound."""
    return _trait(type(module), "slope_bounds")


def declared_shape_parameters(module: nn.Module) -> tuple[str, ...]:
    """The names of the scalar shape parameters ``module``'s class declares (``shape_parameters``), else ()."""
    return getattr(type(module), "shape_parameters", ())


# --- the registry -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActivationSpec:
    """A registered activation: its factory, what its class is known to satisfy, and the keyword arguments a
    config may give it (the factory's parameters)."""

    name: str
    factory: Callable[..., nn.Module]
    positive_bias: bool | None
    slope_bounds: SlopeBounds | None
    args: tuple[str, ...]


class _FromClass:
    """The default of ``register_activation``'s traits: read them from the class the factory builds."""

    def __repr__(self) -> str:
        return "FROM_CLASS"


FROM_CLASS = _FromClass()

_REGISTRY: dict[str, ActivationSpec] = {}


def _built_class(factory: Callable[..., nn.Module]) -> type[nn.Module]:
    """The class ``factory`` builds: itself, the class under a ``functools.partial``, or its return annotation."""
    target: typing.Any = factory
    while isinstance(target, partial):
        target = target.func
    if not isinstance(target, type):
        target = typing.get_type_hints(target).get("return")
    if not (isinstance(target, type) and issubclass(target, nn.Module)):
        raise ConfigError(f"an activation factory must be an nn.Module class, a partial of one or a function "
                          f"annotated with the class it returns; got {factory!r}")
    return target


def register_activation(
    name: str,
    factory: Callable[..., nn.Module],
    positive_bias: bool | None | _FromClass = FROM_CLASS,
    slope_bounds: SlopeBounds | None | _FromClass = FROM_CLASS,
) -> ActivationSpec:
    """Register ``factory`` under ``name`` and return its entry.

    ``positive_bias`` and ``slope_bounds`` default to what the built class declares (see the module
    docstring). Values given here must agree with a class that declares them; for a class that does not (a
    torch or third-party activation) they are recorded for the class, so that ``activation_bias`` and
    ``activation_slope_bounds`` of the modules it builds say the same as the registry.
    """
    if name in _REGISTRY:
        raise ConfigError(f"activation {name!r} is already registered")
    cls = _built_class(factory)
    traits = ActivationTraits(_trait(cls, "positive_bias"), _trait(cls, "slope_bounds"))
    given = ActivationTraits(positive_bias, slope_bounds)
    for field, known, value in zip(ActivationTraits._fields, traits, given):
        if value is not FROM_CLASS and known is not None and value != known:
            raise ConfigError(f"activation {name!r}: {field}={value} contradicts {cls.__name__}'s {known}")
    bias = traits.positive_bias if isinstance(positive_bias, _FromClass) else positive_bias
    bounds = traits.slope_bounds if isinstance(slope_bounds, _FromClass) else slope_bounds
    if bounds is not None:
        bounds = (float(bounds[0]), float(bounds[1]))
        if not bounds[0] <= bounds[1]:
            raise ConfigError(f"activation {name!r}: slope_bounds {bounds} need lo <= hi")
    if (bias, bounds) != tuple(traits):
        _CLASS_TRAITS[cls] = ActivationTraits(bias, bounds)
    args = tuple(
        p.name for p in inspect.signature(factory).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )
    spec = ActivationSpec(name, factory, bias, bounds, args)
    _REGISTRY[name] = spec
    return spec


register_activation("relu", ReLU)
register_activation("gelu", GELU)
register_activation("silu", SiLU)
register_activation("tanh", Tanh)
register_activation("identity", Identity)
register_activation("relu2", partial(ReLU2, None))  # clip bound positionally: relu2 takes no argument
register_activation("relu2_clip", partial(ReLU2, clip=DEFAULT_CLIP))  # clip a keyword with a new default
register_activation("gelu2", partial(GELU2, None))
register_activation("gelu2_clip", partial(GELU2, clip=DEFAULT_CLIP))
register_activation("quantile_relu", QuantileReLU)
register_activation("cauchy", CauchyAct)
register_activation("gaussian", GaussianAct)
register_activation("sine", Sine)


def activation_names() -> list[str]:
    return sorted(_REGISTRY)


def activation_spec(name: str) -> ActivationSpec:
    """The registry's entry for ``name`` (its factory, ``positive_bias``, ``slope_bounds`` and arguments)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown activation {name!r}; choose one of {activation_names()}") from None


def _arg_takers() -> dict[str, list[str]]:
    """Every keyword argument of a registered activation -> the names that take it, in registration order."""
    takers: dict[str, list[str]] = {}
    for spec in _REGISTRY.values():
        for arg in spec.args:
            takers.setdefault(arg, []).append(spec.name)
    return takers


def _describe_args(takers: Mapping[str, list[str]]) -> str:
    return ", ".join(f"{arg} for {' / '.join(names)}" for arg, names in takers.items())


def get_activation(name: str, /, **args: float | None) -> nn.Module:
    """A fresh activation module by name (see ``activation_names()``).

    ``args`` are the factory's keyword arguments, e.g. ``clip`` of ``relu2_clip`` / ``gelu2_clip`` (default
    50), ``sparsity`` of ``quantile_relu`` (default 0.5), ``w0`` of ``sine`` (default 30); None means the
    default. A name rejects the arguments its factory does not take.
    """
    spec = activation_spec(name)
    given = {k: v for k, v in args.items() if v is not None}
    for arg, value in given.items():
        if arg not in spec.args:
            takers = _arg_takers()
            if arg not in takers:
                raise ConfigError(f"{arg}={value} is no activation's argument; they take {_describe_args(takers)}")
            raise ConfigError(f"{arg}={value} only applies to {' / '.join(takers[arg])}, not {name!r}")
    return spec.factory(**given)


def make_activation(name: str, args: Mapping[str, float] | None = None) -> nn.Module:
    """``get_activation(name, **args)`` for the ``activation_args`` mapping of a config
    (``{clip: 8.0}`` for ``relu2_clip`` / ``gelu2_clip``, ``{sparsity: 0.9}`` for ``quantile_relu``)."""
    args = dict(args or {})
    takers = _arg_takers()
    unknown = sorted(set(args) - set(takers))
    if unknown:
        raise ConfigError(
            f"activation_args {unknown} unknown: an activation takes {list(takers)} ({_describe_args(takers)})"
        )
    return get_activation(name, **{k: float(v) for k, v in args.items()})
