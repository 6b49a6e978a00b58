"""How runs are named and where their folders are, and which experiment a task's runs go to: pure string rules,
free of torch, Lightning and MLflow, so that the sweep runner's process (which never imports those) names runs,
folders and experiments by the same rules as the CLI (``import_class`` imports what it is given, when called)."""

from __future__ import annotations

import importlib
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


def import_class(class_path: str) -> type:
    """The class a config's ``class_path`` names (``modules.mlp_classifier.MLPClassifier``)."""
    module_name, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def method_of(class_path: str) -> str:
    """A task's method, the MLflow experiment its runs go to by default: ``modules.causal_pieces.CausalPiecesSNN``
    (or ``modules.causal_pieces.snn.CausalPiecesSNN``) -> ``causal_pieces``; a class outside ``modules/`` -> its
    name in lower case."""
    module_name, _, name = class_path.rpartition(".")
    parts = module_name.split(".")
    return parts[1] if parts[0] == "modules" and len(parts) > 1 else name.lower()


def method_name(module_class: type) -> str:
    """``method_of`` the module where the class is defined."""
    return method_of(f"{module_class.__module__}.{module_class.__name__}")
