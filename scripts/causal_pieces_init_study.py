"""Initialisation study of paper 000-01 (causal pieces), trained in-process.

For every hidden-layer initialisation ``N(mean, std)`` of a grid (output layer fixed at ``N(0.5, 0.8)``) and
every seed: count the causal pieces the 4(+1)-120-3 nLIF network realises on the 5000 Yin-Yang training
samples at initialisation, train it for a fixed (short) budget with the default recipe, and record the test
accuracy. Prints the Spearman rank correlation between the count at initialisation and the final test
accuracy (the paper's claim: strongly positive) and saves a scatter plot and the raw results.

    python scripts/causal_pieces_init_study.py                 # 8 means x 3 stds x 2 seeds = 48 runs
    python scripts/causal_pieces_init_study.py --epochs 20 --workers 2 --out init_study

Runs are spread over ``--workers`` processes with one torch thread each. ``--mlflow`` logs the figure and
the numbers to the ``causal_pieces`` MLflow experiment (run ``init_study``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MEANS = [-0.5, 0.0, 0.25, 0.5, 1.0, 1.5, 2.5, 4.0]
STDS = [0.2, 0.8, 1.6]

_DATA: dict = {}


def _data():
    if not _DATA:
        from datamodules.spike_encoding import SpikeYinYangDataModule

        dm = SpikeYinYangDataModule()
        dm.setup()
        _DATA.update(dm.splits)
    return _DATA


def run_one(job: dict) -> dict:
    """Count pieces at init, train ``epochs`` epochs, test; one configuration and seed."""
    import torch

    from callbacks.causal_pieces import count_pieces
    from modules.causal_pieces import CausalPiecesSNN, ttfs_loss

    torch.set_num_threads(1)
    data = _data()
    xtr, ytr = data["train"]
    xte, yte = data["test"]
    torch.manual_seed(job["seed"])
    model = CausalPiecesSNN(
        init_mean=[job["mean"], 0.5], init_std=[job["std"], 0.8], init_seed=job["seed"], bump_iters=job["bump_iters"]
    )
    t0 = time.time()
    batches = [(xtr[i : i + 1000],) for i in range(0, xtr.shape[0], 1000)]
    path = count_pieces(model, batches, mode="path")
    full = count_pieces(model, batches, mode="full")
    hp = model.hparams
    opt = torch.optim.Adam(model.parameters(), lr=hp.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, hp.lr_step, hp.lr_gamma)
    gen = torch.Generator().manual_seed(job["seed"])
    for _ in range(job["epochs"]):
        for idx in torch.randperm(xtr.shape[0], generator=gen).split(150):
            times = model.all_spike_times(xtr[idx])
            loss = ttfs_loss(times[-1], ytr[idx], hp.tau_s, hp.xi, hp.alpha, hp.beta, hp.t_no_spike)
            opt.zero_grad()
            loss.backward()
            opt.step()
            model.bump_silent_weights(xtr[idx])
        sched.step()
    with torch.no_grad():
        acc = float((model.predict_from_times(model(xte)) == yte).double().mean())
        final = count_pieces(model, batches, mode="path")
    return {
        **job,
        "count_init": path.count,
        "count_init_full": full.count,
        "fraction_init": path.fraction,
        "relevant_init": path.relevant_mean,
        "count_final": final.count,
        "test_acc": acc,
        "seconds": time.time() - t0,
    }


def spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def scatter(results: list[dict], rho: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    sc = ax.scatter(
        [r["count_init"] for r in results],
        [r["test_acc"] for r in results],
        c=[r["mean"] for r in results],
        s=[12 + 10 * r["std"] ** 2 * 4 for r in results],
        cmap="viridis",
    )
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("causal pieces on the training set at initialisation (path mode)")
    ax.set_ylabel("test accuracy after training")
    ax.set_title(f"Yin-Yang init study: Spearman rho = {rho:.2f} (n = {len(results)})")
    fig.colorbar(sc, label="hidden-layer init mean (marker size: std)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--means", type=float, nargs="+", default=MEANS)
    ap.add_argument("--stds", type=float, nargs="+", default=STDS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--epochs", type=int, default=8, help="training epochs per run (the default config: 60)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--bump-iters", type=int, default=20,
        help="weight-bumping rounds per batch (model default 20; 1 = a single bump per batch as in Goeltz et al.)",
    )
    ap.add_argument("--out", type=Path, default=Path("causal_pieces_init_study"))
    ap.add_argument("--mlflow", action="store_true", help="log results to MLflow (MLFLOW_TRACKING_URI)")
    args = ap.parse_args(argv)
    if args.epochs < 1 or args.workers < 1:
        raise ValueError("--epochs and --workers must be positive")
    jobs = [
        {"mean": m, "std": s, "seed": seed, "epochs": args.epochs, "bump_iters": args.bump_iters}
        for m in args.means
        for s in args.stds
        for seed in args.seeds
    ]
    t0 = time.time()
    if args.workers == 1:
        results = [run_one(j) for j in jobs]
    else:
        with ProcessPoolExecutor(args.workers) as pool:
            results = list(pool.map(run_one, jobs))
    wall = time.time() - t0
    print(f"{'mean':>6} {'std':>5} {'seed':>4} {'pieces@init':>11} {'full@init':>9} {'test acc':>8} {'pieces@end':>10}")
    for r in results:
        print(
            f"{r['mean']:6.2f} {r['std']:5.2f} {r['seed']:4d} {r['count_init']:11d} {r['count_init_full']:9d} "
            f"{r['test_acc']:8.3f} {r['count_final']:10d}"
        )
    acc = [r["test_acc"] for r in results]
    rho_path = spearman([r["count_init"] for r in results], acc)
    rho_full = spearman([r["count_init_full"] for r in results], acc)
    print(
        f"\n{len(results)} runs, {args.epochs} epochs each, bump_iters={args.bump_iters}, "
        f"{wall:.0f} s wall with {args.workers} workers"
    )
    print(f"Spearman(pieces at init [path], final test acc) = {rho_path:.3f}")
    print(f"Spearman(pieces at init [full], final test acc) = {rho_full:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "spearman_path": rho_path,
        "spearman_full": rho_full,
        "runs": len(results),
        "epochs": args.epochs,
        "wall_s": wall,
        "results": results,
    }
    (args.out / "init_study.json").write_text(json.dumps(summary, indent=1))
    scatter(results, rho_path, args.out / "init_study_scatter.png")
    print(f"scatter: {args.out / 'init_study_scatter.png'}")
    if args.mlflow:
        import mlflow

        mlflow.set_experiment("causal_pieces")
        with mlflow.start_run(run_name="init_study", tags={"paper_id": "000-01"}):
            mlflow.log_params({"epochs": args.epochs, "runs": len(results)})
            mlflow.log_metrics({"spearman_path": rho_path, "spearman_full": rho_full})
            mlflow.log_artifact(str(args.out / "init_study_scatter.png"), "figures")
            mlflow.log_artifact(str(args.out / "init_study.json"))
    return 0 if all(math.isfinite(a) for a in acc) else 1


if __name__ == "__main__":
    sys.exit(main())
