"""Every import of the project's own packages resolves, function-level imports included.

A module-level import that breaks fails at once; one inside a function (a lazy import, common
here for optional dependencies and to keep import cycles out) fails only when that code runs,
which may be a slow test or a user's first call. This reads every ``import`` and ``from ...
import`` of ``immersion`` and its plugins in ``sdk/``, ``plugins/``, ``tests/``, ``benchmarks/``
and the demos (relative ones resolved against the file's package) and checks that the module
imports and has each imported name.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {
    "immersion",
    "immersion_fl",
    "immersion_mpdp",
    "immersion_secagg",
    "immersion_siml",
    "immersion_reactor",
    "immersion_examples",
}
FOLDERS = ("sdk", "plugins", "tests", "benchmarks", "control_demos", "fl_demos")


def package_of(path: Path) -> list[str]:
    """The dotted package a file's relative imports start from (``sdk/`` and ``plugins/`` are
    source roots)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("sdk", "plugins"):
        parts = parts[1:]
    return parts[:-1]


def imports_of(path: Path) -> list[tuple[int, str, list[str]]]:
    """``(line, module, names)`` for every import of our packages in ``path``, at any depth."""
    found = []
    package = package_of(path)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [a.name for a in node.names if a.name != "*"]
            found.append((node.lineno, module, names))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
    return [(line, m, names) for line, m, names in found if m.split(".")[0] in OURS]


def problem(module: str, names: list[str]) -> str | None:
    """Why ``from module import names`` fails, or None."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as error:
        return f"no module {error.name!r}"
    missing = []
    for name in names:
        if hasattr(loaded, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ModuleNotFoundError:
            missing.append(name)
    return f"{module} has no {', '.join(missing)}" if missing else None


def test_every_import_of_our_packages_resolves():
    files = [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(files) > 200
    broken = []
    for path in files:
        for line, module, names in imports_of(path):
            why = problem(module, names)
            if why:
                broken.append(f"{path.relative_to(ROOT)}:{line}: {why}")
    assert not broken, "\n".join(broken)


def test_the_check_sees_a_broken_lazy_relative_import(tmp_path, monkeypatch):
    """A function-level ``from .secure import ...`` in ``immersion_fl/flower/`` (the module is
    ``immersion_fl.runtime.secure``) is reported."""
    fake = ROOT / "plugins" / "immersion_fl" / "flower" / "engine.py"
    source = "def f():\n    from .secure import SecureRound\n"
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: source)
    (line, module, names), *_ = imports_of(fake)
    assert (line, module, names) == (2, "immersion_fl.flower.secure", ["SecureRound"])
    assert problem(module, names) == "no module 'immersion_fl.flower.secure'"
    assert problem("immersion_fl.runtime.secure", names) is None
    with pytest.raises(ValueError):
        package_of(tmp_path / "elsewhere.py")
