"""Seed-parallel throughput: K seeds in one ``fit --run.seeds`` against the same K seeds one after another.

    python bench/seed_parallel.py                      # K = 1, 4, 16, 32 of both cases
    python bench/seed_parallel.py --cases mlp --ks 16  # one case, one K
    python bench/seed_parallel.py --cases gpt --ks 4 --run.num_threads 2  # anything else: both sides' fit options
    python bench/seed_parallel.py --cases mlp --ks 16 --arms 4  # K rows: 4 learning rates x K/4 seeds

Both sides run end to end through the CLI (``cli_messages.run_training``, as ``python main.py fit`` does) with
MLflow logging and checkpoints, in one fresh process per measurement (its own temporary folder and MLflow
store, created before the clock starts): "sequential" is K plain fits ``--seed_everything s`` in that
process, "vectorized" one fit with ``--run.seeds``. With ``--arms A`` the K runs are A learning rates
(0.01, 0.003, 0.001, ...) times K/A seeds: K plain fits ``--model.optimizer.init_args.lr a --seed_everything s``
against one fit ``--run.rows`` (one optimizer param group per row). The ratio is sequential time / vectorized time (the same
work, so the throughput ratio); the CPU time of each side (all its threads) is printed too, a steadier measure
of the work than the wall time on a machine that other jobs share. Peak memory is the process's peak resident set (``ru_maxrss``).

Cases (the issue's): ``mlp`` the reference yinyang MLP, 3 epochs of its 5,000 samples, batch 32;
``gpt`` weight drift's tiny GPT (``configs/weight_drift/tiny_gpt_text.yaml``) at 30 steps, validation at
the end on 4 batches; its diagnostics dropped (``--trainer.callbacks=[]``: they watch one model).
Not a timed test: numbers depend on the machine and its load; docs/benchmarks.md records them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "mlp": ["--config", str(REPO / "configs/mlp_classifier/yinyang.yaml"), "--trainer.max_epochs", "3"],
    "gpt": ["--config", str(REPO / "configs/weight_drift/tiny_gpt_text.yaml"), "--trainer.callbacks=[]",
            "--trainer.max_steps", "30", "--trainer.val_check_interval", "30", "--trainer.limit_val_batches", "4"],
}


LR = "model.init_args.optimizer.init_args.lr"


def runs(k: int, arms: int) -> list[tuple[float | None, int]]:
    """The K runs: (learning rate, seed), the rate None without arms (the config's)."""
    if not arms:
        return [(None, s) for s in range(k)]
    if k % arms:
        raise SystemExit(f"--arms {arms} must divide K={k}")
    return [(round(0.01 / 3.0**a, 6), s) for a in range(arms) for s in range(k // arms)]


def one(case: str, mode: str, k: int, extra: list[str], arms: int = 0) -> dict[str, float]:
    """One measurement in this process (a fresh one: see ``main``)."""
    sys.path.insert(0, str(REPO))
    os.environ["CI"] = "1"  # no progress bar
    folder = Path(tempfile.mkdtemp(prefix="paperlab-seeds-"))
    os.chdir(folder)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    import lightning_cli  # noqa: F401 - imported before the clock: a process's cost, not a run's
    from cli_messages import run_training
    from tracking.uri import prepare_store

    prepare_store(os.environ["MLFLOW_TRACKING_URI"], None, writable=True)  # the store's tables: not timed
    seeds = list(range(k))
    todo = runs(k, arms)
    cpu_start = time.process_time()
    start = time.perf_counter()
    if mode == "sequential":
        for i, (lr, s) in enumerate(todo):
            flags = [f"--{LR}", str(lr)] if lr is not None else []
            assert run_training(["fit", *CASES[case], *extra, *flags, "--seed_everything", str(s),
                                 "--run.name", f"r{i}"]) == 0
    elif arms:
        rows = [{"seed": s, "overrides": {LR: lr}} for lr, s in todo]
        assert run_training(["fit", *CASES[case], *extra, "--run.rows", json.dumps(rows), "--run.name", "stack"]) == 0
    else:
        assert run_training(["fit", *CASES[case], *extra, "--run.seeds", json.dumps(seeds), "--run.name", "stack"]) == 0
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "cpu_seconds": time.process_time() - cpu_start,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(case: str, mode: str, k: int, extra: list[str], arms: int = 0) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--one", case, mode, str(k), "--arms", str(arms), *extra],
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    if out.returncode != 0:
        raise SystemExit(f"{case} {mode} K={k} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--ks", nargs="+", type=int, default=[1, 4, 16, 32])
    parser.add_argument("--arms", type=int, default=0,
                        help="K runs as this many learning rates x K/arms seeds (--run.rows); default: K seeds")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args()  # the rest goes to both sides' fit commands
    if args.one:
        case, mode, k = args.one
        print(json.dumps(one(case, mode, int(k), extra, args.arms)))
        return
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    for case in args.cases:
        for k in args.ks:
            seq, vec = measure(case, "sequential", k, extra, args.arms), measure(case, "vectorized", k, extra, args.arms)
            ratio = seq["seconds"] / vec["seconds"]
            cpu_ratio = seq["cpu_seconds"] / vec["cpu_seconds"]
            what = f" ({args.arms} lr x {k // args.arms} seeds)" if args.arms else ""
            print(f"{case} K={k}{what}: vectorized/sequential throughput {ratio:.2f} (sequential {seq['seconds']:.1f} s, "
                  f"vectorized {vec['seconds']:.1f} s; CPU time {seq['cpu_seconds']:.1f} s / {vec['cpu_seconds']:.1f} s: "
                  f"{cpu_ratio:.2f}; peak memory {seq['peak_mb']:.0f} MB / {vec['peak_mb']:.0f} MB)", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
