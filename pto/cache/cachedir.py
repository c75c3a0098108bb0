"""Where pto keeps what it builds: ``$PTO_CACHE_DIR``, default ``~/.cache/pto`` (compiled
modules under ``cffi/``, generated orchestration C under ``src/``, Triton kernel sources under
``triton/``, the user's schedule database under ``schedules/``).

:func:`cache_root` is the one definition every user of the cache calls, and it checks the folder:
a value that cannot be a folder pto writes (a file, a path through a file, a read-only folder) is
one :class:`UsageError` naming the variable, not an errno from deep inside a build. The command
line calls it before any work.
"""

from __future__ import annotations

import os
from pathlib import Path

from pto.errors import UsageError
from pto.paths import can_create_in

ENV = "PTO_CACHE_DIR"


def cache_root() -> Path:
    """The cache folder (not created here), checked: see the module docstring."""
    env = os.environ.get(ENV)
    if env:
        root, what = Path(env), f"{ENV}={env}"
        fix = "give a folder pto may create or write, or unset it for ~/.cache/pto"
    else:
        root = Path.home() / ".cache" / "pto"
        what, fix = str(root), f"set {ENV} to a folder pto may write"
    _check(root, what, fix)
    return root


def _check(root: Path, what: str, fix: str) -> None:
    """The folder, or its nearest existing ancestor (pto creates the rest), must be a folder
    that this process may write."""
    existing = root
    while not existing.exists() and not existing.is_symlink() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == root else f" ({existing} is a file)"
        raise UsageError(f"{what}: not a directory{where}; the cache of compiled modules and kernels goes "
                         f"there: {fix}")
    if not can_create_in(existing, folder_too=True):
        raise UsageError(f"{what}: cannot write {existing}; the cache of compiled modules and kernels goes "
                         f"there: {fix}")


__all__ = ["cache_root", "ENV"]
