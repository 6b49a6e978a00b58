"""BVPO (paper 000-14): losses, exact marginals, trace sampling, the probe against a brute-force reference.

The brute-force reference scores every explicit sequence with the policy and with a frozen copy of the
reference network (not the module's tables or its enumeration), enumerates all 30 x 30 trace pairs of one
preference pair with their posterior weights, and differentiates one log-probability at a time: exact
E[g_t], V_t, g_e, g*, MSE(alpha) and E[cos] for that pair. Monte Carlo checks use the exact standard
errors of that distribution.
"""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from callbacks.gradient_variance import estimate_gradient_variance, per_sample_gradients
from datamodules.arith_traces import ArithTracesDataModule
from datamodules.arith_vocab import all_prompts, nothink_seqs, prompt_ids, thinking_seqs
from modules.bvpo import (
    BVPOModule,
    bias_variance,
    hash_uniform,
    mse_alpha,
    nothink_logp,
    think_logp,
    trace_key,
)

REPO = Path(__file__).resolve().parents[2]
BETA = 0.1


def _module(**kw) -> BVPOModule:
    torch.manual_seed(0)
    kw = {"n_layer": 1, "n_head": 2, "n_embd": 16, "sft_steps": 1, "seed": 0, **kw}
    return BVPOModule(**kw)


@functools.cache
def _switched() -> dict[str, torch.Tensor]:
    """The state of ``_module()`` right after the switch to DPO (reference tables built once per session):
    all 1000 prompts in float32 (faster), the test prompts again in float64. The weights are spread out
    first: at initialisation every posterior over traces is nearly uniform, and a test that cannot tell
    the posterior from a uniform sampler (or y+'s posterior from y-'s) proves little."""
    m = _module()
    with torch.no_grad():
        g = torch.Generator().manual_seed(2)
        for p in m.gpt.parameters():
            p.add_(0.8 * torch.randn(p.shape, generator=g))
    m.build_reference()
    m = m.double()
    prompts = torch.cat([_batch()[0], all_prompts()[torch.tensor([45, 123])]])
    with torch.no_grad():
        m.ref_joint[prompt_ids(prompts)] = m.enumerate_traces(prompts)[0]
        m.ref_nothink[prompt_ids(prompts)] = m.nothink_all(prompts)
    return copy.deepcopy(m.state_dict())


def _dpo_module(scale: float = 0.05, **kw) -> tuple[BVPOModule, torch.nn.Module]:
    """A module in its DPO stage whose policy differs from the reference; and a copy of the reference net."""
    m = _module(**kw).double()
    m.load_state_dict(_switched())
    ref_net = copy.deepcopy(m.gpt)
    with torch.no_grad():  # a policy that differs from the reference, so the losses are not at log 2
        g = torch.Generator().manual_seed(1)
        for p in m.gpt.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m, ref_net


def _batch(n: int = 6, seed: int = 0):
    dm = ArithTracesDataModule(seed=seed)
    dm.setup()
    return tuple(t[:n] for t in dm.splits["train"])


def _flat(loss: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)])


def brute_force(m: BVPOModule, ref_net: torch.nn.Module, pair: tuple[torch.Tensor, ...]) -> dict:
    """Exact statistics of g_t, g_e, g* for one preference pair (x, y+, y-), from explicit sequences."""
    prompts, y_pos, _, y_neg, _ = pair
    params = list(m.gpt.parameters())
    r = torch.arange(30)
    x = prompts[:1].repeat(30, 1)

    def scores(net: torch.nn.Module, y: int) -> torch.Tensor:  # log pi(r, y | x) for all 30 traces r
        seqs = thinking_seqs(x, r // 10, r % 10, torch.full((30,), y))
        return think_logp(net(seqs[:, :-1]), seqs)

    yp, yn = int(y_pos[0]), int(y_neg[0])
    with torch.no_grad():
        ref_p, ref_n = scores(ref_net, yp), scores(ref_net, yn)
    lp_p, lp_n = scores(m.gpt, yp), scores(m.gpt, yn)
    jac_p = torch.stack([_flat(lp_p[i], params) for i in range(30)])  # (30, P): grad log pi(r, y+|x)
    jac_n = torch.stack([_flat(lp_n[i], params) for i in range(30)])
    q = (ref_p.softmax(0)[:, None] * ref_n.softmax(0)[None, :]).reshape(-1)  # posterior of (r+, r-)
    h = ((lp_p - ref_p)[:, None] - (lp_n - ref_n)[None, :]).detach()  # (30, 30) DPO log-ratio margin
    c = -BETA * torch.sigmoid(-BETA * h)  # d/dh of -log sigmoid(beta h)
    g = (c[:, :, None] * (jac_p[:, None, :] - jac_n[None, :, :])).reshape(900, -1)  # g_t of every pair
    m_t = q @ g
    dev = (g - m_t).pow(2).sum(1)
    # empty branch and the marginal, written out on explicit sequences
    ns_p, ns_n = nothink_seqs(prompts[:1], y_pos[:1]), nothink_seqs(prompts[:1], y_neg[:1])
    with torch.no_grad():
        ref_e = nothink_logp(ref_net(ns_p[:, :-1]), ns_p) - nothink_logp(ref_net(ns_n[:, :-1]), ns_n)
    h_e = nothink_logp(m.gpt(ns_p[:, :-1]), ns_p) - nothink_logp(m.gpt(ns_n[:, :-1]), ns_n) - ref_e
    g_e = _flat(-F.logsigmoid(BETA * h_e).sum(), params)
    h_m = (lp_p.logsumexp(0) - ref_p.logsumexp(0)) - (lp_n.logsumexp(0) - ref_n.logsumexp(0))
    g_star = _flat(-F.logsigmoid(BETA * h_m), params)
    return {"g": g, "q": q, "m_t": m_t, "V_t": q @ dev, "mu4": q @ dev.pow(2), "g_e": g_e, "g_star": g_star}


def exact_mse(bf: dict, alpha: torch.Tensor) -> torch.Tensor:
    """E|alpha g_t + (1 - alpha) g_e - g*|^2 for each alpha, from the moments of all 900 trace pairs:
    alpha^2 E|g_t|^2 + 2 alpha <E g_t, c> + |c|^2 with c = (1 - alpha) g_e - g*."""
    g, g_e, g_star, q = bf["g"], bf["g_e"], bf["g_star"], bf["q"]
    second = q @ g.pow(2).sum(1)
    c = (1 - alpha)[:, None] * g_e - g_star
    return alpha**2 * second + 2 * alpha * (c @ bf["m_t"]) + c.pow(2).sum(1)


# --- hashing and sampling ---------------------------------------------------------------------------------
def test_hash_uniform_is_deterministic_and_uniform():
    key = torch.arange(200_000)
    u = hash_uniform(key)
    assert torch.equal(u, hash_uniform(key)) and (u > 0).all() and (u < 1).all()
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / len(u)
    assert (hist - 0.1).abs().max() < 0.005  # 5 standard errors of a bin frequency (0.00067)


def test_trace_keys_are_distinct_over_every_field():
    rows = torch.arange(10)
    draws = torch.arange(130)[:, None]  # draws past 64 collided with the next step in an earlier key layout
    keys = torch.cat([trace_key(seed, step, draws, side, rows).reshape(-1) for seed in range(3)
                      for step in range(4) for side in (0, 1)])
    assert len(set(keys.tolist())) == keys.numel()
    tensor_draws = trace_key(2, 3, torch.arange(130)[:, None], 1, rows)
    assert torch.equal(tensor_draws[77], trace_key(2, 3, 77, 1, rows))


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


@pytest.mark.parametrize("side", [0, 1])
def test_trace_draws_follow_the_reference_posterior_of_their_own_answer(side):
    """The probe's K draws of one pair: frequencies of r+ (side 0) and r- (side 1) against the exact
    posterior pi_ref(r | x, y+-) computed from the reference copy on explicit sequences."""
    m, ref_net = _dpo_module()
    pair = _batch(1)
    k = 4000
    draws = m.trace_draws(pair, k)[3 + side][:, 0]  # (K,) traces of the one pair
    y = int(pair[1 + 2 * side][0])
    r = torch.arange(30)
    seqs = thinking_seqs(pair[0].repeat(30, 1), r // 10, r % 10, torch.full((30,), y))
    with torch.no_grad():
        post = think_logp(ref_net(seqs[:, :-1]), seqs).softmax(0)
    freq = torch.bincount(draws, minlength=30).double() / k
    se = (post * (1 - post) / k).sqrt()
    assert ((freq - post).abs() <= 5 * se + 1e-3).all(), (freq - post).abs().max()
    # training draws are a pure function of (seed, step, draw, side, row): the same row, the same trace
    rows = torch.tensor([5, 9])
    both = m.sample_traces(torch.tensor([123, 45]), torch.tensor([4, 1]), rows, side)
    alone = m.sample_traces(torch.tensor([45]), torch.tensor([1]), rows[1:], side)
    assert both[1] == alone[0]


# --- losses ---------------------------------------------------------------------------------------------
def test_losses_at_the_switch_and_the_composite_mix():
    m = _module().double()
    m.load_state_dict(_switched())  # policy == reference: every DPO log-ratio is 0, every loss is log 2
    batch = _batch()
    for branch in ("trace", "empty", "marginal", "composite"):
        assert torch.allclose(m.per_sample_loss(batch, branch), torch.full((6,), math.log(2), dtype=torch.float64))
    assert torch.allclose(m.expected_trace_loss(batch), torch.full((6,), math.log(2), dtype=torch.float64))
    m, _ = _dpo_module(alpha=0.3)
    t, e = m.per_sample_loss(batch, "trace"), m.per_sample_loss(batch, "empty")
    assert torch.allclose(m.per_sample_loss(batch), 0.3 * t + 0.7 * e)
    # the empty branch is DPO on the no-thinking answers, written out by hand
    prompts, y_pos, _, y_neg, _ = batch
    pid = prompt_ids(prompts)
    lp = lambda y: nothink_logp(m.logits(nothink_seqs(prompts, y)), nothink_seqs(prompts, y))  # noqa: E731
    h = (lp(y_pos) - m.ref_nothink[pid, y_pos]) - (lp(y_neg) - m.ref_nothink[pid, y_neg])
    assert torch.allclose(e, -F.logsigmoid(BETA * h))


def test_expected_trace_gradient_is_the_exact_mean_over_the_reference_posterior():
    m, ref_net = _dpo_module()
    batch = _batch(3)
    params = list(m.gpt.parameters())
    m_t = _flat(m.expected_trace_loss(batch).mean(), params)
    ref = sum(brute_force(m, ref_net, tuple(t[i : i + 1] for t in batch))["m_t"] for i in range(3)) / 3
    assert torch.allclose(m_t, ref, rtol=1e-6, atol=1e-9 * ref.norm().item())


def test_variance_contraction_against_the_exact_trace_variance():
    """Var(g_c | x, y+-) = alpha^2 V_t with V_t exact (all 900 trace pairs of one preference pair).

    K rows of one pair, each drawing its own traces: the GradientVariance estimate of the composite's
    per-row variance must be alpha^2 V_t within 4 standard errors of a sample variance (exact from the
    fourth moment), and the mean of the rows' gradients must be alpha E[g_t] + (1 - alpha) g_e along
    E[g_t] within 4 standard errors. A sampler off the posterior, or y+ and y- swapped anywhere, moves
    both far outside.
    """
    alpha = 0.3
    m, ref_net = _dpo_module(alpha=alpha)
    pair = _batch(1)
    bf = brute_force(m, ref_net, pair)
    k = 400
    rows = tuple(t.repeat(k, *([1] * (t.dim() - 1))) for t in pair[:4]) + (torch.arange(k),)
    composite = estimate_gradient_variance(m, lambda mod, b: mod.per_sample_loss(b), rows)
    se_var = math.sqrt((bf["mu4"] - bf["V_t"] ** 2).item() / k)
    assert abs(composite["trace"] - alpha**2 * bf["V_t"].item()) < 4 * alpha**2 * se_var
    few = tuple(t[:8] for t in rows)  # the empty branch has no trace randomness: zero variance
    empty = estimate_gradient_variance(m, lambda mod, b: mod.per_sample_loss(b, "empty"), few)
    assert empty["trace"] == pytest.approx(0.0, abs=1e-12 * composite["trace"])
    g = per_sample_gradients(m, lambda mod, b: mod.per_sample_loss(b), rows)
    u = bf["m_t"] / bf["m_t"].norm()
    proj = (g - (alpha * bf["m_t"] + (1 - alpha) * bf["g_e"])) @ u  # (K,) mean zero if unbiased
    sd = alpha * math.sqrt((bf["q"] @ ((bf["g"] - bf["m_t"]) @ u).pow(2)).item())
    assert abs(proj.mean().item()) < 4 * sd / math.sqrt(k)


def test_probe_against_the_brute_force_reference():
    """The probe on one pair with K = 600 draws: exact parts to 1e-6, V_t / cosine within 4 standard
    errors, alpha* within its standard error of the argmin of the exact MSE(alpha) on a fine grid."""
    m, ref_net = _dpo_module(scale=0.3, alpha=0.5, probe_prompts=1, trace_resamples=600)
    pair = _batch(1)
    bf = brute_force(m, ref_net, pair)
    out = m.probe(pair)
    assert m._draw_grads.chosen == "hooks"
    d_t, d_e = bf["m_t"] - bf["g_star"], bf["g_e"] - bf["g_star"]
    assert out["bias_t_sq"] == pytest.approx(d_t.pow(2).sum().item(), rel=1e-6)
    assert out["bias_e_sq"] == pytest.approx(d_e.pow(2).sum().item(), rel=1e-6)
    assert out["g_star_sq"] == pytest.approx(bf["g_star"].pow(2).sum().item(), rel=1e-6)
    v, k = bf["V_t"].item(), 600
    se_v = math.sqrt((bf["mu4"] - bf["V_t"] ** 2).item() / k)
    assert abs(out["V_t"] - v) < 4 * se_v
    grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
    curve = exact_mse(bf, grid)
    best = grid[curve.argmin()].item()
    a_num, curv = (d_e @ (d_e - d_t)).item(), v + (d_t - d_e).pow(2).sum().item()
    se_alpha = abs(a_num) / curv**2 * se_v  # d alpha* / d V_t times the error of V_t
    assert 0.05 < best < 0.95, "the reference should have an interior minimum here"
    assert abs(out["alpha_star"] - best) < 4 * se_alpha + 1e-3
    assert out["mse_alpha_half"] == pytest.approx(exact_mse(bf, torch.tensor([0.5], dtype=torch.float64)).item(),
                                                  abs=4 * 0.25 * se_v)
    assert out["mse_alpha0"] == pytest.approx(curve[0].item(), rel=1e-6)  # no trace noise at alpha = 0
    assert out["rel_mse_alpha0"] == pytest.approx(curve[0].item() / out["g_star_sq"], rel=1e-6)
    cos = (bf["g"] @ bf["g_star"]) / (bf["g"].norm(dim=1) * bf["g_star"].norm())
    e_cos, sd_cos = (bf["q"] @ cos).item(), math.sqrt((bf["q"] @ (cos - bf["q"] @ cos).pow(2)).item())
    assert abs(out["cos_alpha1"] - e_cos) < 4 * sd_cos / math.sqrt(k)
    assert out["draw_check"] < 20  # K |mean - E|^2 / V_t, about 1 (a chi-square over P dimensions / P)


def test_alpha_star_is_the_argmin_of_the_measured_mse_on_a_grid():
    """With the sample mean as E[g_t], the closed-form MSE is exactly the mean over draws of |g_c - g*|^2:
    alpha* must be the argmin of that directly averaged MSE over a grid (not of the module's formula)."""
    g = torch.Generator().manual_seed(0)
    for shift in (0.0, 0.2, 0.6):  # unbiased, mildly and strongly biased trace branch
        g_star = torch.randn(50, generator=g, dtype=torch.float64)
        g_e = g_star + 0.5 * torch.randn(50, generator=g, dtype=torch.float64)
        g_t = g_star + shift + torch.randn(16, 50, generator=g, dtype=torch.float64)
        out = bias_variance(g_t, g_t.mean(0), g_e, g_star, alpha=0.3)
        grid = torch.linspace(0, 1, 2001, dtype=torch.float64)
        measured = torch.stack([(a * g_t + (1 - a) * g_e - g_star).pow(2).sum(1).mean() for a in grid])
        assert out["alpha_star"].item() == pytest.approx(grid[measured.argmin()].item(), abs=1e-3)
        assert out["mse_alpha_star"].item() == pytest.approx(measured.min().item(), rel=1e-6)
        for key, a in (("mse_alpha0", 0.0), ("mse_alpha_half", 0.5), ("mse_alpha1", 1.0), ("mse", 0.3)):
            direct = (a * g_t + (1 - a) * g_e - g_star).pow(2).sum(1).mean()
            assert out[key].item() == pytest.approx(direct.item(), rel=1e-10)
            assert mse_alpha(a, g_t, g_t.mean(0), g_e, g_star).item() == pytest.approx(direct.item(), rel=1e-10)
        g_c = 0.3 * g_t + 0.7 * g_e
        cos = (g_c @ g_star / (g_c.norm(dim=1) * g_star.norm())).mean()
        assert out["cos"].item() == pytest.approx(cos.item(), rel=1e-10)
        assert out["rel_mse"].item() == pytest.approx(out["mse"].item() / g_star.pow(2).sum().item(), rel=1e-10)


# --- arguments, the two stages, the CLI -------------------------------------------------------------------
def test_bad_arguments_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="alpha"):
        BVPOModule(alpha=1.5)
    with pytest.raises(ValueError, match="auto"):
        BVPOModule(alpha="best")
    with pytest.raises(ValueError, match="probe_every > 0"):
        BVPOModule(alpha="auto", probe_every=0)
    with pytest.raises(ValueError, match="trace_resamples >= 2"):
        BVPOModule(trace_resamples=1)
    with pytest.raises(ValueError, match="init_ckpt"):
        BVPOModule(sft_steps=0)
    with pytest.raises(ValueError, match="SFT stage"):
        BVPOModule(sft_steps=0, init_ckpt=str(tmp_path / "missing.pt"))


def test_seed_follows_the_run_seed_unless_given():
    model, data = BVPOModule(n_layer=1, n_head=2, n_embd=16), ArithTracesDataModule()
    model.run_seed = data.run_seed = 7  # what the CLI sets from seed_everything
    assert model.seed == 7
    assert data.seed == 7
    assert BVPOModule(n_layer=1, n_head=2, n_embd=16, seed=3).seed == 3


class _Recorder(L.Callback):
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []

    def setup(self, trainer, pl_module, stage):
        recorder = self

        class Capture(L.pytorch.loggers.logger.Logger):
            name, version = "capture", "0"

            def log_metrics(self, metrics, step=None):
                recorder.logged.append((step, dict(metrics)))

            def log_hyperparams(self, *args, **kwargs):
                pass

        trainer.loggers = [Capture()]


def test_two_stages_in_one_fit_probe_logged_at_every_probe_step_and_init_ckpt(tmp_path):
    m = _module(sft_steps=2, probe_every=2, trace_resamples=3, probe_prompts=4, alpha="auto")
    rec = _Recorder()
    trainer = L.Trainer(max_steps=7, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                        val_check_interval=7, check_val_every_n_epoch=None, callbacks=[rec])
    dm = ArithTracesDataModule(batch_size=8, copies=1, seed=0)
    trainer.fit(m, dm)
    assert bool(m.ref_ready) and trainer.optimizers[0].param_groups[0]["lr"] == m.hparams.dpo_lr
    assert 0.0 <= m.alpha <= 1.0 and "diag/bvpo/alpha_star" in trainer.callback_metrics
    probe_steps = [s for s, vals in rec.logged if "diag/bvpo/cos" in vals]
    assert probe_steps == [2, 4, 6]  # DPO steps 0, 2, 4: none dropped by the logging cadence
    assert [p["step"] for p in m.probe_log] == [2, 4, 6]
    assert {"val/pref_acc", "val/em_marginal", "val/p_correct"} <= set(trainer.callback_metrics)
    path = tmp_path / "policy.pt"
    torch.save(m.gpt.state_dict(), path)
    m2 = BVPOModule(n_layer=1, n_head=2, n_embd=16, sft_steps=0, init_ckpt=str(path))
    assert all(torch.equal(a, b) for a, b in zip(m.gpt.parameters(), m2.gpt.parameters()))
