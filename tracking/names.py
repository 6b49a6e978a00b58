"""How runs are named and where their folders are: pure string rules, free of torch, Lightning and MLflow, so
that the sweep runner's process (which never imports those) names folders by the same rules as the CLI."""

from __future__ import annotations

import re

#: each run folder's record of its MLflow run (``tracking.run_registry``)
RUN_FILE = "mlflow_run.json"
#: ``<base> #<n>``: the n-th run of a name
INSTANCE = re.compile(r"^(?P<base>.+) #(?P<n>[0-9]+)$")


def folder_name(run_name: str) -> str:
    """A run name as a portable folder name (``yinyang lr=0.003 #2`` -> ``yinyang_lr=0.003_#2``)."""
    return re.sub(r"[^A-Za-z0-9._,=+#\[\]-]+", "_", run_name).strip("_") or "run"


def instance_name(base: str, n: int) -> str:
    """The n-th run of a name: the name itself, then ``<name> #2``, ``<name> #3``, ..."""
    return base if n == 1 else f"{base} #{n}"


def child_name(run_name: str, seed: int) -> str:
    """A seed-parallel fit's run of one seed."""
    return f"{run_name} s{seed}"


def parent_name(run_name: str) -> str:
    """A seed-parallel fit's parent run (its folder holds the stack's own ``last.ckpt``)."""
    return f"{run_name} seeds"
