"""The registry of runnable programs: every entry point of the ``pto.programs`` group
(:mod:`pto.plugins`).

The built-in programs (softmax, bgemm, llama7b, llama, model) register through pto's own
``pyproject.toml`` the way any other package does (:mod:`pto.program` shows the declaration). An
entry point names a :class:`pto.program.Program` instance or class; it is loaded on first use.
"""

from __future__ import annotations

from pto import plugins
from pto.errors import UsageError
from pto.program import Program

GROUP = "pto.programs"
_LOADED: dict[str, Program] = {}


def names() -> list[str]:
    """Registered program names, sorted."""
    return sorted(plugins.group(GROUP))


def get(name: str) -> Program:
    """The program registered under ``name`` (UsageError naming the choices otherwise)."""
    prog = _LOADED.get(name)
    if prog is not None:
        return prog
    obj = plugins.load(GROUP, name, "program")
    prog = obj() if isinstance(obj, type) else obj
    where = plugins.group(GROUP)[name].value
    if not isinstance(prog, Program):
        raise UsageError(f"program {name!r}: entry point {where} is not a pto.program.Program")
    if prog.name != name:
        raise UsageError(f"program {name!r}: entry point {where} names itself {prog.name!r}")
    _LOADED[name] = prog
    return prog


__all__ = ["GROUP", "names", "get"]
