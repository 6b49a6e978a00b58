"""Tiny GPT activation comparison (paper 000-09): validation loss and activation spikes per MLP activation.

The paper (124M GPT on FineWeb) finds GELU² with the lowest validation loss, and unclipped ReLU² producing
activation spikes in the middle layers that clipping at 50 removes. Here: minGPT's gpt-nano size (3 layers,
3 heads, width 48), character level on the CPython text corpus, AdamW (lr 3e-3, betas 0.9/0.95, wd 0),
batch 32 x 64 characters, the same steps and seeds for every activation. Reported: validation loss (nats per
character, on 1024 held-out windows), and per block the largest |h| entering the MLP down-projection and its
ratio to the median (``ActivationStats``'s ``max`` and ``spike_ratio``), on the same windows.

    python scripts/weight_drift_gpt_acts.py --write      # ~8 min on 2 busy CPU cores
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks.activation_stats import histogram_median, layer_input_stats  # noqa: E402
from callbacks.weight_drift import weight_stats  # noqa: E402
from datamodules.text import CharTextDataModule  # noqa: E402
from modules.weight_drift import WeightDriftModel  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "papers" / "weight_drift.md"
ACTS = ("relu", "relu2", "relu2_clip", "gelu", "gelu2", "gelu2_clip")


def evaluate(
    model: WeightDriftModel, xv: torch.Tensor, yv: torch.Tensor
) -> tuple[float, list[float], list[float]]:
    blocks = model.net.blocks
    stats: dict[int, list] = {}

    def hook(i: int):
        def f(mod, args):
            z, n, mx, hist = layer_input_stats(args[0])
            if i in stats:
                stats[i][2] = max(stats[i][2], mx)
                stats[i][3] += hist
            else:
                stats[i] = [z, n, mx, hist]

        return f

    hooks = [b.mlp.proj.register_forward_pre_hook(hook(i)) for i, b in enumerate(blocks)]
    model.eval()
    losses = []
    with torch.no_grad():
        for xb, yb in zip(xv.split(256), yv.split(256)):
            logits = model(xb)
            losses.append(F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="sum").item())
    model.train()
    for h in hooks:
        h.remove()
    loss = sum(losses) / yv.numel()
    mx = [stats[i][2] for i in range(len(blocks))]
    ratio = [stats[i][2] / max(histogram_median(stats[i][3]), 1e-12) for i in range(len(blocks))]
    return loss, mx, ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--acts", nargs="+", default=list(ACTS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    splits = CharTextDataModule(block_size=64).build_splits()
    x, y = splits["train"]
    xv, yv = splits["val"][0][:1024], splits["val"][1][:1024]
    rows = [
        "| activation | val loss (nats/char) | val bits/char | max abs(h) into down-proj, blocks 0/1/2 "
        "| spike ratio max/median, blocks 0/1/2 | down-proj drift (1e-4) |",
        "|---|---|---|---|---|---|",
    ]
    for act in args.acts:
        res = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            model = WeightDriftModel(arch="gpt", activation=act, optimizer="adamw", lr=args.lr)
            w0 = [b.mlp.proj.weight.detach().clone() for b in model.net.blocks]
            opt = model.configure_optimizers()
            gen = torch.Generator().manual_seed(seed)
            for _ in range(args.steps):
                idx = torch.randint(0, len(x), (32,), generator=gen)
                loss = model._loss(model(x[idx]), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            drift = statistics.fmean(
                weight_stats(b.mlp.proj.weight, w)[2] for b, w in zip(model.net.blocks, w0)
            )
            res.append((*evaluate(model, xv, yv), drift))
        losses = [r[0] for r in res]
        sd = statistics.stdev(losses) if len(losses) > 1 else 0.0
        mx = "/".join(f"{statistics.fmean(r[1][i] for r in res):.1f}" for i in range(3))
        rt = "/".join(f"{statistics.fmean(r[2][i] for r in res):.0f}" for i in range(3))
        drifts = [r[3] * 1e4 for r in res]
        dsd = statistics.stdev(drifts) if len(drifts) > 1 else 0.0
        rows.append(
            f"| {act} | {statistics.fmean(losses):.4f} ± {sd:.4f} | "
            f"{statistics.fmean(losses) / math.log(2):.3f} | {mx} | {rt} "
            f"| {statistics.fmean(drifts):+.2f} ± {dsd:.2f} |"
        )
        print(rows[-1], flush=True)
    elapsed = time.time() - t0
    cmd = "python scripts/weight_drift_gpt_acts.py " + " ".join(sys.argv[1:])
    text = (
        f"Command: `{cmd.strip()}` ({args.steps} steps, {args.seeds} seeds, mean ± std; "
        f"{elapsed / 60:.1f} min).\n\n" + "\n".join(rows) + "\n"
    )
    print(f"total {elapsed:.0f} s")
    if args.write:
        doc = DOC.read_text()
        pat = re.compile(r"(<!-- gpt:start -->\n).*?(<!-- gpt:end -->)", re.S)
        if not pat.search(doc):
            raise SystemExit(f"{DOC} lacks the gpt markers")
        DOC.write_text(pat.sub(lambda m: m.group(1) + text + "\n" + m.group(2), doc))


if __name__ == "__main__":
    main()
