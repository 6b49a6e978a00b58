"""Speed of the per-sample gradient-variance estimator on the tiny GPT (CPU).

Compares, on one batch (default 64 sequences of 64 tokens, 2 threads), interleaved over several rounds
so that load from other processes hits every contender alike (the median per contender is reported):
  loop    the naive reference: one backward pass per sample (B backward passes)
  vmap    torch.func per-sample gradients (the estimator's reference path)
  hooks   the fast path (per-sample gradients of linear/embedding/norm layers from hooks)
  ghost   the fast path with ghost norms for every untied Linear weight
  step    one ordinary training step (forward, backward, AdamW step) on the same batch
and the GradientVariance callback's overhead at its default cadence inside a Lightning fit.

    python bench/gradient_variance.py [--batch 64] [--rounds 5] [--threads 2] [--skip-fit]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modules.components.grad_variance import GradientVarianceEstimator  # noqa: E402
from modules.components.grad_variance.per_sample import loop_stats  # noqa: E402
from modules.components.tiny_gpt import TinyGPT  # noqa: E402


def lm_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x).transpose(1, 2), y, reduction="none").mean(1)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def estimator_bench(batch: int, seq: int, rounds: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = TinyGPT(block_size=seq)
    x, y = torch.randint(0, 128, (batch, seq)), torch.randint(0, 128, (batch, seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        lm_loss(model, (x, y)).mean().backward()
        opt.step()

    ests = {k: GradientVarianceEstimator(k) for k in ("hooks", "vmap")}
    ghost = GradientVarianceEstimator("hooks", ghost="always")
    fns = {
        "step": step,
        "hooks": lambda: ests["hooks"](model, lm_loss, (x, y)),
        "ghost": lambda: ghost(model, lm_loss, (x, y)),
        "vmap": lambda: ests["vmap"](model, lm_loss, (x, y)),
        "loop": lambda: loop_stats(model, lm_loss, (x, y)),
    }
    for fn in fns.values():  # warm-up (allocator, autograd graph caches, the one-time choice)
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            times[k].append(timed(fn))
    return {k: statistics.median(v) for k, v in times.items()}


def fit_overhead(steps: int, every: int, rounds: int) -> dict[str, float]:
    """Wall time of a Lightning fit on the tiny GPT with and without the callback (interleaved)."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks.diagnostic import Schedule
    from callbacks.gradient_variance import GradientVariance

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = TinyGPT()

        def per_sample_loss(self, batch):
            return lm_loss(self.net, batch)

        def training_step(self, batch, _):
            return self.per_sample_loss(batch).mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 128, (64 * steps, 64), generator=g),
                         torch.randint(0, 128, (64 * steps, 64), generator=g))

    def run(with_cb: bool) -> float:
        torch.manual_seed(0)
        cbs = [GradientVariance(schedule=Schedule(every_n_steps=every))] if with_cb else []
        trainer = L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, callbacks=cbs,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        start = time.perf_counter()
        trainer.fit(LM(), DataLoader(data, batch_size=64))
        return time.perf_counter() - start

    out: dict[str, list[float]] = {"plain": [], "callback": []}
    for _ in range(rounds):
        out["plain"].append(run(False))
        out["callback"].append(run(True))
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fit-steps", type=int, default=100)
    ap.add_argument("--fit-rounds", type=int, default=3)
    ap.add_argument("--skip-fit", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import warnings

    warnings.filterwarnings("ignore")
    t = estimator_bench(args.batch, args.seq, args.rounds)
    print(f"tiny GPT (3 layers, width 48), batch {args.batch} x {args.seq} tokens, {args.threads} threads, "
          f"median of {args.rounds} interleaved rounds (ms):")
    for k, v in t.items():
        print(f"  {k:6s} {v:8.1f}")
    best = min(t["hooks"], t["ghost"])
    print(f"  loop / hooks = {t['loop'] / t['hooks']:.1f}x   loop / ghost = {t['loop'] / t['ghost']:.1f}x   "
          f"loop / vmap = {t['loop'] / t['vmap']:.1f}x   (target >= 5x)")
    print(f"  hooks / step = {t['hooks'] / t['step']:.2f}   ghost / step = {t['ghost'] / t['step']:.2f}   "
          f"best / step = {best / t['step']:.2f}   (target <= 1.5)")
    if not args.skip_fit:
        from callbacks.gradient_variance import GradientVariance

        every = GradientVariance().schedule.every_n_steps
        f = fit_overhead(args.fit_steps, every, args.fit_rounds)
        print(f"Lightning fit, {args.fit_steps} steps, callback every {every} steps, median of "
              f"{args.fit_rounds}: plain {f['plain']:.2f} s, with callback {f['callback']:.2f} s, "
              f"overhead {100 * (f['callback'] / f['plain'] - 1):+.1f}% (target <= 10%)")


if __name__ == "__main__":
    main()
