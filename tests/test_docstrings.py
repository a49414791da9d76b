"""Every argument of the public API is documented in its NumPy "Parameters" section.

Modelled on python-control's ``control/tests/docstrings_test.py``, stricter: an undocumented
argument fails the test instead of warning. The public API is the names in ``immersion.__all__`` and
in each plugin package's ``__all__`` (a package without one is skipped), plus the modules in
``MODULES`` (their ``__all__``, or without one every public class and function they define),
recursing into public classes: their constructor (documented in the class or ``__init__`` docstring)
and the public methods they define. Every parameter, keyword-only included, must be named in the
"Parameters" section (``name : type``, ``name:`` or ``a, b :`` forms); ``self`` and ``cls`` are
exempt, and so are private arguments (a leading underscore); ``*args`` / ``**kwargs`` must be
documented under that name. A documented parameter the signature does not have fails too (a stale
docstring).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from typing import Any, Callable

import pytest

PACKAGES = [
    "immersion",
    "immersion_fl",
    "immersion_siml",
    "immersion_mpdp",
    "immersion_secagg",
    "immersion_reactor",
    "immersion_examples",
    "immersion.lwe",
]

#: Modules whose contracts plugins and users build on (the federated scheme contract, the option
#: classes, the hook specifications), checked whole although their packages export less.
MODULES = [
    "immersion.plugins.hookspecs",
    "immersion.securesum.round",
    "immersion_fl.hookspecs",
    "immersion_fl.registry",
    "immersion_fl.scheme",
    "immersion_fl.config",
    "immersion_fl.runtime.optimizers",
    "immersion_fl.runtime.engine",
    "immersion_fl.schemes",
    "immersion_fl.schemes.options",
    "immersion_fl.schemes.kit",
    "immersion_fl.cli.options",
    "immersion_fl.cli.run",
    "immersion_mpdp.options",
    "immersion_secagg.options",
]

#: Objects whose missing Parameters entries are tolerated for now (none left). Each must still
#: have a problem (``test_known_gaps_are_still_gaps``),
#: so the list only shrinks.
KNOWN_GAPS: dict[str, set[str]] = {}

_SECTION = re.compile(r"^(?P<title>[A-Z][A-Za-z ]+)\n-{3,}$", re.M)
_ENTRY = re.compile(r"^(?P<names>\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?$")


def parameters_section(doc: str | None) -> set[str] | None:
    """Names listed in the docstring's "Parameters" section (None if it has none).

    Examples
    --------
    >>> sorted(parameters_section('''Sum.
    ...
    ... Parameters
    ... ----------
    ... a, b : float
    ...     Terms.
    ... **kwargs:
    ...     Ignored.
    ...
    ... Returns
    ... -------
    ... float
    ... '''))
    ['**kwargs', 'a', 'b']
    """
    if not doc:
        return None
    text = inspect.cleandoc(doc)
    sections = list(_SECTION.finditer(text))
    for i, match in enumerate(sections):
        if match.group("title").strip() != "Parameters":
            continue
        end = sections[i + 1].start() if i + 1 < len(sections) else len(text)
        names: set[str] = set()
        for line in text[match.end() : end].splitlines():
            if not line.strip() or line[0].isspace():
                continue  # blank or a description line
            entry = _ENTRY.match(line.strip())
            if entry is None:
                names.add(f"<unparsed: {line.strip()}>")
                continue
            names.update(n.strip() for n in entry.group("names").split(","))
        return names
    return None


def _expected(parameter: inspect.Parameter) -> str:
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        return f"*{parameter.name}"
    if parameter.kind is inspect.Parameter.VAR_KEYWORD:
        return f"**{parameter.name}"
    return parameter.name


def check_callable(label: str, func: Callable[..., Any], docs: list[str | None]) -> list[str]:
    """Problems of one function: arguments missing from, or stale in, its Parameters section."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    wanted = [
        _expected(p)
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and not p.name.startswith("_")
    ]
    listed: set[str] | None = None
    for doc in docs:
        found = parameters_section(doc)
        if found is not None:
            listed = (listed or set()) | found
    if listed is None:
        if not wanted:
            return []
        if not any(docs):
            return [f"{label}: no docstring"]
        return [f"{label}: no Parameters section (arguments {', '.join(wanted)})"]
    bare = {name.lstrip("*") for name in listed}
    problems = [
        f"{label}: argument {name!r} not documented"
        for name in wanted
        if name not in listed and not (name.startswith("*") and name.lstrip("*") in bare)
    ]
    known = {name.lstrip("*") for name in wanted}
    problems += [
        f"{label}: documents {name!r}, which is not an argument"
        for name in sorted(listed)
        if name.lstrip("*") not in known
    ]
    return problems


def _constructor_owner(cls: type) -> type | None:
    """The class in ``cls``'s MRO whose ``__init__`` builds it, if it is not a builtin's (a
    ``typing.Protocol`` is never built: it has none)."""
    if getattr(cls, "_is_protocol", False):
        return None
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            return klass if klass.__module__.split(".")[0] != "builtins" else None
    return None


def check_class(label: str, cls: type) -> list[str]:
    """The constructor and the public methods ``cls`` defines itself."""
    problems: list[str] = []
    owner = _constructor_owner(cls)
    if owner is not None:
        init = vars(owner)["__init__"]
        docs = [cls.__doc__, init.__doc__] + ([owner.__doc__] if owner is not cls else [])
        problems += check_callable(label, init, docs)
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if inspect.isfunction(member):
            problems += check_callable(f"{label}.{name}", member, [member.__doc__])
    return problems


def public_names(module: Any) -> list[str]:
    """``module.__all__``, or the public classes and functions ``module`` defines itself."""
    if hasattr(module, "__all__"):
        return [name for name in module.__all__ if not name.startswith("__")]
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", None) == module.__name__
    ]


def public_problems(package: str) -> list[str]:
    """Every documentation problem of ``package``'s public names (:func:`public_names`)."""
    module = importlib.import_module(package)
    problems: list[str] = []
    for name in public_names(module):
        obj = getattr(module, name)
        label = f"{package}.{name}"
        if inspect.isclass(obj):
            problems += check_class(label, obj)
        elif callable(obj):
            problems += check_callable(label, obj, [obj.__doc__])
    return problems


@pytest.mark.parametrize("package", PACKAGES)
def test_public_arguments_are_documented(package: str) -> None:
    module = importlib.import_module(package)
    if not hasattr(module, "__all__"):
        pytest.skip(f"{package} has no __all__ yet")
    known = KNOWN_GAPS.get(package, set())
    problems = [p for p in public_problems(package) if _subject(p) not in known]
    assert not problems, "\n".join(problems)


def _subject(problem: str) -> str:
    return problem.split(":", 1)[0]


@pytest.mark.parametrize("module", MODULES)
def test_contract_module_arguments_are_documented(module: str) -> None:
    known = KNOWN_GAPS.get(module, set())
    problems = [p for p in public_problems(module) if _subject(p) not in known]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("package", sorted(KNOWN_GAPS))
def test_known_gaps_are_still_gaps(package: str) -> None:
    fixed = KNOWN_GAPS[package] - {_subject(p) for p in public_problems(package)}
    assert not fixed, f"documented now, remove from KNOWN_GAPS: {sorted(fixed)}"


def _sample(a: int, b: float, *rest: int, scale: float = 1.0, **extra: Any) -> None:
    """A function with every kind of argument.

    Parameters
    ----------
    a, b:
        Positional.
    scale : float
        Keyword-only.
    """


def _documented(a: int, *rest: int, scale: float = 1.0, _private: int = 0, **extra: Any) -> None:
    """Every kind of argument, documented in the accepted forms.

    Parameters
    ----------
    a:
        Positional.
    *rest : int
        Variadic.
    scale : float
        Keyword-only.
    **extra
        Keywords.
    """


@dataclasses.dataclass
class _Point:
    """A point.

    Parameters
    ----------
    x : float
        Abscissa.
    z : float
        Not a field.
    """

    x: float
    y: float

    def moved(self, dx: float) -> _Point:
        """The point moved by ``dx``."""
        return _Point(self.x + dx, self.y)

    def norm(self) -> float:
        """Distance to the origin.

        Parameters
        ----------
        p : float
            Left over from an older signature.
        """
        return float((self.x**2 + self.y**2) ** 0.5)


def test_checker_flags_undocumented_and_stale_arguments() -> None:
    assert check_callable("_documented", _documented, [_documented.__doc__]) == []
    assert check_callable("_sample", _sample, [_sample.__doc__]) == [
        "_sample: argument '*rest' not documented",
        "_sample: argument '**extra' not documented",
    ]
    assert check_class("_Point", _Point) == [
        "_Point: argument 'y' not documented",
        "_Point: documents 'z', which is not an argument",
        "_Point.moved: no Parameters section (arguments dx)",
        "_Point.norm: documents 'p', which is not an argument",
    ]
