"""Shared by the sweep tests: tiny training budgets and a sweep-file writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.helpers import REPO

BASE = REPO / "configs/mlp_classifier/yinyang.yaml"
# One epoch of two batches on 200 samples: a point costs about a second in process.
TINY: dict[str, Any] = {
    "trainer.max_epochs": 1,
    "trainer.limit_train_batches": 2,
    "trainer.limit_val_batches": 2,
    "trainer.limit_test_batches": 2,
    "trainer.num_sanity_val_steps": 0,
    "trainer.enable_model_summary": False,
    "data.init_args.train_size": 200,
    "data.init_args.val_size": 100,
    "data.init_args.test_size": 100,
}


def write_sweep(directory: Path, name: str = "tiny", **fields: Any) -> Path:
    """A sweep file over the reference MLP with the tiny budget merged into its overrides."""
    data: dict[str, Any] = {"name": name, "base": str(BASE)}
    data.update(fields)
    data["overrides"] = {**TINY, **(fields.get("overrides") or {})}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
