"""BVPO (paper 000-14): mix a trace-based DPO gradient with an empty-trace DPO gradient, weight alpha.

A reasoning policy pi(r, y | x) emits a trace r, then an answer y. For a preference pair (x, y+, y-)
with reference policy pi_ref (the SFT model, frozen):
  trace-based DPO   l_t = -log sigma(beta [log pi(r+, y+|x)/pi_ref(r+, y+|x)
                                           - log pi(r-, y-|x)/pi_ref(r-, y-|x)])
                    with one trace per side drawn from pi_ref(r | x, y+-)  (noisy: g_t has variance V_t)
  empty-trace DPO   l_e = the same with r = empty (thinking disabled)     (no trace noise, biased)
  marginal DPO      l_m = the same with pi(y|x) = sum_r pi(r, y|x)         (the ideal objective; exact here)
  BVPO              L = alpha l_t + (1 - alpha) l_e,  so g_c = alpha g_t + (1 - alpha) g_e and, with the
                    empty branch deterministic given (x, y+-), Var(g_c | x, y+-) = alpha^2 V_t.
With d_t = E[g_t] - g*, d_e = g_e - g* (g* = grad l_m),
MSE(alpha) = alpha^2 V_t + |alpha d_t + (1-alpha) d_e|^2 is minimised at
alpha* = <d_e, d_e - d_t> / (V_t + |d_t - d_e|^2), clipped to [0, 1] (our derivation of the paper's
closed form). ``alpha="auto"`` follows an EMA of alpha* measured every ``probe_every`` steps.

The probe (every ``probe_every`` DPO steps, logged as ``diag/bvpo/*``) measures these on pairs of the
batch: g*, g_e and E[g_t] exactly (E[g_t] as the gradient of the loss averaged over the reference
posterior of all 30 x 30 trace pairs), V_t from K independent trace draws, and the scale-free forms
relative MSE = MSE / |g*|^2 and the cosine of each draw's mixed gradient with g*. Raw variances are not
scale-free: L = 0.5 l_t has a quarter of l_t's variance and the same direction.

Two stages in one run (one optimizer, one MLflow run): steps < ``sft_steps`` are SFT on the teacher's
sequences (restricted-softmax NLL at the trace and answer positions); at step ``sft_steps`` the policy is
frozen into the reference (its exact log-probabilities over all 30 traces x 10 answers of all 1000
prompts become buffers, so the reference is in the checkpoint), the optimizer state is reset and the lr
changes from the optimizer's (the SFT rate) to ``dpo_lr``; the remaining steps are BVPO. ``init_ckpt``
starts from a saved policy instead. alpha = 1 is trace-only DPO, alpha = 0 empty-only DPO: the baselines
are this module. Runs with one seed share the SFT stage exactly (same seed, same batches, same steps).

Decoding is constrained (softmax restricted to the pair tokens at P, to digits at s1 and y), so the trace
space is exactly 30 traces and pi(y|x) is computed by enumeration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor

from datamodules.arith_vocab import (
    END_THINK,
    N_DIGITS,
    N_TRACES,
    P_AB,
    SEQ_LEN,
    VOCAB_SIZE,
    all_prompts,
    nothink_seqs,
    prompt_ids,
    thinking_seqs,
)
from errors import ConfigError
from modules.base import PaperTask, Stage, StepOutput, WeightedMean
from modules.components.grad_variance import GradientVarianceEstimator
from modules.components.metrics import Accuracy
from modules.components.tiny_gpt import TinyGPT

BRANCHES = ("composite", "trace", "empty", "marginal")
_M64 = (1 << 64) - 1


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


def mix64(z: Tensor) -> Tensor:
    """splitmix64 of int64 ``z`` (wrapping arithmetic): a bijection of 64-bit words that scrambles every bit."""
    z = z + _signed(0x9E3779B97F4A7C15)
    z = (z ^ ((z >> 30) & (_M64 >> 30))) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ ((z >> 27) & (_M64 >> 27))) * _signed(0x94D049BB133111EB)
    return z ^ ((z >> 31) & (_M64 >> 31))


def hash_uniform(key: Tensor) -> Tensor:
    """Counter-based uniforms in (0, 1) (splitmix64 of ``key``): a pure function of the key."""
    return (((mix64(key) >> 11) & ((1 << 53) - 1)).double() + 0.5) / float(1 << 53)


def trace_key(seed: int, step: int, draw: int | Tensor, side: int, rows: Tensor) -> Tensor:
    """One 64-bit key per row from the fields (seed, step, draw, side, row), chained through ``mix64`` so
    that no two distinct tuples share a key (up to 64-bit hash collisions)."""
    z = mix64(torch.tensor(seed, dtype=torch.long, device=rows.device))
    for field in (step, draw, side):
        z = mix64(z ^ torch.as_tensor(field, dtype=torch.long, device=rows.device))
    return mix64(z ^ rows)


def think_logp(logits: Tensor, seqs: Tensor) -> Tensor:
    """log pi(r, y | x) of thinking ``seqs`` (N, 10) from ``logits`` (N, 9, V) of ``seqs[:, :-1]``."""
    pair = (seqs[:, 5] - P_AB).clamp(0, 2)
    lp = logits[:, 4, P_AB : P_AB + 3].log_softmax(-1).gather(1, pair[:, None])
    lp = lp + logits[:, 5, :N_DIGITS].log_softmax(-1).gather(1, seqs[:, 6, None].clamp(0, 9))
    lp = lp + logits[:, 7, :N_DIGITS].log_softmax(-1).gather(1, seqs[:, 8, None].clamp(0, 9))
    return lp.squeeze(1)


def nothink_logp(logits: Tensor, seqs: Tensor) -> Tensor:
    """log pi(y | x, empty trace) of no-thinking ``seqs``."""
    return logits[:, 5, :N_DIGITS].log_softmax(-1).gather(1, seqs[:, 6, None].clamp(0, 9)).squeeze(1)


ALPHAS = {"0": 0.0, "_half": 0.5, "1": 1.0}


def bias_variance(
    g_t: Tensor, m_t: Tensor, g_e: Tensor, g_star: Tensor, alpha: float | None = None
) -> dict[str, Tensor]:
    """Bias/variance of g_c = alpha g_t + (1 - alpha) g_e against the exact marginal gradient g*.

    ``g_t`` (K, P): K independent draws of the trace-branch gradient; ``m_t`` = E[g_t], exact (the
    expectation over the reference posterior, see ``BVPOModule.expected_trace_loss``); ``g_e`` and
    ``g_star`` exact. With d_t = m_t - g*, d_e = g_e - g* and V_t = E|g_t - m_t|^2, estimated without bias
    by mean_k |g_t,k - m_t|^2 (the mean is exact, so no Bessel factor):
        MSE(alpha) = E|g_c - g*|^2 = alpha^2 V_t + |alpha d_t + (1 - alpha) d_e|^2
                   = alpha^2 (V_t + |d_t - d_e|^2) - 2 alpha <d_e, d_e - d_t> + |d_e|^2,
    minimised over [0, 1] at alpha* = <d_e, d_e - d_t> / (V_t + |d_t - d_e|^2), clipped. Scale-free forms:
    ``rel_mse`` = MSE / |g*|^2 and ``cos`` = mean_k cos(g_c,k, g*) (the direction of each draw). Values at
    alpha = 0, 1/2, 1, alpha* and, if given, at ``alpha`` (the run's own, no suffix). ``draw_check`` =
    K |mean_k g_t,k - m_t|^2 / V_t, about 1 when the draws follow the distribution m_t is the mean of.
    """
    k = g_t.shape[0]
    v_t = (g_t - m_t).pow(2).sum(1).mean()
    d_t, d_e = m_t - g_star, g_e - g_star
    curvature = v_t + (d_t - d_e).pow(2).sum()
    alpha_star = (d_e @ (d_e - d_t) / curvature.clamp_min(1e-300)).clamp(0.0, 1.0)
    g2 = g_star.pow(2).sum()
    gn = g_star.norm()

    def mse(a: float | Tensor) -> Tensor:
        return a**2 * v_t + (a * d_t + (1 - a) * d_e).pow(2).sum()

    def cos(a: float | Tensor) -> Tensor:
        g_c = a * g_t + (1 - a) * g_e
        return (g_c @ g_star / (g_c.norm(dim=1) * gn).clamp_min(1e-300)).mean()

    alphas = {**ALPHAS, "_star": alpha_star}
    if alpha is not None:
        alphas[""] = alpha
    out = {
        "V_t": v_t,
        "bias_t_sq": d_t.pow(2).sum(),
        "bias_e_sq": d_e.pow(2).sum(),
        "g_star_sq": g2,
        "alpha_star": alpha_star,
        "draw_check": k * (g_t.mean(0) - m_t).pow(2).sum() / v_t.clamp_min(1e-300),
    }
    for name, a in alphas.items():
        out[f"mse{'_alpha' + name if name else ''}"] = mse(a)
        out[f"rel_mse{'_alpha' + name if name else ''}"] = mse(a) / g2.clamp_min(1e-300)
        out[f"cos{'_alpha' + name if name else ''}"] = cos(a)
    return out


def mse_alpha(alpha: float | Tensor, g_t: Tensor, m_t: Tensor, g_e: Tensor, g_star: Tensor) -> Tensor:
    """MSE(alpha) = alpha^2 V_t + |alpha d_t + (1 - alpha) d_e|^2 (see ``bias_variance``)."""
    v_t = (g_t - m_t).pow(2).sum(1).mean()
    return alpha**2 * v_t + (alpha * (m_t - g_star) + (1 - alpha) * (g_e - g_star)).pow(2).sum()


class BVPOModule(PaperTask):
    """SFT then BVPO on the tiny GPT for the arithmetic-trace task (see the module docstring).

    Args:
        n_layer, n_head, n_embd, dropout: the tiny GPT policy (block size 10, vocabulary 18).
        sft_steps: optimizer steps of SFT before the reference is frozen and DPO starts.
        dpo_lr: learning rate of the DPO stage (the SFT stage uses the optimizer's own lr).
        beta: DPO inverse temperature beta.
        alpha: mixing weight alpha of the trace branch in [0, 1] (1: trace-only DPO, 0: empty-only DPO), or
            "auto" for the EMA of the measured MSE-optimal alpha*.
        probe_every: DPO steps between bias/variance probes, from the first DPO step (0: never; "auto"
            needs it > 0).
        probe_prompts: pairs of the current batch used by the probe.
        trace_resamples: K, independent trace draws per probe (V_t and the per-draw cosines from K draws;
            E[g_t] is exact).
        alpha_ema: EMA factor of alpha* for ``alpha="auto"``.
        init_ckpt: policy weights to start from (a ``.ckpt`` of this module or a TinyGPT state dict).
        seed: seed of the trace draws (chained with the step, the draw and the row id of each pair); None:
            the run's seed (``seed_everything``).
        optimizer, lr_scheduler: AdamW at the SFT learning rate 3e-3 by default.
    """

    paper_id = "000-14"
    monitor = "val/em_marginal"
    monitor_mode = "max"
    vectorizable = False  # --run.seeds: it configures its own optimizers

    def __init__(
        self,
        n_layer: int = 3,
        n_head: int = 3,
        n_embd: int = 48,
        dropout: float = 0.0,
        sft_steps: int = 500,
        dpo_lr: float = 1e-4,
        beta: float = 0.1,
        alpha: float | str = 0.5,
        probe_every: int = 100,
        probe_prompts: int = 16,
        trace_resamples: int = 64,
        alpha_ema: float = 0.9,
        init_ckpt: str | None = None,
        seed: int | None = None,
        optimizer: OptimizerCallable = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.0),
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        metrics = {n: Accuracy() for n in ("em_marginal", "em_think", "em_nothink")}
        means = ("pref_acc", "pref_acc_all", "pref_acc_nothink", "dpo_loss_marginal", "p_correct",
                 "p_correct_nothink")
        metrics.update({n: WeightedMean() for n in means})
        super().__init__(optimizer, lr_scheduler, metrics)
        if isinstance(alpha, str):
            if alpha != "auto":
                raise ConfigError(f"alpha must be a number in [0, 1] or 'auto', got {alpha!r}")
            if probe_every <= 0:
                raise ConfigError("alpha='auto' estimates alpha* in the probe: set probe_every > 0")
        elif not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"alpha must be in [0, 1] (1 = trace-only DPO, 0 = empty-only), got {alpha}")
        if sft_steps < 0 or beta <= 0 or trace_resamples < 2 or probe_prompts < 1 or probe_every < 0:
            raise ConfigError("need sft_steps >= 0, beta > 0, trace_resamples >= 2, probe_prompts >= 1 and "
                              "probe_every >= 0")
        if sft_steps == 0 and init_ckpt is None:
            raise ConfigError("sft_steps=0 needs init_ckpt (an SFT policy): DPO from a random policy is moot")
        self.sft_steps, self.dpo_lr, self.beta, self.alpha_setting = sft_steps, dpo_lr, beta, alpha
        self.probe_every, self.probe_prompts, self.trace_resamples = probe_every, probe_prompts, trace_resamples
        self.alpha_ema = alpha_ema
        self.fixed_seed = seed
        self.gpt = TinyGPT(block_size=SEQ_LEN, vocab_size=VOCAB_SIZE, n_layer=n_layer, n_head=n_head,
                           n_embd=n_embd, activation="gelu", mlp_ratio=4, dropout=dropout, bias=False,
                           tie_weights=True)
        if init_ckpt is not None:
            self._load_policy(init_ckpt)
        # the frozen reference as exact tables over all prompts: log pi_ref(r, y|x), log pi_ref(y|x, empty)
        self.register_buffer("ref_joint", torch.zeros(1000, N_TRACES, N_DIGITS))
        self.register_buffer("ref_nothink", torch.zeros(1000, N_DIGITS))
        self.register_buffer("ref_ready", torch.tensor(False))
        self.register_buffer("alpha_est", torch.tensor(0.5 if alpha == "auto" else float(alpha)))
        self.register_buffer("alpha_probed", torch.tensor(False))
        self.probe_log: list[dict[str, float]] = []  # every probe's statistics
        self._draw_grads = GradientVarianceEstimator("auto")  # per-draw gradients for the probe


    @property
    def seed(self) -> int:
        """The seed of the trace draws: ``seed``, else the run's seed."""
        return self.seed_or_run(self.fixed_seed) % (1 << 62)
    def _load_policy(self, path: str) -> None:
        if not Path(path).is_file():
            raise ConfigError(f"init_ckpt {path!r} does not exist; run the SFT stage first (see bvpo.md)")
        state = torch.load(path, map_location="cpu", weights_only=False)
        if "state_dict" in state:
            state = {k[4:]: v for k, v in state["state_dict"].items() if k.startswith("gpt.")}
        self.gpt.load_state_dict(state)

    # --- the policy's log-probabilities ---------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        a = self.alpha_setting
        return float(self.alpha_est) if a == "auto" else float(a)

    @property
    def in_dpo(self) -> bool:
        return bool(self.ref_ready)

    def logits(self, seqs: Tensor) -> Tensor:
        return self.gpt(seqs[:, :-1])

    def enumerate_traces(self, prompts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log pi(r, y|x) (N, 30, 10), log pi(P|x) (N, 3), log pi(s1|x, P) (N, 3, 10); r = 10 P + s1."""
        n = prompts.shape[0]
        r = torch.arange(N_TRACES, device=prompts.device).repeat(n)
        seqs = thinking_seqs(prompts.repeat_interleave(N_TRACES, 0), r // 10, r % 10, torch.zeros_like(r))
        lg = self.logits(seqs)
        lp_pair = lg[:, 4, P_AB : P_AB + 3].log_softmax(-1)
        lp_s1 = lg[:, 5, :N_DIGITS].log_softmax(-1)
        lp_r = lp_pair.gather(1, (r // 10)[:, None]) + lp_s1.gather(1, (r % 10)[:, None])
        joint = (lp_r + lg[:, 7, :N_DIGITS].log_softmax(-1)).reshape(n, N_TRACES, N_DIGITS)
        return joint, lp_pair.reshape(n, N_TRACES, 3)[:, 0], lp_s1.reshape(n, 3, 10, N_DIGITS)[:, :, 0]

    def nothink_all(self, prompts: Tensor) -> Tensor:
        """log pi(y | x, empty trace) for all answers, (N, 10)."""
        seqs = nothink_seqs(prompts, torch.zeros_like(prompts[:, 0]))
        return self.logits(seqs)[:, 5, :N_DIGITS].log_softmax(-1)

    @torch.no_grad()
    def build_reference(self) -> None:
        """Freeze the current policy as pi_ref: exact tables over all 1000 prompts."""
        was = self.training
        self.eval()
        prompts = all_prompts().to(self.device)
        for chunk in torch.arange(1000, device=self.device).split(200):
            self.ref_joint[chunk] = self.enumerate_traces(prompts[chunk])[0].to(self.ref_joint.dtype)
            self.ref_nothink[chunk] = self.nothink_all(prompts[chunk]).to(self.ref_nothink.dtype)
        self.ref_ready.fill_(True)
        self.train(was)

    # --- losses --------------------------------------------------------------------------------------------
    def sample_traces(self, pid: Tensor, y: Tensor, rows: Tensor, side: int, draw: int | Tensor = 0) -> Tensor:
        """r ~ pi_ref(r | x, y) by Gumbel-max, uniforms keyed on (seed, step, draw, side, row).

        Training uses draw 0; the probe's K draws are 1..K. ``draw`` may be a tensor broadcasting with rows.
        """
        key = trace_key(self.seed, self.global_step, draw, side, rows)
        u = hash_uniform(key[..., None] + torch.arange(N_TRACES, device=rows.device))
        gumbel = -torch.log(-torch.log(u)).to(self.ref_joint.dtype)
        return (self.ref_joint[pid, :, y] + gumbel).argmax(-1)

    def sft_losses(self, batch: Any) -> Tensor:
        """Per-sample NLL of the teacher sequence (summed over its scored tokens)."""
        seq = batch[2]
        lg = self.logits(seq)
        return -torch.where(seq[:, 5] != END_THINK, think_logp(lg, seq), nothink_logp(lg, seq))

    def trace_loss_of(self, prompts: Tensor, y_pos: Tensor, y_neg: Tensor, r_pos: Tensor, r_neg: Tensor) -> Tensor:
        """l_t of the pairs (any leading shape) with the given traces r+- (r = 10 P + s1)."""
        shape = y_pos.shape
        prompts, y_pos, y_neg, r_pos, r_neg = (t.reshape(-1, *t.shape[len(shape):])
                                               for t in (prompts, y_pos, y_neg, r_pos, r_neg))
        pid = prompt_ids(prompts)
        seqs = torch.stack([thinking_seqs(prompts, r_pos // 10, r_pos % 10, y_pos),
                            thinking_seqs(prompts, r_neg // 10, r_neg % 10, y_neg)], 1)  # (N, 2, 10)
        n = seqs.shape[0]
        lg = self.logits(seqs.reshape(2 * n, SEQ_LEN)).reshape(n, 2, SEQ_LEN - 1, -1)
        h = (think_logp(lg[:, 0], seqs[:, 0]) - self.ref_joint[pid, r_pos, y_pos]) - (
            think_logp(lg[:, 1], seqs[:, 1]) - self.ref_joint[pid, r_neg, y_neg])
        return -F.logsigmoid(self.beta * h).reshape(shape)

    def dpo_losses(self, batch: Any, draw: int = 0) -> dict[str, Tensor]:
        """Per-sample l_t (one trace per side drawn from pi_ref) and l_e."""
        prompts, y_pos, _, y_neg, rows = batch
        pid = prompt_ids(prompts)
        r_pos = self.sample_traces(pid, y_pos, rows, 0, draw)
        r_neg = self.sample_traces(pid, y_neg, rows, 1, draw)
        seqs = torch.stack([
            thinking_seqs(prompts, r_pos // 10, r_pos % 10, y_pos),
            thinking_seqs(prompts, r_neg // 10, r_neg % 10, y_neg),
            nothink_seqs(prompts, y_pos),
            nothink_seqs(prompts, y_neg),
        ], 1)  # (B, 4, 10), sample-major rows so that per-sample hooks see B groups
        b = seqs.shape[0]
        lg = self.logits(seqs.reshape(4 * b, SEQ_LEN)).reshape(b, 4, SEQ_LEN - 1, -1)
        beta = self.beta
        h_t = (think_logp(lg[:, 0], seqs[:, 0]) - self.ref_joint[pid, r_pos, y_pos]) - (
            think_logp(lg[:, 1], seqs[:, 1]) - self.ref_joint[pid, r_neg, y_neg])
        h_e = (nothink_logp(lg[:, 2], seqs[:, 2]) - self.ref_nothink[pid, y_pos]) - (
            nothink_logp(lg[:, 3], seqs[:, 3]) - self.ref_nothink[pid, y_neg])
        return {"trace": -F.logsigmoid(beta * h_t), "empty": -F.logsigmoid(beta * h_e)}

    def expected_trace_loss(self, batch: Any) -> Tensor:
        """(B,) E_{r+ ~ pi_ref(r|x,y+), r- ~ pi_ref(r|x,y-)} l_t, exact: a sum over all 30 x 30 trace pairs.

        The posterior weights are the frozen reference's, so the gradient of this is E[g_t] exactly.
        """
        prompts, y_pos, _, y_neg, _ = batch
        pid = prompt_ids(prompts)
        idx = torch.arange(prompts.shape[0], device=prompts.device)
        joint = self.enumerate_traces(prompts)[0]  # (B, 30, 10)
        ref = self.ref_joint[pid]
        lr_pos = joint[idx, :, y_pos] - ref[idx, :, y_pos]  # (B, 30): log-ratio of (r, y+)
        lr_neg = joint[idx, :, y_neg] - ref[idx, :, y_neg]
        q_pos = ref[idx, :, y_pos].softmax(-1).to(joint.dtype)
        q_neg = ref[idx, :, y_neg].softmax(-1).to(joint.dtype)
        loss = -F.logsigmoid(self.beta * (lr_pos[:, :, None] - lr_neg[:, None, :]))  # (B, 30, 30)
        return torch.einsum("bi,bj,bij->b", q_pos, q_neg, loss)

    def marginal_margin(self, batch: Any) -> Tensor:
        """Exact log pi(y+|x)/pi_ref(y+|x) - log pi(y-|x)/pi_ref(y-|x) with pi(y|x) = sum_r pi(r, y|x)."""
        prompts, y_pos, _, y_neg, _ = batch
        pid = prompt_ids(prompts)
        marg = self.enumerate_traces(prompts)[0].logsumexp(1)
        ref = self.ref_joint[pid].logsumexp(1)
        idx = torch.arange(prompts.shape[0], device=prompts.device)
        return (marg[idx, y_pos] - ref[idx, y_pos]) - (marg[idx, y_neg] - ref[idx, y_neg])

    def per_sample_loss(self, batch: Any, branch: str = "composite") -> Tensor:
        """(B,) per-sample training loss: SFT NLL before the switch, then the BVPO loss of ``branch``.

        This is the ``GradientVariance`` protocol: the training loss is the mean of these.
        """
        if not self.in_dpo:
            return self.sft_losses(batch)
        if branch == "marginal":
            return -F.logsigmoid(self.beta * self.marginal_margin(batch))
        if branch not in BRANCHES:
            raise ConfigError(f"branch must be one of {BRANCHES}, got {branch!r}")
        terms = self.dpo_losses(batch)
        if branch == "composite":
            return self.alpha * terms["trace"] + (1.0 - self.alpha) * terms["empty"]
        return terms[branch]

    # --- the bias/variance probe -------------------------------------------------------------------
    def trace_draws(self, batch: Any, k: int) -> tuple[Tensor, ...]:
        """K independent trace draws for the pairs of ``batch``: ``(prompts, y+, y-, r+, r-)``, each (K, B, ...)."""
        prompts, y_pos, _, y_neg, rows = batch
        pid = prompt_ids(prompts)
        draw = torch.arange(1, k + 1, device=rows.device)[:, None]
        r_pos = self.sample_traces(pid, y_pos, rows, 0, draw)
        r_neg = self.sample_traces(pid, y_neg, rows, 1, draw)
        rep = lambda t: t.expand(k, *t.shape)  # noqa: E731
        return rep(prompts), rep(y_pos), rep(y_neg), r_pos, r_neg

    def probe(self, batch: Any) -> dict[str, float]:
        """V_t, |d_t|^2, |d_e|^2, alpha*, MSE / relative MSE / cosine at several alpha (see ``bias_variance``).

        On ``probe_prompts`` pairs of ``batch``, gradients of the mean loss over those pairs (the conditional
        view: pairs fixed, traces random): g* (marginal), g_e and E[g_t] exact, g_t from K independent draws
        (one per-draw gradient each, by the per-sample gradient machinery with a draw as the sample).
        """
        k_draws = self.trace_resamples
        sub = tuple(t[: self.probe_prompts] for t in batch)
        params = [p for p in self.parameters() if p.requires_grad]

        def flat(loss: Tensor) -> Tensor:
            return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]).double()

        def per_draw(model: BVPOModule, draws: tuple[Tensor, ...]) -> Tensor:
            return model.trace_loss_of(*draws).mean(1)

        with torch.enable_grad():
            g_star = flat(self.per_sample_loss(sub, "marginal").mean())
            g_e = flat(self.dpo_losses(sub)["empty"].mean())
            m_t = flat(self.expected_trace_loss(sub).mean())
            g_t = self._draw_grads.per_sample_grads(self, per_draw, self.trace_draws(sub, k_draws))
        out = bias_variance(g_t, m_t, g_e, g_star, self.alpha)
        trainer = self.attached_trainer()
        if trainer is not None and trainer.world_size > 1:  # one alpha for all ranks
            out["alpha_star"] = trainer.strategy.reduce(out["alpha_star"].to(self.device), reduce_op="mean")
        return {k: float(v) for k, v in out.items()}

    # --- Lightning ---------------------------------------------------------------------------------
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if not self.in_dpo and self.global_step >= self.sft_steps:
            self.build_reference()
            for opt in self.trainer.optimizers:  # DPO starts from a fresh AdamW at its own rate
                opt.state.clear()
                for group in opt.param_groups:
                    group["lr"] = self.dpo_lr

    def step(self, batch: Any, stage: Stage) -> StepOutput:
        if stage == "train":
            return StepOutput(self._train_loss(batch), n=batch[0].shape[0])
        return self._evaluate(batch)

    def _train_loss(self, batch: Any) -> Tensor:
        every = self.probe_every
        if self.in_dpo and every > 0 and (self.global_step - self.sft_steps) % every == 0:
            alpha = self.alpha  # the alpha this step trains with
            stats = self.probe(batch)
            if self.alpha_setting == "auto":
                ema = self.alpha_ema if bool(self.alpha_probed) else 0.0
                self.alpha_est.fill_(ema * self.alpha + (1 - ema) * stats["alpha_star"])
                self.alpha_probed.fill_(True)
            stats["alpha"] = alpha
            self.probe_log.append({"step": self.global_step, **stats})
            self._emit({f"diag/bvpo/{k}": v for k, v in stats.items()})
        return self.per_sample_loss(batch).mean()

    def _emit(self, values: dict[str, float]) -> None:
        """To every logger at this step (rank 0) and into ``callback_metrics``, like a ``Diagnostic``
        (``self.log`` would wait for ``log_every_n_steps`` and drop a probe that falls between)."""
        trainer = self.attached_trainer()
        if trainer is None:
            return
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(values, step=self.global_step)
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in values.items()})

    def _evaluate(self, batch: Any) -> StepOutput:
        prompts, y_pos, _, y_neg, _ = batch
        pid = prompt_ids(prompts)
        joint, lp_pair, lp_s1 = self.enumerate_traces(prompts)
        idx = torch.arange(prompts.shape[0], device=prompts.device)
        pair = lp_pair.argmax(-1)
        s1 = lp_s1[idx, pair].argmax(-1)
        greedy = joint[idx, pair * 10 + s1].argmax(-1)
        nothink = self.nothink_all(prompts)
        marg = joint.logsumexp(1)
        ref = self.ref_joint[pid].logsumexp(1) if self.in_dpo else marg
        ref_n = self.ref_nothink[pid] if self.in_dpo else nothink
        margin = (marg[idx, y_pos] - ref[idx, y_pos]) - (marg[idx, y_neg] - ref[idx, y_neg])
        margin_n = (nothink[idx, y_pos] - ref_n[idx, y_pos]) - (nothink[idx, y_neg] - ref_n[idx, y_neg])
        reward = marg - ref  # the implicit reward log pi(y|x)/pi_ref(y|x) of every answer
        beats = (reward[idx, y_pos][:, None] > reward).double()  # y* against each of the 9 wrong answers
        n = prompts.shape[0]
        dpo_marginal = -F.logsigmoid(self.beta * margin)
        inputs = {
            "em_marginal": (marg.argmax(-1), y_pos),
            "em_think": (greedy, y_pos),
            "em_nothink": (nothink.argmax(-1), y_pos),
            "pref_acc": ((margin > 0).double().mean(), n),
            "pref_acc_all": ((beats.sum(1) / (N_DIGITS - 1)).mean(), n),
            "pref_acc_nothink": ((margin_n > 0).double().mean(), n),
            "dpo_loss_marginal": (dpo_marginal.mean(), n),
            # the accuracy of a sampled answer: pi(y*|x) (marginal over traces) and pi(y*|x, empty)
            "p_correct": (marg[idx, y_pos].exp().mean(), n),
            "p_correct_nothink": (nothink[idx, y_pos].exp().mean(), n),
        }
        return StepOutput(dpo_marginal.mean(), n=n, inputs=inputs)

    def configure_optimizers(self) -> Any:
        config = super().configure_optimizers()
        if self.sft_steps == 0:  # no SFT stage: DPO from the start, at its own rate
            optimizer = config["optimizer"] if isinstance(config, dict) else config
            for group in optimizer.param_groups:
                group["lr"] = self.dpo_lr
        return config
