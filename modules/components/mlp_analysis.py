"""Layer-by-layer access to an ``MLP`` for the methods that analyse one in closed form (papers 002-05, 002-06,
004-10): its affine maps, its activation, random nets to study, function-preserving rescalings of hidden
neurons, and input Jacobians.

Convention: an ``MLP`` with hidden widths ``n_1 .. n_l`` computes ``x -> W_l phi(... phi(W_0 x + b_0) ...) + b_l``;
``affine_layers`` returns ``[(W_0, b_0), ..., (W_l, b_l)]`` in ``nn.Linear``'s layout (``W_i`` is
``(n_{i+1}, n_i)``), which is also the order of ``net.parameters()``.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from errors import ConfigError
from modules.components.mlp import MLP

# Activations with phi(a z) = a phi(z) for a > 0: scaling a hidden neuron's incoming weights and bias by a and its
# outgoing weights by 1/a leaves the function unchanged only for these.
POSITIVELY_HOMOGENEOUS = ("relu", "identity")


def _linears(net: MLP) -> list[nn.Linear]:
    if not isinstance(net, MLP):
        raise ConfigError(f"expected a modules.components.mlp.MLP, got {type(net).__name__}")
    return [m for m in net.layers if isinstance(m, nn.Linear)]


def affine_layers(net: MLP) -> list[tuple[Tensor, Tensor]]:
    """``[(W_i, b_i)]`` of every linear layer, input to output: the live parameters (detach to analyse them);
    a layer built without bias gets a zero bias of the weight's dtype."""
    out = []
    for lin in _linears(net):
        b = lin.bias if lin.bias is not None else torch.zeros(lin.out_features, dtype=lin.weight.dtype)
        out.append((lin.weight, b))
    return out


def activation_name(net: MLP) -> str:
    """The registry name of the activation after every hidden layer (``relu``, ``gelu``, ...)."""
    _linears(net)
    return net.activation_name


def random_mlp(
    widths: Sequence[int],
    activation: str = "relu",
    seed: int = 0,
    scale: float = 1.0,
    bias_scale: float = 0.0,
    dtype: torch.dtype = torch.float64,
) -> MLP:
    """An ``MLP`` ``widths[0] -> widths[1] -> ... -> widths[-1]`` with weights ``N(0, scale^2 / fan_in)`` and
    biases ``N(0, bias_scale^2)`` (zero by default), drawn from ``seed`` alone (the global RNG is untouched)."""
    if len(widths) < 2:
        raise ConfigError(f"random_mlp needs at least an input and an output width, got {list(widths)}")
    if scale <= 0 or bias_scale < 0:
        raise ConfigError(f"scale must be > 0 and bias_scale >= 0, got scale={scale}, bias_scale={bias_scale}")
    net = MLP(widths[0], widths[-1], hidden=list(widths[1:-1]), activation=activation).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in _linears(net):
            fan_in = lin.in_features
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=dtype) * scale / fan_in**0.5)
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen, dtype=dtype) * bias_scale)
    return net


def rescale_hidden(net: MLP, log_alpha: Sequence[Tensor]) -> MLP:
    """A copy of ``net`` with hidden neuron j of layer i scaled by ``alpha = exp(log_alpha[i][j])``: its incoming
    row and bias times alpha, its outgoing column divided by alpha. The function is unchanged for positively
    homogeneous activations (relu, identity), which is the symmetry the gamma-canonical Laplace removes."""
    linears = _linears(net)
    act = activation_name(net)
    if act not in POSITIVELY_HOMOGENEOUS:
        raise ConfigError(
            f"rescaling hidden neurons preserves the function only for {POSITIVELY_HOMOGENEOUS}, not {act!r}"
        )
    if len(log_alpha) != len(linears) - 1:
        raise ConfigError(f"log_alpha needs one tensor per hidden layer ({len(linears) - 1}), got {len(log_alpha)}")
    out = copy.deepcopy(net)
    out_linears = _linears(out)
    with torch.no_grad():
        for i, la in enumerate(log_alpha):
            producer, consumer = out_linears[i], out_linears[i + 1]
            if la.shape != (producer.out_features,):
                raise ConfigError(f"log_alpha[{i}] must have shape ({producer.out_features},), got {tuple(la.shape)}")
            alpha = la.to(producer.weight.dtype).exp()
            producer.weight.mul_(alpha[:, None])
            if producer.bias is not None:
                producer.bias.mul_(alpha)
            consumer.weight.div_(alpha[None, :])
    return out


def input_jacobians(net: nn.Module, x: Tensor) -> Tensor:
    """``d net(x_n) / d x_n`` for every row of ``x`` (N, d): a tensor (N, out, d)."""
    if x.dim() != 2:
        raise ConfigError(f"input_jacobians expects inputs (N, d), got shape {tuple(x.shape)}")

    def one(xi: Tensor) -> Tensor:
        return net(xi[None])[0]

    return torch.func.vmap(torch.func.jacrev(one))(x)
