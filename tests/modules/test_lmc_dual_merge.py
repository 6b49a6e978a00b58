"""LMC-DM (paper 004-03): the symmetries are exact (float64 logits), weight matching undoes a planted symmetry,
the aligner's path loss is the naive loop over interpolated networks, its hardened transforms preserve the
endpoints' functions, and user errors are one-line ConfigErrors."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from callbacks.function_preservation import FunctionPreservationCheck
from errors import ConfigError
from modules.components.interpolation import loss_barrier
from modules.components.tiny_gpt import TinyGPT
from modules.lmc_dual_merge import (
    DualLMCAligner,
    harden,
    sinkhorn,
    transform_state_dict,
    weight_matching,
)
from modules.lmc_dual_merge.task import EVAL_ALPHAS, check_endpoints
from modules.protocols import FunctionPreservation

V, T, D, H, L = 20, 8, 16, 4, 2
DH, FFN = D // H, 4 * D


def _net(bias: bool = False, norm: str = "rmsnorm", tie: bool = False, seed: int = 0, **kw) -> TinyGPT:
    torch.manual_seed(seed)
    net = TinyGPT(
        T, V, n_layer=L, n_head=H, n_embd=D, activation="relu", norm=norm, tie_weights=tie, bias=bias, **kw
    ).double()
    with torch.no_grad():  # spread weights and gains out: at initialisation the gains are 1 and logits flat
        for p in net.parameters():
            p.normal_(0.0, 0.5)
            if p.dim() == 1 and p.shape[0] == D:
                p.abs_().add_(0.5)
    return net


def _random_maps(seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    eye = torch.eye(DH, dtype=torch.float64)
    return {
        "rotation": q,
        "head_perm": [torch.randperm(H, generator=g) for _ in range(L)],
        "ffn_perm": [torch.randperm(FFN, generator=g) for _ in range(L)],
        "qk_maps": [torch.randn(H, DH, DH, generator=g, dtype=torch.float64) + 2 * eye for _ in range(L)],
        "vo_maps": [torch.randn(H, DH, DH, generator=g, dtype=torch.float64) + 2 * eye for _ in range(L)],
    }


def _logits_after(net: TinyGPT, sd: dict, x: torch.Tensor) -> torch.Tensor:
    other = _net(bias=net.blocks[0].attn.qkv.bias is not None)
    other.load_state_dict(sd)
    return other(x)


MAPS = ["none", "rotation", "head_perm", "ffn_perm", "qk_maps", "vo_maps", "all"]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("which", MAPS)
def test_each_symmetry_preserves_logits(which: str, bias: bool) -> None:
    net = _net(bias)
    x = torch.randint(0, V, (3, T))
    maps = _random_maps()
    kw = {} if which == "none" else maps if which == "all" else {which: maps[which]}
    sd = transform_state_dict(net.state_dict(), H, **kw)
    assert (_logits_after(net, sd, x) - net(x)).abs().max() < 1e-10
    if which != "none":  # the weights did move: an identity would pass trivially
        folded = transform_state_dict(net.state_dict(), H)
        assert max(float((sd[k] - folded[k]).abs().max()) for k in sd) > 1e-2
    assert all(float(sd[k].sub(1).abs().max()) == 0 for k in sd if "ln_" in k)  # gains folded to 1


def test_a_wrong_transform_changes_the_function() -> None:
    # positive control for the test above: a map applied to one side only (q without the matching k^-T)
    net = _net()
    x = torch.randint(0, V, (3, T))
    sd = transform_state_dict(net.state_dict(), H)
    sd["blocks.0.attn.qkv.weight"] = sd["blocks.0.attn.qkv.weight"].clone()
    sd["blocks.0.attn.qkv.weight"][:D] *= 2.0
    assert (_logits_after(net, sd, x) - net(x)).abs().max() > 1e-3


def test_weight_matching_undoes_a_planted_symmetry() -> None:
    sd_a = _net().state_dict()
    maps = _random_maps(3)
    sd_b = transform_state_dict(
        sd_a, H, rotation=maps["rotation"], head_perm=maps["head_perm"], ffn_perm=maps["ffn_perm"]
    )
    found = weight_matching(sd_a, sd_b, H)
    back, folded_a = transform_state_dict(sd_b, H, **found), transform_state_dict(sd_a, H)
    assert max(float((back[k] - folded_a[k]).abs().max()) for k in back) < 1e-10
    # the planted inverse: B's new head j must be the old head that A's head j went to
    for l in range(L):
        assert torch.equal(maps["head_perm"][l][found["head_perm"][l]], torch.arange(H))
        assert torch.equal(maps["ffn_perm"][l][found["ffn_perm"][l]], torch.arange(FFN))
    assert torch.allclose(found["rotation"], maps["rotation"].T, atol=1e-10)


def test_sinkhorn_is_doubly_stochastic_and_hardens_to_the_nearest_permutation() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 6, generator=g, dtype=torch.float64)
    p = sinkhorn(logits, tau=0.5, iters=200)
    assert torch.allclose(p.sum(-1), torch.ones(3, 6, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(p.sum(-2), torch.ones(3, 6, dtype=torch.float64), atol=1e-8)
    hard = harden(logits)
    import itertools

    for i in range(3):  # brute force over all 720 permutations
        best = max(itertools.permutations(range(6)), key=lambda s: sum(float(logits[i, j, s[j]]) for j in range(6)))
        assert torch.equal(hard[i].argmax(-1), torch.tensor(best))


@functools.cache
def _aligner(mode: str = "dual") -> DualLMCAligner:
    torch.manual_seed(0)
    factory = functools.partial(
        TinyGPT, n_layer=L, n_head=H, n_embd=D, activation="relu", norm="rmsnorm", tie_weights=False
    )
    m = DualLMCAligner(mode=mode, net=factory, endpoint_steps=0, input_shape=(T,), num_classes=V)
    with torch.no_grad():
        for net in (m.net_a, m.net_b):
            for p in net.parameters():
                p.normal_(0.0, 0.3)
        m.initialise_transforms()
        for phi in (m.phi_a, m.phi_b):  # move every learned transform off its start
            phi.skew.normal_(0.0, 0.3)
            phi.qk.add_(0.3 * torch.randn_like(phi.qk))
            phi.vo.add_(0.3 * torch.randn_like(phi.vo))
            phi.ffn_logits.add_(0.05 * torch.rand_like(phi.ffn_logits))
    return m


def test_aligner_hardened_transforms_preserve_both_endpoints() -> None:
    m = _aligner("dual")
    x = torch.randint(0, V, (4, T))
    assert isinstance(m, FunctionPreservation)
    assert m.function_preservation((x, x)) < 1e-4
    ta, tb = m.transformed(hard=False)  # relaxed permutations are not function-preserving
    assert (torch.func.functional_call(m.net_b, tb, (x,)) - m.net_b(x)).abs().max() > 1e-4


def test_path_loss_is_the_naive_loop_and_the_barrier_its_max_over_the_chord() -> None:
    m = _aligner("dual")
    x, y = torch.randint(0, V, (4, T)), torch.randint(0, V, (4, T))
    ta, tb = m.transformed(hard=True)
    ref_losses = []
    for a in EVAL_ALPHAS:  # an independent network per alpha, loaded with a loop over the entries
        net = TinyGPT(T, V, n_layer=L, n_head=H, n_embd=D, activation="relu", norm="rmsnorm", tie_weights=False)
        net.load_state_dict({k: (1 - a) * ta[k] + a * tb[k] for k in ta})
        with torch.no_grad():
            ref_losses.append(float(F.cross_entropy(net(x).flatten(0, 1), y.flatten())))
    m._path = None
    out = m.step((x, y), "val")
    got = [float(out.inputs[f"loss_at_{k:02d}"][0]) for k in range(11)]
    assert got == pytest.approx(ref_losses, abs=1e-5)
    values = {f"val/loss_at_{k:02d}": torch.tensor(v) for k, v in enumerate(got)}
    barrier = float(m.extra_epoch_metrics("val", values)["val/barrier"])
    assert barrier == pytest.approx(loss_barrier(EVAL_ALPHAS, ref_losses), abs=1e-5)
    # endpoints unchanged: alpha = 0 and 1 are A's and B's own losses
    for net, k in ((m.net_a, 0), (m.net_b, 10)):
        with torch.no_grad():
            assert got[k] == pytest.approx(float(F.cross_entropy(net(x).flatten(0, 1), y.flatten())), abs=1e-5)


@pytest.mark.parametrize(
    ("mode", "trained"),
    [("one_sided", {"phi_b"}), ("dual", {"phi_a", "phi_b"}), ("naive", set()), ("weight_matching", set())],
)
def test_only_the_modes_transforms_get_gradients(mode: str, trained: set) -> None:
    m = _aligner(mode)
    m.zero_grad()
    x, y = torch.randint(0, V, (4, T)), torch.randint(0, V, (4, T))
    with torch.set_grad_enabled(mode in ("one_sided", "dual")):
        ta, tb = m.transformed(hard=mode not in ("one_sided", "dual"))
        loss = F.cross_entropy(m.path_logits(ta, tb, 0.5, x).flatten(0, 1), y.flatten())
    if loss.requires_grad:
        loss.backward()
    got = {
        name
        for name in ("phi_a", "phi_b", "net_a", "net_b")
        if any(p.grad is not None and p.grad.abs().sum() > 0 for p in getattr(m, name).parameters())
    }
    assert got == trained


def test_function_preservation_check_logs_the_modules_value() -> None:
    m = _aligner("dual")
    check = FunctionPreservationCheck(tolerance=1e-4)
    x = torch.randint(0, V, (4, T))
    check._fixed_batch = (x, x)
    stats = check.measure(None, m, None)  # type: ignore[arg-type]
    assert stats["max_abs_diff"] == pytest.approx(m.function_preservation((x, x)))
    assert check.finalize(stats)["passed"] == 1.0
    assert check.finalize({"max_abs_diff": 1e-3})["passed"] == 0.0


# --- errors ---------------------------------------------------------------------------------------------------
def test_errors_name_the_fix(tmp_path) -> None:
    sd = _net().state_dict()
    with pytest.raises(ConfigError, match="not orthogonal"):
        transform_state_dict(sd, H, rotation=torch.eye(D, dtype=torch.float64) * 1.1)
    with pytest.raises(ConfigError, match="not a permutation"):
        transform_state_dict(sd, H, head_perm=[torch.tensor([0, 0, 1, 2])] * L)
    with pytest.raises(ConfigError, match="not a permutation"):
        transform_state_dict(sd, H, ffn_perm=[torch.arange(FFN - 1)] * L)
    with pytest.raises(ConfigError, match="singular"):
        transform_state_dict(sd, H, qk_maps=[torch.zeros(H, DH, DH, dtype=torch.float64)] * L)
    with pytest.raises(ConfigError, match="rmsnorm"):
        transform_state_dict(_net(norm="layernorm", bias=True).state_dict(), H)
    with pytest.raises(ConfigError, match="tie_weights"):
        transform_state_dict(_net(tie=True).state_dict(), H)

    def factory(norm: str = "rmsnorm", **kw):
        return functools.partial(
            TinyGPT, n_layer=L, n_head=H, n_embd=D, activation="relu", norm=norm, tie_weights=False, **kw
        )

    with pytest.raises(ConfigError, match="differ in n_head: 4 .ckpt_a. vs 2"):
        check_endpoints(
            factory()((T,), V),
            TinyGPT(T, V, n_layer=L, n_head=2, n_embd=D, activation="relu", norm="rmsnorm", tie_weights=False),
        )
    with pytest.raises(ConfigError, match="differ in activation"):
        check_endpoints(
            factory()((T,), V),
            TinyGPT(T, V, n_layer=L, n_head=H, n_embd=D, activation="gelu", norm="rmsnorm", tie_weights=False),
        )
    with pytest.raises(ConfigError, match="norm='layernorm'"):
        DualLMCAligner(net=factory("layernorm"), input_shape=(T,), num_classes=V)

    # mismatched endpoints: the field is named
    def save(path, width: int) -> str:
        init = {
            "n_layer": L,
            "n_head": H,
            "n_embd": width,
            "activation": "relu",
            "norm": "rmsnorm",
            "tie_weights": False,
        }
        net = TinyGPT(T, V, **init)
        hp = {
            "net": {"class_path": "modules.components.tiny_gpt.TinyGPT", "init_args": init},
            "input_shape": [T],
            "num_classes": V,
        }
        torch.save({"state_dict": {f"net.{k}": v for k, v in net.state_dict().items()}, "hyper_parameters": hp}, path)
        return str(path)

    a, b = save(tmp_path / "a.ckpt", D), save(tmp_path / "b.ckpt", 2 * D)
    save(tmp_path / "0.ckpt", D)  # "{seed}" in a path: the run's seed (0 when built in Python)
    with pytest.raises(ConfigError, match="differ in n_embd: 16 .ckpt_a. vs 32"):
        DualLMCAligner(ckpt_a=a, ckpt_b=b, input_shape=(T,), num_classes=V)
    with pytest.raises(ConfigError, match="do not fit the data"):
        DualLMCAligner(ckpt_a=a, ckpt_b=a, input_shape=(T,), num_classes=V + 1)
    with pytest.raises(ConfigError, match="does not exist; train it"):
        DualLMCAligner(ckpt_a=a, ckpt_b=str(tmp_path / "missing.ckpt"), input_shape=(T,), num_classes=V)
    aligned = DualLMCAligner(ckpt_a=a, ckpt_b=str(tmp_path / "{seed}.ckpt"), input_shape=(T,), num_classes=V)
    assert not any(p.requires_grad for p in aligned.net_a.parameters())  # the endpoints stay fixed
    with pytest.raises(ConfigError, match="both ckpt_a and ckpt_b"):
        DualLMCAligner(ckpt_a=a, net=factory(), input_shape=(T,), num_classes=V)
    with pytest.raises(ConfigError, match="add norm_absorb"):
        DualLMCAligner(symmetries=["resid_rot"], net=factory(), input_shape=(T,), num_classes=V)
