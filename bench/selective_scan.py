"""Speed of the selective scan (002-02) when some steps forget much at once, as in a trained selective SSM.

A trained recall model writes with large ``Delta`` at the tokens it stores and near-zero ``Delta`` on
filler. One large step makes the factorised chunk form unusable for the fast modes over any chunk that
holds it, so before the segment-sum form those modes ran step by step. Compared, forward plus backward on
one batch, interleaved over several rounds (the median per contender is reported):
  segsum  the scan as it runs (fast modes in the segment-sum form, its default chunks of 8)
  steps   the same scan with ``segsum_chunk=1`` (fast modes step by step: the previous behaviour)
  loop    the plain recurrence written out (the test suite's reference)
for the exponential baseline (one mode, 128 states) and FRAC (8 modes, 16 states) at the recall size
(batch 8, length 1100, 32 channels).

    python bench/selective_scan.py [--rounds 3] [--threads 1] [--big-fraction 0.01]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modules.components.ssm import frac_kernel_weights, log_spaced_rates, selective_scan  # noqa: E402


def scan_inputs(kernel: str, big_fraction: float, b: int = 8, n_len: int = 1100, c: int = 32):
    g = torch.Generator().manual_seed(0)
    n, rates = (128, torch.ones(1)) if kernel == "exp" else (16, log_spaced_rates(1e-4, 1.0, 8).float())
    w = torch.ones(c, 1) if kernel == "exp" else frac_kernel_weights(torch.full((c,), 0.5), rates)
    delta = 1e-3 * torch.exp(torch.rand(b, n_len, c, generator=g) * 4.6)  # 1e-3 .. 0.1, Mamba's init range
    delta[torch.rand(b, n_len, c, generator=g) < big_fraction] = 5.0  # the steps that reset the state
    lam = torch.exp(torch.rand(c, generator=g) * 2.77)  # 1 .. 16
    x = torch.randn(b, n_len, c, generator=g)
    Bm, Cm = torch.randn(b, n_len, n, generator=g), torch.randn(b, n_len, n, generator=g)
    return x, delta, Bm, Cm, rates, w, lam


def loop_scan(x, delta, Bm, Cm, rates, w, lam):
    h = x.new_zeros(x.shape[0], x.shape[2], Bm.shape[-1], rates.numel())
    ys = []
    for t in range(x.shape[1]):
        decay = torch.exp(-delta[:, t, :, None] * rates * lam[:, None])
        h = decay[:, :, None] * h + (delta[:, t] * x[:, t])[:, :, None, None] * Bm[:, t, None, :, None]
        ys.append(torch.einsum("bcnk,bn,ck->bc", h, Cm[:, t], w))
    return torch.stack(ys, 1)


def fwd_bwd(fn, args) -> float:
    leaves = [a.clone().requires_grad_(True) if a.dtype.is_floating_point and i != 4 else a for i, a in enumerate(args)]
    start = time.perf_counter()
    fn(*leaves).square().mean().backward()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--big-fraction", type=float, default=0.01, help="share of steps with Delta = 5")
    opts = ap.parse_args()
    torch.set_num_threads(opts.threads)
    contenders = {
        "segsum": lambda *a: selective_scan(*a),
        "steps": lambda *a: selective_scan(*a, segsum_chunk=1),
        "loop": loop_scan,
    }
    print(f"{'kernel':<6} {'contender':<8} {'ms (median)':>12} {'vs steps':>9} {'vs loop':>8}")
    for kernel in ("exp", "frac"):
        args = scan_inputs(kernel, opts.big_fraction)
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(opts.rounds):
            for name, fn in contenders.items():
                times[name].append(fwd_bwd(fn, args))
        med = {k: statistics.median(v) for k, v in times.items()}
        for name in contenders:
            print(f"{kernel:<6} {name:<8} {med[name]:>12.0f} {med['steps'] / med[name]:>8.1f}x "
                  f"{med['loop'] / med[name]:>7.1f}x")


if __name__ == "__main__":
    main()
