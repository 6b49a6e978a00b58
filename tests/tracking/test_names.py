"""The class-path rules that name a run's experiment, shared by the CLI and the sweep runner's process."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeps.spec import experiment_of
from tracking.names import import_class, method_name, method_of

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("class_path", "method"),
    [
        ("modules.mlp_classifier.MLPClassifier", "mlp_classifier"),
        ("modules.compression_error.tasks.LadderTask", "compression_error"),  # a method's package
        ("tests.helpers.SomeTask", "sometask"),  # outside modules/: the class's name
    ],
)
def test_method_of_a_class_path(class_path: str, method: str) -> None:
    assert method_of(class_path) == method


def test_every_config_names_the_experiment_the_cli_names() -> None:
    """The sweep's rule (a resolved config, no Lightning) and the CLI's (the imported class) agree on every
    experiment config's model."""
    for config in sorted((REPO / "configs").glob("*/*.yaml")):
        model = (yaml.safe_load(config.read_text()) or {}).get("model")
        if not isinstance(model, dict) or "class_path" not in model:
            continue
        cls = import_class(model["class_path"])
        assert experiment_of({"model": model}, {}) == method_name(cls) == config.parent.name, config
