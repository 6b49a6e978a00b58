"""Map where the weight-drift prediction of paper 000-09 holds: optimiser x loss x activation x layer.

The prediction: weights that read a positively biased activation (relu, gelu, silu) drift negative early in
training, even on random data, and weights reading tanh or identity do not. This script trains, in process,

1. a 3-hidden-layer MLP (64 -> 256 -> 256 -> 256 -> 10, He init) on Gaussian inputs with random labels, for
   every optimiser {SGD, AdamW} x loss {cross-entropy, MSE to one-hot} x activation {relu, gelu, silu, tanh,
   identity}, several seeds; the layers reading the activation are the two hidden-to-hidden layers and the
   read-out;
2. the tiny GPT (gpt-nano size) on the CPython text corpus with AdamW, watching the MLP down-projections
   ``blocks.{i}.mlp.proj`` (what the authors' code measures) against the up-projections ``mlp.fc`` (which read
   a LayerNorm output, the contrast);

and prints per setting the drift mean(W_T - W_0) (mean +- std over seeds), the mean gradient over the first
10 steps (the paper's statement is about E[dL/dW] near initialisation) and the change in the fraction of
negative weights. With ``--write`` the tables go into docs/papers/weight_drift.md between the map markers.

    python scripts/weight_drift_map.py --write            # the full grid, ~6-8 min on 2 busy CPU cores
    python scripts/weight_drift_map.py --steps 100 --gpt-steps 50 --seeds 2   # a quick look
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks.activation_stats import layer_input_stats  # noqa: E402
from callbacks.weight_drift import weight_stats  # noqa: E402
from datamodules.random_gaussian import RandomGaussianDataModule  # noqa: E402
from datamodules.text import CharTextDataModule  # noqa: E402
from modules.weight_drift import WeightDriftModel  # noqa: E402

ACTS = ("relu", "gelu", "silu", "tanh", "identity")
LR = {"sgd": 0.05, "adamw": 1e-3}
DOC = Path(__file__).resolve().parents[1] / "docs" / "papers" / "weight_drift.md"


def train(
    model: WeightDriftModel,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    batch: int,
    seed: int,
    watch: dict[str, list[str]],
    grad_steps: int = 10,
) -> dict[str, tuple[float, float, float]]:
    """Train ``steps`` SGD/AdamW steps; per watched group: (drift, mean early gradient, d frac_negative)."""
    mods = dict(model.net.named_modules())
    w0 = {n: mods[n].weight.detach().clone() for g in watch.values() for n in g}
    grads = dict.fromkeys(w0, 0.0)
    opt = model.configure_optimizers()
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        idx = torch.randint(0, x.shape[0], (batch,), generator=gen)
        loss = model._loss(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step < grad_steps:
            for n in w0:
                grads[n] += mods[n].weight.grad.double().mean().item() / grad_steps
        opt.step()
    out = {}
    for group, names in watch.items():
        drift, dneg = [], []
        for n in names:
            _, neg_t, d = weight_stats(mods[n].weight, w0[n])
            _, neg_0, _ = weight_stats(w0[n], w0[n])
            drift.append(d)
            dneg.append(neg_t - neg_0)
        out[group] = (
            sum(drift) / len(drift),
            sum(grads[n] for n in names) / len(names),
            sum(dneg) / len(dneg),
        )
    return out


def fmt(values: list[float], scale: float) -> str:
    m = statistics.fmean(values) * scale
    s = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{m:+.2f} ± {s:.2f}"


def sign_call(values: list[float]) -> str:
    if all(abs(v) < 1e-8 for v in values):
        return "zero"  # float rounding of an exactly zero drift (the CE read-out under SGD)
    if all(v < 0 for v in values):
        return "neg"
    if all(v > 0 for v in values):
        return "pos"
    return "mixed"


def verdict(act: str, hidden: str, out: str) -> str:
    """Does the row agree with the paper? relu/gelu/silu: negative; tanh/identity: no systematic sign."""
    if act in ("tanh", "identity"):
        return "yes" if "neg" not in (hidden, out) else "no (drifts neg)"
    if (hidden, out) == ("neg", "neg"):
        return "yes"
    if hidden == "neg":
        return "hidden yes, read-out " + ("zero" if out == "zero" else "no")
    if out == "neg":
        return "read-out yes, hidden no"
    return "no"


def mlp_grid(steps: int, seeds: int) -> str:
    dm = RandomGaussianDataModule()
    x, y = dm.build_splits()["train"]
    watch = {"hidden": ["layers.2", "layers.4"], "out": ["layers.6"]}
    rows = [
        "| optimiser | loss | activation | hidden drift (1e-4) | read-out drift (1e-4) "
        "| hidden early grad (1e-5) "
        "| hidden Δ frac W<0 (%) | prediction holds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for opt in ("sgd", "adamw"):
        for loss in ("ce", "mse"):
            for act in ACTS:
                res = []
                for seed in range(seeds):
                    torch.manual_seed(seed)
                    model = WeightDriftModel(
                        arch="mlp",
                        activation=act,
                        loss=loss,
                        optimizer=opt,
                        lr=LR[opt],
                        hidden=[256, 256, 256],
                    )
                    res.append(train(model, x, y, steps, 128, seed, watch))
                hd = [r["hidden"][0] for r in res]
                od = [r["out"][0] for r in res]
                hg = [r["hidden"][1] for r in res]
                hn = [r["hidden"][2] for r in res]
                rows.append(
                    f"| {opt} | {loss} | {act} | {fmt(hd, 1e4)} ({sign_call(hd)}) "
                    f"| {fmt(od, 1e4)} ({sign_call(od)}) "
                    f"| {fmt(hg, 1e5)} | {fmt(hn, 100)} | {verdict(act, sign_call(hd), sign_call(od))} |"
                )
                print(rows[-1], flush=True)
    return "\n".join(rows)


def gpt_runs(steps: int, seeds: int) -> str:
    dm = CharTextDataModule(block_size=64)
    x, y = dm.build_splits()["train"]
    watch = {
        "proj": [f"blocks.{i}.mlp.proj" for i in range(3)],
        "fc": [f"blocks.{i}.mlp.fc" for i in range(3)],
    }
    rows = [
        "| activation | down-proj drift (1e-4) | down-proj early grad (1e-5) | down-proj Δ frac W<0 (%) "
        "| up-proj (reads LayerNorm) drift (1e-4) | down-proj input sparsity | prediction holds |",
        "|---|---|---|---|---|---|---|",
    ]
    for act in ACTS:
        res, sparsity = [], []
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = WeightDriftModel(arch="gpt", activation=act, optimizer="adamw", lr=3e-3)
            res.append(train(model, x, y, steps, 32, seed, watch))
            acts: list[torch.Tensor] = []
            hooks = [
                b.mlp.proj.register_forward_pre_hook(lambda m, a, acts=acts: acts.append(a[0]))
                for b in model.net.blocks
            ]
            with torch.no_grad():
                model.eval()(x[:64])
            for h in hooks:
                h.remove()
            zeros, n = 0, 0
            for a in acts:
                z, k, _, _ = layer_input_stats(a)
                zeros, n = zeros + z, n + k
            sparsity.append(zeros / n)
        pd = [r["proj"][0] for r in res]
        fd = [r["fc"][0] for r in res]
        holds = (
            ("yes" if sign_call(pd) == "neg" else "no")
            if act not in ("tanh", "identity")
            else ("yes" if sign_call(pd) != "neg" else "no (drifts neg)")
        )
        rows.append(
            f"| {act} | {fmt(pd, 1e4)} ({sign_call(pd)}) | {fmt([r['proj'][1] for r in res], 1e5)} "
            f"| {fmt([r['proj'][2] for r in res], 100)} | {fmt(fd, 1e4)} ({sign_call(fd)}) "
            f"| {statistics.fmean(sparsity):.3f} | {holds} |"
        )
        print(rows[-1], flush=True)
    return "\n".join(rows)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    pattern = re.compile(r"(<!-- map:start -->\n).*?(<!-- map:end -->)", re.S)
    if not pattern.search(doc):
        raise SystemExit(f"{DOC} lacks the <!-- map:start --> / <!-- map:end --> markers")
    DOC.write_text(pattern.sub(lambda m: m.group(1) + text + "\n" + m.group(2), doc))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="MLP training steps per run")
    p.add_argument("--gpt-steps", type=int, default=300, help="tiny GPT training steps per run (0: skip)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared machine)")
    p.add_argument("--write", action="store_true", help="write the tables into docs/papers/weight_drift.md")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    cmd = "python scripts/weight_drift_map.py " + " ".join(sys.argv[1:])
    print(
        f"MLP on random Gaussian data, {args.steps} steps, batch 128, "
        f"lr SGD {LR['sgd']} / AdamW {LR['adamw']}"
    )
    mlp = mlp_grid(args.steps, args.seeds)
    gpt = ""
    if args.gpt_steps > 0:
        print(f"\ntiny GPT on the CPython text corpus, AdamW lr 3e-3, {args.gpt_steps} steps, batch 32 x 64")
        gpt = gpt_runs(args.gpt_steps, args.seeds)
    elapsed = time.time() - t0
    text = (
        f"Command: `{cmd.strip()}` ({args.seeds} seeds, mean ± std over seeds; sign in brackets: all seeds "
        f"negative / positive / mixed; {elapsed / 60:.1f} min on 2 shared CPU cores).\n\n"
        f"**MLP 64-256-256-256-10 on random Gaussian inputs and labels, {args.steps} steps.** "
        "Hidden = the two "
        "hidden-to-hidden layers, read-out = the last layer; both read the activation.\n\n" + mlp + "\n"
    )
    if gpt:
        text += (
            f"\n**Tiny GPT (3 layers, 3 heads, width 48) on the CPython text corpus, AdamW, {args.gpt_steps} "
            "steps.** Averages over the 3 blocks.\n\n" + gpt + "\n"
        )
    print(f"\ntotal {elapsed:.0f} s")
    if args.write:
        write_doc(text)
        print(f"written to {DOC}")


if __name__ == "__main__":
    main()
