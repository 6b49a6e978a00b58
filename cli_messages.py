"""The training commands' entry and their one-line messages, without importing torch or Lightning.

``run_training(argv)`` runs ``fit``/``validate``/``test``/``predict`` through ``lightning_cli.PaperlabCLI`` (imported
when called) and turns jsonargparse's and paperlab's errors into one line with the fix: the closest option
for a misspelt one (or the deeper key it exists under: ``--model.lr`` -> ``--model.optimizer.lr``), the
closest class for a class path that imports nothing, named by its own key (``--model.net``), the closest
shipped config for a config file that does not exist, the shipped configs when ``--config`` is missing. ``main.py`` and ``sweeps/`` (in-process points, key checks) both call it: it sits on
the floor of ``lightning_cli.py``, below both.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import sys
from pathlib import Path
from typing import Any

from errors import PaperlabError

REPO = Path(__file__).resolve().parent
TRAINING = ("fit", "validate", "test", "predict")

_NOISE = ("Expected a <class 'NoneType'>", "Given value type:", "Given value:", "Subtypes:", "Errors:",
          "Does not validate against any of the Union subtypes")


_BULLET = re.compile(r"^(?:- )+")


def clean_error(message: str) -> str:
    """jsonargparse's message without the Union-of-None noise (every class argument is Optional)."""
    # jsonargparse's bullets ("- ") go; an option's own dashes (--run.seeds) stay
    lines = [_BULLET.sub("", ln.strip()).strip() for ln in str(message).splitlines()]
    kept = [ln for ln in lines if ln and not any(n in ln for n in _NOISE)]
    return "; ".join(dict.fromkeys(kept)).replace(":; ", ": ") or str(message)


def shipped_configs() -> str:
    methods = sorted(p.name for p in (REPO / "configs").iterdir() if p.is_dir() and p.name not in ("trainer", "diagnostics"))
    return f"configs/<method>/ holds one YAML per experiment; methods: {', '.join(methods)}"


_resolving = False  # set while _resolved_keys parses: a failure there must not ask for suggestions again


def _resolved_keys(argv: list[str]) -> list[str]:
    """Every option the command line takes for these configs: the resolved keys, full and short forms. When
    the configs together do not parse (the mistake is in one of them), the first config's keys."""
    global _resolving
    if _resolving:
        return []
    configs = [a for i, a in enumerate(argv) if i and argv[i - 1] == "--config"]
    _resolving = True
    try:
        for chosen in (configs, configs[:1]):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = run_training([argv[0], *(a for c in chosen for a in ("--config", c)), "--print_config"])
            if rc == 0:
                break
        else:
            return []
    finally:
        _resolving = False
    import yaml

    full = config_keys(yaml.safe_load(out.getvalue()) or {})
    return sorted(full | {k.replace(".init_args.", ".") for k in full})


def suggest_key(key: str, known: list[str]) -> str | None:
    """The valid key a mistyped ``key`` most likely meant, or None.

    Keys under the same prefix first, the shallowest (so the short form when ``key`` is short, the full
    ``init_args`` form when it is full): one that ends in the same name one or more levels deeper
    (``model.lr`` -> ``model.optimizer.lr``: jsonargparse takes no shortcut across a nested class), else
    the closest spelling of the last name (``model.net.hiddn`` -> ``model.net.hidden``, also deeper); else
    the closest whole key (difflib).
    """
    prefix, _, last = key.rpartition(".")
    under = [k for k in known if k != key and k.startswith(f"{prefix}." if prefix else "")]
    deeper = [k for k in under if k.rsplit(".", 1)[-1] == last]
    if deeper:
        return min(deeper, key=lambda k: (k.count("."), k))
    ratios = {k: difflib.SequenceMatcher(None, last, k.rsplit(".", 1)[-1]).ratio() for k in under}
    close_last = [k for k, r in ratios.items() if r >= 0.75]
    if close_last:
        return min(close_last, key=lambda k: (-ratios[k], k.count("."), k))
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown_options(keys: list[str], argv: list[str]) -> str:
    """``unknown option(s): --trainer.max_epcohs (did you mean --trainer.max_epochs?)``."""
    known = _resolved_keys(argv)
    hints = []
    for key in keys:
        close = suggest_key(key, known)
        hints.append(f"--{key}" + (f" (did you mean --{close}?)" if close else ""))
    return "unknown option(s): " + ", ".join(hints)


def _class_names(folder: str) -> list[str]:
    """``module.Class`` of every class defined in the project's files under ``folder`` (no imports)."""
    out = []
    for path in sorted((REPO / folder).rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        out += [f"{module}.{name}" for name in re.findall(r"^class (\w+)\(", path.read_text(), re.M)
                if not name.startswith("_")]
    return out


def _module_classes(dotted: str) -> list[str]:
    """``module.Class`` of the public classes of the module a dotted class path names, when that module
    imports (``torch.optim.Adamm`` -> the classes of ``torch.optim``); else nothing."""
    import importlib
    import inspect

    module_name = dotted.rpartition(".")[0]
    if not module_name:
        return []
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 - a module that does not import offers no suggestion, nothing more
        return []
    return [f"{module_name}.{name}" for name, obj in vars(module).items()
            if inspect.isclass(obj) and not name.startswith("_")]


def _closest_class(given: str, top: str) -> str | None:
    """The class a misspelt class path most likely meant: among the named module's classes and the project's
    classes under ``modules/`` (for ``--model...``) or ``datamodules/`` (for ``--data...``)."""
    names = _module_classes(given) + _class_names("datamodules" if top == "data" else "modules")
    by_class = {n.rsplit(".", 1)[1]: n for n in reversed(names)}  # the named module's own class wins
    close = difflib.get_close_matches(given.rsplit(".", 1)[-1], list(by_class), n=1, cutoff=0.6)
    return by_class[close[0]] if close else None


_TASK_NETWORK = ("a task network: a Module class whose first two arguments are one sample's shape and the number "
                 "of outputs (e.g. modules.components.mlp.MLP)")
_NESTED_ARG = re.compile(r"Given value: NestedArg\(key='([^']*)', val=(.*)\)\s*$", re.M)
_NO_SUCH_CLASS = re.compile(r"has no attribute '\w+'|No module named '[\w.]+'|Expected a dot import path string")
_NOT_A_SUBCLASS = re.compile(r"Expected '([\w.]+)' to be a subclass of <class '(\w+)'>")


def _short(key: str) -> str:
    """A key in the short form: no ``init_args`` level, no trailing ``class_path``."""
    return key.replace(".init_args.", ".").removesuffix(".class_path").removesuffix(".init_args")


def _as_typed(key: str, argv: list[str]) -> str:
    """``key`` as the command line spelt it (``model.init_args.net.class_path`` for ``model.net``), when it did."""
    for token in argv:
        typed = token[2:].split("=", 1)[0] if token.startswith("--") else ""
        if typed and _short(typed) == _short(key):
            return typed
    return key


def _nested(message: str) -> tuple[str, str | None] | None:
    """The nested key (``model.net``, ``model.optimizer.lrr``) a jsonargparse error under ``--model`` or
    ``--data`` is about, in the short form, and the value given on the command line; None for an error of
    ``--model``/``--data`` itself.

    jsonargparse names the top key (``Parser key "model"``), then the nested keys down to the failing one,
    and the command line's own argument as ``NestedArg(key='net', val='...')``, relative to the top key.
    """
    top = re.match(r'Parser key "(\w+)"', message)
    if not top:
        return None
    given = _NESTED_ARG.findall(message)
    if given:  # the last NestedArg is the outermost: relative to the top key
        key, value = given[-1]
        return _short(f"{top.group(1)}.{key}"), value.strip("'\"")
    chain = re.findall(r'Parser key "(\w+)"', message)  # from a config file: the keys down to the failure
    option = re.search(r"Option '(\w+)' is not accepted", message)
    keys = chain + ([option.group(1)] if option else [])
    return (".".join(keys), None) if len(keys) > 1 else None


def _unknown_class(raw: str, argv: list[str]) -> str | None:
    """A class path that imports nothing, or imports something of the wrong kind, for the key that takes it
    (``--model``, ``--data``, or a nested class such as ``--model.net``), with the closest class."""
    message = clean_error(raw)
    nested = _nested(raw)
    if nested is not None and "Option '" not in raw:
        return _nested_class(raw, nested, argv)
    match = re.search(r'Parser key "(model|data)":.*?(?:but|string:) ([\w.]+)', message)
    if not match or "import path" not in message and "not accessible" not in message:
        return None
    key, given = match.groups()
    base = re.search(r"does not correspond to a subclass of (\w+)", message)
    if base:  # it imports, but is not a paperlab task / DataModule
        full = {"PaperTask": "modules.base.PaperTask", "PaperlabDataModule": "datamodules.base.PaperlabDataModule"}
        return (f"--{key} {given} is not a {base.group(1)}: --{key} takes a subclass of "
                f"{full.get(base.group(1), base.group(1))} (python main.py fit --help lists them)")
    names = _class_names("modules" if key == "model" else "datamodules")
    close = _closest_class(given, key)
    hint = f"; did you mean {close}?" if close else ""
    return f"--{key} {given}: no such class{hint} (a class name or its dotted path, e.g. {names[0] if names else ''})"


def _nested_class(raw: str, nested: tuple[str, str | None], argv: list[str]) -> str | None:
    """``--model.net modules.components.mlp.MLPP: no such class; did you mean ...?`` and ``--model.net
    torch.optim.AdamW is not a Module``: the nested key itself, not ``--model``."""
    key, value = nested
    typed = _as_typed(key, argv)
    not_a = _NOT_A_SUBCLASS.search(raw)
    if not_a:
        given, base = not_a.groups()
        article = "an" if base[:1] in "AEIOU" else "a"
        takes = _TASK_NETWORK if key.rsplit(".", 1)[-1] == "net" else f"a subclass of {base}"
        return f"--{typed} {given} is not {article} {base}: --{typed} takes {takes}"
    if not _NO_SUCH_CLASS.search(raw):
        return _wrong_type(raw, typed, value)
    # "Expected a dot import path string" is also what a float option says to a word: only a key whose
    # resolved value is a class (it has a class_path) is about a class
    if "has no attribute" not in raw and "No module named" not in raw and \
            f"{key}.class_path" not in _resolved_keys(argv):
        return _wrong_type(raw, typed, value)
    given = value
    if given is None:  # from a config file: the class path as jsonargparse quotes it
        quoted = re.search(r"Got value: Namespace\(class_path='([\w.]+)'|Got value: ([\w.]+)\.?$", raw, re.M)
        given = next((g for g in quoted.groups() if g), None) if quoted else None
    if not given:
        return None
    close = _closest_class(given, key.split(".", 1)[0])
    hint = f"; did you mean {close}?" if close else ""
    return f"--{typed} {given}: no such class{hint}"


def _wrong_type(raw: str, typed: str, value: str | None) -> str | None:
    """``--model.optimizer.lr abc: expected a float``: the types jsonargparse expected for the nested key."""
    last = typed.rsplit(".", 1)[-1]
    tail = raw.rpartition(f'Parser key "{last}"')[2]
    expected = [t.rsplit(".", 1)[-1] for t in re.findall(r"Expected a <class '([\w.]+)'>", tail) if t != "NoneType"]
    if value is None or not tail or not expected:
        return None
    return f"--{typed} {value}: expected " + " or ".join(f"a {t}" for t in dict.fromkeys(expected))


def _config_files(section: str) -> list[str]:
    """The shipped config files, as ``configs/...`` paths (``configs/trainer/`` only, for ``--trainer``)."""
    root = REPO / "configs" / ("trainer" if section == "trainer" else "")
    return sorted(str(p.relative_to(REPO)) for p in root.rglob("*.yaml"))


def _missing_file(raw: str, argv: list[str]) -> str | None:
    """``--config configs/mlp_classifer/yinyang.yaml: no such file; did you mean
    configs/mlp_classifier/yinyang.yaml?``: jsonargparse says only that the file does not exist."""
    match = re.match(r'Parser key "(\w+)":\s*(?:File does not exist|Unable to load config)', raw)
    if not match:
        return None
    option = f"--{match.group(1)}"
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option]
    values += [a.split("=", 1)[1] for a in argv if a.startswith(f"{option}=")]
    missing = next((v for v in values if not Path(v).is_file()), None)
    if missing is None:
        return None
    path = Path(missing).resolve()
    if path.is_relative_to(REPO):
        wanted = str(path.relative_to(REPO))
    elif "configs/" in missing:  # given from another folder: compare from configs/ on
        wanted = "configs/" + missing.rpartition("configs/")[2]
    else:
        wanted = missing
    close = difflib.get_close_matches(wanted, _config_files(match.group(1)), n=1, cutoff=0.75)
    if not close:
        hint = f" ({shipped_configs()})" if match.group(1) == "config" else ""
        return f"{option} {missing}: no such file{hint}"
    found = REPO / close[0]
    shown = found.relative_to(Path.cwd()) if found.is_relative_to(Path.cwd()) else found
    return f"{option} {missing}: no such file; did you mean {shown}?"


def argument_error(err: Exception, argv: list[str]) -> str:
    """The one line for a command line jsonargparse refuses (``argv``: the training command's arguments): the
    closest option, key, class or config file where there is one, else jsonargparse's message cleaned."""
    raw = str(err)
    message = clean_error(raw)
    if argv[:1] and argv[0] in TRAINING and "--config" not in argv and "required" in message:
        return f"{argv[0]} needs an experiment config: --config configs/<method>/<experiment>.yaml ({shipped_configs()})"
    missing = _missing_file(raw, argv)
    if missing:
        return missing
    if "unrecognized arguments" in message:
        return _unknown_options([t[2:].split("=", 1)[0] for t in message.split() if t.startswith("--")], argv)
    nested = _nested(raw)
    option = re.search(r"Option '(\w+)' is not accepted", raw)
    if option and nested is not None:
        key = nested[0] if nested[0].endswith(f".{option.group(1)}") else f"{nested[0]}.{option.group(1)}"
        return _unknown_options([_as_typed(key, argv)], argv)
    return _unknown_class(raw, argv) or message


def _construction_error(err: ValueError, argv: list[str]) -> str | None:
    """A class named on the command line (``--model.net torch.nn.Linear``) that its caller cannot build: jsonargparse
    wraps the ``TypeError`` its constructor raises. One line naming the key, when the ``TypeError`` comes
    from that class's own ``__init__`` (its signature refuses the call); anything else stays a traceback."""
    import importlib
    import traceback

    root: BaseException = err
    while root.__cause__ is not None:
        root = root.__cause__
    if not isinstance(root, TypeError):
        return None
    codes = {frame.f_code for frame, _ in traceback.walk_tb(root.__traceback__)}
    for key, class_path in _named_classes(argv):
        module_name, _, name = class_path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError, ValueError):
            continue
        init = getattr(cls, "__init__", None)
        code = getattr(init, "__code__", None)
        if code in codes or str(root).startswith(f"{getattr(init, '__qualname__', '-')}()"):
            reason = f"{type(root).__name__}: {str(root).splitlines()[0][:200]}"
            if key.rsplit(".", 1)[-1] == "net":  # the task-network contract (docs/design.md)
                return (f"--{key} {class_path} is not a task network: {name}(input_shape, num_classes) fails "
                        f"({reason}); --{key} takes {_TASK_NETWORK}")
            return f"--{key} {class_path} cannot be built here ({reason})"
    return None


def _named_classes(argv: list[str]) -> list[tuple[str, str]]:
    """``(key as typed, class path)`` of every class the command line names (``--model.net torch.nn.Linear``).
    Only the command line's: a class a shipped config names that fails to build is more likely a bug than a
    choice, and keeps its traceback."""
    out: list[tuple[str, str]] = []
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        key, eq, value = token[2:].partition("=")
        if not eq and i + 1 < len(argv):
            value = argv[i + 1]
        if re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", value):
            out.append((key.removesuffix(".class_path"), value))
    return out


def config_keys(config: dict[str, Any], prefix: str = "") -> set[str]:
    """Every dotted key of a resolved config: leaves and the sections above them."""
    keys: set[str] = set()
    for key, value in config.items():
        name = f"{prefix}{key}"
        keys.add(name)
        if isinstance(value, dict):
            keys |= config_keys(value, f"{name}.")
    return keys



def run_training(argv: list[str]) -> int:
    """Run a training command (``fit``, ``validate``, ``test``, ``predict``) through ``PaperlabCLI``; return the
    exit code. User errors are one ``error:`` line, never a traceback."""
    from jsonargparse import ArgumentError

    from lightning_cli import PaperlabCLI

    # LightningCLI reads the command line itself: an in-process call (a test, a sweep's --in-process point or
    # its key check) puts its arguments there for the call, so Lightning sees one command line, not two
    # (it warns on args= plus a foreign sys.argv), and a subprocess launcher re-runs this very command
    outer_argv = sys.argv
    sys.argv = [outer_argv[0] if outer_argv else "main.py", *argv]
    try:
        PaperlabCLI(args=None)
    except ArgumentError as err:
        print(f"error: {argument_error(err, argv)}", file=sys.stderr)
        print(f"(python main.py {argv[0] if argv[0] in TRAINING else 'fit'} --help lists every option)", file=sys.stderr)
        return 2
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except PaperlabError as err:
        if os.environ.get("PAPERLAB_TRACEBACK"):
            raise
        print(f"error: {clean_error(str(err))}", file=sys.stderr)
        print("(set PAPERLAB_TRACEBACK=1 for the full traceback)", file=sys.stderr)
        return err.exit_code
    except ValueError as err:
        # a class the command line names whose constructor refuses the call (lightning_cli.py re-raises
        # jsonargparse's wrapper of it); any other ValueError is a bug and keeps its traceback. After
        # PaperlabError: a ConfigError is a ValueError too
        message = None if os.environ.get("PAPERLAB_TRACEBACK") else _construction_error(err, argv)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        print("(set PAPERLAB_TRACEBACK=1 for the full traceback)", file=sys.stderr)
        return 2
    finally:
        sys.argv = outer_argv
    return 0
