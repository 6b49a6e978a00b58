"""Shared components: activations against closed forms, TinyGPT causality and shapes, ResNet/ViT shapes."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from modules.components.activations import activation_names, get_activation, is_positively_biased
from modules.components.tiny_gpt import TinyGPT


def _gelu_ref(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _gelu_grad_ref(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) + x * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _default_width(w: float = 1.0) -> float:
    """The width ``softplus(raw) + 1e-3`` a module holds for an initial ``w``: ``raw`` is the softplus
    pre-image of ``w - 1e-3``, stored as a float32 parameter."""
    y = w - 1e-3
    raw = struct.unpack("f", struct.pack("f", y + math.log(-math.expm1(-y))))[0]
    return math.log1p(math.exp(raw)) + 1e-3


_D = _default_width()  # CauchyAct's d and GaussianAct's a at their default 1


# closed forms (value, derivative) written from scratch with the math module, never torch
_REFS = {
    "relu": (lambda x: max(x, 0.0), lambda x: 1.0 if x > 0 else 0.0),
    "gelu": (_gelu_ref, _gelu_grad_ref),
    "silu": (
        lambda x: x / (1 + math.exp(-x)),
        lambda x: (1 / (1 + math.exp(-x))) * (1 + x * (1 - 1 / (1 + math.exp(-x)))),
    ),
    "tanh": (math.tanh, lambda x: 1 - math.tanh(x) ** 2),
    "identity": (lambda x: x, lambda x: 1.0),
    "relu2": (lambda x: max(x, 0.0) ** 2, lambda x: 2 * max(x, 0.0)),
    "relu2_clip": (
        lambda x: min(max(x, 0.0) ** 2, 50.0),
        lambda x: 2 * max(x, 0.0) if max(x, 0) ** 2 < 50 else 0.0,
    ),
    "gelu2": (lambda x: _gelu_ref(x) ** 2, lambda x: 2 * _gelu_ref(x) * _gelu_grad_ref(x)),
    "gelu2_clip": (
        lambda x: min(_gelu_ref(x) ** 2, 50.0),
        lambda x: 2 * _gelu_ref(x) * _gelu_grad_ref(x) if _gelu_ref(x) ** 2 < 50 else 0.0,
    ),
    # the trainable local activations at their initial parameters (lambda1 = lambda2 = 1, d = a = 1)
    "cauchy": (
        lambda x: (x + 1) / (x * x + _D * _D),
        lambda x: ((x * x + _D * _D) - 2 * x * (x + 1)) / (x * x + _D * _D) ** 2,
    ),
    "gaussian": (lambda x: math.exp(-x * x / (2 * _D * _D)), lambda x: -x / _D**2 * math.exp(-x * x / (2 * _D * _D))),
    "sine": (lambda x: math.sin(30 * x), lambda x: 30 * math.cos(30 * x)),  # SIREN's default w0 = 30
}

# avoid the kinks (0 for relu, sqrt(50) for the clip) where the derivative is not defined
_POINTS = [-9.0, -3.3, -1.2, -0.4, 0.3, 1.1, 2.5, 6.9, 7.3, 11.0]


def test_registry_complete():
    assert set(activation_names()) == set(_REFS) | {"quantile_relu"}


@pytest.mark.parametrize("s", [0.0, 0.25, 0.7, 0.9])
def test_quantile_relu_forces_sparsity(s):
    x = torch.randn(50, 200, generator=torch.Generator().manual_seed(0))
    y = get_activation("quantile_relu", sparsity=s)(x)
    frac = (y == 0).double().mean(1)
    assert (frac - s).abs().max() <= 1.5 / 200  # exactly s up to the quantile's interpolation
    # brute force: the threshold is the per-row s-quantile of the sorted row (linear interpolation)
    srt = x.sort(1).values
    pos = s * 199
    lo, hi = int(pos), min(int(pos) + 1, 199)
    thr = srt[:, lo] + (pos - lo) * (srt[:, hi] - srt[:, lo])
    assert torch.allclose(y, torch.relu(x - thr[:, None]), atol=1e-6)


@pytest.mark.parametrize("name", sorted(_REFS))
def test_activation_values_and_gradients(name):
    f, df = _REFS[name]
    x = torch.tensor(_POINTS, dtype=torch.float64, requires_grad=True)
    y = get_activation(name).double()(x)  # float64 parameters for the trainable ones
    y.sum().backward()
    for xi, yi, gi in zip(_POINTS, y.tolist(), x.grad.tolist()):
        assert yi == pytest.approx(f(xi), rel=1e-9, abs=1e-12), (name, xi)
        assert gi == pytest.approx(df(xi), rel=1e-7, abs=1e-10), (name, xi)


def test_clip_value_configurable_and_validated():
    act = get_activation("relu2_clip", clip=4.0)
    x = torch.tensor([1.0, 1.9, 2.1, 10.0], requires_grad=True)
    y = act(x)
    y.sum().backward()
    assert y.tolist() == pytest.approx([1.0, 3.61, 4.0, 4.0])
    assert x.grad.tolist() == pytest.approx([2.0, 3.8, 0.0, 0.0])
    assert get_activation("relu2_clip")(torch.tensor([100.0])).item() == 50.0
    with pytest.raises(ValueError, match="only applies"):
        get_activation("relu", clip=3.0)
    with pytest.raises(ValueError, match="unknown activation"):
        get_activation("swish9")
    with pytest.raises(ValueError, match="positive"):
        get_activation("gelu2_clip", clip=-1.0)
    with pytest.raises(ValueError, match="only applies to quantile_relu"):
        get_activation("relu", sparsity=0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        get_activation("quantile_relu", sparsity=1.0)


def test_positive_bias_flag():
    assert is_positively_biased(get_activation("gelu")) and is_positively_biased(get_activation("relu2_clip"))
    assert not is_positively_biased(get_activation("tanh")) and not is_positively_biased(
        get_activation("identity")
    )


# --- the registry: one entry per activation, its positive_bias and slope_bounds ---------------------------------


class _Ramp(torch.nn.Module):
    """``clamp((x + 1 + shift) / 2, 0, 1)``: E > 0, slope 1/2 inside the ramp and 0 outside."""

    positive_bias = True
    slope_bounds = (0.0, 0.5)

    def __init__(self, shift: float = 0.0) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x + 1 + self.shift) / 2).clamp(0, 1)


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in the test are undone after it."""
    from modules.components import activations

    monkeypatch.setattr(activations, "_REGISTRY", dict(activations._REGISTRY))
    monkeypatch.setattr(activations, "_CLASS_TRAITS", dict(activations._CLASS_TRAITS))


def test_register_an_activation_round_trip(scratch_registry):
    from errors import ConfigError
    from modules.components.activations import (
        Tanh,
        activation_bias,
        activation_slope_bounds,
        activation_spec,
        make_activation,
        register_activation,
    )

    spec = register_activation("ramp", _Ramp)  # traits read from the class
    assert (spec.positive_bias, spec.slope_bounds, spec.args) == (True, (0.0, 0.5), ("shift",))
    assert "ramp" in activation_names() and activation_spec("ramp") is spec
    ramp = get_activation("ramp", shift=1.0)
    assert isinstance(ramp, _Ramp) and ramp.shift == 1.0
    assert activation_bias(ramp) is True and activation_slope_bounds(ramp) == (0.0, 0.5)
    assert make_activation("ramp", {"shift": 2}).shift == 2.0
    with pytest.raises(ConfigError, match="shift=1.0 only applies to ramp, not 'relu'"):
        get_activation("relu", shift=1.0)
    with pytest.raises(ConfigError, match="already registered"):
        register_activation("ramp", _Ramp)
    # a class that declares nothing: the values given are recorded for it, so its modules say the same
    soft = register_activation("softplus", torch.nn.Softplus, slope_bounds=(0.0, 1.0))
    assert (soft.positive_bias, soft.slope_bounds) == (True, (0.0, 1.0))
    assert activation_slope_bounds(get_activation("softplus", beta=2.0)) == (0.0, 1.0)
    with pytest.raises(ConfigError, match="contradicts"):
        register_activation("tanh_biased", Tanh, positive_bias=True)
    with pytest.raises(ConfigError, match="factory must be"):
        register_activation("anonymous", lambda: torch.nn.Tanh())
    with pytest.raises(ConfigError, match="lo <= hi"):
        register_activation("logsigmoid", torch.nn.LogSigmoid, slope_bounds=(1.0, 0.0))


def _bounded_activations() -> list[tuple[str, torch.nn.Module]]:
    """Every registered activation with slope bounds, and torch's own classes the registry knows bounds of."""
    from modules.components.activations import activation_slope_bounds

    torch_acts = [torch.nn.ReLU(), torch.nn.ReLU6(), torch.nn.Hardtanh(), torch.nn.Softsign(), torch.nn.Tanh()]
    acts = [(n, get_activation(n)) for n in activation_names()] + [(type(m).__name__, m) for m in torch_acts]
    return [(n, m) for n, m in acts if activation_slope_bounds(m) is not None]


def test_the_standard_activations_declare_their_slope_bounds():
    from modules.components.activations import activation_spec

    bounds = {n: activation_spec(n).slope_bounds for n in activation_names()}
    assert (bounds["relu"], bounds["tanh"], bounds["identity"]) == ((0.0, 1.0), (0.0, 1.0), (1.0, 1.0))
    assert bounds["gelu"] is bounds["silu"] is None
    assert all(bounds[n] is None for n in ("relu2", "relu2_clip", "gelu2", "gelu2_clip"))
    assert {n for n, _ in _bounded_activations()} >= {"relu", "tanh", "identity", "ReLU6", "Hardtanh", "Softsign"}


@pytest.mark.parametrize("name, act", [pytest.param(n, m, id=n) for n, m in _bounded_activations()])
def test_slope_bounds_hold_on_a_dense_grid(name, act):
    """Difference quotients of phi over a fine grid (mean values of phi', so inside any bound on phi')."""
    from modules.components.activations import activation_slope_bounds

    lo, hi = activation_slope_bounds(act)
    x = torch.linspace(-12, 12, 240_001, dtype=torch.float64)
    with torch.no_grad():
        y = act(x)
    slopes = (y[1:] - y[:-1]) / (x[1:] - x[:-1])
    assert slopes.min().item() >= lo - 1e-9 and slopes.max().item() <= hi + 1e-9, (name, slopes.min(), slopes.max())
    if name in ("relu", "tanh", "identity"):  # tight: both bounds are reached (tanh's 0 only as |x| grows)
        assert slopes.min().item() == pytest.approx(lo, abs=1e-6) and slopes.max().item() == pytest.approx(hi, abs=1e-6)


# --- one make_norm ---------------------------------------------------------------------------------------------


def test_make_norm_builds_every_kind_and_nets_narrow_the_choice():
    from typing import get_args

    from errors import ConfigError
    from modules.components import norms
    from modules.components.norms import ChannelNorm, Norm, TokenNorm, make_norm
    from modules.components.resnet import ResNet
    from modules.components.vit import ViT

    assert set(norms._BUILDERS) == set(get_args(Norm)) == set(get_args(TokenNorm)) | set(get_args(ChannelNorm))
    ln = make_norm("layernorm", 8, bias=False)
    assert type(ln) is torch.nn.LayerNorm and ln.bias is None and ln.normalized_shape == (8,)
    assert make_norm("layernorm", 8).bias is not None
    rms = make_norm("rmsnorm", 8)
    assert type(rms) is torch.nn.RMSNorm and rms.normalized_shape == (8,)
    bn = make_norm("batch", 4)
    assert type(bn) is torch.nn.BatchNorm2d and bn.num_features == 4
    gn = make_norm("group", 6, groups=3)
    assert type(gn) is torch.nn.GroupNorm and (gn.num_groups, gn.num_channels) == (3, 6)
    x = torch.randn(2, 6, 3, 3)
    assert gn(x).shape == x.shape and make_norm("batch", 6)(x).shape == x.shape
    with pytest.raises(ConfigError, match="do not split into norm_groups=4"):
        make_norm("group", 6, groups=4)
    with pytest.raises(ConfigError, match="norm must be 'layernorm', 'rmsnorm', 'batch' or 'group', got 'bn'"):
        make_norm("bn", 4)
    with pytest.raises(ConfigError, match="norm must be 'layernorm' or 'rmsnorm', got 'batch'"):
        TinyGPT(norm="batch")
    with pytest.raises(ConfigError, match="norm must be 'layernorm' or 'rmsnorm', got 'group'"):
        ViT(norm="group")
    with pytest.raises(ConfigError, match="norm must be 'batch' or 'group', got 'layernorm'"):
        ResNet(norm="layernorm")
    resnet = ResNet(widths=(4, 8), norm="group", norm_groups=2)
    assert sum(isinstance(m, torch.nn.GroupNorm) for m in resnet.modules()) == 1 + 2 * 2 + 1
    assert type(TinyGPT(norm="rmsnorm").ln_f) is torch.nn.RMSNorm and type(ViT(norm="rmsnorm").ln) is torch.nn.RMSNorm


def test_tiny_gpt_shapes_names_and_causality():
    torch.manual_seed(0)
    model = TinyGPT(activation="relu2_clip").eval()
    idx = torch.randint(0, 128, (2, 20))
    logits = model(idx)
    assert logits.shape == (2, 20, 128)
    names = dict(model.named_modules())
    for i in range(3):
        assert isinstance(names[f"blocks.{i}.mlp.fc"], torch.nn.Linear)
        assert isinstance(names[f"blocks.{i}.mlp.proj"], torch.nn.Linear)
        assert names[f"blocks.{i}.mlp.proj"].in_features == 4 * 48
    assert model.head.weight is model.tok_emb.weight
    t = 11
    idx2 = idx.clone()
    idx2[:, t] = (idx2[:, t] + 7) % 128
    out2 = model(idx2)
    assert torch.equal(logits[:, :t], out2[:, :t])  # the past cannot see the future
    assert (logits[:, t:] - out2[:, t:]).abs().max() > 1e-4  # and the change does propagate forward
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_tiny_gpt_untied_and_trains():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=16, block_size=8, n_layer=1, n_head=2, n_embd=16, tie_weights=False)
    assert model.head.weight is not model.tok_emb.weight
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    idx = torch.arange(9).remainder(16).repeat(4, 1)
    first = None
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_resnet_and_vit_shapes_and_errors():
    from modules.components.resnet import ResNet
    from modules.components.vit import ViT

    torch.manual_seed(0)
    x = torch.rand(3, 1, 8, 8)
    resnet = ResNet(widths=(4, 8, 16), blocks_per_stage=2, activation="gelu")
    assert resnet(x).shape == (3, 10)
    assert sum(isinstance(m, torch.nn.GELU) for m in resnet.modules()) == 1 + 3 * 2 * 2
    assert ResNet((3, 32, 32), num_classes=5)(torch.rand(2, 3, 32, 32)).shape == (2, 5)
    assert ResNet(3, 5)(torch.rand(2, 3, 16, 16)).shape == (2, 5)  # a channel count is enough
    vit = ViT(dim=12, heads=2, depth=2, activation="relu2_clip")
    assert vit(x).shape == (3, 10)
    assert not vit.blocks[0].attn.causal  # a ViT token sees every patch
    with pytest.raises(ValueError, match="image_shape"):
        resnet(torch.rand(3, 64))
    with pytest.raises(ValueError, match="image_shape"):
        vit(torch.rand(3, 64))
    with pytest.raises(ValueError, match="divide"):
        ViT((1, 8, 8), patch_size=3)
    with pytest.raises(ValueError, match="image_shape"):
        ViT((64,))  # flat samples: the data module must give images


def test_vit_attention_is_not_causal():
    from modules.components.vit import ViT

    torch.manual_seed(0)
    vit = ViT(dim=12, heads=2, depth=1).eval()
    x = torch.rand(1, 1, 8, 8)
    x2 = x.clone()
    x2[..., -2:, -2:] += 1.0  # the last patch: the [CLS] token (position 0) must still see it
    assert (vit(x) - vit(x2)).abs().max() > 1e-5


# --- the norm choice of the transformers (paper 000-09: LayerNorm hides the drift) ---------------------------


def _relative_mean_grads(model, loss_of) -> dict[str, float]:
    """``mean(dL/dW) / mean|dL/dW|`` of every ``attn.qkv``/``attn.proj``/``mlp.fc``/``mlp.proj`` weight."""
    model.zero_grad()
    loss_of(model).backward()
    return {
        n: (p.grad.double().mean() / p.grad.double().abs().mean()).item()
        for n, p in model.named_parameters()
        if n.endswith(("attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight"))
    }


def _gpt_loss(m):
    idx = torch.randint(0, 128, (8, 33), generator=torch.Generator().manual_seed(1))
    return torch.nn.functional.cross_entropy(m(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())


def _vit_loss(m):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.rand(16, 1, 8, 8, generator=gen), torch.randint(0, 10, (16,), generator=gen)
    return torch.nn.functional.cross_entropy(m(x), y)


@pytest.mark.parametrize("arch", ["gpt", "vit"])
def test_layernorm_zeroes_the_mean_gradient_rmsnorm_does_not(arch):
    """LayerNorm's backward removes the feature mean, so the residual-writing layers (attn.proj, mlp.proj) get
    weight-gradient columns summing to zero, and the layers reading a LayerNorm output (qkv, fc) read
    zero-mean features at init: their mean gradient is 0 up to float32 rounding. RMSNorm has neither."""
    from modules.components.vit import ViT

    rel = {}
    for norm in ("layernorm", "rmsnorm"):
        torch.manual_seed(0)
        if arch == "gpt":
            model = TinyGPT(block_size=32, n_layer=2, n_embd=24, n_head=2, activation="relu", norm=norm)
            rel[norm] = _relative_mean_grads(model, _gpt_loss)
        else:
            model = ViT(dim=24, depth=2, heads=2, activation="relu", norm=norm)
            rel[norm] = _relative_mean_grads(model, _vit_loss)
        expected = torch.nn.LayerNorm if norm == "layernorm" else torch.nn.RMSNorm
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm)]
        assert len(norms) == 2 * 2 + 1 and all(type(m) is expected for m in norms)
    assert len(rel["layernorm"]) == 2 * 4
    # float32 rounding of a sum of ~1e3 terms: ~1e-7 relative; the measured values are ~1e-8
    assert max(abs(v) for v in rel["layernorm"].values()) < 1e-5, rel["layernorm"]
    # RMSNorm: 1e-3 .. 2e-1 of the mean |gradient| (measured), two orders of magnitude above the bound
    assert sum(abs(v) for v in rel["rmsnorm"].values()) / len(rel["rmsnorm"]) > 1e-3, rel["rmsnorm"]
    assert min(abs(v) for v in rel["rmsnorm"].values()) > 1e-5, rel["rmsnorm"]


def test_norm_default_is_layernorm_and_bad_choice_fails():
    from modules.components.vit import ViT

    assert type(TinyGPT().blocks[0].ln_1) is torch.nn.LayerNorm and type(TinyGPT().ln_f) is torch.nn.LayerNorm
    assert type(ViT().ln) is torch.nn.LayerNorm
    with pytest.raises(ValueError, match="norm must be one of|norm must be"):
        TinyGPT(norm="batchnorm")


def test_activation_args_reach_the_activation():
    from modules.components.mlp import MLP
    from modules.components.vit import ViT

    mlp = MLP(16, 3, hidden=[200, 200], activation="quantile_relu", activation_args={"sparsity": 0.9})
    acts = [m for m in mlp.layers if type(m).__name__ == "QuantileReLU"]
    assert len(acts) == 2 and all(a.sparsity == 0.9 for a in acts)
    h = mlp.layers[:2](torch.randn(32, 16, generator=torch.Generator().manual_seed(0)))
    assert (h == 0).double().mean().item() == pytest.approx(0.9, abs=1.5 / 200)
    assert MLP(16, 3, activation="relu2_clip", activation_args={"clip": 4.0}).layers[1].clip == 4.0
    assert MLP(16, 3, activation="relu2_clip").layers[1].clip == 50.0  # the default is unchanged
    gpt = TinyGPT(n_layer=1, activation="relu2_clip", activation_args={"clip": 4.0})
    assert gpt.blocks[0].mlp.act.clip == 4.0
    assert ViT(dim=12, heads=2, depth=1, activation="gelu2_clip", activation_args={"clip": 2.0}).blocks[0].mlp.act.clip == 2.0
    with pytest.raises(ValueError, match="activation_args"):
        MLP(16, 3, activation="relu", activation_args={"slope": 0.1})
    with pytest.raises(ValueError, match="only applies"):
        MLP(16, 3, activation="relu", activation_args={"sparsity": 0.5})
