"""No import cycles between the module pairs that had them (issue 15, part 4).

Static: every ``import`` / ``from ... import`` statement counts, lazy ones inside functions too
(a cycle through a function-level import still ties the two modules together); only imports under
``if TYPE_CHECKING:`` are left out (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "sdk" / "immersion", *sorted((ROOT / "plugins").glob("immersion_*"))]

#: Pairs that imported each other (issue 15); each must stay apart.
BROKEN_CYCLES = [
    ("immersion_mpdp.engine", "immersion_mpdp.flower_engine"),
    ("immersion.keys.keys", "immersion.keys.store"),
    ("immersion_fl.engine", "immersion_fl.flower_engine"),
]


def _module_files() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            parts = path.relative_to(package.parent).with_suffix("").parts
            out[".".join(parts).removesuffix(".__init__")] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skip


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of ``modules`` that ``name`` imports at run time (anywhere in the file)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in modules else base)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m in modules and m != name}


@pytest.mark.parametrize("pair", BROKEN_CYCLES, ids=" <-> ".join)
def test_the_pair_does_not_import_both_ways(pair):
    modules = _module_files()
    a, b = pair
    assert a in modules and b in modules
    both = b in imports_of(a, modules[a], modules) and a in imports_of(b, modules[b], modules)
    assert not both, f"{a} and {b} import each other"


def test_the_checker_sees_a_lazy_import_cycle(tmp_path):
    """The checker's own control: a function-level import both ways is a cycle, a TYPE_CHECKING
    one is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from .a import f\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import g\n"
    )
    modules = {"pkg": pkg / "__init__.py", **{f"pkg.{m}": pkg / f"{m}.py" for m in "abc"}}
    assert imports_of("pkg.a", modules["pkg.a"], modules) == {"pkg.b"}
    assert imports_of("pkg.b", modules["pkg.b"], modules) == {"pkg.a"}
    assert imports_of("pkg.c", modules["pkg.c"], modules) == set()


def test_no_plugin_imports_another_plugins_private_helpers():
    """Issue 15: plugins share code through public names (or the core), never ``_private`` ones."""
    bad = []
    for path in (ROOT / "plugins").rglob("*.py"):
        own = path.relative_to(ROOT / "plugins").parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                other = node.module.split(".")[0]
                if other.startswith("immersion_") and other != own:
                    bad += [
                        f"{path.name}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_")
                    ]
    assert not bad


def test_one_secure_sum_module():
    """Key agreement and pair seeds live in ``immersion.securesum`` only, the AES-CTR keystream
    in ``immersion.prg`` (shared with the LWE coding's public vectors)."""
    markers = ("X25519PrivateKey", "modes.CTR(", "HKDF(")
    users = sorted(
        str(p.relative_to(ROOT))
        for p in [*(ROOT / "sdk").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
        if any(m in p.read_text() for m in markers)
    )
    assert users == ["sdk/immersion/prg.py", "sdk/immersion/securesum.py"]
