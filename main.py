"""paperlab's command line.

    python main.py {fit,validate,test,predict} --config configs/<method>/<experiment>.yaml [--key value ...]
    python main.py sweep --config configs/<method>/<study>_sweep.yaml
    python main.py compare --experiment <method> --sweep <study> --metric test/acc --by <key>
    python main.py papers [--write]
    python main.py ui [--port 5000] [--host 127.0.0.1]

The training subcommands are LightningCLI (``lightning_cli.PaperlabCLI``); ``sweep`` and ``compare`` are
``sweeps.cli`` and start without importing torch or Lightning; so does ``papers`` (``sweeps.papers``), which
prints the README's methods table from the pages' front matter. User errors (``errors.PaperlabError``) are
one ``error:`` line and a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import sys

USAGE = """usage: python main.py <command> ...

training (LightningCLI; python main.py <command> --help lists every option):
  fit        train a method from its experiment config: --config configs/<method>/<experiment>.yaml
  validate   evaluate a checkpoint on the validation split (--ckpt_path last|best|<file>)
  test       evaluate a checkpoint on the test split
  predict    write predictions of a checkpoint
studies:
  sweep      run a sweep file's points as child runs of one MLflow run (docs/sweeps.md)
  compare    compare runs over seeds: table, figure, CSV
  papers     the README's methods table from docs/papers/*.md front matter (--write rewrites it)
results:
  ui         serve the MLflow UI on the runs' store; a link per experiment to its runs table

example: python main.py fit --config configs/mlp_classifier/yinyang.yaml"""


def cli_main(args: list[str] | None = None) -> int:
    """Run the command line on ``args`` (default: ``sys.argv[1:]``); return the exit code."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in ("sweep", "compare"):
        from sweeps.cli import main as sweeps_main

        return sweeps_main(argv)
    if argv and argv[0] == "papers":
        from sweeps.papers import main as papers_main

        return papers_main(argv[1:])
    if argv and argv[0] == "ui":
        from tracking.ui import main as ui_main

        return ui_main(argv[1:])
    if not argv or argv[0] in ("-h", "--help") and len(argv) == 1:
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    from cli_messages import run_training

    return run_training(argv)


if __name__ == "__main__":
    sys.exit(cli_main())
