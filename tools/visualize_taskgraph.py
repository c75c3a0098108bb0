#!/usr/bin/env python3
"""Draw a task-graph dump: ``python tools/visualize_taskgraph.py DUMP OUT.pdf``.

The seed's usage, kept as a thin wrapper: the work is done by :func:`pto.viz.visualize`, exactly
as for ``pto visualize DUMP OUT.pdf``. Errors a user can cause end with one line on stderr and
exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# run from a checkout without installing: the repository root holds the pto package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pto.errors import PTOError  # noqa: E402
from pto.viz import FORMATS, visualize  # noqa: E402

PROG = "visualize_taskgraph"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other pto error
        raise PTOError(message)


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog=PROG, description="Draw a task-graph dump (written by `pto run --dump`) with graphviz.")
    p.add_argument("dump", help="the dump file")
    p.add_argument("out", help="output file; its suffix picks the format unless --format is given")
    p.add_argument("--format", choices=FORMATS, default=None)
    p.add_argument("--max-nodes", type=int, default=2000,
                   help="draw at most this many tasks one by one; summarize larger graphs (default 2000)")
    try:
        args = p.parse_args(argv)
        print(visualize(args.dump, args.out, fmt=args.format, max_nodes=args.max_nodes))
    except PTOError as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
