"""FRAC (002-02): the scan against a naive loop, the kernel against the power law, decode against prefill."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import pytest
import torch

from errors import ConfigError
from modules.components.ssm import log_cell_widths, log_spaced_rates, selective_scan
from modules.frac_ssm import FracSSMLM, FracSSMNet, FracSSMRegressor, frac_kernel_weights, frac_selective_scan

F64 = torch.float64


def naive_scan(x, delta, Bm, Cm, rates, w, lam=None, D=None, h=None):
    """The recurrence written out, one step at a time (float64 reference)."""
    b, n_len, c = x.shape
    n, k = Bm.shape[-1], rates.numel()
    lam = torch.ones(c, dtype=x.dtype) if lam is None else lam
    h = torch.zeros(b, c, n, k, dtype=x.dtype) if h is None else h
    ys = []
    for t in range(n_len):
        decay = torch.exp(-delta[:, t, :, None] * rates[None, None, :] * lam[None, :, None])  # (B, C, K)
        h = decay[:, :, None, :] * h + (delta[:, t] * x[:, t])[:, :, None, None] * Bm[:, t, None, :, None]
        y = torch.einsum("bcnk,bn,ck->bc", h, Cm[:, t], w)
        ys.append(y + (D * x[:, t] if D is not None else 0.0))
    return torch.stack(ys, 1), h


def inputs(b=2, n_len=520, c=3, n=4, k=8, scale=0.1, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, n_len, c, generator=g, dtype=dtype)
    # step sizes spread over 4 decades around `scale`, so that modes decay at very different speeds
    delta = scale * torch.exp(torch.empty(b, n_len, c, dtype=dtype).uniform_(-4.6, 4.6, generator=g))
    Bm = torch.randn(b, n_len, n, generator=g, dtype=dtype)
    Cm = torch.randn(b, n_len, n, generator=g, dtype=dtype)
    rates = log_spaced_rates(1e-4, 1.0, k).to(dtype)
    alpha = torch.empty(c, dtype=dtype).uniform_(0.1, 0.9, generator=g)
    w = frac_kernel_weights(alpha, rates)
    lam = torch.empty(c, dtype=dtype).uniform_(0.5, 16.0, generator=g)
    D = torch.randn(c, generator=g, dtype=dtype)
    return x, delta, Bm, Cm, rates, w, lam, D


@pytest.mark.parametrize("segsum_chunk", [8, 16, 1])
@pytest.mark.parametrize("scale", [1e-3, 0.3, 30.0])
def test_scan_matches_naive_loop_float64(scale: float, segsum_chunk: int) -> None:
    """L = 520 (not a multiple of the chunk), 8 modes over 4 decades; at scale 30 the fast modes forget
    everything in a step and the scan must shorten their chunks: the segment-sum form takes them (chunks of 8 or 16), or
    chunks of one step (1)."""
    args = inputs(scale=scale)
    y, h = selective_scan(*args, return_state=True, segsum_chunk=segsum_chunk)
    y_ref, h_ref = naive_scan(*args)
    tol = 1e-10 * max(1.0, y_ref.abs().max().item())
    assert (y - y_ref).abs().max().item() < tol
    assert (h - h_ref).abs().max().item() < 1e-10 * max(1.0, h_ref.abs().max().item())
    assert torch.equal(frac_selective_scan(*args), selective_scan(*args))


def test_scan_matches_naive_loop_for_one_mode_and_no_lam_or_skip() -> None:
    x, delta, Bm, Cm, _, _, _, _ = inputs(n_len=512, scale=0.5)
    rates = torch.tensor([1.0], dtype=F64)
    w = torch.full((3, 1), 0.7, dtype=F64)
    y = selective_scan(x, delta, Bm, Cm, rates, w, chunk_size=16)
    y_ref, _ = naive_scan(x, delta, Bm, Cm, rates, w)
    assert (y - y_ref).abs().max().item() < 1e-10 * y_ref.abs().max().item()


def test_scan_negative_weights_take_the_general_readout() -> None:
    x, delta, Bm, Cm, rates, w, lam, D = inputs(n_len=130, scale=0.1)
    w = w * torch.tensor([1.0, -2.0, 0.5], dtype=F64)[:, None]
    y = selective_scan(x, delta, Bm, Cm, rates, w, lam, D)
    y_ref, _ = naive_scan(x, delta, Bm, Cm, rates, w, lam, D)
    assert (y - y_ref).abs().max().item() < 1e-10 * y_ref.abs().max().item()


@pytest.mark.parametrize("delta_value", [1e-9, 1e4])
def test_scan_stable_for_decays_near_one_and_zero(delta_value: float) -> None:
    """Decays exp(-1e-13) (every mode holds) and exp(-1e4) (the fastest forget at once): finite, and float32
    agrees with the float64 loop to float32 precision."""
    x, _, Bm, Cm, rates, w, lam, D = inputs(n_len=300)
    delta = torch.full_like(x, delta_value)
    y_ref, _ = naive_scan(x, delta, Bm, Cm, rates, w, lam, D)
    y64 = selective_scan(x, delta, Bm, Cm, rates, w, lam, D)
    y32 = selective_scan(*(t.float() for t in (x, delta, Bm, Cm, rates, w, lam, D)))
    assert torch.isfinite(y32).all() and y32.dtype == torch.float32
    scale = y_ref.abs().max().item()
    assert (y64 - y_ref).abs().max().item() < 1e-9 * scale
    assert (y32.double() - y_ref).abs().max().item() < 1e-4 * scale


def test_scan_gradients_match_autograd_through_the_loop() -> None:
    """Gradients of the chunked form (several chunk lengths at once) equal those of the naive loop."""
    args = [t.clone().requires_grad_(True) for t in inputs(b=1, n_len=70, c=2, n=2, k=4, scale=3.0)]
    x, delta, Bm, Cm, rates, w, lam, D = args
    grads = torch.autograd.grad(selective_scan(x, delta, Bm, Cm, rates.detach(), w, lam, D, chunk_size=32).square().sum(),
                                (x, delta, Bm, Cm, w, lam, D))
    ref = torch.autograd.grad(naive_scan(x, delta, Bm, Cm, rates.detach(), w, lam, D)[0].square().sum(),
                              (x, delta, Bm, Cm, w, lam, D))
    for g, r in zip(grads, ref):
        assert (g - r).abs().max().item() < 1e-9 * max(1.0, r.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_scan_keeps_the_input_dtype(dtype: torch.dtype) -> None:
    args = [t.to(dtype) for t in inputs(n_len=40)]
    assert frac_selective_scan(*args).dtype == dtype


def test_scan_continues_from_a_state() -> None:
    """Scanning a sequence in two pieces, the second from the first's final state, is the whole scan."""
    x, delta, Bm, Cm, rates, w, lam, D = inputs(n_len=200, scale=1.0)
    y, h = selective_scan(x, delta, Bm, Cm, rates, w, lam, D, return_state=True)
    y1, h1 = selective_scan(x[:, :77], delta[:, :77], Bm[:, :77], Cm[:, :77], rates, w, lam, D, return_state=True)
    y2, h2 = selective_scan(x[:, 77:], delta[:, 77:], Bm[:, 77:], Cm[:, 77:], rates, w, lam, D,
                            initial_state=h1, return_state=True)
    assert torch.allclose(torch.cat([y1, y2], 1), y, rtol=1e-11, atol=1e-11)
    assert torch.allclose(h2, h, rtol=1e-11, atol=1e-11)


# --- the kernel ------------------------------------------------------------------------------------------------
def mode_sum(t, w, rates):
    return (w[:, :, None] * torch.exp(-rates[None, :, None] * t[None, None, :])).sum(1)


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.8])
def test_kernel_is_the_power_law_on_a_fine_grid(alpha: float) -> None:
    """64 rates in [1e-8, 1e2]: the mode sum is t^(a-1)/Gamma(a) to 1e-3 over 4 decades of t."""
    rates = log_spaced_rates(1e-8, 1e2, 64)
    w = frac_kernel_weights(torch.tensor([alpha], dtype=F64), rates)
    t = torch.logspace(0, 4, 41, dtype=F64)
    ratio = mode_sum(t, w, rates)[0] / (t ** (alpha - 1) / math.gamma(alpha))
    assert (ratio - 1).abs().max().item() < 1e-3


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.8])
def test_kernel_on_the_default_grid(alpha: float) -> None:
    """The default 8 rates in [1e-4, 1]: within 1.5 % for 3 <= t <= 300, within 6 % up to 1000."""
    rates = log_spaced_rates(1e-4, 1.0, 8)
    w = frac_kernel_weights(torch.tensor([alpha], dtype=F64), rates)
    t = torch.logspace(math.log10(3), 3, 50, dtype=F64)
    err = (mode_sum(t, w, rates)[0] / (t ** (alpha - 1) / math.gamma(alpha)) - 1).abs()
    assert err[t <= 300].max().item() < 0.015
    assert err.max().item() < 0.06


def test_kernel_weights_closed_form() -> None:
    """Without the tail term, w = sin(pi a)/pi s^(1-a) h on a uniform log grid (h its spacing); with it only
    the slowest weight changes, to sin(pi a)/pi (s_0 e^(h/2))^(1-a)/(1-a); any order of the rates."""
    rates = log_spaced_rates(1e-3, 10.0, 5)
    h = math.log(10.0)
    alpha = torch.tensor([0.3, 0.7], dtype=F64)
    expect = torch.sin(math.pi * alpha)[:, None] / math.pi * rates[None] ** (1 - alpha[:, None]) * h
    assert torch.allclose(frac_kernel_weights(alpha, rates, tail=False), expect, rtol=1e-12)
    tail = frac_kernel_weights(alpha, rates)
    slow = torch.sin(math.pi * alpha) / math.pi * (1e-3 * math.exp(h / 2)) ** (1 - alpha) / (1 - alpha)
    assert torch.allclose(tail[:, 0], slow, rtol=1e-12) and torch.equal(tail[:, 1:], frac_kernel_weights(alpha, rates, tail=False)[:, 1:])
    perm = torch.tensor([3, 0, 4, 1, 2])
    assert torch.allclose(frac_kernel_weights(alpha, rates[perm]), tail[:, perm], rtol=1e-12)
    assert torch.allclose(log_cell_widths(rates), torch.full((5,), h, dtype=F64))


def test_kernel_weights_are_differentiable_in_alpha() -> None:
    alpha = torch.tensor([0.4], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: frac_kernel_weights(a, log_spaced_rates(1e-4, 1, 8)), (alpha,))


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.2, 1.5, float("nan")])
def test_kernel_weights_refuse_alpha_outside_the_open_unit_interval(alpha: float) -> None:
    with pytest.raises(ConfigError, match="alpha"):
        frac_kernel_weights(torch.tensor([0.5, alpha]), log_spaced_rates(1e-4, 1, 8))


@pytest.mark.parametrize("rates", [[0.0, 1.0], [-1.0, 1.0], [0.1, 0.1], [1.0]])
def test_kernel_weights_refuse_bad_rates(rates: list[float]) -> None:
    with pytest.raises(ConfigError, match="rates"):
        frac_kernel_weights(torch.tensor([0.5]), torch.tensor(rates))


def test_kernel_weights_refuse_a_matrix_of_alphas() -> None:
    with pytest.raises(ConfigError, match=r"alpha must be a 1-D"):
        frac_kernel_weights(torch.full((2, 2), 0.5), log_spaced_rates(1e-4, 1, 8))


def test_scan_refuses_shape_mismatches_and_bad_rates() -> None:
    x, delta, Bm, Cm, rates, w, lam, D = inputs(n_len=10)
    cases = [
        ((x[0], delta, Bm, Cm, rates, w), "x must be"),
        ((x, delta[:, :5], Bm, Cm, rates, w), "delta must"),
        ((x, delta, Bm, Cm[..., :2], rates, w), "Bm and Cm"),
        ((x, delta, Bm, Cm, rates, w[:, :3]), "weights must"),
        ((x, delta, Bm, Cm, -rates, w), "rates must"),
        ((x, delta, Bm, Cm, rates, w, lam[:2]), "lam must"),
        ((x, delta, Bm, Cm, rates, w, lam, D[:1]), "D must"),
    ]
    for args, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            frac_selective_scan(*args)


# --- the model -------------------------------------------------------------------------------------------------
def lm(vocab_size: int = 64, **net_args) -> FracSSMLM:
    """``FracSSMLM`` on a ``FracSSMNet`` with ``net_args`` (the config's ``model.init_args.net.init_args``)."""
    return FracSSMLM(net=functools.partial(FracSSMNet, **net_args), vocab_size=vocab_size)


@pytest.mark.parametrize("kernel", ["frac", "exp"])
def test_decode_equals_prefill(kernel: str) -> None:
    """Token-by-token decoding with the bounded state gives the parallel forward's logits, also when the
    first tokens are prefilled by the scan."""
    torch.manual_seed(0)
    m = lm(d_model=16, n_layers=2, d_state=4, n_modes=4, kernel=kernel, vocab_size=11, chunk_size=8).double()
    m.eval()
    tokens = torch.randint(0, 11, (2, 45))
    with torch.no_grad():
        ref = m(tokens)
    for prefix in (0, 1, 2, 30):
        out = m.decode_logits(tokens, prefix=prefix)
        assert (out - ref).abs().max().item() < 1e-10, prefix


def test_equal_state_and_parameter_counts() -> None:
    """kernel='exp' keeps the state size (one mode of N K states) and has more parameters (wider B, C)."""
    frac = lm(d_model=32, n_layers=2, kernel="frac")
    exp = lm(d_model=32, n_layers=2, kernel="exp")
    for bf, be in zip(frac.net.backbone.blocks, exp.net.backbone.blocks):
        assert bf.init_state(1)["ssm"].numel() == be.init_state(1)["ssm"].numel() == 64 * 16 * 8
        assert be.n_modes == 1 and bf.n_modes == 8
    assert sum(p.numel() for p in exp.parameters()) > sum(p.numel() for p in frac.parameters())


def test_alpha_is_a_learned_sigmoid_per_channel() -> None:
    m = lm(d_model=8, n_layers=1, alpha_init=0.3)
    (a,) = m.alphas()
    assert a.shape == (16,) and torch.allclose(a, torch.full((16,), 0.3))
    out = m.step((torch.randint(0, 64, (2, 20)), torch.randint(0, 64, (2, 20)),
                  torch.randint(1, 9, (2, 20))), "train")
    out.loss.backward()
    assert m.net.backbone.blocks[0].alpha_raw.grad.abs().sum() > 0
    assert lm(d_model=8, n_layers=1, kernel="exp").alphas() == []


def test_memory_kernel_of_a_constant_step_is_the_mode_sum() -> None:
    """With Delta constant the realised kernel is sum_k w_k exp(-s_k lambda Delta t)."""
    m = lm(d_model=8, n_layers=1, n_modes=8)
    block = m.net.backbone.blocks[0]
    delta = torch.full((3, 50, 16), 0.2)
    lk = block.log_memory_kernel(delta)
    t = torch.arange(1, 50, dtype=F64)
    w, s, lam = block.weights().double(), block.rates.double(), block.lam().double()
    expect = (w[:, :, None] * torch.exp(-s[None, :, None] * lam[:, None, None] * 0.2 * t)).sum(1).log()
    assert torch.allclose(lk, expect, rtol=1e-5, atol=1e-6)


def test_lag_bucket_accuracies_count_each_answer_in_the_bucket_of_its_lag() -> None:
    """``test/acc_lag<lo>_<hi>`` (the page's recall table) against a naive loop: an answer with lag l counts in the
    bucket lo <= l < hi, the top bucket open above. The lags sit on and next to every bucket edge; the answers at
    an edge (lag 1, 32, 256) are right and the others wrong, so an edge answer put in the wrong bucket changes
    the accuracy. ``test/acc`` of a plain next-token batch (no lags) is the accuracy over every position."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    vocab, n_len = 11, 40
    model = lm(d_model=8, n_layers=1, vocab_size=vocab, chunk_size=8).eval()
    tokens = torch.randint(0, vocab, (2, n_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        preds = model(tokens).argmax(-1)
    answer_lags = [1, 2, 31, 32, 33, 255, 256, 257, 1023, 1024, 1500]
    edges = {1, 32, 256}
    targets = torch.full_like(tokens, -100)
    lags = torch.zeros_like(tokens)
    answers = []  # (lag, correct)
    for j, lag in enumerate(answer_lags * 2):
        b, t = j % 2, 3 + 3 * j // 2
        right = lag in edges
        targets[b, t] = preds[b, t] if right else (preds[b, t] + 1) % vocab
        lags[b, t] = lag
        answers.append((lag, right))
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    one_batch = DataLoader(TensorDataset(tokens, targets, lags), batch_size=2)
    (logged,) = trainer.test(model, dataloaders=one_batch, verbose=False)
    for lo, hi, name in ((1, 32, "acc_lag1_32"), (32, 256, "acc_lag32_256"), (256, None, "acc_lag256_1024")):
        mine = [right for lag, right in answers if lag >= lo and (hi is None or lag < hi)]
        assert logged[f"test/{name}"] == pytest.approx(sum(mine) / len(mine)), (name, mine)
    assert logged["test/acc"] == pytest.approx(sum(right for _, right in answers) / len(answers))

    plain_targets = torch.where(torch.arange(n_len) % 2 == 0, preds, (preds + 1) % vocab)  # half of them right
    (plain,) = trainer.test(model, dataloaders=DataLoader(TensorDataset(tokens, plain_targets), batch_size=2),
                            verbose=False)
    assert plain["test/acc"] == pytest.approx(0.5)


def test_model_refuses_bad_configurations() -> None:
    with pytest.raises(ConfigError, match="n_modes >= 2"):
        lm(n_modes=1)
    with pytest.raises(ConfigError, match="alpha_init"):
        lm(d_model=8, n_layers=1, alpha_init=1.0)
    with pytest.raises(ConfigError, match="kernel must be one of"):
        lm(kernel="gauss")
    m = lm(d_model=8, n_layers=1, vocab_size=10)
    with pytest.raises(ConfigError, match="vocab_size does not match"):
        m(torch.full((1, 5), 12))
    with pytest.raises(ConfigError, match="series must be"):
        FracSSMRegressor(net=functools.partial(FracSSMNet, d_model=8, n_layers=1), input_shape=(20, 1))(torch.randn(2, 20, 3))


# --- through the CLI -------------------------------------------------------------------------------------------
# The default suite's twin is tests/test_cli.py's smoke fit (recall_frac.yaml + tests/conf/frac_ssm.yaml), which
# checks the same metrics reach MLflow (SMOKE_METRICS); this second CLI fit is the slow tier's.
@pytest.mark.slow
def test_fit_and_test_through_the_cli(paperlab_tmp: Path) -> None:
    """A tiny recall run logs the lag-bucket accuracies and the kernel diagnostic to MLflow."""
    from main import cli_main
    from tests.helpers import REPO, TINY, runs_of

    small = ["--data.init_args.seq_len", "300", "--data.init_args.max_lag", "256", "--data.init_args.n_train", "64",
             "--data.init_args.n_val", "16", "--data.init_args.n_test", "16", "--model.init_args.net.init_args.d_model", "16"]
    config = str(REPO / "configs/frac_ssm/recall_frac.yaml")
    assert cli_main(["fit", "--config", config, *TINY, *small]) == 0
    assert cli_main(["test", "--config", config, *TINY, *small, "--ckpt_path", "last"]) == 0
    (run,) = runs_of("frac_ssm")
    metrics = run.data.metrics
    assert {"test/acc", "test/acc_lag1_32", "test/acc_lag32_256", "test/acc_lag256_1024"} <= set(metrics)
    assert {"diag/kernel_shape/loglog_r2", "diag/kernel_shape/semilog_r2", "train/alpha_mean"} <= set(metrics)
    assert run.data.params["model.init_args.net.init_args.kernel"] == "frac"


# --- the claims (the claim budgets of configs/frac_ssm/: 3 seeds per arm; recall 600 / 1800, ARFIMA 200 steps) ---
def _fit_test(config: str, seed: int, *overrides: str) -> dict[str, float]:
    """One point of claim_sweep.yaml / arfima_sweep.yaml: fit, then test the best checkpoint."""
    from main import cli_main
    from tests.helpers import REPO, runs_of

    name = f"{Path(config).stem}-s{seed}"
    args = ["--config", str(REPO / "configs/frac_ssm" / config), *overrides, "--seed_everything", str(seed),
            "--run.name", name]
    assert cli_main(["fit", *args]) == 0
    assert cli_main(["test", *args, "--ckpt_path", "best"]) == 0
    (run,) = [r for r in runs_of("frac_ssm") if r.info.run_name == name]
    return run.data.metrics


def _mean(runs: list[dict[str, float]], key: str) -> float:
    return sum(r[key] for r in runs) / len(runs)


FIRST_STAGE = ("--trainer.max_steps", "600", "--trainer.val_check_interval", "600")


def check_recall(runs: dict[str, list[dict[str, float]]]) -> None:
    """The issue's recall claim: FRAC's accuracy on lags >= 256 at least 15 points above the exponential
    baseline's, within 10 points of it below lag 32 (means over seeds)."""
    long_gap = _mean(runs["frac"], "test/acc_lag256_1024") - _mean(runs["exp"], "test/acc_lag256_1024")
    short_gap = _mean(runs["frac"], "test/acc_lag1_32") - _mean(runs["exp"], "test/acc_lag1_32")
    assert long_gap >= 0.15, long_gap
    assert abs(short_gap) <= 0.10, short_gap


def test_check_recall_accepts_the_claim_and_refuses_its_negations() -> None:
    def runs(frac_long, exp_long, frac_short=1.0, exp_short=1.0):
        return {"frac": [{"test/acc_lag256_1024": frac_long, "test/acc_lag1_32": frac_short}],
                "exp": [{"test/acc_lag256_1024": exp_long, "test/acc_lag1_32": exp_short}]}
    check_recall(runs(0.8, 0.6))
    for bad in (runs(0.7, 0.6), runs(1.0, 1.0), runs(0.8, 0.6, frac_short=0.8)):
        with pytest.raises(AssertionError):
            check_recall(bad)


@pytest.mark.slow  # 6 runs of 600 steps on 64-token sequences, tested at length 1100: about 5 CPU minutes
def test_recall_claim_after_the_first_curriculum_stage(paperlab_tmp: Path) -> None:
    """claim_sweep.yaml's 600-step points (3 seeds per arm, equal state, equal steps): trained on lags <= 32
    only, tested on lags to 1024. The issue's claim does not hold (long-lag gap +0.09 < 0.15, the seed spread
    as large as the gap; docs/papers/frac_ssm.md); what holds instead: both arms learn the short lags on
    average (mean accuracy below lag 32 >= 0.85) and neither recalls the long lags as well as the short ones.
    The kernel diagnostic is not checked here: at fit end it sees a 64-token training batch (1.2 decades)."""
    recall = {k: [_fit_test(f"recall_{k}.yaml", s, *FIRST_STAGE) for s in (0, 1, 2)] for k in ("frac", "exp")}
    with pytest.raises(AssertionError):
        check_recall(recall)
    for runs in recall.values():
        assert _mean(runs, "test/acc_lag1_32") >= 0.85
        assert _mean(runs, "test/acc_lag256_1024") < _mean(runs, "test/acc_lag1_32")


@pytest.mark.slow  # 6 runs of 1800 steps (the whole curriculum): about 23 CPU minutes
def test_recall_claim_after_the_whole_curriculum(paperlab_tmp: Path) -> None:
    """claim_sweep.yaml's 1800-step points (3 seeds per arm). The issue's claim does not hold: both arms
    recall nearly every lag (mean long-lag accuracy >= 0.9 for both), so there is no 15-point gap; the
    baseline's kernels are exponentials (semilog R^2 > 0.99), FRAC's straighter in log-log than the
    baseline's."""
    recall = {k: [_fit_test(f"recall_{k}.yaml", s) for s in (0, 1, 2)] for k in ("frac", "exp")}
    with pytest.raises(AssertionError):
        check_recall(recall)
    assert min(_mean(runs, "test/acc_lag256_1024") for runs in recall.values()) >= 0.9
    assert min(r["diag/kernel_shape/decades"] for runs in recall.values() for r in runs) >= 2.0
    assert _mean(recall["exp"], "diag/kernel_shape/semilog_r2") > 0.99
    assert _mean(recall["frac"], "diag/kernel_shape/loglog_r2") > _mean(recall["exp"], "diag/kernel_shape/loglog_r2")


@pytest.mark.slow  # 6 runs of 200 steps at length 1100: about 8 CPU minutes
def test_arfima_claims_at_the_claim_budget(paperlab_tmp: Path) -> None:
    """What arfima_sweep.yaml found (3 seeds per arm): the trained FRAC kernels are power laws over >= 2
    decades (log-log R^2 > 0.95) and the baseline's exponentials (semilog R^2 > 0.99, log-log < 0.9); the
    issue's ARFIMA claim (FRAC's test MSE >= 5 % below the baseline's) does not hold at this budget."""
    arfima = {k: [_fit_test(f"arfima_{k}.yaml", s) for s in (0, 1, 2)] for k in ("frac", "exp")}
    _assert_kernel_shapes(arfima)
    assert _mean(arfima["exp"], "diag/kernel_shape/semilog_r2") > 0.99
    assert _mean(arfima["exp"], "diag/kernel_shape/loglog_r2") < 0.9
    assert _mean(arfima["frac"], "test/mse") > 0.95 * _mean(arfima["exp"], "test/mse")


def _assert_kernel_shapes(runs: dict[str, list[dict[str, float]]]) -> None:
    assert min(r["diag/kernel_shape/decades"] for r in runs["frac"]) >= 2.0
    assert _mean(runs["frac"], "diag/kernel_shape/loglog_r2") > 0.95
    assert _mean(runs["exp"], "diag/kernel_shape/semilog_r2") > _mean(runs["exp"], "diag/kernel_shape/loglog_r2")
