"""Shared components: activations against closed forms, TinyGPT causality and shapes, ResNet/ViT shapes."""

from __future__ import annotations

import math

import pytest
import torch

from modules.components.activations import activation_names, get_activation, is_positively_biased
from modules.components.tiny_gpt import TinyGPT


def _gelu_ref(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _gelu_grad_ref(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) + x * math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


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
    y = get_activation(name)(x)
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
