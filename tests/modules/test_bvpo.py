"""BVPO (paper 000-14): losses, exact marginals, trace sampling, variance contraction, alpha*, CLI."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from callbacks.gradient_variance import estimate_gradient_variance
from datamodules.arith_traces import (
    ArithTracesDataModule,
    all_prompts,
    nothink_seqs,
    prompt_ids,
    thinking_seqs,
)
from modules.bvpo import BVPOModule, bias_variance, hash_uniform, mse_alpha, nothink_logp, think_logp

REPO = Path(__file__).resolve().parents[2]


def _module(**kw) -> BVPOModule:
    torch.manual_seed(0)
    kw = {"n_layer": 1, "n_head": 2, "n_embd": 16, "sft_steps": 1, **kw}
    return BVPOModule(**kw)


def _dpo_module(**kw) -> BVPOModule:
    m = _module(**kw)
    m.build_reference()  # in float32 (faster); the float64 tables are then just a fixed reference
    m = m.double()
    with torch.no_grad():  # a policy that differs from the reference, so the losses are not at log 2
        for p in m.gpt.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m


def _batch(n: int = 6, seed: int = 0):
    dm = ArithTracesDataModule(seed=seed)
    dm.setup()
    return tuple(t[:n] for t in dm.splits["train"])


def test_hash_uniform_is_deterministic_and_uniform():
    key = torch.arange(200_000)
    u = hash_uniform(key)
    assert torch.equal(u, hash_uniform(key)) and (u > 0).all() and (u < 1).all()
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / len(u)
    assert (hist - 0.1).abs().max() < 0.005


def test_enumerated_joint_matches_explicit_sequences_and_normalises():
    m = _module().double()
    prompts = all_prompts()[torch.tensor([7, 123, 999])]
    joint, lp_pair, lp_s1 = m.enumerate_traces(prompts)
    assert torch.allclose(joint.logsumexp((1, 2)), torch.zeros(3, dtype=torch.float64), atol=1e-10)
    # brute force: score every one of the 300 explicit (trace, answer) sequences of prompt 1
    r = torch.arange(30).repeat_interleave(10)
    y = torch.arange(10).repeat(30)
    seqs = thinking_seqs(prompts[1:2].repeat(300, 1), r // 10, r % 10, y)
    explicit = think_logp(m.logits(seqs), seqs).reshape(30, 10)
    assert torch.allclose(explicit, joint[1], atol=1e-10)
    nseqs = nothink_seqs(prompts[1:2].repeat(10, 1), torch.arange(10))
    assert torch.allclose(nothink_logp(m.logits(nseqs), nseqs), m.nothink_all(prompts[1:2])[0], atol=1e-10)


def test_trace_sampling_follows_the_reference_posterior():
    m = _dpo_module()
    n = 4000  # 4000 rows of the same pair: independent draws
    draws = m.sample_traces(torch.full((n,), 123), torch.full((n,), 4), torch.arange(n), 0)
    freq = torch.bincount(draws, minlength=30).double() / len(draws)
    post = m.ref_joint[123, :, 4].softmax(0)
    assert (freq - post).abs().max() < 0.03
    # a pure function of (seed, step, draw, side, row): the same row gives the same trace in any batch
    rows = torch.tensor([5, 9])
    both = m.sample_traces(torch.tensor([123, 45]), torch.tensor([4, 1]), rows, 0)
    alone = m.sample_traces(torch.tensor([45]), torch.tensor([1]), rows[1:], 0)
    assert both[1] == alone[0]


def test_losses_at_the_switch_and_the_composite_mix():
    m = _module()
    m.build_reference()  # policy == reference: every DPO log-ratio is 0, every loss is log 2
    m = m.double()
    batch = _batch()
    for branch in ("trace", "empty", "marginal", "composite"):
        assert torch.allclose(m.per_sample_loss(batch, branch), torch.full((6,), 0.6931471805599453,
                                                                            dtype=torch.float64))
    m = _dpo_module(alpha=0.3)
    t, e = m.per_sample_loss(batch, "trace"), m.per_sample_loss(batch, "empty")
    assert torch.allclose(m.per_sample_loss(batch), 0.3 * t + 0.7 * e)
    # the empty branch is DPO on the no-thinking answers, written out by hand
    prompts, y_pos, _, y_neg, _ = batch
    pid = prompt_ids(prompts)
    lp = lambda y: nothink_logp(m.logits(nothink_seqs(prompts, y)), nothink_seqs(prompts, y))  # noqa: E731
    h = (lp(y_pos) - m.ref_nothink[pid, y_pos]) - (lp(y_neg) - m.ref_nothink[pid, y_neg])
    assert torch.allclose(e, -F.logsigmoid(0.1 * h))


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_variance_contraction_is_alpha_squared(alpha):
    """Var(g_c | x, y+-) = alpha^2 Var(g_t | x, y+-) when the empty branch is deterministic."""
    m = _dpo_module(alpha=alpha)
    one = _batch(1)
    k = 16  # one pair, 16 rows: each row draws its own traces
    batch = tuple(t.repeat(k, *([1] * (t.dim() - 1))) for t in one[:4]) + (torch.arange(k),)
    v = {b: estimate_gradient_variance(m, lambda mod, x, b=b: mod.per_sample_loss(x, b), batch)["trace"]
         for b in ("trace", "empty", "composite")}
    assert v["trace"] > 0
    assert v["empty"] == pytest.approx(0.0, abs=1e-12 * v["trace"])
    assert v["composite"] / v["trace"] == pytest.approx(alpha**2, rel=1e-8)


def test_fast_estimator_matches_a_loop_on_the_bvpo_loss():
    # four sequences per pair (sample-major rows) and the broadcast positional embedding
    m = _dpo_module(alpha=0.5)
    batch = _batch(6)
    fast = estimate_gradient_variance(m, lambda mod, x: mod.per_sample_loss(x), batch)
    assert fast["method"] == "hooks"
    loop = estimate_gradient_variance(m, lambda mod, x: mod.per_sample_loss(x), batch, method="loop")
    assert fast["trace"] == pytest.approx(loop["trace"], rel=1e-6)
    assert fast["grad_norm_sq"] == pytest.approx(loop["grad_norm_sq"], rel=1e-6)


def test_alpha_star_is_the_minimum_of_the_mse_curve():
    g = torch.Generator().manual_seed(0)
    g_star = torch.randn(50, generator=g, dtype=torch.float64)
    g_e = g_star + 0.5 * torch.randn(50, generator=g, dtype=torch.float64)
    g_t = g_star + 0.2 + torch.randn(8, 50, generator=g, dtype=torch.float64)
    out = bias_variance(g_t, g_e, g_star)
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    curve = torch.stack([mse_alpha(a, g_t, g_e, g_star) for a in grid])
    assert out["alpha_star"].item() == pytest.approx(grid[curve.argmin()].item(), abs=1e-3)
    assert out["mse_alpha_star"] <= min(out["mse_alpha0"], out["mse_alpha1"], out["mse_alpha_half"])
    # MSE(1) = V_t + |d_t|^2 with the V_t / K correction of |m_t - g*|^2
    assert out["mse_alpha1"].item() == pytest.approx((out["V_t"] + out["bias_t_sq"]).item(), rel=1e-10)
    assert out["mse_alpha0"].item() == pytest.approx(out["bias_e_sq"].item(), rel=1e-10)


def test_bad_arguments_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="alpha"):
        BVPOModule(alpha=1.5)
    with pytest.raises(ValueError, match="auto"):
        BVPOModule(alpha="best")
    with pytest.raises(ValueError, match="init_ckpt"):
        BVPOModule(sft_steps=0)
    with pytest.raises(ValueError, match="SFT stage"):
        BVPOModule(sft_steps=0, init_ckpt=str(tmp_path / "missing.pt"))


def test_two_stages_in_one_fit_and_init_ckpt(tmp_path):
    m = _module(sft_steps=2, probe_every=1, trace_resamples=2, probe_prompts=4, alpha="auto")
    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                        val_check_interval=4, check_val_every_n_epoch=None)
    dm = ArithTracesDataModule(batch_size=8, copies=1)
    trainer.fit(m, dm)
    assert bool(m.ref_ready) and trainer.optimizers[0].param_groups[0]["lr"] == m.hparams.dpo_lr
    assert 0.0 <= m.alpha <= 1.0 and "diag/bvpo/alpha_star" in trainer.callback_metrics
    assert {"val/pref_acc", "val/em_marginal", "val/p_correct"} <= set(trainer.callback_metrics)
    path = tmp_path / "policy.pt"
    torch.save(m.gpt.state_dict(), path)
    m2 = BVPOModule(n_layer=1, n_head=2, n_embd=16, sft_steps=0, init_ckpt=str(path))
    assert all(torch.equal(a, b) for a, b in zip(m.gpt.parameters(), m2.gpt.parameters()))


@pytest.mark.parametrize("config", ["bvpo.yaml", "trace_only.yaml", "bvpo_auto.yaml"])
def test_cli_fast_dev_run(paperlab_tmp, config):
    from main import cli_main

    cfg = REPO / "configs" / "bvpo" / config
    assert cli_main(["fit", "--config", str(cfg), "--trainer.fast_dev_run", "true"]) == 0
