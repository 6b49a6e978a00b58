"""Activation sparsity vs accuracy (paper 000-09): does ReLU sparsity rise, is there a cliff near 70%?

Two sweeps of a 3-hidden-layer MLP on scikit-learn's digits (AdamW lr 1e-3, batch 64, 30 epochs), in process:

1. natural sparsity: activation {relu, relu2, gelu, silu} x width {32, 64, 128, 256, 512}: exact-zero
   sparsity of the hidden activations entering each layer (``ActivationStats``'s definition) at
   initialisation and after training, and test accuracy;
2. forced sparsity: ``quantile_relu`` (relu shifted by the per-sample s-quantile, the authors' QuantileReLU)
   at s in {.1, .25, .5, .7, .8, .9, .95} and width 256: test accuracy against s (compare relu at width 256
   in sweep 1).

    python scripts/weight_drift_sparsity.py --write     # ~3 min on 2 busy CPU cores
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks.activation_stats import layer_input_stats  # noqa: E402
from datamodules.digits import DigitsDataModule  # noqa: E402
from modules.components.activations import get_activation  # noqa: E402
from modules.weight_drift import WeightDriftModel  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "papers" / "weight_drift.md"


def hidden_sparsity(model: WeightDriftModel, x: torch.Tensor) -> tuple[float, float]:
    """(exact-zero fraction, fraction |h| < 1e-2) of the inputs of hidden layers 2.., in eval mode."""
    layers = [m for m in model.net.layers if isinstance(m, nn.Linear)][1:]
    seen: list[torch.Tensor] = []
    hooks = [m.register_forward_pre_hook(lambda mod, a: seen.append(a[0])) for m in layers]
    model.eval()
    with torch.no_grad():
        model(x)
    model.train()
    for h in hooks:
        h.remove()
    zeros = sum(layer_input_stats(h)[0] for h in seen)
    total = sum(h.numel() for h in seen)
    small = sum((h.abs() < 1e-2).sum().item() for h in seen)
    return zeros / total, small / total


def run(act: str, width: int, seed: int, epochs: int, data: dict, sparsity: float | None = None) -> dict:
    torch.manual_seed(seed)
    model = WeightDriftModel(
        arch="mlp",
        activation="relu" if sparsity is not None else act,
        hidden=[width] * 3,
        lr=1e-3,
        optimizer="adamw",
    )
    if sparsity is not None:  # swap the ReLUs for forced-sparsity QuantileReLUs
        for i, m in enumerate(model.net.layers):
            if isinstance(m, nn.ReLU):
                model.net.layers[i] = get_activation("quantile_relu", sparsity=sparsity)
    xtr, ytr = data["train"]
    xte, yte = data["test"]
    s0 = hidden_sparsity(model, xte)
    opt = model.configure_optimizers()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(xtr), generator=gen).split(64):
            loss = model._loss(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    s1 = hidden_sparsity(model, xte)
    model.eval()
    with torch.no_grad():
        acc = (model(xte).argmax(-1) == yte).double().mean().item()
    return {"s0": s0[0], "s1": s1[0], "small1": s1[1], "acc": acc}


def ms(vals: list[float], scale: float = 1.0, digits: int = 3) -> str:
    m = statistics.fmean(vals) * scale
    s = statistics.stdev(vals) * scale if len(vals) > 1 else 0.0
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--widths", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    dm = DigitsDataModule()
    data = dm.build_splits()
    data["train"] = (
        torch.cat([data["train"][0], data["val"][0]]),
        torch.cat([data["train"][1], data["val"][1]]),
    )
    rows = [
        "| activation | width | sparsity at init | sparsity trained | frac abs(h) < 0.01 trained "
        "| test acc (%) |",
        "|---|---|---|---|---|---|",
    ]
    for act in ("relu", "relu2", "gelu", "silu"):
        for w in args.widths:
            res = [run(act, w, s, args.epochs, data) for s in range(args.seeds)]
            rows.append(
                f"| {act} | {w} | {ms([r['s0'] for r in res])} | {ms([r['s1'] for r in res])} "
                f"| {ms([r['small1'] for r in res])} | {ms([r['acc'] for r in res], 100, 1)} |"
            )
            print(rows[-1], flush=True)
    forced = ["| forced sparsity s (quantile_relu) | measured sparsity | test acc (%) |", "|---|---|---|"]
    for s in (0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 0.95):
        res = [run("quantile_relu", 256, seed, args.epochs, data, sparsity=s) for seed in range(args.seeds)]
        forced.append(f"| {s} | {ms([r['s1'] for r in res])} | {ms([r['acc'] for r in res], 100, 1)} |")
        print(forced[-1], flush=True)
    elapsed = time.time() - t0
    cmd = "python scripts/weight_drift_sparsity.py " + " ".join(sys.argv[1:])
    text = (
        f"Command: `{cmd.strip()}` (digits, 3 hidden layers, AdamW 1e-3, {args.epochs} epochs, {args.seeds} "
        f"seeds, mean ± std; sparsity = exact zeros entering hidden layers 2 and 3 on the test set; "
        f"{elapsed / 60:.1f} min).\n\n" + "\n".join(rows) + "\n\n" + "\n".join(forced) + "\n"
    )
    print(f"total {elapsed:.0f} s")
    if args.write:
        doc = DOC.read_text()
        pat = re.compile(r"(<!-- sparsity:start -->\n).*?(<!-- sparsity:end -->)", re.S)
        if not pat.search(doc):
            raise SystemExit(f"{DOC} lacks the sparsity markers")
        DOC.write_text(pat.sub(lambda m: m.group(1) + text + "\n" + m.group(2), doc))


if __name__ == "__main__":
    main()
