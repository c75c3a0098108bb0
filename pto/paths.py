"""Whether the file system takes a write where an output goes, tried rather than asked: the
one-line checks of outputs before any work (the command line's, the drawings', the cache
folder's) all use these. ``os.access`` says yes to root everywhere, and /proc or /sys take
nothing whatever their bits say, so each check makes (and removes) a probe or opens the file."""

from __future__ import annotations

import os
import tempfile


def can_create_in(folder: str | os.PathLike, folder_too: bool = False) -> bool:
    """Whether a file (``folder_too``: a folder) can be made in ``folder``; the probe is removed."""
    try:
        made = (tempfile.mkdtemp if folder_too else tempfile.mkstemp)(dir=folder, prefix=".pto-probe-")
    except OSError:
        return False
    if isinstance(made, tuple):  # mkstemp: (descriptor, path)
        os.close(made[0])
        os.unlink(made[1])
    else:
        os.rmdir(made)
    return True


def opens_for_writing(path: str | os.PathLike) -> bool:
    """Whether an existing file opens for writing (it is neither truncated nor changed)."""
    try:
        os.close(os.open(path, os.O_WRONLY))
    except OSError:
        return False
    return True


def can_write(path: str | os.PathLike) -> bool:
    """Whether the file ``path`` can be written: opened if it exists, else made in its folder."""
    return opens_for_writing(path) if os.path.exists(path) else can_create_in(os.path.dirname(os.path.abspath(path)))


__all__ = ["can_create_in", "opens_for_writing", "can_write"]
