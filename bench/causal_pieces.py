"""Benchmarks for paper 000-01 (causal pieces); ratios against baselines measured in the same process.

1. Forward pass of the 4(+1)-120-3 network over the 5000 Yin-Yang training samples: exact closed-form nLIF
   spike times vs the time-stepped ``lif_grid`` simulation at dt = 0.01 tau_s over 4 tau_s (400 steps).
   Target: >= 10x faster.
2. Counting causal pieces on those 5000 samples: the callback's vectorised count (packed causal-set bits,
   ``torch.unique``) vs a naive per-sample Python loop building frozensets, both from the same spike times.
   Target: >= 50x faster. The end-to-end ratio (forward included in both) is printed too.

    python bench/causal_pieces.py [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from callbacks.causal_pieces import count_pieces  # noqa: E402
from datamodules.spike_encoding import SpikeYinYangDataModule  # noqa: E402
from modules.causal_pieces import CausalPiecesSNN, grid_first_spike_times  # noqa: E402


def best_of(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def naive_count(pairs) -> int:
    """The obvious implementation: per sample a tuple of per-neuron frozenset causal sets, in a Python set."""
    pieces = set()
    pairs = [(p.tolist(), q.tolist()) for p, q in pairs]
    for b in range(len(pairs[0][0])):
        relevant = [j for j, t in enumerate(pairs[-1][1][b]) if math.isfinite(t)]
        key = []
        for l in range(len(pairs) - 1, -1, -1):
            t_pre, t_post = pairs[l][0][b], pairs[l][1][b]
            sets = {j: frozenset(i for i, ti in enumerate(t_pre) if ti < t_post[j]) for j in relevant}
            key.append(frozenset(sets.items()))
            if l > 0:
                n_prev = len(pairs[l - 1][1][b])
                relevant = sorted({i for s in sets.values() for i in s if i < n_prev})
        pieces.add(tuple(key))
    return len(pieces)


class _Precomputed(torch.nn.Module):
    """Hands precomputed spike times to the counter, so both counters start from the same times."""

    def __init__(self, pairs):
        super().__init__()
        self.pairs = pairs

    def spike_times(self, batch):
        return self.pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="causal pieces benchmarks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    dm = SpikeYinYangDataModule()
    dm.setup()
    x = dm.splits["train"][0]
    model = CausalPiecesSNN(init_seed=0)
    model.eval()
    print(f"torch {torch.__version__}, {args.threads} thread(s), 5000 Yin-Yang samples, 4(+1)-120-3, float64")

    with torch.no_grad():
        t_closed, out_c = best_of(lambda: model(x), args.repeats)

        def grid(stop_early: bool):
            kw = {"dt": 0.01, "t_max": 4.0, "interpolate": False, "stop_early": stop_early}
            h = grid_first_spike_times(x, model.weights[0], **kw)
            return grid_first_spike_times(h, model.weights[1], **kw)

        for stop_early, label in ((False, "all 400 steps"), (True, "stops once all fired")):
            t_grid, out_g = best_of(lambda s=stop_early: grid(s), max(1, args.repeats - 1))
            agree = (torch.isfinite(out_c) & torch.isfinite(out_g) & ((out_c - out_g).abs() <= 0.02)).double().mean()
            print(
                f"forward  closed-form nLIF {t_closed * 1e3:8.1f} ms | lif_grid dt=0.01, {label:20s} "
                f"{t_grid * 1e3:8.1f} ms | speed-up {t_grid / t_closed:6.1f}x (target >= 10x); "
                f"outputs within 2 dt: {agree:.3f}"
            )

    pairs = model.spike_times((x,))
    pre = _Precomputed(pairs)
    t_vec, res = best_of(lambda: count_pieces(pre, [None], mode="path", key="exact"), args.repeats)
    t_naive, n_naive = best_of(lambda: naive_count(pairs), 1)
    assert res.count == n_naive, (res.count, n_naive)
    print(
        f"count    vectorised {t_vec * 1e3:8.1f} ms | naive frozenset loop {t_naive * 1e3:8.1f} ms | "
        f"speed-up {t_naive / t_vec:6.1f}x (target >= 50x); {res.count} pieces"
    )
    t_e2e, _ = best_of(lambda: count_pieces(model, [(x,)], mode="path"), args.repeats)
    t_e2e_naive, _ = best_of(lambda: naive_count(model.spike_times((x,))), 1)
    print(
        f"count+forward  vectorised {t_e2e * 1e3:8.1f} ms | naive {t_e2e_naive * 1e3:8.1f} ms | "
        f"speed-up {t_e2e_naive / t_e2e:6.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
