"""What a sweep costs on top of its fits: ``python main.py sweep --workers 1`` and ``--workers 2`` against the
same fits (and tests) run one after the other in one warm process.

N points of the reference MLP on Yin-Yang (a seed study: ``seeds: [0..N-1]``, ``--epochs`` epochs each, then
``test --ckpt_path best``), each mode on its own fresh sqlite MLflow store. Every fit carries ``FitTimer``,
which records the fit's training time: from the fit's ``setup`` (data built, run opened) to ``on_fit_end``
(checkpoints written, metrics flushed). Printed:

    one process: training <s>/point, fit command <s>, test command <s>, <s> in all
    two such processes at once: ... <r> x the throughput of one (the most --workers 2 can get now)
    --workers W: <s> wall, start-up <s>; a point <s> = training <s> + overhead <s>     (medians over rounds)
    throughput --workers 2 / --workers 1: whole sweep <r>; from the first point on <r>

Rounds of ``--workers 1`` and ``--workers 2`` alternate (``--repeats``), each sweep on a fresh store. A point
is the runner's own time for it (fit and test, ``[i/n] FINISHED ... (s)``); start-up is the time to the
runner's first line, right before the first point starts (this process's imports, the checks of the sweep,
the parent run). Targets (issue "The first hour at 57 methods", item 7): overhead <= 3 s a point, throughput
ratio >= 1.6 on 2 cores.

    python bench/sweep_overhead.py --points 8 --epochs 3 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
BASE = REPO / "configs/mlp_classifier/yinyang.yaml"


class FitTimer(Callback):
    """Appends ``{"fit_s": <seconds from setup to on_fit_end>}`` to ``out`` (rank 0)."""

    def __init__(self, out: str = "fit_times.jsonl") -> None:
        self.out = out
        self._start = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._start = time.perf_counter()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            with open(self.out, "a") as f:
                f.write(json.dumps({"fit_s": time.perf_counter() - self._start}) + "\n")


def _sweep_file(folder: Path, name: str, points: int, epochs: int, times: Path) -> Path:
    data: dict[str, Any] = {
        "name": name,
        "base": str(BASE),
        "seeds": list(range(points)),
        "test": True,
        "overrides": {
            "trainer.max_epochs": epochs,
            "trainer.callbacks": [{"class_path": "sweep_overhead.FitTimer", "init_args": {"out": str(times)}}],
        },
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _fresh_store(folder: Path, template: Path) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, folder / "mlflow.db")
    return {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}", "CI": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(BENCH), os.environ.get("PYTHONPATH")]))}


def _fit_times(path: Path) -> list[float]:
    if not path.is_file():
        return []
    return [json.loads(line)["fit_s"] for line in path.read_text().splitlines() if line.strip()]


_LOOP = """
import json, sys, time
first, count, epochs, base, times = json.loads(sys.argv[1])
sys.argv = ["main.py"]
from cli_messages import run_training
import lightning_cli  # noqa: F401
fit_s, test_s = [], []
for seed in [-1 - first] + list(range(first, first + count)):  # a negative seed: warm-up, not counted
    args = ["--config", base, "--trainer.max_epochs", str(epochs), "--seed_everything", str(abs(seed)),
            "--run.name", f"one-{seed}", "--trainer.callbacks",
            json.dumps([{"class_path": "sweep_overhead.FitTimer", "init_args": {"out": times}}])]
    if seed == first:
        start = time.time()
    t0 = time.perf_counter(); assert run_training(["fit", *args]) == 0; t1 = time.perf_counter()
    assert run_training(["test", *args, "--ckpt_path", "best"]) == 0; t2 = time.perf_counter()
    if seed >= 0:
        fit_s.append(t1 - t0); test_s.append(t2 - t1)
print("RESULT", json.dumps({"fit_cmd": fit_s, "test_cmd": test_s, "start": start, "end": time.time()}))
"""


def one_process(folder: Path, env: dict[str, str], points: int, epochs: int, copies: int = 1) -> dict[str, float]:
    """The same points' fit and test commands in one warm process (a child, so that this one stays light);
    with ``copies``, that many such processes at once, the points shared out: the throughput two processes
    get on this machine now, the most ``--workers 2`` can get."""
    times = folder / "fit_times.jsonl"
    share = [points // copies + (i < points % copies) for i in range(copies)]
    procs = [subprocess.Popen([sys.executable, "-c", _LOOP, json.dumps([sum(share[:i]), n, epochs, str(BASE), str(times)])],
                              cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, n in enumerate(share)]
    results = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"one-process run failed:\n{out[-3000:]}\n{err[-3000:]}")
        results.append(json.loads(out.split("RESULT", 1)[1]))
    fit_cmd = [x for r in results for x in r["fit_cmd"]]
    test_cmd = [x for r in results for x in r["test_cmd"]]
    training = _fit_times(times)[copies:]  # the warm-ups' first (roughly: they end first)
    return {"training": statistics.median(training), "fit_cmd": statistics.median(fit_cmd),
            "test_cmd": statistics.median(test_cmd), "total": sum(fit_cmd) + sum(test_cmd),
            "loop": max(r["end"] for r in results) - min(r["start"] for r in results)}


def sweep(folder: Path, env: dict[str, str], points: int, epochs: int, workers: int) -> dict[str, Any]:
    """One ``python main.py sweep --workers W`` on its own store; its output lines timed as they come."""
    folder.mkdir(parents=True, exist_ok=True)
    times = folder / "fit_times.jsonl"
    path = _sweep_file(folder, f"w{workers}", points, epochs, times)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(REPO / "main.py"), "sweep", "--config", str(path), "--workers",
                             str(workers)], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[tuple[float, str]] = [(time.perf_counter() - start, line.rstrip()) for line in proc.stdout]
    wall = time.perf_counter() - start
    if proc.wait() != 0:
        raise SystemExit(f"sweep --workers {workers} failed ({proc.returncode}):\n" + "\n".join(t for _, t in lines[-40:]))
    # the runner's first line comes right before the first point starts; "[i/n] ..." when a point ends
    first = next(t for t, text in lines if re.match(r"sweep \S+: \d+ point\(s\), experiment", text))
    done = [(t, float(m.group(1))) for t, text in lines if (m := re.match(r"\[\d+/\d+\] FINISHED .* \(([\d.]+) s\)", text))]
    return {"wall": wall, "start_up": first, "points_s": done[-1][0] - first, "point": statistics.median(s for _, s in done),
            "training": statistics.median(_fit_times(times)), "last_line": lines[-1][1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of --workers 1 and 2, interleaved")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="paperlab-sweep-bench-"))
    template = root / "template.db"
    import mlflow  # the store's migrations, once, outside every timing

    mlflow.MlflowClient(f"sqlite:///{template}").search_experiments()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{args.points} points x ({args.epochs} epochs of {BASE.name} + test), load average {load}, in {root}",
          flush=True)
    one = one_process(root / "one", _fresh_store(root / "one", template), args.points, args.epochs)
    print(f"one process: training {one['training']:.2f} s/point, fit command {one['fit_cmd']:.2f} s, test command "
          f"{one['test_cmd']:.2f} s, {one['total']:.1f} s in all", flush=True)
    two = one_process(root / "two", _fresh_store(root / "two", template), args.points, args.epochs, copies=2)
    print(f"two such processes at once: training {two['training']:.2f} s/point, {two['loop']:.1f} s for the points: "
          f"{one['loop'] / two['loop']:.2f} x the throughput of one (this machine's room for --workers 2 now)",
          flush=True)
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    for r in range(args.repeats):
        for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
            folder = root / f"r{r}w{workers}"
            res = sweep(folder, _fresh_store(folder, template), args.points, args.epochs, workers)
            results[workers].append(res)
            print(f"  round {r} --workers {workers}: {res['wall']:.1f} s wall (start-up {res['start_up']:.1f} s, "
                  f"points {res['points_s']:.1f} s); a point {res['point']:.2f} s, training {res['training']:.2f} s",
                  flush=True)
    med = {w: {k: statistics.median(x[k] for x in rs) for k in ("wall", "start_up", "points_s", "point", "training")}
           for w, rs in results.items()}
    for w, m in med.items():
        print(f"--workers {w}: {m['wall']:.1f} s wall, start-up {m['start_up']:.1f} s; a point {m['point']:.2f} s = "
              f"training {m['training']:.2f} s + overhead {m['point'] - m['training']:.2f} s")
    whole = [a["wall"] / b["wall"] for a, b in zip(results[1], results[2])]
    steady = [a["points_s"] / b["points_s"] for a, b in zip(results[1], results[2])]
    print(f"throughput --workers 2 / --workers 1: whole sweep {statistics.median(whole):.2f} "
          f"({min(whole):.2f}-{max(whole):.2f}); from the first point on {statistics.median(steady):.2f} "
          f"({min(steady):.2f}-{max(steady):.2f})")
    print(f"last line: {results[1][-1]['last_line']}")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
