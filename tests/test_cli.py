"""The CLI end to end: fit + test from every experiment config, what lands in MLflow, presets, print_config."""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.entities import Run

from datamodules.base import PaperlabDataModule
from errors import PaperlabError
from lightning_cli import PaperlabCLI
from main import cli_main
from modules.base import PaperTask
from tests.helpers import REPO, TINY, client, runs_of

EXPERIMENT_CONFIGS = sorted(
    p for p in (REPO / "configs").glob("*/*.yaml")
    if p.parent.name not in ("trainer", "diagnostics") and "sweep" not in p.stem
)


def test_every_experiment_config_has_an_explicit_integer_seed() -> None:
    assert EXPERIMENT_CONFIGS, "no experiment configs found"
    for path in EXPERIMENT_CONFIGS:
        seed = yaml.safe_load(path.read_text()).get("seed_everything")
        assert isinstance(seed, int) and not isinstance(seed, bool), f"{path}: seed_everything must be an int"


HUB_HINT = "Use the embedded default instead"


def _config_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


BUILD_SLICES: dict[str, dict[str, object]] = yaml.safe_load((REPO / "tests/conf/config_builds.yaml").read_text())


def build_slice(config: Path) -> list[str]:
    """The command-line overrides ``tests/conf/config_builds.yaml`` gives ``config``: a smaller data slice."""
    return [a for k, v in BUILD_SLICES.get(_config_id(config), {}).items() for a in (f"--{k}", json.dumps(v))]


def test_build_slices_name_existing_configs() -> None:
    stale = set(BUILD_SLICES) - {_config_id(c) for c in EXPERIMENT_CONFIGS}
    assert not stale, f"tests/conf/config_builds.yaml names configs that do not exist: {sorted(stale)}"


class _SharedParserCLI(PaperlabCLI):
    """``PaperlabCLI`` (``run=False``: no subcommands) whose parser is built once for all the config checks: the
    parser depends on no config, and building it was about half of each check. Parsing, linking the sizes and
    instantiating stay ``PaperlabCLI``'s own, per config."""

    shared: Any = None

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]) -> None:
        if _SharedParserCLI.shared is None:
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
            _SharedParserCLI.shared = self.parser
        self.parser = _SharedParserCLI.shared


@pytest.fixture(scope="module")
def _config_builds_store(_migrated_mlflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One MLflow store for all the config builds. A build only reads the store (the fresh-run-name lookup)
    and starts no run, so sharing it keeps the builds independent; a store this process has not opened costs
    an engine and a schema check, about a fifth of each build (docs/benchmarks.md). At the end the store must
    still hold no run: a build that started one would make the next build's run name depend on the order."""
    import mlflow

    path = tmp_path_factory.mktemp("config-builds") / "mlflow.db"
    shutil.copy(_migrated_mlflow_db, path)
    uri = f"sqlite:///{path}"
    yield uri
    store = mlflow.MlflowClient(uri)
    experiments = [e.experiment_id for e in store.search_experiments(view_type=mlflow.entities.ViewType.ALL)]
    runs = store.search_runs(experiments, run_view_type=mlflow.entities.ViewType.ALL)
    assert not runs, f"config builds started runs: {[r.info.run_name for r in runs]}"


@pytest.mark.parametrize("config", EXPERIMENT_CONFIGS, ids=_config_id)
def test_config_builds(config: Path, paperlab_tmp: Path, _config_builds_store: str,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The default suite's check of every experiment config: parsed, model and DataModule built (sizes linked),
    the training split set up (on the slice tests/conf/config_builds.yaml names, if any) and its first batch
    drawn; no fit (each method's smoke fit is below, every config's tiny fit in the slow suite). A paper-scale
    config fails offline with the one-line hint only."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", _config_builds_store)
    try:
        cli = _SharedParserCLI(args=["--config", str(config), *build_slice(config), *TINY], run=False)
        data = cli.datamodule
        data.trainer = cli.trainer  # what a fit attaches: the loaders shard by its world size
        data.setup("fit")
        next(iter(data.train_dataloader()))
    except PaperlabError as err:
        assert HUB_HINT in str(err), str(err)
        return
    assert isinstance(cli.model, PaperTask) and isinstance(data, PaperlabDataModule)


def test_a_preset_diagnostic_the_experiment_configures_keeps_the_experiment_settings(paperlab_tmp: Path) -> None:
    """``--config configs/diagnostics/full.yaml`` on an experiment that configures its own piece counter: one
    counter, the experiment's (150 samples), not the preset's (5000), beside the preset's other diagnostics."""
    from callbacks.causal_pieces import CausalPieceCounter
    from callbacks.diagnostic import Diagnostic

    config = REPO / "configs" / "causal_pieces" / "yinyang.yaml"
    cli = _SharedParserCLI(args=["--config", str(config), *smoke_overrides("causal_pieces"), *TINY], run=False)
    counters = [c for c in cli.trainer.callbacks if isinstance(c, CausalPieceCounter)]
    assert [c.max_samples for c in counters] == [150]
    assert {type(c).__name__ for c in cli.trainer.callbacks if isinstance(c, Diagnostic)} >= {
        "WeightDrift", "ActivationStats", "GradientVariance"}


@pytest.mark.parametrize("config", ["mlp_classifier/yinyang"])
def test_the_dumps_are_the_validated_dump(config: str, paperlab_tmp: Path) -> None:
    """Neither the config artifact (``dump_config``) nor LightningCLI's dump for ``save_hyperparameters``
    (``ParsedConfigParser``) runs jsonargparse's second validation (the parse did it); each must be what the
    validated dump gives, class paths, links and None values included (checked once for all 78 experiment
    configs when the validation was dropped, docs/benchmarks.md), and the model's hyperparameters keep what
    ``load_from_checkpoint`` needs."""
    from tracking.config_artifact import dump_config

    cli = _SharedParserCLI(args=["--config", str(REPO / "configs" / f"{config}.yaml"), *TINY], run=False)
    dumped = dump_config(cli.parser, cli.config)
    assert dumped == cli.parser.dump(cli.config, skip_unset=False, skip_validation=False)
    assert "class_path: modules." in dumped and ": null" in dumped
    validated = cli.parser.dump(cli.config, skip_link_targets=False, skip_unset=False, format="yaml",
                                skip_validation=False)
    assert cli.config_dump == yaml.safe_load(validated)
    assert cli.model.hparams["_class_path"] == cli.config.model.class_path


def _default_config(method: str) -> Path:
    """The method's default experiment: ``default_config`` of its docs page's front matter, else its first
    experiment config."""
    page = REPO / "docs" / "papers" / f"{method}.md"
    text = page.read_text() if page.is_file() else ""
    if text.startswith("---"):
        front = yaml.safe_load(text.split("---", 2)[1]) or {}
        if front.get("default_config"):
            return REPO / front["default_config"]
    return next(c for c in EXPERIMENT_CONFIGS if c.parent.name == method)


SMOKE_CONFIGS = [_default_config(m) for m in sorted({c.parent.name for c in EXPERIMENT_CONFIGS})]

# What a smoke run must log beyond some train/ and test/ metric: the quantities a method's README row reports,
# where no other default-suite test sees them reach MLflow through the CLI.
SMOKE_METRICS: dict[str, set[str]] = {
    "frac_ssm": {"test/acc", "test/acc_lag1_32", "test/acc_lag32_256", "test/acc_lag256_1024", "train/alpha_mean",
                 "diag/kernel_shape/loglog_r2", "diag/kernel_shape/semilog_r2"},
    "byte_distill": {"train/distill", "test/bpb", "test/teacher_bpb"},
    "craft": {"test/acc", "test/client_acc_mean", "test/client_acc_std", "test/client_acc_worst10",
              "test/client_acc_noise_std", "test/client_acc_var_corrected", "test/client_acc_spread_corrected",
              "test/client_acc_spread_corrected_lo", "test/client_acc_spread_corrected_hi",
              "diag/client_conflict/rate", "diag/client_conflict/layer_rate_avg"},
}
# What a smoke run's values and tags must be, where they say the method ran as itself
SMOKE_VALUES: dict[str, dict[str, float]] = {
    "craft": {"diag/client_conflict/rate": 0.0, "diag/client_conflict/layer_rate_avg": 0.0},  # CRAFT: no conflict
}
SMOKE_TAGS: dict[str, dict[str, str]] = {"craft": {"paper_id": "000-04", "dataset": "digits"}}


# A diagnostics preset stacked on a method's smoke fit. Causal pieces' is the default suite's one case of a preset
# whose diagnostic the experiment configures too (tests/callbacks/test_diagnostic.py, PRESET_CASES): that one
# keeps the experiment's settings, the others say they are off for a spiking net. As a CLI fit of its own it
# was a second fit of the same smoke config, about 1 s of the method's share.
SMOKE_PRESETS: dict[str, str] = {"causal_pieces": "full"}


def smoke_overrides(method: str) -> list[str]:
    """``tests/conf/<method>.yaml`` stacked on the default config where the method has one: the same model and
    data classes at a size that keeps the method's share of the default suite within its budget (a smaller data
    set, diagnostics without figures), then the method's ``SMOKE_PRESETS`` preset. The experiments themselves
    are checked by ``test_config_builds``."""
    conf = REPO / "tests" / "conf" / f"{method}.yaml"
    preset = SMOKE_PRESETS.get(method)
    return ([*(["--config", str(conf)] if conf.is_file() else []),
             *(["--config", str(REPO / "configs" / "diagnostics" / f"{preset}.yaml")] if preset else [])])


@pytest.mark.parametrize("config", SMOKE_CONFIGS, ids=_config_id)
def test_smoke_fit_then_test(config: Path, paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    """Each method's one CLI fit + test in the default suite, on its default config (with its smoke overrides)
    at the tiny budget."""
    method = config.parent.name
    run = _fit_then_test(config, paperlab_tmp, capsys, smoke_overrides(method))
    if run is not None:
        missing = SMOKE_METRICS.get(method, set()) - set(run.data.metrics)
        assert not missing, f"{method}: the smoke run did not log {sorted(missing)}"
        for key, value in SMOKE_VALUES.get(method, {}).items():
            assert run.data.metrics[key] == value, (method, key, run.data.metrics[key])
        for key, value in SMOKE_TAGS.get(method, {}).items():
            assert run.data.tags[key] == value, (method, key, run.data.tags[key])
        if method == "causal_pieces":
            # the full preset's CausalPieceCounter (5000 samples) gave way to the experiment's (150 of the 450)
            metrics = run.data.metrics
            samples = metrics["diag/causal_pieces/count"] / metrics["diag/causal_pieces/fraction"]
            assert 150 <= round(samples) < 450, samples
            assert not any(k.startswith(("diag/weight_drift/", "diag/grad_var/", "diag/activations/")) for k in metrics)
            # the piece maps of the input plane, at fit start and end, as MLflow figures (tests/conf: 40 x 40)
            figures = {a.path for a in client().list_artifacts(run.info.run_id, "figures/causal_pieces")}
            assert {"figures/causal_pieces/piece_map_init.png", "figures/causal_pieces/piece_map_final.png"} <= figures
            assert metrics["diag/causal_pieces/grid_count_init"] >= 1 and metrics["diag/causal_pieces/grid_count_final"] >= 1


# Configs whose method schedules more steps than TINY's three before it can end without an error: their
# schedule shortened to fit them, the rest of the config (net, data, quantiser) as it is
TINY_SCHEDULES = {
    # full-precision steps, calibration, then greedy rounds until the bit budget is met; unmet, the fit is an error
    "scalebits/scalebits": ["--model.init_args.fp_steps", "1", "--model.init_args.calib_batches", "1",
                            "--model.init_args.round_frac", "1.0", "--model.init_args.budget_bits", "3.0"],
}


@pytest.mark.slow
@pytest.mark.parametrize("config", EXPERIMENT_CONFIGS, ids=_config_id)
def test_fit_then_test_from_config(config: Path, paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    """Every experiment config's tiny fit and test (the slow suite)."""
    _fit_then_test(config, paperlab_tmp, capsys, TINY_SCHEDULES.get(_config_id(config), []))


def _fit_then_test(
    config: Path, paperlab_tmp: Path, capsys: pytest.CaptureFixture, overrides: Sequence[str] = ()
) -> Run | None:
    """Fit and test ``config`` at the tiny budget; the MLflow run, or None for a paper-scale config offline."""
    args = ["--config", str(config), *overrides, *TINY]
    name = ["--run.name", config.stem]  # TINY's overrides would otherwise name the run (test_run_names)
    rc = cli_main(["fit", *args, *name])
    if rc != 0:
        # Paper-scale configs read hub data: offline they must fail with the one-line hint, nothing else.
        err = capsys.readouterr().err
        assert HUB_HINT in err, err[-2000:]
        return None
    method = config.parent.name
    ckpt_dir = paperlab_tmp / "checkpoints" / method / config.stem
    assert (ckpt_dir / "last.ckpt").is_file()
    assert cli_main(["test", *args, *name, "--ckpt_path", "last"]) == 0
    (run,) = runs_of(method)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == config.stem
    assert any(k.startswith("test/") for k in run.data.metrics), run.data.metrics
    assert any(k.startswith("train/") for k in run.data.metrics), run.data.metrics
    return run


def test_mlflow_run_contents(paperlab_tmp: Path) -> None:
    config = REPO / "configs/mlp_classifier/yinyang.yaml"
    long_tag = "x" * 400  # longer than Lightning's 250-character param cut
    assert cli_main(["fit", "--config", str(config), *TINY, "--run.tags", f'{{"note": "{long_tag}"}}',
                     "--data.init_args.train_size", "300"]) == 0
    (run,) = runs_of("mlp_classifier")
    params, tags = run.data.params, run.data.tags
    assert params["model.init_args.net.init_args.hidden"] == "[64, 64]"
    assert params["model.init_args.optimizer.class_path"] == "torch.optim.AdamW"
    assert params["model.init_args.optimizer.init_args.lr"] == "0.01"
    assert params["data.init_args.train_size"] == "300"
    assert params["seed_everything"] == "0"
    assert not any("_instantiator" in k for k in params)
    assert tags["note"] == long_tag
    assert tags["paper_id"] == "reference" and tags["method"] == "mlp_classifier"
    assert tags["dataset"] == "yinyang" and tags["strategy"] == "SingleDeviceStrategy"
    assert len(tags["git_commit"]) in (7, 40) or tags["git_commit"] == "unknown"
    assert {"val/acc", "val/acc_best", "train/loss"} <= set(run.data.metrics)
    text = Path(client().download_artifacts(run.info.run_id, "config/config.yaml", str(paperlab_tmp))).read_text()
    resolved = yaml.safe_load(text)
    assert resolved["model"]["init_args"]["net"]["init_args"]["hidden"] == [64, 64]
    assert resolved["data"]["init_args"]["train_size"] == 300


def test_long_param_values_are_not_cut_silently(paperlab_tmp: Path) -> None:
    from tracking.mlflow_logger import PaperlabMLFlowLogger

    logger = PaperlabMLFlowLogger(experiment_name="params", run_name="long")
    value = "y" * 1000
    logger.log_params_dict({"a": {"b": value}, "_instantiator": "noise"})
    logger.log_params_dict({"a": {"b": "changed"}})  # a resume that changed the value: a tag, no crash
    run = client().get_run(logger.run_id)
    assert run.data.params["a.b"] == value
    assert "_instantiator" not in run.data.params
    assert run.data.tags["param_changed.a.b"] == "changed"


@pytest.mark.parametrize("preset", sorted((REPO / "configs/trainer").glob("*.yaml")), ids=lambda p: p.stem)
def test_trainer_presets_parse(preset: Path, capsys: pytest.CaptureFixture) -> None:
    config = REPO / "configs/mlp_classifier/yinyang.yaml"
    assert cli_main(["fit", "--config", str(config), "--trainer", str(preset), "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    expected = yaml.safe_load(preset.read_text())
    for key, value in expected.items():
        got = printed["trainer"][key]
        if isinstance(value, dict):  # a class: its class_path and the init_args the preset sets
            assert got["class_path"] == value["class_path"]
            assert value["init_args"].items() <= got["init_args"].items()
        else:
            assert got == value, (key, got)


def test_override_from_command_line(capsys: pytest.CaptureFixture) -> None:
    config = REPO / "configs/mlp_classifier/digits.yaml"
    assert cli_main(["fit", "--config", str(config), "--model.optimizer.lr", "0.123", "--model.net.hidden", "[7]",
                     "--print_config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.123
    assert printed["model"]["init_args"]["net"]["init_args"]["hidden"] == [7]


def test_predict_writes_predictions(paperlab_tmp: Path) -> None:
    config = REPO / "configs/mlp_classifier/yinyang.yaml"
    assert cli_main(["fit", "--config", str(config), *TINY, "--run.name", "yinyang"]) == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli_main(["predict", "--config", str(config), "--ckpt_path", "best", "--run.name", "yinyang"]) == 0
    import torch

    table = torch.load(paperlab_tmp / "checkpoints/mlp_classifier/yinyang/predictions.pt")  # weights_only: tensors
    preds = table["prediction"]
    assert preds.shape == (1000, 3)
    assert torch.allclose(preds.sum(-1), torch.ones(1000), atol=1e-5)
    # labelled: each row's sample index in the predict split (the test split) and that sample's target
    from datamodules.yinyang import YinYangDataModule

    data = YinYangDataModule(**yaml.safe_load(config.read_text())["data"]["init_args"])
    data.setup()
    assert torch.equal(table["index"], torch.arange(1000))
    assert torch.equal(table["target"], data.splits["test"][1][table["index"]])
    assert not [w for w in caught if "infer the batch indices" in str(w.message)]
    (run,) = runs_of("mlp_classifier")
    assert [a.path for a in client().list_artifacts(run.info.run_id, "predictions")]
