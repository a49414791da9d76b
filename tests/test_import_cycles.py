"""No import cycles in the core package and the plugins (issues 13, 15 and 29).

Static: every ``import`` / ``from ... import`` statement counts, lazy ones inside functions too
(a cycle through a function-level import still ties the modules together); only imports under
``if TYPE_CHECKING:`` are left out (they never run). Cycles are looked for through the whole
import graph, not only between two modules: ``a`` importing ``b`` lazily, ``b`` importing ``c``
and ``c`` importing ``a`` is a cycle.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "sdk" / "immersion", *sorted((ROOT / "plugins").glob("immersion_*"))]

#: Pairs that imported each other (issue 15); neither may reach the other and be reached back.
BROKEN_CYCLES = [
    ("immersion_mpdp.engine", "immersion_mpdp.flower_engine"),
    ("immersion.keys.keys", "immersion.keys.store"),
    ("immersion_fl.runtime.engine", "immersion_fl.flower.engine"),
    # through api -> engine (issue 13)
    ("immersion_fl.flower.engine", "immersion_fl.runtime.federation"),
    ("immersion_secagg.core_flower", "immersion_secagg.engine"),  # through users (issue 29)
]

#: Packages in which no module may lie on an import cycle ("immersion": the whole core package,
#: subpackages included; the float/modular factory sits above both variants).
ACYCLIC = [
    "immersion",
    "immersion_fl",
    "immersion_mpdp",
    "immersion_secagg",
    "immersion.keys",
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


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports at run time (:func:`imports_of`)."""
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


@functools.cache
def project_graph() -> dict[str, set[str]]:
    """:func:`import_graph` of every module of ``sdk/`` and ``plugins/`` (read once per run)."""
    return import_graph(_module_files())


def import_path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """A shortest chain of imports from ``start`` to ``goal`` (``[start, ..., goal]``, at least
    one step), or None if ``start`` cannot reach ``goal``."""
    parent: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.get(node, ())):
            if nxt in parent:
                continue
            parent[nxt] = node
            if nxt == goal:
                chain = [goal]
                while chain[-1] != start or len(chain) == 1:
                    chain.append(parent[chain[-1]])
                return chain[::-1]
            queue.append(nxt)
    return None


def cycles_of(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import cycles of ``graph``: its strongly connected components of two or more modules
    (or one module importing itself), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while not component or node not in component:
                component.add(stack.pop())
            if len(component) > 1 or node in graph.get(node, ()):
                out.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_no_import_cycle_in_the_project():
    """Every module of ``sdk/`` and ``plugins/``: no import cycle at all (issue 29; the last one,
    ``immersion_secagg.core_flower`` <-> ``engine``, went when the users moved to
    ``immersion_secagg.users``)."""
    graph = project_graph()
    assert len(graph) > 100
    cycles = cycles_of(graph)
    shown = [" -> ".join(import_path(graph, min(c), min(c)) or [min(c)]) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(shown)


@pytest.mark.parametrize("pair", BROKEN_CYCLES, ids=" <-> ".join)
def test_the_pair_is_not_on_one_cycle(pair):
    graph = project_graph()
    a, b = pair
    assert a in graph and b in graph
    there, back = import_path(graph, a, b), import_path(graph, b, a)
    assert not (there and back), " -> ".join(there + back[1:])


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_module_of_the_package_is_on_an_import_cycle(package):
    graph = project_graph()
    own = [m for m in graph if m == package or m.startswith(package + ".")]
    assert len(own) > 3
    cycles = [" -> ".join(c) for m in sorted(own) if (c := import_path(graph, m, m))]
    assert not cycles


def test_the_user_model_helpers_are_a_leaf_and_still_importable_from_api():
    """``federation`` takes ``check_module`` / ``client_tensors`` from ``user_model``, which
    reaches neither engine nor api; ``immersion_fl.api`` still exports them."""
    graph = project_graph()
    far_modules = (
        "immersion_fl.runtime.engine",
        "immersion_fl.api",
        "immersion_fl.runtime.federation",
    )
    for far in far_modules:
        assert import_path(graph, "immersion_fl.runtime.user_model", far) is None
    pytest.importorskip("torch")
    from immersion_fl import api
    from immersion_fl.runtime import user_model

    assert api.check_module is user_model.check_module
    assert api.client_tensors is user_model.client_tensors


def test_the_checker_sees_a_lazy_import_cycle(tmp_path):
    """The checker's own control: a function-level import both ways is a cycle, a TYPE_CHECKING
    one is not, and a cycle of three through a lazy import is found with its path."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from .a import f\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import g\n"
    )
    (pkg / "d.py").write_text("from . import e\n")
    (pkg / "e.py").write_text("import pkg.f\n")
    (pkg / "f.py").write_text("def h():\n    from .d import x\n")
    modules = {"pkg": pkg / "__init__.py", **{f"pkg.{m}": pkg / f"{m}.py" for m in "abcdef"}}
    assert imports_of("pkg.a", modules["pkg.a"], modules) == {"pkg.b"}
    assert imports_of("pkg.b", modules["pkg.b"], modules) == {"pkg.a"}
    assert imports_of("pkg.c", modules["pkg.c"], modules) == set()
    graph = import_graph(modules)
    assert import_path(graph, "pkg.d", "pkg.d") == ["pkg.d", "pkg.e", "pkg.f", "pkg.d"]
    assert import_path(graph, "pkg.d", "pkg.f") == ["pkg.d", "pkg.e", "pkg.f"]
    assert import_path(graph, "pkg.c", "pkg.c") is None
    assert import_path(graph, "pkg.a", "pkg.e") is None
    assert sorted(map(sorted, cycles_of(graph))) == [
        ["pkg.a", "pkg.b"],
        ["pkg.d", "pkg.e", "pkg.f"],
    ]
    assert cycles_of({"x": {"x"}, "y": {"x"}}) == [{"x"}]


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


def test_plugins_import_only_public_core_modules_and_names():
    """Issue 29: plugins build on the core's public modules and names, never ``immersion._x``
    (the shared helpers are :mod:`immersion.files`, :mod:`immersion.lazy`,
    :mod:`immersion.validation`)."""
    bad = []
    for path in (ROOT / "plugins").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                for name in names
                if name.split(".")[0] == "immersion"
                and any(part.startswith("_") for part in name.split(".")[1:])
            ]
    assert not bad, "\n".join(bad)


def test_one_secure_sum_module():
    """Key agreement and pair seeds live in ``immersion.securesum.protocol`` only, the AES-CTR
    keystream in ``immersion.securesum.prg`` (shared with the LWE coding's public vectors)."""
    markers = ("X25519PrivateKey", "modes.CTR(", "HKDF(")
    users = sorted(
        str(p.relative_to(ROOT))
        for p in [*(ROOT / "sdk").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
        if any(m in p.read_text() for m in markers)
    )
    assert users == ["sdk/immersion/securesum/prg.py", "sdk/immersion/securesum/protocol.py"]
