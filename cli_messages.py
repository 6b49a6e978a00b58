"""The training commands' entry and their one-line messages, without importing torch or Lightning.

``run_training(argv)`` runs ``fit``/``validate``/``test``/``predict`` through ``lightning_cli.PaperlabCLI`` (imported
when called) and turns jsonargparse's and paperlab's errors into one line with the fix: the closest option
for a misspelt one, the closest class for a class path that imports nothing, the shipped configs when
``--config`` is missing. ``main.py`` and ``sweeps/`` (in-process points, key checks) both call it: it sits on
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


def clean_error(message: str) -> str:
    """jsonargparse's message without the Union-of-None noise (every class argument is Optional)."""
    lines = [ln.strip().lstrip("- ").strip() for ln in str(message).splitlines()]
    kept = [ln for ln in lines if ln and not any(n in ln for n in _NOISE)]
    return "; ".join(dict.fromkeys(kept)).replace(":; ", ": ") or str(message)


def shipped_configs() -> str:
    methods = sorted(p.name for p in (REPO / "configs").iterdir() if p.is_dir() and p.name not in ("trainer", "diagnostics"))
    return f"configs/<method>/ holds one YAML per experiment; methods: {', '.join(methods)}"


def _resolved_keys(argv: list[str]) -> list[str]:
    """Every option the command line takes for these configs: the resolved keys, full and short forms."""
    keep = [a for i, a in enumerate(argv) if a == "--config" or (i and argv[i - 1] == "--config") or i == 0]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run_training([*keep, "--print_config"])
    if rc != 0:
        return []
    import yaml

    full = config_keys(yaml.safe_load(out.getvalue()) or {})
    return sorted(full | {k.replace(".init_args.", ".") for k in full})


def _unknown_options(message: str, argv: list[str]) -> str:
    """``unrecognized arguments: --trainer.max_epcohs 1`` with the closest valid option for each."""
    unknown = [t for t in message.split() if t.startswith("--")]
    if not unknown:
        return message
    known = _resolved_keys(argv)
    hints = []
    for token in unknown:
        key = token[2:].split("=", 1)[0]
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hints.append(f"--{key}" + (f" (did you mean --{close[0]}?)" if close else ""))
    return "unknown option(s): " + ", ".join(hints)


def _class_names(folder: str) -> list[str]:
    """``module.Class`` of every class defined in the project's files under ``folder`` (no imports)."""
    out = []
    for path in sorted((REPO / folder).rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        out += [f"{module}.{name}" for name in re.findall(r"^class (\w+)\(", path.read_text(), re.M)
                if not name.startswith("_")]
    return out


def _unknown_class(message: str) -> str | None:
    """A class path that imports nothing, with the closest project class (for --model, --data)."""
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
    by_class = {n.rsplit(".", 1)[1]: n for n in names}
    close = difflib.get_close_matches(given.rsplit(".", 1)[-1], list(by_class), n=1, cutoff=0.6)
    hint = f"; did you mean {by_class[close[0]]}?" if close else ""
    return f"--{key} {given}: no such class{hint} (a class name or its dotted path, e.g. {names[0] if names else ''})"


def _argument_error(err: Exception, argv: list[str]) -> str:
    message = clean_error(str(err))
    if argv[:1] and argv[0] in TRAINING and "--config" not in argv and "required" in message:
        return f"{argv[0]} needs an experiment config: --config configs/<method>/<experiment>.yaml ({shipped_configs()})"
    if "unrecognized arguments" in message:
        return _unknown_options(message, argv)
    return _unknown_class(message) or message


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
        print(f"error: {_argument_error(err, argv)}", file=sys.stderr)
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
    finally:
        sys.argv = outer_argv
    return 0
