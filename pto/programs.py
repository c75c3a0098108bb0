"""The registry of runnable programs: every entry point of the ``pto.programs`` group.

The built-in programs (softmax, bgemm, llama7b) register through pto's own ``pyproject.toml``
the way any other package does (:mod:`pto.program` shows the declaration). An entry point names
a :class:`pto.program.Program` instance or class; it is loaded on first use.
"""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from pathlib import Path

from pto.errors import UsageError
from pto.program import Program

GROUP = "pto.programs"
_LOADED: dict[str, Program] = {}


def _checkout_entry_points() -> list[EntryPoint]:
    """pto's own entry points read from the pyproject.toml of a source checkout that is not
    installed (scripts run from the tree, the GPU machine): the same declarations an install
    registers."""
    try:
        distribution("pto")
        return []  # installed: the metadata has them
    except PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if not pyproject.is_file():
        return []
    section = re.search(r'^\[project\.entry-points\."pto\.programs"\]\s*$(.*?)(?=^\[|\Z)', pyproject.read_text(),
                        re.M | re.S)
    if section is None:
        return []
    return [EntryPoint(m.group(1), m.group(2), GROUP)
            for m in re.finditer(r'^\s*([A-Za-z0-9_.-]+)\s*=\s*"([^"]+)"', section.group(1), re.M)]


def _entry_points() -> dict:
    eps = {ep.name: ep for ep in _checkout_entry_points()}
    eps.update({ep.name: ep for ep in entry_points(group=GROUP)})
    return eps


def names() -> list[str]:
    """Registered program names, sorted."""
    return sorted(_entry_points())


def get(name: str) -> Program:
    """The program registered under ``name`` (UsageError naming the choices otherwise)."""
    prog = _LOADED.get(name)
    if prog is not None:
        return prog
    eps = _entry_points()
    if name not in eps:
        have = ", ".join(sorted(eps)) or "none: is pto installed (pip install -e .)?"
        raise UsageError(f"unknown program {name!r} (choose from {have})")
    obj = eps[name].load()
    prog = obj() if isinstance(obj, type) else obj
    if not isinstance(prog, Program):
        raise UsageError(f"program {name!r}: entry point {eps[name].value} is not a pto.program.Program")
    if prog.name != name:
        raise UsageError(f"program {name!r}: entry point {eps[name].value} names itself {prog.name!r}")
    _LOADED[name] = prog
    return prog


__all__ = ["GROUP", "names", "get"]
