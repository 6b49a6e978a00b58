"""The sweep file: grid expansion against a naive loop, seeds, labels, structural errors, key validation."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from main import cli_main
from sweeps.spec import SweepError, cli_value, expand, load_sweep, parse_sweep
from tests.helpers import REPO, runs_of
from tests.sweeps.common import BASE, write_sweep


def test_grid_times_points_times_seeds_matches_a_naive_loop() -> None:
    grid = {"model.net.activation": ["relu", "gelu", "tanh"], "model.optimizer.lr": [0.1, 0.01]}
    points = [
        {"model.net.hidden": [128]},
        {"model.net.activation": "relu", "model.optimizer.lr": 0.1},
    ]
    overrides = {"trainer.max_epochs": 3, "model.optimizer.lr": 0.5}
    spec = parse_sweep(
        {
            "name": "s",
            "base": str(BASE),
            "grid": grid,
            "points": points,
            "overrides": overrides,
            "seeds": [3, 7],
        }
    )
    got = expand(spec)

    expected = []
    for act in grid["model.net.activation"]:
        for lr in grid["model.optimizer.lr"]:
            expected.append({"model.net.activation": act, "model.optimizer.lr": lr})
    expected.append({"model.net.hidden": [128]})  # the second explicit point duplicates a grid point
    assert len(got) == len(expected) * 2
    for i, values in enumerate(expected):
        for j, seed in enumerate([3, 7]):
            point = got[2 * i + j]
            assert point.index == 2 * i + j and point.seed == seed and point.values == values
            # A point's own value beats the global override; the rest of the overrides apply to every point.
            assert point.overrides == {**overrides, **values}
            assert point.cli_args()[-2:] == ["--seed_everything", str(seed)]
    assert got[0].label == "activation=relu-lr=0.1" and got[0].run_name == "s-activation=relu-lr=0.1-s3"
    assert got[-1].label == "hidden=128"
    assert len({p.run_name for p in got}) == len(got)


def test_constant_keys_stay_out_of_the_label_and_a_seed_study_is_one_base_point() -> None:
    spec = parse_sweep({"name": "s", "base": str(BASE), "grid": {"a.b": [1, 2], "trainer.max_epochs": [5]}})
    assert [p.label for p in expand(spec)] == ["b=1", "b=2"]
    seeds_only = expand(parse_sweep({"base": str(BASE), "seeds": [0, 1, 2]}))
    assert [(p.label, p.seed) for p in seeds_only] == [("base", 0), ("base", 1), ("base", 2)]


def test_labels_keep_to_portable_characters() -> None:
    """A string value with a space, ``#`` or brackets gives a label of portable file-name characters only."""
    spec = parse_sweep({"name": "s", "base": str(BASE), "grid": {"a.tag": ["x #2", "[y]"]}})
    assert [p.label for p in expand(spec)] == ["tag=x_2", "tag=_y"]


def test_seeds_default_to_the_base_configs_seed(tmp_path: Path) -> None:
    base = tmp_path / "b.yaml"
    base.write_text(yaml.safe_dump({**yaml.safe_load(BASE.read_text()), "seed_everything": 11}))
    assert parse_sweep({"base": str(base)}).seeds == [11]


@pytest.mark.parametrize(
    "value",
    ["relu", 3, 0.001, 1e-7, True, None, [64, 64], [-0.5, 1e-5], {"a": 1, "b": [True, "x"]}, float("inf")],
)
def test_cli_values_read_back_as_the_same_value(value) -> None:
    assert yaml.safe_load(cli_value(value)) == value


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"seed": [0]}, "did you mean 'seeds'"),
        ({"grid": {"model.optimizer.lr": 0.1}}, "non-empty list of alternatives"),
        ({"seeds": [0, 0]}, "lists a seed twice"),
        ({"seeds": [True]}, "list of integers"),
        ({"grid": {"seed_everything": [0, 1]}}, "seeds:"),
        ({"overrides": {"run.name": "x"}}, "cannot be swept"),
        ({"base": "configs/nope/missing.yaml"}, "not found"),
        ({"points": {"a": 1}}, "list of mappings"),
        ({"name": "a b"}, "may only contain"),
    ],
)
def test_structural_errors_name_the_fix(data: dict, needle: str) -> None:
    with pytest.raises(SweepError, match=None) as err:
        parse_sweep({"base": str(BASE), **data})
    assert needle in str(err.value)


def test_every_shipped_sweep_file_parses_and_names_real_keys() -> None:
    from cli_messages import config_keys
    from sweeps.spec import canonicalize, print_config

    files = sorted(REPO.glob("configs/*/*sweep*.yaml"))
    assert any(p.name == "activation_sweep.yaml" for p in files)
    printed: dict[Path, dict] = {}  # 43 sweeps over 25 bases: each base is printed (a parser built) once
    for path in files:
        spec = load_sweep(path)
        if spec.base not in printed:
            printed[spec.base] = print_config(spec.base)
        keys = config_keys(canonicalize(spec, copy.deepcopy(printed[spec.base])))
        assert set(spec.override_keys()) <= keys, (path, set(spec.override_keys()) - keys)
        assert expand(spec)


def test_the_key_check_prints_and_refuses_as_fit_does_with_one_parser_per_process() -> None:
    """``print_config`` reuses one training parser: for one base after another, what it prints is what a fresh
    ``fit --print_config`` prints, and what it refuses it refuses in the same words."""
    import contextlib
    import io

    from cli_messages import run_training
    from sweeps.spec import print_config

    def fresh(base: Path, extra: list[str]) -> object:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = run_training(["fit", "--config", str(base), *extra, "--print_config"])
        return yaml.safe_load(out.getvalue()) if rc == 0 else err.getvalue().splitlines()[0]

    def reused(base: Path, extra: list[str]) -> object:
        try:
            return print_config(base, extra)
        except SweepError as err:
            return f"error: {err}"

    other = REPO / "configs/bvpo/bvpo.yaml"
    cases = [(BASE, []), (other, []), (BASE, ["--model.optimizer.lr", "0.5"]), (other, ["--trainer.max_epochs", "many"]),
             (BASE, ["--model.lr", "0.1"]), (BASE, ["--model.net", "torch.nn.Linearr"]), (BASE, [])]
    got = [reused(base, extra) for base, extra in cases]
    assert got == [fresh(base, extra) for base, extra in cases]
    assert got[0] == got[-1] and got[0] != got[2] and got[0]["model"] != got[1]["model"]
    assert [isinstance(g, str) for g in got] == [False, False, False, True, True, True, False]


def test_sweep_keys_take_every_form_the_command_line_takes() -> None:
    from sweeps.spec import canonicalize

    forms = ["model.optimizer.lr", "model.init_args.optimizer.init_args.lr", "model.optimizer.init_args.lr"]
    for form in forms:
        spec = parse_sweep({"base": str(BASE), "grid": {form: [0.1, 0.2]}, "overrides": {"data.batch_size": 16}})
        canonicalize(spec)
        assert list(spec.grid) == ["model.init_args.optimizer.init_args.lr"]
        assert list(spec.overrides) == ["data.init_args.batch_size"]
        assert [p.label for p in expand(spec)] == ["lr=0.1", "lr=0.2"]
    spec = parse_sweep({"base": str(BASE), "grid": {forms[0]: [0.1], forms[1]: [0.2]}})
    with pytest.raises(SweepError, match="name the same key"):
        canonicalize(spec)


def test_unknown_override_key_is_rejected_before_any_run(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"model.init_args.activaton": ["relu", "tanh"]}, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep)]) == 101
    err = capsys.readouterr().err
    # either spelling of the real key is one the CLI takes; which one depends on the printed base config's form
    assert "'model.init_args.activaton'" in err
    assert re.search(r"did you mean 'model\.(init_args\.)?net\.(init_args\.)?activation'", err)
    assert "Traceback" not in err
    assert runs_of("mlp_classifier") == []
    assert not (paperlab_tmp / "checkpoints").exists()


def test_a_value_of_the_wrong_type_is_rejected_before_any_run(
    paperlab_tmp: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = write_sweep(paperlab_tmp, grid={"trainer.max_epochs": [1, "many"]}, seeds=[0])
    assert cli_main(["sweep", "--config", str(sweep)]) == 101
    err = capsys.readouterr().err
    assert "max_epochs" in err and "many" in err
    assert runs_of("mlp_classifier") == []


def test_dry_run_lists_the_points_and_runs_nothing(paperlab_tmp: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = write_sweep(
        paperlab_tmp, grid={"model.net.activation": ["relu", "tanh"]}, seeds=[0, 1], test=True
    )
    assert cli_main(["sweep", "--config", str(sweep), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for name in (
        "tiny-activation=relu-s0",
        "tiny-activation=relu-s1",
        "tiny-activation=tanh-s0",
        "tiny-activation=tanh-s1",
    ):
        assert f"todo        {name}" in out
        assert f"--run.name {name}" in out
    assert out.count("python main.py fit ") == 4 and out.count("python main.py test ") == 4
    assert runs_of("mlp_classifier") == []
    assert not (paperlab_tmp / "checkpoints").exists()
