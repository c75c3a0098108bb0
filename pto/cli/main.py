"""``pto``'s entry point: every error a user can cause is one line on stderr and an exit status."""

from __future__ import annotations

import os
import sys

from pto.cli.checks import check_cache
from pto.cli.commands import COMMANDS
from pto.cli.parser import build_parser, parse
from pto.errors import PTOError, UsageError


def _rank_prefix() -> str:
    """``rank R: `` in a torchrun launch of several processes (each failing rank says its line)."""
    if "WORLD_SIZE" not in os.environ:  # no launch to read (and no torch to import for a typo)
        return ""
    try:
        from pto.dist import environment

        env = environment()
    except PTOError:
        return ""
    return f"rank {env.rank}: " if env is not None and env.world > 1 else ""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse(argv)
        check_cache(args.cmd)
        if not args.cmd:
            build_parser().print_help(sys.stderr)
            raise UsageError(f"pto: a command is required ({', '.join(COMMANDS)})")
        return COMMANDS[args.cmd](args)
    except PTOError as e:
        msg = " ".join(str(e).split("\n"))
        print(f"pto: error: {_rank_prefix()}{msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pto: interrupted", file=sys.stderr)
        return 130
    except (OSError, MemoryError) as e:
        print(f"pto: error: {_rank_prefix()}{' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # torch's allocation failures (CPU and CUDA) are RuntimeErrors
        if "alloc" not in str(e).lower() and "out of memory" not in str(e).lower():
            if os.environ.get("PTO_DEBUG"):
                raise
            print(f"pto: internal error: {_rank_prefix()}{type(e).__name__}: {' '.join(str(e).split())} "
                  "(set PTO_DEBUG=1 for the traceback)", file=sys.stderr)
            return 3
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"pto: error: {_rank_prefix()}out of memory ({first}); try a shorter --seq or a smaller --config",
              file=sys.stderr)
        return 1
    except Exception as e:  # an internal error: still one line unless debugging
        if os.environ.get("PTO_DEBUG"):
            raise
        print(f"pto: internal error: {_rank_prefix()}{type(e).__name__}: {e} (set PTO_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 3

