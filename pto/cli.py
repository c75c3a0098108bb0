"""The ``pto`` command line: info, run, graph, codegen, estimate, bench, tune, visualize.

The contract: ``--json`` prints one JSON object on stdout and nothing else there; every error a
user can cause ends with a one-line message on stderr and a non-zero exit, never a traceback or
a hang (set PTO_DEBUG=1 to see the traceback of an internal error). Long work shows a progress
bar on a terminal (never with ``--json``) and a line every 10 s into a log (:mod:`pto.progress`).

The commands that take a PROGRAM add that program's own options (:mod:`pto.program`): the line
is parsed once to find the program, then again with its options, so ``pto run llama7b --help``
lists them and another program's flag is an error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from pto.cli_checks import (
    check_cache,
    check_distinct,
    check_output_dir,
    check_output_file,
    page,
    positive,
    seed,
    seq_list,
    unrecognized,
)
from pto.errors import PTOError, UsageError

PROGRAM_COMMANDS = ("run", "graph", "codegen", "estimate", "bench", "tune")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump; the subcommand's name, never "pto" twice
        raise UsageError(message if self.prog == "pto" else f"{self.prog}: {message}")


# -- the parser ----------------------------------------------------------------------------------


def _program_args(s: argparse.ArgumentParser, cmd: str, program) -> None:
    from pto import programs, target
    from pto.device import DEVICES
    from pto.ir.dtypes import DType

    s.add_argument("program", metavar="PROGRAM", help=f"one of: {', '.join(programs.names())}")
    if cmd in ("estimate", "bench", "tune"):
        s.add_argument("--seq", required=cmd != "tune", default=None, metavar="N,N,...",
                       help="comma-separated sequence lengths" + (" (default: the program's)" if cmd == "tune" else ""))
    else:
        s.add_argument("--seq", type=positive, default=None, metavar="N",
                       help="sequence length (default: the program's)")
    dev_help = "where the program runs" if cmd in ("run", "bench", "tune") else \
        "the device whose defaults apply (config, dtype, target)"
    s.add_argument("--device", default="auto", choices=DEVICES, help=f"{dev_help} (default: auto)")
    configs = list(program.configs) if program is not None else None
    s.add_argument("--config", default="auto", choices=["auto", *configs] if configs else None, metavar=None
                   if configs else "NAME", help="the program's configuration (default: auto, the program's "
                   "default for the device)")
    s.add_argument("--dtype", default="auto", choices=["auto", *(d.short for d in DType)],
                   help="storage dtype (default: auto, bf16 on cuda, f32 on cpu)")
    s.add_argument("--target", default=None, choices=target.names(),
                   help="the machine whose on-chip memory sizes the tiles (default: the device's own)")
    if cmd in ("run", "graph", "codegen", "estimate"):
        s.add_argument("--tp", type=positive, default=1, metavar="N",
                       help="tensor-parallel ranks: the graph of one rank" + (
                           "; one process per rank: torchrun --nproc-per-node N -m pto.cli run ... --tp N"
                           if cmd == "run" else "") + " (default: 1)")
    if program is not None and program.options:
        g = s.add_argument_group(f"options of {program.name}")
        for o in program.options:
            o.add_to(g)


def build_parser(program=None, helps: bool = True) -> argparse.ArgumentParser:
    """The parser; with ``program`` the program commands also take its options."""
    from pto.backends import names as backend_names
    from pto.exec import names as executor_names
    from pto.program import DEFAULTS_RULE

    p = _Parser(prog="pto", description="PTO task-graph runtime and orchestration code generator",
                add_help=helps)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    more = "; `pto COMMAND PROGRAM --help` lists the program's own options"

    s = sub.add_parser("info", help="the device, its target (SRAM, SMs), backends and executors", add_help=helps)
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")

    s = sub.add_parser("run", help="build and execute a program's task graph", add_help=helps,
                       epilog=DEFAULTS_RULE + more)
    _program_args(s, "run", program)
    s.add_argument("--backend", default="auto", choices=["auto", *backend_names()],
                   help="how InCore tasks run (default: auto, triton on a GPU, torch on the CPU)")
    s.add_argument("--executor", default="auto", choices=["auto", *executor_names()],
                   help="how the graph runs (default: auto)")
    s.add_argument("--check", action="store_true", help="compare with an independent torch reference (rel_err)")
    s.add_argument("--dump", metavar="FILE", help="write the task graph dump (pto visualize reads it)")
    s.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the execution")
    s.add_argument("--repeat", type=positive, default=1, metavar="N",
                   help="time N replays (a CUDA graph on the GPU) and report the median")
    s.add_argument("--profile", action="store_true", help="time each InCore function")
    s.add_argument("--seed", type=seed, default=0, help="seed of the random inputs (default: 0)")
    s.add_argument("--inputs", metavar="FILE", help="take the inputs from a safetensors file (every input of the "
                   "program by name, at its shape) instead of seeded random ones")
    s.add_argument("--save", metavar="FILE", help="write the outputs to a safetensors file")
    s.add_argument("--save-inputs", metavar="FILE", help="write the run's inputs (the seeded ones, or those of "
                   "--inputs) to a safetensors file, by name, as --inputs takes them")
    s.add_argument("--sentinel", action="store_true", help="when an output holds NaN or inf, name the task that made "
                   "the first one (exit 1); docs/SAFETY.md")
    s.add_argument("--check-schedule", action="store_true", help="check the execution trace against the graph: every "
                   "task after its predecessors, no conflicting tasks at once")
    s.add_argument("--deterministic", action="store_true", help="the same bits from the waves and persistent "
                   "executors on a GPU (the batched kernels take the persistent kernel's launch settings)")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")

    s = sub.add_parser("graph", help="build a program's task graph as `pto run` does, execute nothing: counts, "
                       "dump, drawing", add_help=helps, epilog=DEFAULTS_RULE + more)
    _program_args(s, "graph", program)
    s.add_argument("--dump", metavar="FILE", help="write the task graph dump (the one `pto run --dump` writes)")
    s.add_argument("--draw", metavar="FILE", help="draw the graph as `pto visualize` does (.pdf, .svg, .png or .dot)")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")

    s = sub.add_parser("codegen", help="write orchestration .c, the runtime, main.c and the Triton kernels",
                       add_help=helps, epilog=DEFAULTS_RULE + more)
    _program_args(s, "codegen", program)
    s.add_argument("--out", required=True, metavar="DIR", help="the folder to write (created if missing; pto's "
                   "earlier output there is replaced whole; another non-empty folder is refused)")
    s.add_argument("--force", action="store_true", help="write into a folder that holds other files: pto's files "
                   "replaced, the others kept")
    s.add_argument("--no-adaptive", action="store_true", help="no binary expansion: base tiles only")

    s = sub.add_parser("estimate", help="task counts and runtime memory against sequence length",
                       add_help=helps, epilog=DEFAULTS_RULE + more)
    _program_args(s, "estimate", program)
    s.add_argument("--no-adaptive", action="store_true", help="report the non-adaptive graph only")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")
    s.add_argument("--plot", metavar="FILE.png", help="draw tasks and memory against length (needs matplotlib)")

    s = sub.add_parser("bench", help="time a program against PyTorch eager and torch.compile (a GPU)",
                       add_help=helps, epilog=DEFAULTS_RULE + more)
    _program_args(s, "bench", program)
    s.add_argument("--backend", default="auto", choices=["auto", *backend_names()],
                   help="how InCore tasks run (default: auto)")
    s.add_argument("--executor", default="auto", metavar="NAME[,NAME]",
                   help=f"executors to time, comma-separated (default: auto; from {', '.join(executor_names())})")
    s.add_argument("--compare", default="eager,compile", metavar="LIST",
                   help="references to time: eager, compile, both or none (default: eager,compile)")
    s.add_argument("--iterations", type=positive, default=20, metavar="N", help="timed runs (default: 20)")
    s.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed runs first (default: 3)")
    s.add_argument("--seed", type=seed, default=0, help="seed of the random inputs (default: 0)")
    s.add_argument("--json", metavar="FILE", help="write the results as JSON")
    s.add_argument("--plot", metavar="FILE.png", help="draw ms against sequence length (needs matplotlib)")

    s = sub.add_parser("tune", help="search each InCore function's launch parameters on the GPU; store the "
                       "winners in the schedule database", add_help=helps, epilog=DEFAULTS_RULE + more)
    _program_args(s, "tune", program)
    s.add_argument("--budget-s", type=float, default=600.0, metavar="S", help="stop after S seconds (default: 600)")
    s.add_argument("--iterations", type=positive, default=10, metavar="N",
                   help="timed runs per candidate (default: 10)")
    s.add_argument("--show", action="store_true", help="print what applies to each variant now, and why; tune nothing")
    s.add_argument("--json", metavar="FILE", help="write every variant's search as JSON")

    s = sub.add_parser("visualize", help="draw a task-graph dump (graphviz)", add_help=helps)
    s.add_argument("dump", help="a dump written by `pto run --dump`")
    s.add_argument("out", help="the drawing to write (its suffix picks the format)")
    s.add_argument("--format", choices=["pdf", "svg", "png", "dot"], default=None,
                   help="output format (default: from the suffix, else pdf)")
    s.add_argument("--max-nodes", type=positive, default=None, metavar="N",
                   help="draw one box per task only for graphs of at most N tasks, and at most N groups in a "
                   "summary (default: per task whenever that fits the page)")
    s.add_argument("--page", type=page, default=None, metavar="WxH",
                   help="the largest page in inches (default: 60x36, about 3 x 3 screens at 100%% zoom)")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``: once without help to find the program, then with its options."""
    from pto import programs

    program = None
    if argv and argv[0] in PROGRAM_COMMANDS:
        # the program: the first registered name after the command (it may follow options), else
        # whatever the generic parser takes for it (an unknown name is reported here)
        known = set(programs.names())
        name = next((a for a in argv[1:] if a in known), None)
        if name is None:
            try:
                name = build_parser(helps=False).parse_known_args(argv)[0].program
            except UsageError:
                if "-h" not in argv and "--help" not in argv:
                    raise
        if name is not None:
            program = programs.get(name)
    parser = build_parser(program)
    args, extra = parser.parse_known_args(argv)
    if extra:
        raise UsageError(unrecognized(extra, parser, args.cmd, program))
    return args


# -- the commands --------------------------------------------------------------------------------


def _job(args):
    from pto.engine import resolve
    from pto.programs import get

    prog = get(args.program)
    options = {o.name: getattr(args, o.name) for o in prog.options}
    return resolve(args.program, device=args.device, backend=getattr(args, "backend", "auto"),
                   executor=getattr(args, "executor", "auto"), config=args.config, dtype=args.dtype,
                   target=args.target, options=options, tp=getattr(args, "tp", 1))


def _cmd_info(args) -> int:
    from pto.device import format_info, info

    d = info("auto")
    print(json.dumps(d) if args.json else format_info(d))
    return 0


def _cmd_run(args) -> int:
    from pto.engine import format_summary, run
    from pto.progress import reporter

    check_output_file(args.dump, "--dump")
    check_output_file(args.trace, "--trace")
    check_output_file(args.save, "--save")
    check_output_file(args.save_inputs, "--save-inputs")
    check_distinct({"--dump": args.dump, "--trace": args.trace, "--save": args.save, "--save-inputs": args.save_inputs,
                    "--inputs": args.inputs})
    if args.inputs is not None and not os.path.isfile(args.inputs):
        raise UsageError(f"--inputs {args.inputs}: no such file")
    job = _job(args)
    with reporter(f"{job.program.name}: executing", args.json) as progress:
        res = run(job, seq=args.seq, check=args.check, dump=args.dump, trace=args.trace, seed=args.seed,
                  repeat=args.repeat, profile=args.profile, progress=progress, sentinel=args.sentinel,
                  inputs=args.inputs, save=args.save, save_inputs=args.save_inputs,
                  check_schedule=args.check_schedule, deterministic=args.deterministic,
                  warn=lambda line: print(f"pto: {line}", file=sys.stderr))
    from pto import dist

    code = 1 if res.get("nonfinite") else 0
    if dist.rank() != 0:  # tensor parallelism: rank 0 reports for all
        dist.shutdown()
        return code
    if "trace" in res:
        from pto.trace import flow_note

        note = flow_note(res["trace"]["flows"], res["trace"]["dependencies"])
        if note:
            print(f"pto: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(res))
    else:
        print(format_summary(res, tuple(o.name for o in job.program.options)))
    dist.shutdown()
    return code


def _cmd_graph(args) -> int:
    from pto.graphcmd import build_only, format_report

    check_output_file(args.dump, "--dump")
    job = _job(args)
    res = build_only(job, args.seq, dump=args.dump, draw=args.draw)
    if "drawing_note" in res:
        print(f"pto graph: note: {res['drawing_note']}", file=sys.stderr)
    print(json.dumps(res) if args.json else format_report(res, tuple(o.name for o in job.program.options)))
    return 0


def _cmd_codegen(args) -> int:
    from pto.emit import check, codegen
    from pto.progress import wanted

    check_output_dir(args.out, "--out")
    check(args.out, args.force)
    job = _job(args)
    for path in codegen(job, args.out, seq=args.seq, adaptive=not args.no_adaptive, progress=wanted(False),
                        force=args.force):
        print(path)
    return 0


def _cmd_estimate(args) -> int:
    from pto.estimate import check_plot_path, check_seqs, estimate, format_table, plot
    from pto.progress import wanted

    seqs = check_seqs(seq_list(args.seq))
    if args.plot:
        check_plot_path(args.plot)
    job = _job(args)
    show = wanted(args.json)
    res = estimate(job.program, seqs, settings=job.settings, adaptive=not args.no_adaptive, progress=show)
    if args.plot:
        baselines = [(b, estimate(job.program, seqs, settings=b.settings, adaptive=not args.no_adaptive))
                     for b in job.program.estimate_baselines(job.settings)]
        plot(res, args.plot, baselines)
        res["plot"] = args.plot
    print(json.dumps(res) if args.json else format_table(res))
    if args.plot and not args.json:
        print(f"wrote the plot {args.plot}")
    return 0


def _cmd_bench(args) -> int:
    from pto.bench import bench, format_table, plot
    from pto.estimate import check_plot_path, check_seqs
    from pto.progress import wanted

    seqs = check_seqs(seq_list(args.seq))
    check_output_file(args.json, "--json")
    if args.plot:
        check_plot_path(args.plot)
    check_distinct({"--json": args.json, "--plot": args.plot})
    if args.device == "auto":
        from pto.device import cuda_available

        if not cuda_available():
            raise UsageError("pto bench times a GPU and none is visible; --device cpu times the torch backend on "
                             "the CPU (small configs)")
    compare = tuple(c for c in args.compare.split(",") if c and c != "none")
    executors = tuple(e for e in args.executor.split(",") if e)
    prog = __import__("pto.programs", fromlist=["get"]).get(args.program)
    res = bench(args.program, seqs, executors=executors or ("auto",), compare=compare, iterations=args.iterations,
                warmup=args.warmup, device=args.device, backend=args.backend, config=args.config, dtype=args.dtype,
                target=args.target, options={o.name: getattr(args, o.name) for o in prog.options}, seed=args.seed,
                progress=wanted(False))
    if args.plot:
        plot(res, args.plot)
        res["plot"] = args.plot
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    print(format_table(res))
    if args.plot:
        print(f"wrote the plot {args.plot}")
    return 0


def _cmd_tune(args) -> int:
    from pto.estimate import check_seqs
    from pto.programs import get
    from pto.progress import wanted
    from pto.tune import refuse_without_gpu, show, tune

    prog = get(args.program)
    seqs = check_seqs(seq_list(args.seq)) if args.seq else [prog.default_seq]
    options = {o.name: getattr(args, o.name) for o in prog.options}
    kw = dict(device=args.device, config=args.config, dtype=args.dtype, target=args.target, options=options)
    if args.show:
        print(show(args.program, seqs, **kw))
        return 0
    refuse_without_gpu(args.device, args.program)
    check_output_file(args.json, "--json")

    def report(label, cand, ms, why):
        if not wanted(False):
            return
        what = "heuristics" if cand is None else cand
        print(f"  {what}: {f'{ms:.3f} ms' if ms is not None else 'rejected: ' + why}", file=sys.stderr)

    res = tune(args.program, seqs, budget_s=args.budget_s, iterations=args.iterations, progress=wanted(False),
               on_measure=report, **kw)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    for r in res["results"]:
        if r["best"] is None:
            print(f"{r['variant']} ({r['tasks']} tasks): nothing faster than today's {r['default_ms']} ms; "
                  f"{r['rejected']} of {r['candidates']} candidates rejected")
            continue
        gain = f" ({r['default_ms'] / r['best_ms']:.2f}x today's)" if r["default_ms"] else ""
        print(f"{r['variant']} ({r['tasks']} tasks): {r['best']} {r['best_ms']} ms{gain}; "
              f"{r['rejected']} of {r['candidates']} candidates rejected")
    print(f"stored in {res['database']}" + ("; interrupted: kept what was measured" if res["interrupted"] else ""))
    return 130 if res["interrupted"] else 0


def _cmd_visualize(args) -> int:
    from pto.viz import PAGE_IN, draw

    d = draw(args.dump, args.out, fmt=args.format, max_nodes=args.max_nodes, page=args.page or PAGE_IN)
    print(d.path)
    if d.note:
        print(f"pto visualize: note: {d.note}", file=sys.stderr)
    return 0


COMMANDS = {"info": _cmd_info, "run": _cmd_run, "graph": _cmd_graph, "codegen": _cmd_codegen,
            "estimate": _cmd_estimate, "bench": _cmd_bench, "tune": _cmd_tune, "visualize": _cmd_visualize}


def _rank_prefix() -> str:
    """``rank R: `` in a torchrun launch of several processes (each failing rank says its line)."""
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
