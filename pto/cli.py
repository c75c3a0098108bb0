"""The ``pto`` command line: info, codegen, run, estimate, visualize.

The contract (DESIGN.md): ``--json`` prints one JSON object on stdout and nothing else there;
every error a user can cause ends with a one-line message on stderr and a non-zero exit, never a
traceback or a hang (set PTO_DEBUG=1 to see the traceback of an internal error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pto.errors import PTOError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(f"{self.prog}: {message}")


def _seq_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--seq {text!r}: expected comma-separated integers") from None
    if not out or any(v <= 0 for v in out):
        raise UsageError(f"--seq {text!r}: sequence lengths must be positive")
    return out


INT32_MAX = 2**31 - 1  # the runtime's limit on tensor dimensions and ids


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {v}")
    if v > INT32_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT32_MAX}, got {v}")
    return v


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**63), got {v}")
    return v


def _writable(path: str | None, what: str) -> None:
    """Fail before any work when an output file cannot be created."""
    if path is None:
        return
    if not path:
        raise UsageError(f"{what}: the path is empty")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{what} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{what} {path}: the folder {parent} is not writable")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pto", description="PTO task-graph runtime and orchestration code generator")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    s = sub.add_parser("info", help="GPU/arch/capability, SRAM, available backends")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("run", help="build and execute a program's task graph")
    _program_args(s)
    s.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    s.add_argument("--backend", default="auto", choices=["auto", "triton", "torch"])
    s.add_argument("--check", action="store_true", help="compare with an independent torch reference")
    s.add_argument("--dump", metavar="FILE", help="write the task graph dump (pto visualize reads it)")
    s.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the execution")
    s.add_argument("--repeat", type=_positive, default=1,
                   help="time N replays (CUDA graph on the GPU) and report the median")
    s.add_argument("--profile", action="store_true", help="print time per InCore function")
    s.add_argument("--seed", type=_seed, default=0)
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("codegen", help="write orchestration .c (and InCore kernel sources)")
    _program_args(s)
    s.add_argument("--out", required=True, metavar="DIR")

    s = sub.add_parser("estimate", help="task counts and runtime memory against sequence length")
    s.add_argument("program")
    s.add_argument("--seq", required=True, help="comma-separated sequence lengths")
    s.add_argument("--config", default="7b", choices=["tiny", "7b"])
    s.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    s.add_argument("--target", default=None)
    s.add_argument("--attention", default="fused", choices=["split", "pair", "fused"])
    s.add_argument("--causal", dest="causal", action="store_true", default=True)
    s.add_argument("--no-causal", dest="causal", action="store_false")
    s.add_argument("--no-adaptive", action="store_true", help="report the non-adaptive graph only")
    s.add_argument("--json", action="store_true")
    s.add_argument("--plot", metavar="FILE.png")

    s = sub.add_parser("visualize", help="draw a task-graph dump (graphviz)")
    s.add_argument("dump")
    s.add_argument("out")
    s.add_argument("--format", choices=["pdf", "svg", "png", "dot"], default=None)
    s.add_argument("--max-nodes", type=_positive, default=2000)
    return p


def _program_args(s):
    s.add_argument("program")
    s.add_argument("--seq", type=_positive, default=None)
    s.add_argument("--config", default="auto", choices=["auto", "tiny", "7b"])
    s.add_argument("--dtype", default="auto", choices=["auto", "bf16", "f16", "f32"])
    s.add_argument("--attention", default="fused", choices=["split", "pair", "fused"])
    s.add_argument("--causal", dest="causal", action="store_true", default=True)
    s.add_argument("--no-causal", dest="causal", action="store_false")
    s.add_argument("--target", default=None, help="SRAM-aware tiling target (default: the device's)")


def _cmd_info(args) -> int:
    from pto.device import device_info, format_info

    info = device_info("auto")
    if args.json:
        print(json.dumps(info.to_json()))
    else:
        print(format_info(info))
    return 0


def _cmd_run(args) -> int:
    from pto.engine import format_summary, run

    _writable(args.dump, "--dump")
    _writable(args.trace, "--trace")
    res = run(args.program, seq=args.seq, config=args.config, device=args.device, backend=args.backend,
              dtype=args.dtype, causal=args.causal, attention=args.attention, target=args.target,
              check=args.check, dump=args.dump, trace=args.trace, seed=args.seed, repeat=args.repeat,
              profile=args.profile)
    if args.json:
        print(json.dumps(res, sort_keys=False))
    else:
        print(format_summary(res))
    return 0


def _cmd_codegen(args) -> int:
    from pto.engine import codegen

    if not args.out:
        raise UsageError("--out: the folder name is empty")
    written = codegen(args.program, args.out, seq=args.seq, config=args.config, dtype=args.dtype,
                      causal=args.causal, attention=args.attention, target=args.target)
    for path in written:
        print(path)
    return 0


def _cmd_estimate(args) -> int:
    seqs = _seq_list(args.seq)
    from pto.estimate import estimate, format_table, plot

    res = estimate(args.program, seqs, config=args.config, dtype=args.dtype, target=args.target,
                   attention=args.attention, causal=args.causal, adaptive=not args.no_adaptive,
                   plot_path=args.plot)
    if args.plot:
        plot(res, args.plot)
    if args.json:
        print(json.dumps(res))
    else:
        print(format_table(res))
    return 0


def _cmd_visualize(args) -> int:
    from pto.viz import visualize

    out = visualize(args.dump, args.out, fmt=args.format, max_nodes=args.max_nodes)
    print(out)
    return 0


COMMANDS = {"info": _cmd_info, "run": _cmd_run, "codegen": _cmd_codegen, "estimate": _cmd_estimate,
            "visualize": _cmd_visualize}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not args.cmd:
            parser.print_help(sys.stderr)
            raise UsageError("pto: a command is required (info, run, codegen, estimate, visualize)")
        return COMMANDS[args.cmd](args)
    except PTOError as e:
        msg = " ".join(str(e).split("\n"))
        print(f"pto: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pto: interrupted", file=sys.stderr)
        return 130
    except (OSError, MemoryError) as e:
        print(f"pto: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # torch's allocation failures (CPU and CUDA) are RuntimeErrors
        if "alloc" not in str(e).lower() and "out of memory" not in str(e).lower():
            if os.environ.get("PTO_DEBUG"):
                raise
            print(f"pto: internal error: {type(e).__name__}: {' '.join(str(e).split())} "
                  "(set PTO_DEBUG=1 for the traceback)", file=sys.stderr)
            return 3
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"pto: error: out of memory ({first}); try a shorter --seq or the tiny config",
              file=sys.stderr)
        return 1
    except Exception as e:  # an internal error: still one line unless debugging
        if os.environ.get("PTO_DEBUG"):
            raise
        print(f"pto: internal error: {type(e).__name__}: {e} (set PTO_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
