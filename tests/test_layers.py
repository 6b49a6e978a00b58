"""The floors of the tree, enforced: every import of every project file (module level and inside functions)
runs down the floors or stays on its own, and no method imports another method or a DataModule.

Floors from the ground up (``docs/design.md``)::

    errors.py -> tracking/ -> datamodules/ -> modules/ -> callbacks/ -> lightning_cli.py, cli_messages.py
              -> sweeps/ -> main.py

Within ``modules/``: ``base.py`` and ``protocols.py`` are the contract, ``components/`` the shared pieces, every
other file or package a method's room. A method imports the contract, components and its own room; a
component imports the contract and components; the contract imports neither. ``callbacks/`` never imports a
method. A method may import a ``datamodules/`` file only if it defines no DataModule (a task's vocabulary,
say): the data reach a method through the Trainer, never through an import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FLOORS = {"errors": 0, "tracking": 1, "datamodules": 2, "modules": 3, "callbacks": 4, "seed_parallel": 5, "lightning_cli": 5,
          "cli_messages": 5, "sweeps": 6, "main": 7}
CONTRACT = {"base", "protocols"}


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every import in ``path``: ``from a import b`` yields ``a.b`` where ``b`` is a
    submodule, else ``a``; relative imports are resolved against the file's package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            subs = [f"{base}.{a.name}" for a in node.names if _file_of(f"{base}.{a.name}", root) is not None]
            out += [(node.lineno, sub) for sub in subs] or [(node.lineno, base)]
    return out


def _defines_datamodule(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.ClassDef) and any(
        (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "").endswith("DataModule")
        for b in n.bases) for n in ast.walk(tree))


def _room(name: str) -> str | None:
    """The method a ``modules.*`` name belongs to (None for the contract and components)."""
    parts = name.split(".")
    if parts[0] != "modules" or len(parts) < 2 or parts[1] in CONTRACT or parts[1] == "components":
        return None
    return parts[1]


def _file_of(name: str, root: Path) -> Path | None:
    path = root.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def layer_violations(root: Path) -> list[str]:
    """Every import in the tree under ``root`` that breaks a rule: ``file:line imports X: rule``."""
    problems: list[str] = []
    files = [p for top in FLOORS for p in ([root / f"{top}.py"] if (root / f"{top}.py").is_file()
                                          else sorted((root / top).rglob("*.py")))]
    for path in files:
        name = _module_name(path, root)
        floor = FLOORS[name.split(".")[0]]
        where = f"{path.relative_to(root)}"
        for line, target in _imports(path, root):
            top = target.split(".")[0]
            if top not in FLOORS:  # the standard library and third-party packages
                continue
            where_line = f"{where}:{line} imports {target}"
            if FLOORS[top] > floor:
                problems.append(f"{where_line}: runs up the floors ({name.split('.')[0]} is below {top})")
                continue
            own, other = _room(name), _room(target)
            if name.startswith("modules.") and other is not None and other != own:
                kind = "another method" if own else "a method (only methods import their own room)"
                problems.append(f"{where_line}: imports {kind}")
            if name.split(".")[:2] in (["modules", "base"], ["modules", "protocols"]) and target.startswith(
                "modules.components"
            ):
                problems.append(f"{where_line}: the contract (base, protocols) imports no component")
            if name.startswith("callbacks") and other is not None:
                problems.append(f"{where_line}: a diagnostic never imports a method (ask for a protocol)")
            if own is not None and top == "datamodules":
                file = _file_of(target, root)
                if file is not None and _defines_datamodule(file):
                    problems.append(f"{where_line}: a method never imports a DataModule's file")
    return sorted(set(problems))


def test_the_tree_keeps_its_floors() -> None:
    problems = layer_violations(REPO)
    assert not problems, "imports that break the floors (docs/design.md, 'Floors'):\n" + "\n".join(problems)


VIOLATIONS = {
    "tracking/x.py": ("from datamodules.base import PaperlabDataModule", "runs up the floors"),
    "datamodules/x.py": ("import modules.components.pde", "runs up the floors"),
    "modules/alpha.py": ("from modules.beta import f", "imports another method"),
    "modules/components/y.py": ("from modules.alpha import g", "only methods import their own room"),
    "callbacks/z.py": ("from modules.alpha import g", "a diagnostic never imports a method"),
    "modules/gamma/task.py": ("def f():\n    from callbacks.z import Z\n", "runs up the floors"),
    "modules/delta.py": ("from datamodules.data import D", "a method never imports a DataModule's file"),
    "modules/protocols.py": ("from modules.components.y import Y", "the contract (base, protocols)"),
    "sweeps/w.py": ("import main", "runs up the floors"),
}


@pytest.mark.parametrize("file", sorted(VIOLATIONS))
def test_an_injected_violation_is_named(tmp_path: Path, file: str) -> None:
    """The checker on a small tree with one violation: it names the file, the line and the rule."""
    for path, text in {
        "errors.py": "",
        "main.py": "",
        "datamodules/data.py": "class D(PaperlabDataModule):\n    pass\n",
        "datamodules/base.py": "class PaperlabDataModule:\n    pass\n",
        "modules/beta.py": "def f():\n    pass\n",
        "modules/alpha.py": "def g():\n    pass\n",
        "modules/components/pde.py": "",
        "modules/components/y.py": "class Y:\n    pass\n",
        "callbacks/z.py": "class Z:\n    pass\n",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert layer_violations(tmp_path) == []
    source, rule = VIOLATIONS[file]
    target = tmp_path / file
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(("" if not target.exists() else target.read_text()) + "\n" + source + "\n")
    problems = layer_violations(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"{file}:") and rule in problems[0], problems
