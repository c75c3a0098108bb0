"""``pto``'s entry point: every error a user can cause is one line on stderr and an exit status;
Ctrl-C, at any moment, ends the command with ``pto: interrupted`` and 130."""

from __future__ import annotations

import os
import signal
import sys
import threading

from pto.cli.checks import check_cache
from pto.cli.commands import COMMANDS
from pto.cli.parser import build_parser, parse
from pto.errors import PTOError, UsageError


def _rank_prefix() -> str:
    """``rank R: `` in a torchrun launch of several processes (each failing rank says its line)."""
    if "WORLD_SIZE" not in os.environ:  # no launch to read (and no torch to import for a typo)
        return ""
    try:
        from pto.machine.dist import environment

        env = environment()
    except PTOError:
        return ""
    return f"rank {env.rank}: " if env is not None and env.world > 1 else ""


class _Interrupts:
    """SIGINT raises KeyboardInterrupt (as Python's own handler does) and is remembered, so that
    an interrupt swallowed on its way up (raised inside a finalizer, whose exceptions Python only
    prints) still ends the command with 130. Installed first thing in :func:`main`, so that every
    import, compile and build after it is covered; the handler found is restored at the end. An
    interrupt ignored on entry (a background job of a shell without job control) stays ignored,
    as in any program; handlers belong to the main thread."""

    def __init__(self):
        self.seen = False
        self.before = None
        if threading.current_thread() is threading.main_thread():
            before = signal.getsignal(signal.SIGINT)
            if before is not signal.SIG_IGN:
                self.before = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self.before is not None:
            signal.signal(signal.SIGINT, self.before)


def main(argv: list[str] | None = None) -> int:
    interrupts = _Interrupts()
    try:
        code = _main(argv)
    finally:
        interrupts.restore()
    if interrupts.seen and code != 130:  # interrupted, though something swallowed it
        print("pto: interrupted", file=sys.stderr)
        return 130
    return code


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse(argv)
        check_cache(args.cmd)
        if not args.cmd:
            build_parser().print_help(sys.stderr)
            raise UsageError(f"a command is required ({', '.join(COMMANDS)})")
        return COMMANDS[args.cmd](args)
    except PTOError as e:
        msg = " ".join(str(e).split("\n"))
        print(f"pto: error: {_rank_prefix()}{msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pto: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:  # a package pto needs, missing from this environment
        missing = (e.name or "").split(".")[0]
        if os.environ.get("PTO_DEBUG"):
            raise
        if missing and missing != "pto":  # (every package pto imports installs under its own name)
            print(f"pto: error: {_rank_prefix()}the module `{e.name}`, which pto imports, is not installed in this "
                  f"environment: pip install {missing}, or reinstall pto (pip install -e .) for the versions of all "
                  "of its dependencies", file=sys.stderr)
            return 1
        print(f"pto: internal error: {_rank_prefix()}{type(e).__name__}: {e} (set PTO_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 3
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

