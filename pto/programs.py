"""The registry of runnable programs: every entry point of the ``pto.programs`` group.

The built-in programs (softmax, bgemm, llama7b) register through pto's own ``pyproject.toml``
the way any other package does (:mod:`pto.program` shows the declaration). An entry point names
a :class:`pto.program.Program` instance or class; it is loaded on first use.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from pto.errors import UsageError
from pto.program import Program

GROUP = "pto.programs"
_LOADED: dict[str, Program] = {}


def _entry_points() -> dict:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


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
