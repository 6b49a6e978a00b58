"""The run's seed: ``seed_everything`` reaches the task and the DataModule as ``run_seed``; a config without
one gets a seed chosen and recorded in the resolved config (so in the run's params)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lightning_cli import PaperlabCLI
from tests.helpers import REPO

BASE = REPO / "configs/mlp_classifier/yinyang.yaml"


def _built(config: Path, *extra: str) -> PaperlabCLI:
    return PaperlabCLI(args=["--config", str(config), *extra], run=False)


def test_seed_everything_reaches_task_and_data(paperlab_tmp: Path) -> None:
    cli = _built(BASE, "--seed_everything", "7")
    assert cli.model.run_seed == 7 and cli.datamodule.run_seed == 7


def test_a_config_without_a_seed_gets_one_chosen_and_recorded(paperlab_tmp: Path) -> None:
    config = yaml.safe_load(BASE.read_text())
    config.pop("seed_everything")
    unseeded = paperlab_tmp / "unseeded.yaml"
    unseeded.write_text(yaml.safe_dump(config))
    seeds = set()
    for _ in range(3):
        cli = _built(unseeded)
        seed = cli.config["seed_everything"]
        assert isinstance(seed, int) and not isinstance(seed, bool)
        assert cli.model.run_seed == seed == cli.datamodule.run_seed
        seeds.add(seed)
    assert len(seeds) > 1  # chosen per run, not Lightning's fixed 0 (3 draws from 2**31 collide ~never)


@pytest.mark.parametrize("hook", ["on_save_checkpoint", "on_load_checkpoint"])
def test_a_task_cannot_override_the_checkpoint_hooks(hook: str) -> None:
    from modules.base import PaperTask

    with pytest.raises(TypeError, match="extra_state"):
        type("Overrides", (PaperTask,), {hook: lambda self, checkpoint: None, "paper_id": "000-00",
                                         "monitor": "val/acc", "monitor_mode": "max"})


def test_data_built_while_sizes_are_linked_see_the_run_seed(paperlab_tmp: Path) -> None:
    """A linked size can build the data during instantiation: the seed must be there by then."""
    from datamodules.base import PaperlabDataModule

    seen: list[int] = []

    class _SeedAtBuild(PaperlabDataModule):
        @property
        def num_classes(self) -> int:
            seen.append(self.run_seed)
            return 3

    import sys

    module = sys.modules[__name__]
    module._SeedAtBuild = _SeedAtBuild  # importable by its dotted path for the CLI
    _SeedAtBuild.__module__, _SeedAtBuild.__qualname__ = __name__, "_SeedAtBuild"
    _built(BASE, "--seed_everything", "11", "--data", f"{__name__}._SeedAtBuild")
    assert seen and set(seen) == {11}
