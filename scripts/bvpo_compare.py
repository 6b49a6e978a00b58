"""BVPO claim check (paper 000-14): gradient variance and held-out quality of the DPO arms.

For each seed: SFT the tiny GPT once (the reference policy), then run DPO from it with alpha = 1
(trace-only DPO), 0.5 (BVPO), 0 (empty-only) and "auto" (alpha* from the bias/variance probe), same
steps, lr, beta and batches. Records, per arm, the GradientVariance callback's tr(Sigma) of the per-sample
training-loss gradient every 25 steps, the validation metrics every 100 steps and the probe's
V_t / bias / alpha*; writes everything to a JSON file and prints the summary table of docs/papers/bvpo.md.

    python scripts/bvpo_compare.py --seeds 0 1 2 --out bvpo_compare.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from callbacks.gradient_variance import GradientVariance  # noqa: E402
from datamodules.arith_traces import ArithTracesDataModule  # noqa: E402
from modules.bvpo import BVPOModule  # noqa: E402

ARMS = {"trace_only": 1.0, "bvpo": 0.5, "empty_only": 0.0, "bvpo_auto": "auto"}
VAL_KEYS = ("val/pref_acc", "val/p_correct", "val/em_marginal", "val/dpo_loss_marginal", "val/em_nothink",
            "val/p_correct_nothink", "val/pref_acc_nothink")


class Recorder(L.Callback):
    """Validation metrics after every validation."""

    def __init__(self) -> None:
        self.val: list[dict] = []

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        m = trainer.callback_metrics
        self.val.append({"step": trainer.global_step, **{k: float(m[k]) for k in VAL_KEYS if k in m}})


def trainer(steps: int, callbacks: list) -> L.Trainer:
    return L.Trainer(max_steps=steps, max_epochs=-1, val_check_interval=100, check_val_every_n_epoch=None,
                     accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)


def run_seed(seed: int, args: argparse.Namespace, tmp: Path) -> dict:
    sft_steps, dpo_steps, every = args.sft_steps, args.dpo_steps, args.every
    dpo_lr, beta = args.dpo_lr, args.beta
    L.seed_everything(seed, verbose=False)
    sft = BVPOModule(sft_steps=sft_steps, seed=seed)
    rec = Recorder()
    t0 = time.perf_counter()
    trainer(sft_steps, [rec]).fit(sft, ArithTracesDataModule(seed=seed))
    policy = tmp / f"sft_seed{seed}.pt"
    torch.save(sft.gpt.state_dict(), policy)
    out = {"sft": {"val": rec.val, "seconds": time.perf_counter() - t0}}
    for arm, alpha in ARMS.items():
        L.seed_everything(seed, verbose=False)
        model = BVPOModule(sft_steps=0, init_ckpt=str(policy), dpo_lr=dpo_lr, beta=beta, alpha=alpha,
                           seed=seed)
        gv, rec = GradientVariance(every_n_steps=every, per_layer=False), Recorder()
        t0 = time.perf_counter()
        trainer(dpo_steps, [gv, rec]).fit(model, ArithTracesDataModule(seed=seed))
        out[arm] = {
            "alpha": alpha,
            "grad_var": [{"step": s, "trace": r["trace"], "grad_norm_sq": r["grad_norm_sq"],
                          "noise_scale": r["noise_scale"], "n": r["n"]} for s, r in gv.history],
            "method": gv.estimator.chosen,
            "val": rec.val,
            "probe": model.probe_log,
            "seconds": time.perf_counter() - t0,
        }
        last = rec.val[-1]
        mean_tr = statistics.mean(g["trace"] for g in out[arm]["grad_var"])
        print(f"seed {seed} {arm:10s} mean tr(Sigma) {mean_tr:.4f} "
              f"pref_acc {last['val/pref_acc']:.3f} p_correct {last['val/p_correct']:.3f} "
              f"em {last['val/em_marginal']:.3f} ({out[arm]['seconds']:.0f} s)", flush=True)
    return out


def summarise(results: dict) -> str:
    seeds = sorted(results)
    lines = ["| arm | alpha | mean tr(Sigma) over DPO | ratio to trace-only | held-out pref. acc. | "
             "held-out p(y*) marginal | exact-match (marginal argmax) | held-out marginal DPO loss |",
             "|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        tr = [statistics.mean(g["trace"] for g in results[s][arm]["grad_var"]) for s in seeds]
        ref = [statistics.mean(g["trace"] for g in results[s]["trace_only"]["grad_var"]) for s in seeds]
        last = lambda k: [results[s][arm]["val"][-1][k] for s in seeds]  # noqa: B023, E731
        fmt = lambda v: f"{statistics.mean(v):.3f} ± {statistics.pstdev(v):.3f}"  # noqa: E731
        lines.append(f"| {arm} | {results[seeds[0]][arm]['alpha']} | {fmt(tr)} | "
                     f"{fmt([a / b for a, b in zip(tr, ref)])} | {fmt(last('val/pref_acc'))} | "
                     f"{fmt(last('val/p_correct'))} | {fmt(last('val/em_marginal'))} | "
                     f"{fmt(last('val/dpo_loss_marginal'))} |")
    return "\n".join(lines)


def curves(results: dict, window: int = 100) -> str:
    """Seed-mean curves: tr(Sigma) averaged over each ``window`` DPO steps, validation metrics at its end."""
    seeds = sorted(results)
    arms = ("trace_only", "bvpo")
    steps = [v["step"] for v in results[seeds[0]]["trace_only"]["val"]]
    head = "| step | " + " | ".join(f"{a}: tr(Sigma) / pref acc / p(y*) / EM" for a in arms) + " |"
    lines = [head, "|---|" + "---|" * len(arms)]
    for lo, hi in zip([-1, *steps[:-1]], steps):
        cells = []
        for arm in arms:
            tr = [g["trace"] for s in seeds for g in results[s][arm]["grad_var"] if lo < g["step"] <= hi]
            val = [next(v for v in results[s][arm]["val"] if v["step"] == hi) for s in seeds]
            m = lambda k: statistics.mean(v[k] for v in val)  # noqa: B023, E731
            tr_s = f"{statistics.mean(tr):.3f}" if tr else "-"
            cells.append(f"{tr_s} / {m('val/pref_acc'):.3f} / {m('val/p_correct'):.3f} / {m('val/em_marginal'):.3f}")
        lines.append(f"| {hi} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--sft-steps", type=int, default=500)
    ap.add_argument("--dpo-steps", type=int, default=500)
    ap.add_argument("--dpo-lr", type=float, default=1e-4)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--every", type=int, default=25, help="GradientVariance cadence (steps)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=str, default="bvpo_compare.json")
    ap.add_argument("--merge", type=str, nargs="+", default=None,
                    help="only print the tables of these result files (runs split over processes)")
    args = ap.parse_args()
    if args.merge:
        results = {}
        for f in args.merge:
            results.update(json.loads(Path(f).read_text())["results"])
        print(summarise(results), curves(results), sep="\n\n")
        return
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            results[seed] = run_seed(seed, args, Path(tmp))
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(summarise(results), curves(results), sep="\n\n")


if __name__ == "__main__":
    main()
