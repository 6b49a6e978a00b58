"""Take a screenshot of an experiment's runs table with headless Chromium (for the README).

    python docs/screenshot_runs.py [--experiment mlp_classifier] [--out docs/runs_table.png] [--port 5055]

Serves the store (``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``) with ``python main.py ui`` on a free
port, opens the link it prints for the experiment and saves the page as a PNG. Needs a ``chromium``,
``chromium-browser`` or ``google-chrome`` binary on PATH; installs nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="mlp_classifier")
    parser.add_argument("--out", default=str(REPO / "docs" / "runs_table.png"))
    parser.add_argument("--port", type=int, default=5055)
    args = parser.parse_args()
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print(f"error: no {', '.join(BROWSERS)} on PATH", file=sys.stderr)
        return 1
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ui = subprocess.Popen([sys.executable, str(REPO / "main.py"), "ui", "--port", str(args.port)], env=env,
                          stdout=subprocess.PIPE, text=True)
    assert ui.stdout is not None
    try:
        link = None
        for line in ui.stdout:  # the links come once the server answers
            parts = line.split()
            if len(parts) == 2 and parts[0] == args.experiment and "/#/experiments/" in parts[1]:
                link = parts[1]
                break
        if link is None:
            print(f"error: no runs table for experiment {args.experiment!r}", file=sys.stderr)
            return 1
        subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                        "--window-size=1600,900", "--virtual-time-budget=30000", f"--screenshot={args.out}", link],
                       check=True, timeout=300)
        print(f"{args.out}: {link}")
        return 0
    finally:
        ui.send_signal(signal.SIGTERM)  # `python main.py ui` stops its server on SIGTERM
        ui.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
