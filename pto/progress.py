"""Progress bars for long work (tqdm on stderr).

A bar appears only on a terminal, only when the caller asks for one (the command line does,
unless ``--json``), and only once the work has run for a second, so short runs and scripts stay
quiet. Library calls take an optional callback instead and draw nothing themselves.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager


def wanted(json_output: bool) -> bool:
    """The command line's rule: bars on a terminal, never with ``--json``."""
    return not json_output and sys.stderr.isatty()


@contextmanager
def bar(desc: str, enabled: bool, unit: str = "task"):
    """A context giving ``update(done, total)`` (None when disabled)."""
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    pbar = tqdm(desc=desc, unit=unit, file=sys.stderr, delay=1.0, leave=False, dynamic_ncols=True)
    try:
        def update(done: int, total: int) -> None:
            if pbar.total != total:
                pbar.total = total
            pbar.n = done
            pbar.refresh()

        yield update
    finally:
        pbar.close()


def iterate(items, desc: str, enabled: bool, unit: str = "item"):
    """``items``, with a bar when enabled."""
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit, file=sys.stderr, delay=1.0, leave=False, dynamic_ncols=True)


__all__ = ["wanted", "bar", "iterate"]
