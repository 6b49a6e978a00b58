"""How long a mistaken command takes to say so, against the time Python takes to import Lightning.

Three commands, interleaved over ``--repeats`` rounds (the machine is shared: a round's three runs see the
same load), each timed from its start to its first ``error:`` line on stderr (or to its exit):

  lightning      ``python -c "import lightning"`` (the reference: torch and Lightning, nothing of paperlab's),
                 timed to a line it prints after the import
  missing        ``python main.py fit --config configs/nope.yaml`` (the config file does not exist)
  unknown        ``python main.py fit --config configs/mlp_classifier/yinyang.yaml --trainer.max_epcohs 1``
                 (a misspelt option: the error names the closest one, which parses the config a second time)

It prints each command's median seconds and the median of the per-round ratios to the reference (target:
<= 1.5x):

    python bench/startup.py --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = {
    # timed to a line printed right after the import, as the others are: interpreter teardown (torch's takes
    # a good part of a second) counts for none of them
    "lightning": [sys.executable, "-c", "import sys, lightning; print('error: imported', file=sys.stderr, flush=True)"],
    "missing": [sys.executable, str(REPO / "main.py"), "fit", "--config", "configs/nope.yaml"],
    "unknown": [sys.executable, str(REPO / "main.py"), "fit", "--config", "configs/mlp_classifier/yinyang.yaml",
                "--trainer.max_epcohs", "1"],
}


def time_to_error(command: list[str]) -> tuple[float, str]:
    """Seconds from the start to the first ``error:`` line on stderr (or to the exit), and that line."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CI": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = ""
    for line in proc.stderr:
        if line.startswith("error:"):
            break
    elapsed = time.perf_counter() - t0
    proc.stderr.close()
    proc.wait()
    return elapsed, line.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for r in range(args.repeats):
        for name, command in COMMANDS.items():
            seconds, line = time_to_error(command)
            times[name].append(seconds)
            if r == 0 and name != "lightning":
                print(f"{name}: {line}")
    ref = times["lightning"]
    print(f"{'command':10s} {'median s':>9s} {'ratio to import lightning (median of rounds, range)':>52s}")
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, ref)]
        print(f"{name:10s} {statistics.median(values):9.2f} {statistics.median(ratios):8.2f}x "
              f"({min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
