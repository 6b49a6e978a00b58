"""BeeMO (paper 004-02): masking never leaks behaviour, the neural path is live, R^2 and the Wiener filter against
independent references, the two stages, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import r2_score

from errors import ConfigError
from modules.beemo import (
    BeeMO,
    BeeMOTask,
    SingleSessionDecoder,
    VarianceWeightedR2,
    gain_shrink,
    masked_mse,
    sinusoidal_clock,
    wiener_filter,
)
from modules.components.neural_metrics import decoding_r2, lagged_counts, ridge_predict
from modules.protocols import CrossAttentionShare


def _net(**kw: object) -> BeeMO:
    torch.manual_seed(0)
    args = dict(d_model=16, n_layers=2, n_heads=2, max_units=32, max_sessions=4)
    args.update(kw)
    return BeeMO(**args).eval()  # type: ignore[arg-type]


def _inputs(b: int = 3, t: int = 12, u: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    session = torch.tensor([0, 1, 3][:b])
    counts = torch.poisson(torch.full((b, t, u), 0.5), generator=g)
    return session, counts, torch.randn(b, t, 2, generator=g)


def test_masked_behaviour_edits_change_nothing() -> None:
    net = _net()
    session, counts, vel = _inputs()
    mask = torch.rand(3, 12, generator=torch.Generator().manual_seed(2)) < 0.5
    edited = torch.where(mask[..., None], torch.full_like(vel, float("nan")), vel)  # even NaN at masked bins
    for c in (counts, None):
        assert torch.equal(net.decode(session, c, vel, mask), net.decode(session, c, edited, mask))
    # ... and no gradient reaches a masked value
    vel = vel.clone().requires_grad_(True)
    net.decode(session, counts, vel, mask).sum().backward()
    assert vel.grad is not None and (vel.grad[mask] == 0).all() and (vel.grad[~mask] != 0).any()
    # all masked (mask None, behaviour None, or all True) are one prediction
    full = torch.ones(3, 12, dtype=torch.bool)
    assert torch.allclose(net.decode(session, counts), net.decode(session, counts, vel.detach(), full))


def test_behaviour_stream_is_causal() -> None:
    net = _net()
    session, counts, vel = _inputs()
    mask = torch.zeros(3, 12, dtype=torch.bool)
    later = vel.clone()
    later[:, 7:] += 5.0
    a, b = net.decode(session, counts, vel, mask), net.decode(session, counts, later, mask)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6) and not torch.allclose(a[:, 7:], b[:, 7:])


def test_neural_path_is_live() -> None:
    net = _net()
    session, counts, _ = _inputs()
    with_counts = net.decode(session, counts)
    assert not torch.allclose(with_counts, net.decode(session, None, torch.zeros(3, 12, 2), torch.ones(3, 12, dtype=torch.bool)))
    edited = counts.clone()
    edited[0, 5, 3] += 4
    out = net.decode(session, edited)
    assert not torch.allclose(out[0], with_counts[0]) and torch.allclose(out[1:], with_counts[1:])
    # gradient reaches the embeddings of the session's units that spiked, and no other session's
    net.train()
    net.decode(session, counts).square().sum().backward()
    assert net.unit.grad[0, :20].abs().sum() > 0 and net.unit.grad[2].abs().sum() == 0  # session 2 is absent
    assert all(b.cross_attn.q.weight.grad.abs().sum() > 0 for b in net.blocks)


def test_unpaired_batches_skip_cross_attention() -> None:
    net = _net()
    session, _, vel = _inputs()
    net.train()
    net.decode(session, None, vel, torch.rand(3, 12) < 0.5).square().sum().backward()
    assert all(b.cross_attn.q.weight.grad is None for b in net.blocks) and net.unit.grad is None


def test_cross_attention_share_is_the_residual_norm_ratio() -> None:
    task = BeeMOTask(lambda: _net(), pretrain_steps=1, finetune_steps=1)
    assert isinstance(task, CrossAttentionShare)
    session, counts, vel = _inputs()
    share = task.cross_attention_share((session, counts, vel))
    assert share.shape == (2,)
    # by hand: run the blocks one by one
    net = task.net
    t = torch.arange(12)
    x = net.mask_token.expand(3, 12, -1) + net.clock[t] + net.session(session)[:, None]
    neural = net.neural_tokens(session, counts)
    for i, block in enumerate(net.blocks):
        x = x + block.self_attn(block.ln_self(x))
        ctx = block.ln_neural(neural)
        r = block.cross_attn(block.ln_query(x), ctx, ctx)
        assert share[i] == pytest.approx(float(r.norm() / x.norm()), rel=1e-5)
        x = x + r
        x = x + block.mlp(block.ln_mlp(x))
    # the training-batch form reads its paired half
    assert torch.allclose(task.cross_attention_share((session, vel, session, counts, vel)), share)


def test_sinusoidal_clock_turns_a_shift_into_one_rotation() -> None:
    clock = sinusoidal_clock(50, 16).double()
    for k in (1, 5):
        # pair i of bin t + k is pair i of bin t rotated by the angle of bin k
        a = clock[k].view(8, 2)
        rot = torch.stack([torch.stack([a[:, 1], a[:, 0]], -1), torch.stack([-a[:, 0], a[:, 1]], -1)], -2)
        shifted = torch.einsum("pij,tpj->tpi", rot, clock[:-k].view(-1, 8, 2))
        assert torch.allclose(shifted.reshape(-1, 16), clock[k:], atol=1e-5)


def test_variance_weighted_r2_matches_sklearn_and_decoding_r2_over_batches() -> None:
    g = torch.Generator().manual_seed(4)
    y = torch.randn(10, 7, 2, generator=g) * torch.tensor([1.0, 3.0])
    p = y + torch.randn(10, 7, 2, generator=g)
    metric = VarianceWeightedR2()
    for part in range(0, 10, 3):
        metric.update(p[part : part + 3], y[part : part + 3])
    reference = r2_score(y.reshape(-1, 2).numpy(), p.reshape(-1, 2).numpy(), multioutput="variance_weighted")
    assert float(metric.compute()) == pytest.approx(reference, rel=1e-6)
    assert float(decoding_r2(p, y)) == pytest.approx(reference, rel=1e-5)


def test_masked_mse_against_a_loop() -> None:
    g = torch.Generator().manual_seed(5)
    p, y = torch.randn(3, 6, 2, generator=g), torch.randn(3, 6, 2, generator=g)
    mask = torch.rand(3, 6, generator=g) < 0.5
    terms = [float((p[b, t] - y[b, t]).square().mean()) for b in range(3) for t in range(6) if mask[b, t]]
    assert float(masked_mse(p, y, mask)) == pytest.approx(np.mean(terms), rel=1e-6)


def test_training_masks_follow_their_ratios() -> None:
    net = _net(mask_ratio_range=(0.2, 0.6), p_full_mask_paired=0.3)
    g = torch.Generator().manual_seed(6)
    unpaired = net.draw_mask(4000, 50, paired=False, generator=g)
    assert unpaired.any(1).all()
    assert float(unpaired.float().mean()) == pytest.approx(0.4 + 0.6 / 50, abs=0.01)  # E[r] plus the forced bin
    paired = net.draw_mask(4000, 50, paired=True, generator=g)
    full = paired.all(1).float().mean()
    assert float(full) == pytest.approx(0.3, abs=0.03)


def test_lagged_counts_against_a_loop() -> None:
    counts = torch.randn(2, 6, 3)
    out = lagged_counts(counts, 3)
    for b in range(2):
        for t in range(6):
            for k in range(3):
                expected = counts[b, t - k] if t - k >= 0 else torch.zeros(3)
                assert torch.equal(out[b, t, 3 * k : 3 * k + 3], expected)


def test_wiener_filter_recovers_a_lagged_linear_system() -> None:
    g = torch.Generator().manual_seed(7)
    counts = torch.poisson(torch.full((60, 40, 8), 2.0), generator=g)
    w = torch.randn(8, 2, generator=g)
    vel = torch.zeros(60, 40, 2)
    vel[:, 3:] = counts[:, :-3] @ w  # velocity read from the counts three bins back
    weights, intercept, alpha = wiener_filter(counts, vel, lags=5, alphas=(1e-3, 1e3))
    assert alpha == 1e-3
    assert torch.allclose(weights.view(5, 8, 2)[3].float(), w, atol=1e-3)
    pred = ridge_predict(lagged_counts(counts.double(), 5), weights, intercept)
    assert float(decoding_r2(pred, vel.double())) > 0.9999


def test_two_stages_and_the_pretrained_start(tmp_path: Path) -> None:
    task = BeeMOTask(lambda: _net(), pretrain_steps=5, finetune_steps=3)
    assert not bool(task.paired_stage)
    path = tmp_path / "net.pt"
    torch.save(task.net.state_dict(), path)
    started = BeeMOTask(lambda: _net(max_bins=64), pretrain_steps=5, finetune_steps=3, pretrain_ckpt=str(path))
    assert started.pretrain_steps == 0 and bool(started.paired_stage)
    assert all(torch.equal(a, b) for a, b in zip(task.net.state_dict().values(), started.net.state_dict().values()))
    baseline = SingleSessionDecoder(lambda: _net(), finetune_steps=3)
    assert baseline.pretrain_steps == 0 and bool(baseline.paired_stage)
    with pytest.raises(ConfigError, match="does not exist"):
        BeeMOTask(lambda: _net(), pretrain_ckpt=str(tmp_path / "missing.ckpt"))


def test_bad_input_fails_in_one_line() -> None:
    net = _net()
    session, counts, vel = _inputs()
    with pytest.raises(ConfigError, match="max_sessions"):
        net.decode(torch.tensor([0, 1, 4]), counts)
    with pytest.raises(ConfigError, match="max_units"):
        net.decode(session, torch.zeros(3, 12, 33))
    with pytest.raises(ConfigError, match="disagree"):
        net.decode(session, counts, vel[:, :10], torch.zeros(3, 10, dtype=torch.bool))
    with pytest.raises(ConfigError, match="disagree"):
        net.decode(session, counts, vel, torch.zeros(3, 11, dtype=torch.bool))
    with pytest.raises(ConfigError, match="bool"):
        net.decode(session, counts, vel, torch.zeros(3, 12))
    with pytest.raises(ConfigError, match="window length"):
        net.decode(session, None)
    with pytest.raises(ConfigError, match="max_bins"):
        _net(max_bins=8).decode(session, counts)
    with pytest.raises(ConfigError, match="mask_ratio_range"):
        BeeMO(mask_ratio_range=(0.0, 1.0))
    with pytest.raises(ConfigError, match="multiple"):
        BeeMO(d_model=10, n_heads=4)


def test_gain_shrink_against_a_hand_computation() -> None:
    from scipy import stats

    r2 = {(0, 25, 0): 0.30, (0, 25, 300): 0.50, (0, 200, 0): 0.60, (0, 200, 300): 0.65,
          (1, 25, 0): 0.20, (1, 25, 300): 0.45, (1, 200, 0): 0.55, (1, 200, 300): 0.58,
          (2, 25, 0): 0.35, (2, 25, 300): 0.48, (2, 200, 0): 0.62, (2, 200, 300): 0.61}
    rows = [{"seed": float(s), "n": float(n), "pretrain_steps": float(p), "r2": v} for (s, n, p), v in r2.items()]
    out = gain_shrink(rows)
    shrink = [(r2[(s, 25, 300)] - r2[(s, 25, 0)]) - (r2[(s, 200, 300)] - r2[(s, 200, 0)]) for s in range(3)]
    mean, sem = sum(shrink) / 3, stats.sem(shrink)
    assert out["shrink"] == pytest.approx(mean)
    assert out["shrink_hi"] - out["shrink"] == pytest.approx(stats.t.ppf(0.975, 2) * sem)
    assert out["gain_low"] == pytest.approx((0.20 + 0.25 + 0.13) / 3) and out["n_low"] == 25
    with pytest.raises(ConfigError, match="2 or more seeds"):
        gain_shrink([r for r in rows if r["seed"] == 0])
