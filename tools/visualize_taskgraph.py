#!/usr/bin/env python3
"""Draw a task-graph dump: ``python tools/visualize_taskgraph.py DUMP OUT.pdf``.

The seed's usage, kept as a thin wrapper: the work is done by :func:`pto.viz.draw`, exactly as
for ``pto visualize DUMP OUT.pdf``. It prints the path written on stdout and, when the drawing
is not what ``--max-nodes`` asked for, one note on stderr saying why. Errors a user can cause
end with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# run from a checkout without installing: the repository root holds the pto package
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pto.errors import PTOError  # noqa: E402
from pto.viz import FORMATS, PAGE_IN, draw, parse_page  # noqa: E402

PROG = "visualize_taskgraph"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, like every other pto error
        raise PTOError(message)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog=PROG, description="Draw a task-graph dump (written by `pto run --dump`) with graphviz, "
                "readable at 100%% zoom: one box per task when that fits the page, else a summary by "
                "(band of levels, InCore function).")
    p.add_argument("dump", help="the dump file")
    p.add_argument("out", help="output file; its suffix picks the format unless --format is given")
    p.add_argument("--format", choices=FORMATS, default=None)
    p.add_argument("--max-nodes", type=_positive, default=None, metavar="N",
                   help="draw one box per task only for graphs of at most N tasks, and at most N groups "
                   "in a summary (default: no limit; per task whenever that fits the page)")
    p.add_argument("--page", type=parse_page, default=PAGE_IN, metavar="WxH",
                   help=f"largest page in inches (default {PAGE_IN[0]:g}x{PAGE_IN[1]:g})")
    try:
        args = p.parse_args(argv)
        d = draw(args.dump, args.out, fmt=args.format, max_nodes=args.max_nodes, page=args.page)
    except PTOError as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(d.path)
    if d.note:
        print(f"{PROG}: note: {d.note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
