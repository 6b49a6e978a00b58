"""``python -m modules.cd_scaling fit-laws --anchors anchors --repeat repeat``: fit the CD-scaling laws over two
sweeps' runs in MLflow and log the result as the run ``fit_laws`` (``modules.cd_scaling.laws``)."""

from __future__ import annotations

import argparse
import sys

from errors import PaperlabError
from modules.cd_scaling.laws import EXPERIMENT, fit_laws, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modules.cd_scaling", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    laws = sub.add_parser("fit-laws", help="fit the Chinchilla law on the anchors and both effectiveness forms on the repeat runs")
    laws.add_argument("--anchors", default="anchors", help="the 1-epoch sweep's name (default: anchors)")
    laws.add_argument("--repeat", default="repeat", help="the multi-epoch sweep's name (default: repeat)")
    laws.add_argument("--experiment", default=EXPERIMENT, help=f"the MLflow experiment (default: {EXPERIMENT})")
    args = parser.parse_args(argv)
    try:
        result = fit_laws(args.anchors, args.repeat, args.experiment)
    except PaperlabError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
