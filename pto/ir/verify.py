"""The verifiers: :func:`verify_module` checks a whole module, every InCore function with
:func:`pto.ir.verify_incore.verify_incore` (a table of per-op rules) and every orchestration
function with :func:`pto.ir.verify_orch.verify_orch` (a table of per-statement rules).

The builders run the same rules as statements are added; the text parser runs
:func:`verify_module` on what it parses. Errors are one-line BuildErrors.
"""

from __future__ import annotations

from pto.errors import BuildError
from pto.ir.nodes import IncoreFunction, Module, OrchFunction
from pto.ir.verify_incore import verify_incore
from pto.ir.verify_orch import verify_orch


def verify_module(m: Module) -> None:
    """Check every function of ``m``, that function names are unique, and that the entry is an
    orchestration function of the module."""
    seen: set[str] = set()
    for f in m.functions:
        if f.name in seen:
            raise BuildError(f"module: two functions are named `{f.name}`")
        seen.add(f.name)
    entry = m.get(m.entry)
    if entry is None:
        raise BuildError(f"module: the entry `{m.entry}` is not a function of the module")
    if not isinstance(entry, OrchFunction):
        raise BuildError(f"module: the entry `{m.entry}` is an InCore function; the entry must be an "
                         "orchestration function")
    for f in m.functions:
        if isinstance(f, IncoreFunction):
            verify_incore(f)
        elif isinstance(f, OrchFunction):
            verify_orch(f, m)
        else:
            raise BuildError(f"module: {type(f).__name__} is not a function")


__all__ = ["verify_module", "verify_incore", "verify_orch"]
