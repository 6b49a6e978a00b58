"""The sweep file: parsing, grid expansion into points, validation of override keys against the base config.

A sweep file (documented in ``docs/sweeps.md``)::

    name: activations                        # default: the file's stem
    base: configs/mlp_classifier/yinyang.yaml
    grid:                                    # cartesian product; each value is a list of alternatives
      model.init_args.activation: [relu, gelu, tanh]
    points:                                  # explicit extra points, each a dict of overrides
      - {model.init_args.hidden: [128]}
    overrides: {trainer.max_epochs: 10}      # applied to every point (a point's own value wins)
    seeds: [0, 1, 2]                         # seed_everything of each point (default: the base's seed)
    vectorize_seeds: false                   # true: a point's seeds train in one process (--run.seeds)
    vectorize_arms: false                    # true: points differing in optimizer hyperparameters and seed
                                             # share one process too (--run.rows; implies vectorize_seeds)
    test: true                               # test --ckpt_path best after each fit
    description: free text                   # shown as the parent run's description in MLflow

A *point* is one set of swept values times one seed: one child run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cli_messages import config_keys, suggest_key
from errors import ConfigError
from seed_parallel import ROW_KEYS

REPO = Path(__file__).resolve().parent.parent
TOP_LEVEL_KEYS = ("name", "base", "grid", "points", "overrides", "seeds", "vectorize_seeds", "vectorize_arms", "test",
                  "description")
# Keys the sweep sets itself; a sweep file that sets them would silently break resumability or grouping.
RESERVED_KEYS = {
    "seed_everything": "list the seeds in the sweep's `seeds:` entry instead",
    "run.name": "the sweep names every child run <sweep>-<point>-s<seed>",
    "run.parent_run_id": "the sweep links every child to its parent run",
    "config": "put the base config in `base:`",
    "ckpt_path": "a sweep trains every point from scratch",
    "print_config": "use `python main.py sweep --dry-run`",
    "run.seeds": "list the seeds in `seeds:`, and set `vectorize_seeds: true` to train a point's seeds in one process",
    "run.seed_runs": "`vectorize_seeds: true` names each seed's run itself",
    "run.rows": "`vectorize_arms: true` puts points that differ in optimizer hyperparameters into one fit itself",
}
MAX_RUN_NAME = 120


class SweepError(ConfigError):
    """A sweep file or sweep argument that cannot run; the message names the fix."""


def is_arm_key(key: str) -> bool:
    """A key (full form) that ``vectorize_arms`` lets the points of one process differ in."""
    return key.startswith(ROW_KEYS)


def cli_value(value: Any) -> str:
    """One override value as jsonargparse reads it from the command line (YAML flow syntax)."""
    return value if isinstance(value, str) else _flow(value)


def _flow(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[repr(value)]
        text = repr(value)
        mantissa, e, exponent = text.partition("e")
        # YAML 1.1 (PyYAML) reads 1e-07 as a string: a float needs a dot in its mantissa.
        return f"{mantissa}.0e{exponent}" if e and "." not in mantissa else text
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {_flow(v)}" for k, v in value.items()) + "}"
    return str(value)


def label_value(value: Any) -> str:
    """A value as a point's label shows it (a class path: its class name)."""
    if isinstance(value, (list, tuple)):
        return ",".join(label_value(v) for v in value)
    if isinstance(value, dict):
        return ",".join(f"{k}:{label_value(v)}" for k, v in value.items())
    if isinstance(value, str) and "." in value and "/" not in value:  # a class path: its class name
        return value.rsplit(".", 1)[-1] if re.fullmatch(r"[\w.]+\.[A-Z]\w*", value) else value
    return str(value)


def safe_name(text: str) -> str:
    """A sweep point's label (part of its run names): portable file-name characters only, stricter than
    ``tracking.names.folder_name``, which keeps ``#`` and brackets (``<name> #<n>``: the n-th run of a name)."""
    return re.sub(r"[^A-Za-z0-9._,=+-]+", "_", text).strip("_") or "x"


def canonical(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=str)


@dataclass(frozen=True)
class Point:
    """One child run: the swept ``values`` (the point's identity), every override passed, and the seed."""

    index: int
    label: str
    values: dict[str, Any]
    overrides: dict[str, Any]
    seed: int
    run_name: str

    def cli_args(self) -> list[str]:
        args: list[str] = []
        for key, value in self.overrides.items():
            args += [f"--{key}", cli_value(value)]
        return args + ["--seed_everything", str(self.seed)]


@dataclass
class SweepSpec:
    """A parsed sweep file (see the module docstring)."""

    name: str
    base: Path
    grid: dict[str, list[Any]] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    vectorize_seeds: bool = False
    vectorize_arms: bool = False
    test: bool = False
    description: str = ""
    path: Path | None = None
    text: str = ""

    def override_keys(self) -> list[str]:
        keys = list(self.grid) + [k for p in self.points for k in p] + list(self.overrides)
        return list(dict.fromkeys(keys))

    def digest(self) -> str:
        return hashlib.sha1(self.text.encode()).hexdigest()[:12]


def _suggest(key: str, candidates: list[str]) -> str:
    """`` (did you mean '<key>'?)`` with the command line's guess (a key one level deeper, the closest
    spelling), or nothing."""
    close = suggest_key(key, candidates)
    return f" (did you mean '{close}'?)" if close else ""


def _resolve_base(base: str, sweep_path: Path | None) -> Path:
    raw = Path(base)
    candidates = [raw] if raw.is_absolute() else [Path.cwd() / raw, REPO / raw]
    if sweep_path is not None and not raw.is_absolute():
        candidates.append(sweep_path.parent / raw)
    for cand in candidates:
        if cand.is_file():
            return cand.resolve()
    raise SweepError(
        f"base config '{base}' not found (looked in {', '.join(str(c.parent) for c in candidates)})"
    )


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise SweepError(f"{what} must be a mapping of dotted config keys to values, got {value!r}")
    return dict(value)


def parse_sweep(data: Any, path: Path | None = None, text: str = "") -> SweepSpec:
    """A ``SweepSpec`` from the loaded YAML of a sweep file; every structural mistake is a ``SweepError``."""
    where = str(path) if path else "sweep file"
    if not isinstance(data, dict):
        raise SweepError(f"{where}: a sweep file is a YAML mapping with at least `base:`")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise SweepError(
                f"{where}: unknown entry '{key}'{_suggest(str(key), list(TOP_LEVEL_KEYS))}; "
                f"a sweep file has {', '.join(TOP_LEVEL_KEYS)}"
            )
    if "base" not in data:
        raise SweepError(f"{where}: `base:` (the experiment config every point starts from) is missing")
    name = str(data.get("name") or (path.stem if path else "sweep"))
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise SweepError(f"{where}: name '{name}' may only contain letters, digits, '.', '_' and '-'")
    base = _resolve_base(str(data["base"]), path)

    grid = _mapping(data.get("grid"), f"{where}: `grid:`")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(
                f"{where}: grid entry '{key}' must be a non-empty list of alternatives "
                f"(for a single value write `{key}: [{cli_value(values)}]` or use `overrides:`)"
            )
    points_raw = data.get("points") or []
    if not isinstance(points_raw, list):
        raise SweepError(f"{where}: `points:` must be a list of mappings, got {points_raw!r}")
    points = [_mapping(p, f"{where}: points[{i}]") for i, p in enumerate(points_raw)]
    overrides = _mapping(data.get("overrides"), f"{where}: `overrides:`")

    seeds_raw = data.get("seeds")
    if seeds_raw is None:
        seeds_raw = [_base_seed(base)]
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds_raw = [seeds_raw]
    if (
        not isinstance(seeds_raw, list)
        or not seeds_raw
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds_raw)
    ):
        raise SweepError(f"{where}: `seeds:` must be a non-empty list of integers, got {seeds_raw!r}")
    if len(set(seeds_raw)) != len(seeds_raw):
        raise SweepError(f"{where}: `seeds:` lists a seed twice: {seeds_raw}")
    test = data.get("test", False)
    if not isinstance(test, bool):
        raise SweepError(f"{where}: `test:` must be true or false, got {test!r}")
    vectorize = data.get("vectorize_seeds", False)
    if not isinstance(vectorize, bool):
        raise SweepError(f"{where}: `vectorize_seeds:` must be true or false, got {vectorize!r}")
    arms = data.get("vectorize_arms", False)
    if not isinstance(arms, bool):
        raise SweepError(f"{where}: `vectorize_arms:` must be true or false, got {arms!r}")

    spec = SweepSpec(
        name=name,
        base=base,
        grid=grid,
        points=points,
        overrides=overrides,
        seeds=list(seeds_raw),
        vectorize_seeds=vectorize or arms,  # arms are rows of a seed-parallel stack
        vectorize_arms=arms,
        test=test,
        description=str(data.get("description") or ""),
        path=path,
        text=text,
    )
    for key in spec.override_keys():
        reason = RESERVED_KEYS.get(key)
        if reason:
            raise SweepError(f"{where}: '{key}' cannot be swept or overridden: {reason}")
    return spec


def _base_seed(base: Path) -> int:
    seed = (yaml.safe_load(base.read_text()) or {}).get("seed_everything", 0)
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else 0


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and parse a sweep file."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file '{path}' not found")
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SweepError(f"{path}: not valid YAML: {err}") from err
    return parse_sweep(data, path.resolve(), text)


def _short_keys(keys: list[str]) -> dict[str, str]:
    """``model.init_args.activation`` -> ``activation`` unless two varying keys share the last part."""
    last = {k: k.rsplit(".", 1)[-1] for k in keys}
    counts: dict[str, int] = {}
    for v in last.values():
        counts[v] = counts.get(v, 0) + 1
    return {k: (last[k] if counts[last[k]] == 1 else k.replace(".init_args.", ".")) for k in keys}


def expand(spec: SweepSpec) -> list[Point]:
    """Every point of the sweep, in a stable order: (grid product, then explicit points) x seeds.

    The grid's cartesian product comes first (keys in file order, the last key varying fastest), then the
    explicit ``points:``; a point identical to an earlier one is dropped. Each point then runs once per seed.
    ``index`` numbers the (values, seed) pairs from 0: it is the SLURM array index of the point.
    """
    combos: list[dict[str, Any]] = []
    if spec.grid:
        keys = list(spec.grid)
        combos += [dict(zip(keys, vals)) for vals in itertools.product(*(spec.grid[k] for k in keys))]
    combos += [dict(p) for p in spec.points]
    if not combos:
        combos = [{}]
    unique: dict[str, dict[str, Any]] = {}
    for combo in combos:
        unique.setdefault(canonical(combo), combo)
    combos = list(unique.values())

    # The label names only what differs between points: a value shared by all of them says nothing.
    all_keys = list(dict.fromkeys(k for c in combos for k in c))
    varying = [k for k in all_keys if len({canonical({"v": c.get(k, "<base>")}) for c in combos}) > 1]
    short = _short_keys(varying)
    labels = []
    for combo in combos:
        parts = [f"{short[k]}={label_value(combo[k])}" for k in varying if k in combo]
        labels.append(safe_name("-".join(parts)) if parts else "base")
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):  # distinct values can sanitise to the same text
        if label in seen:
            labels[i] = f"{label}-{i}"
        seen[labels[i]] = i

    out: list[Point] = []
    for combo, label in zip(combos, labels):
        overrides = {**{k: v for k, v in spec.overrides.items() if k not in combo}, **combo}
        for seed in spec.seeds:
            run_name = f"{spec.name}-{label}-s{seed}"
            if len(run_name) > MAX_RUN_NAME:
                run_name = f"{spec.name}-p{len(out)}-{hashlib.sha1(label.encode()).hexdigest()[:8]}-s{seed}"
            out.append(
                Point(
                    index=len(out),
                    label=label,
                    values=combo,
                    overrides=overrides,
                    seed=seed,
                    run_name=run_name,
                )
            )
    return out


# ---------------------------------------------------------------------------------------------------------
# Validation against the base config (needs the CLI, imported lazily so that parsing stays cheap).


class _ParserBuilt(Exception):
    """Carries the training parser out of ``PaperlabCLI.__init__``, raised from its ``parse_arguments`` hook."""

    def __init__(self, parser: Any) -> None:
        super().__init__("the training parser is built")
        self.parser = parser


# The training parser, built once per process and per value of the environment its defaults read: building it
# (four subcommands' signatures) is about half of a --print_config, and a sweep check prints one config per
# distinct swept value (the test suite prints every shipped sweep's base).
_PARSERS: dict[str | None, Any] = {}


def _training_parser() -> Any:
    """``PaperlabCLI``'s parser, as ``main.py fit`` builds it, taken from LightningCLI's public
    ``parse_arguments`` hook before it parses anything."""
    import os

    from lightning_cli import PaperlabCLI

    key = os.environ.get("CI")  # the one default that reads the environment: the progress bar (off under CI)
    if key not in _PARSERS:

        class _ParserOnly(PaperlabCLI):
            def parse_arguments(self, parser: Any, args: Any) -> None:
                raise _ParserBuilt(parser)

        try:
            _ParserOnly(args=["fit"])
        except _ParserBuilt as built:
            _PARSERS[key] = built.parser
    return _PARSERS[key]


def print_config(base: Path, extra: list[str] | None = None) -> dict[str, Any]:
    """The resolved config of ``fit --config base <extra>``, parsed in process (nothing is instantiated), with
    the one-line message ``main.py fit`` gives when the command line is refused."""
    from jsonargparse import ArgumentError

    from cli_messages import argument_error, clean_error
    from errors import PaperlabError

    argv = ["fit", "--config", str(base), *(extra or []), "--print_config"]
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            _training_parser().parse_args(argv)
    except ArgumentError as error:
        raise SweepError(argument_error(error, argv)) from None
    except PaperlabError as error:
        raise SweepError(clean_error(str(error))) from None
    except SystemExit as exit_:  # --print_config prints the config and exits 0
        if exit_.code not in (0, None):
            message = err.getvalue().strip().splitlines()
            raise SweepError(message[0].removeprefix("error: ") if message else f"the CLI refused {extra}") from None
    return yaml.safe_load(out.getvalue())


def canonical_key(key: str, resolved: dict[str, Any]) -> str | None:
    """A key as the CLI takes it, in the resolved config's full form, or None if it names nothing.

    The command line accepts ``model.lr`` for ``model.init_args.lr`` (jsonargparse skips ``init_args`` of a
    class); so does a sweep: ``model.net.hidden`` -> ``model.init_args.net.init_args.hidden``.
    """
    node: Any = resolved
    out: list[str] = []
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(node.get("init_args"), dict) and part in node["init_args"]:
            out += ["init_args", part]
            node = node["init_args"][part]
        else:
            return None
    return ".".join(out)


def check_keys(keys: list[str], resolved: dict[str, Any]) -> dict[str, str]:
    """``{key: canonical key}``; a key the base config does not have is rejected with the closest valid key
    (in the short form the command line takes, ``model.net.activation``, as well as the full one)."""
    full = config_keys(resolved)
    valid = sorted(full | {k.replace(".init_args.", ".") for k in full})
    out: dict[str, str] = {}
    for key in keys:
        full = canonical_key(key, resolved)
        if full is None:
            raise SweepError(
                f"override key '{key}' does not exist in the base config{_suggest(key, valid)}; "
                "`python main.py fit --config <base> --print_config` lists every key"
            )
        out[key] = full
    return out


def canonicalize(spec: SweepSpec, resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rewrite the spec's override keys into the base config's full form (in place, before ``expand``), so
    that ``model.lr`` and ``model.init_args.lr`` are one key; return the base's resolved config
    (``resolved``: that config, already printed, for a caller that checks several sweeps of one base)."""
    if resolved is None:
        resolved = print_config(spec.base)
    names = check_keys(spec.override_keys(), resolved)
    for mapping in (spec.grid, spec.overrides, *spec.points):
        seen: dict[str, str] = {}
        for alias in mapping:
            if names[alias] in seen:
                raise SweepError(f"'{seen[names[alias]]}' and '{alias}' name the same key {names[alias]}: keep one")
            seen[names[alias]] = alias
    spec.grid = {names[k]: v for k, v in spec.grid.items()}
    spec.points = [{names[k]: v for k, v in point.items()} for point in spec.points]
    spec.overrides = {names[k]: v for k, v in spec.overrides.items()}
    for key in spec.override_keys():
        reason = RESERVED_KEYS.get(key)
        if reason:
            raise SweepError(f"'{key}' cannot be swept or overridden: {reason}")
    return resolved


def validate(spec: SweepSpec, points: list[Point], resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check every override key and value against the base config before anything runs.

    Keys are checked against the base's resolved config (and put in their full form, see ``canonicalize``);
    each distinct swept value and each explicit point is then parsed once by the CLI (still nothing
    instantiated), so a wrong type fails here and not after hours. Returns the base's resolved config.
    """
    if resolved is None:
        resolved = canonicalize(spec)
    checked: set[str] = set()
    trials: list[dict[str, Any]] = [dict(spec.overrides)]
    trials += [{**spec.overrides, key: value} for key, values in spec.grid.items() for value in values]
    trials += [{**spec.overrides, **p} for p in spec.points]
    for trial in trials:
        sig = canonical(trial)
        if sig in checked:
            continue
        checked.add(sig)
        args = [a for k, v in trial.items() for a in (f"--{k}", cli_value(v))]
        try:
            trial_config = print_config(spec.base, args)
        except SweepError as err:
            raise SweepError(f"the base config refuses {canonical(trial)}: {err}") from None
        why = spec.vectorize_seeds and not_vectorizable(trial_config)
        if why:
            where = "the base config" if not trial else f"the point {canonical(trial)}"
            raise SweepError(f"vectorize_seeds: {where} cannot train its seeds in one process: {why}; drop "
                             "vectorize_seeds (or --vectorize-seeds) to run them one after another")
    return resolved


def not_vectorizable(resolved: dict[str, Any]) -> str | None:
    """Why a point of this resolved config cannot run its seeds as one seed-parallel fit (``--run.seeds``),
    or None: the checks ``seed_parallel`` makes at the start of such a fit that a config alone decides."""
    class_path, cls = _model_class(resolved)
    if cls is None:
        return f"its model class {class_path!r} cannot be imported"
    from seed_parallel.stack import task_class_refusal  # the fit's own check (a worker has torch imported)

    why = task_class_refusal(cls)
    if why is not None:
        return why
    watchers = [*((resolved.get("trainer") or {}).get("callbacks") or []), *(resolved.get("diagnostics") or [])]
    if watchers:
        names = ", ".join(sorted({str(c.get("class_path", c)).rsplit(".", 1)[-1] if isinstance(c, dict) else str(c)
                                  for c in watchers}))
        return (f"its callbacks and diagnostics ({names}) watch one model, not a stack of seeds (override "
                "trainer.callbacks: [] and diagnostics: null)")
    return None


def _model_class(resolved: dict[str, Any], overrides: dict[str, Any] | None = None) -> tuple[str, type | None]:
    """The task's class path (an override's, else the resolved config's) and the class, None if it cannot be
    imported."""
    from tracking.names import import_class

    overrides = overrides or {}
    class_path = str(overrides.get("model.class_path") or (resolved.get("model") or {}).get("class_path", ""))
    try:
        return class_path, import_class(class_path)
    except (ImportError, AttributeError, ValueError):
        return class_path, None


def experiment_of(resolved: dict[str, Any], overrides: dict[str, Any]) -> str:
    """The MLflow experiment the children log to: ``run.experiment`` or the method (the module's package)."""
    explicit = overrides.get("run.experiment") or (resolved.get("run") or {}).get("experiment")
    if explicit:
        return str(explicit)
    from tracking.names import method_name, method_of

    class_path, cls = _model_class(resolved, overrides)
    return method_name(cls) if cls is not None else method_of(class_path)


def monitor_of(resolved: dict[str, Any], overrides: dict[str, Any]) -> str | None:
    """The metric the base config's task monitors (``PaperTask.monitor``, e.g. ``val/acc``), or None."""
    monitor = getattr(_model_class(resolved, overrides)[1], "monitor", None)
    return monitor if isinstance(monitor, str) and monitor else None


def checkpoint_root(resolved: dict[str, Any], overrides: dict[str, Any]) -> Path:
    return Path(
        str(
            overrides.get("run.checkpoint_root")
            or (resolved.get("run") or {}).get("checkpoint_root")
            or "checkpoints"
        )
    )
