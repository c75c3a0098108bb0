"""Plugins: the entry points of a group, the one way pto finds what it does not name.

Three groups: ``pto.programs`` (:mod:`pto.programs`), ``pto.backends`` (:mod:`pto.backends`) and
``pto.generators`` (what answers ``pto generate``, :mod:`pto.generation`). pto's own plugins are
declared in its ``pyproject.toml`` the way any other package declares its own; in a source
checkout (scripts run from the tree, the GPU machine, a tree on ``PYTHONPATH`` beside an install
of another) those declarations are read from the tree's ``pyproject.toml``, so the code that runs
and the plugins it finds come from the same tree. Other distributions' come from their installed
metadata.
"""

from __future__ import annotations

import re
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from pto.errors import UsageError

#: pto's distribution name (its installed entry points are the checkout's, where there is one)
DISTRIBUTION = "pto"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def checkout_entry_points(group: str) -> list[EntryPoint] | None:
    """``group``'s declarations in the pyproject.toml of the source tree this package runs from;
    None when it runs from an installed copy (no pyproject.toml beside the package)."""
    if not _PYPROJECT.is_file():
        return None
    text = _PYPROJECT.read_text()
    if not re.search(r'^name\s*=\s*"pto"\s*$', text, re.M):
        return None  # a pyproject.toml of something else above an installed copy
    section = re.search(rf'^\[project\.entry-points\."{re.escape(group)}"\]\s*$(.*?)(?=^\[|\Z)', text, re.M | re.S)
    if section is None:
        return []
    return [EntryPoint(m.group(1), m.group(2), group)
            for m in re.finditer(r'^\s*([A-Za-z0-9_.-]+)\s*=\s*"([^"]+)"', section.group(1), re.M)]


def _installed(group: str) -> list[EntryPoint]:
    return list(entry_points(group=group))


def group(name: str) -> dict[str, EntryPoint]:
    """The entry points of group ``name`` by name: pto's own (the checkout's where there is one)
    and every other installed distribution's."""
    own = checkout_entry_points(name)
    eps = {}
    for ep in _installed(name):
        dist = getattr(ep, "dist", None)
        if own is not None and dist is not None and dist.name == DISTRIBUTION:
            continue  # the installed copy's declarations may be another tree's
        eps[ep.name] = ep
    eps.update({ep.name: ep for ep in own or ()})
    return eps


def load(group_name: str, name: str, kind: str):
    """The object entry point ``name`` of ``group_name`` names (a UsageError naming the choices
    when there is none; ``kind`` names what the group holds in that message)."""
    eps = group(group_name)
    if name not in eps:
        have = ", ".join(sorted(eps)) or "none: is pto installed (pip install -e .)?"
        raise UsageError(f"unknown {kind} {name!r} (choose from {have})")
    return eps[name].load()


__all__ = ["group", "load", "checkout_entry_points", "DISTRIBUTION"]
