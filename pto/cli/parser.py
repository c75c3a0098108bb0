"""The parser of the ``pto`` command line (:mod:`pto.cli`)."""

from __future__ import annotations

import argparse

from pto.cli.checks import check_outputs, check_tp_options, page, positive, seed, unrecognized, value_list_of
from pto.errors import UsageError

PROGRAM_COMMANDS = ("run", "graph", "codegen", "estimate", "bench", "tune")
#: the commands that sweep the program's first shape parameter (``--seq 1024,4096``)
SWEEPS = ("estimate", "bench", "tune")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump; the subcommand's name, never "pto" twice
        raise UsageError(message if self.prog == "pto" else f"{self.prog}: {message}")


# -- the parser ----------------------------------------------------------------------------------


def _shape_args(s: argparse.ArgumentParser, cmd: str, program) -> None:
    """A flag per shape parameter of the program (``--seq N``); the sweeping commands take a
    list for the first (``--seq 1024,4096``), which estimate and bench require. Without a
    program (``pto run --help``) the generic ``--seq``, whose default is each program's own."""
    from pto.program import Program

    params = program.shape_params if program is not None else Program.shape_params
    # each program's own sizes and defaults (softmax's --seq 100, the model's --cache and --batch)
    own = f"`pto {cmd} PROGRAM --help` gives the program's sizes and defaults"
    for k, p in enumerate(params):
        default = f"default: {p.default}" if program is not None else f"default: the program's own; {own}"
        if cmd in SWEEPS and k == 0:
            need = cmd != "tune"
            required = "required" if program is not None else f"required, or the program's first size; {own}"
            s.add_argument(p.flag, dest=p.name, type=value_list_of(p.flag), required=need and program is not None,
                           default=None, metavar="N,N,...",
                           help=f"{p.help}: comma-separated values ({required if need else default})")
        else:
            s.add_argument(p.flag, dest=p.name, type=positive, default=None, metavar="N",
                           help=f"{p.help} ({default})")


def _program_args(s: argparse.ArgumentParser, cmd: str, program) -> None:
    from pto import programs
    from pto.ir.dtypes import DType
    from pto.machine import target
    from pto.machine.device import DEVICES

    s.add_argument("program", metavar="PROGRAM", help=f"one of: {', '.join(programs.names())}")
    _shape_args(s, cmd, program)
    dev_help = "where the program runs" if cmd in ("run", "bench", "tune") else \
        "the device whose defaults apply (config, dtype, target)"
    s.add_argument("--device", default="auto", choices=DEVICES, help=f"{dev_help} (default: auto)")
    configs = list(program.configs) if program is not None else None
    s.add_argument("--config", default="auto", choices=["auto", *configs] if configs else None, metavar=None
                   if configs else "NAME", help="the program's configuration (default: auto, the program's "
                   "default for the device)")
    s.add_argument("--dtype", default="auto", choices=["auto", *(d.short for d in DType)], metavar="DTYPE",
                   help="storage dtype: auto (bf16 on cuda, f32 on cpu), f32, f16 or bf16 (the quantized "
                   f"{', '.join(d.short for d in DType if d.is_quantized)} store weights only: a program's own "
                   "options say where)")
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
    from pto.version import installed_version

    p = _Parser(prog="pto", description="PTO task-graph runtime and orchestration code generator",
                add_help=helps)
    p.add_argument("--version", action="version", version=f"pto {installed_version()}",
                   help="print pto's version and exit")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    more = "; `pto COMMAND PROGRAM --help` lists the program's own options"
    _add_info(sub, program, helps, more)
    _add_run(sub, program, helps, more)
    _add_graph(sub, program, helps, more)
    _add_codegen(sub, program, helps, more)
    _add_estimate(sub, program, helps, more)
    _add_bench(sub, program, helps, more)
    _add_tune(sub, program, helps, more)
    _add_generate(sub, program, helps, more)
    _add_visualize(sub, program, helps, more)
    return p


def _program_command(sub, name: str, help_text: str, program, helps: bool, more: str) -> argparse.ArgumentParser:
    """A command that takes a program: its parser, with the rule of defaults as its epilog and
    the generic and the program's own flags (:func:`_program_args`)."""
    from pto.program import DEFAULTS_RULE

    s = sub.add_parser(name, help=help_text, add_help=helps, epilog=DEFAULTS_RULE + more)
    _program_args(s, name, program)
    return s


def _add_info(sub, program, helps: bool, more: str) -> None:
    """`pto info`'s flags."""
    s = sub.add_parser("info", help="the device, its target (SRAM, SMs), backends and executors", add_help=helps)
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _add_run(sub, program, helps: bool, more: str) -> None:
    """`pto run`'s flags."""
    from pto.backends import names as backend_names
    from pto.exec import names as executor_names

    s = _program_command(sub, "run", "build and execute a program's task graph", program, helps, more)
    s.add_argument("--backend", default="auto", choices=["auto", *backend_names()],
                   help="how InCore tasks run (default: auto, triton on a GPU, c on the CPU)")
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


def _add_graph(sub, program, helps: bool, more: str) -> None:
    """`pto graph`'s flags."""
    s = _program_command(sub, "graph", "build a program's task graph as `pto run` does, execute nothing: counts, "
                       "dump, drawing", program, helps, more)
    s.add_argument("--dump", metavar="FILE", help="write the task graph dump (the one `pto run --dump` writes)")
    s.add_argument("--draw", metavar="FILE", help="draw the graph as `pto visualize` does (.pdf, .svg, .png or .dot)")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")


def _add_codegen(sub, program, helps: bool, more: str) -> None:
    """`pto codegen`'s flags."""
    s = _program_command(sub, "codegen", "write orchestration .c, the runtime, main.c and the Triton kernels",
                         program, helps, more)
    s.add_argument("--out", required=True, metavar="DIR", help="the folder to write (created if missing; pto's "
                   "earlier output there is replaced whole; another non-empty folder is refused)")
    s.add_argument("--force", action="store_true", help="write into a folder that holds other files: pto's files "
                   "replaced, the others kept")
    s.add_argument("--no-adaptive", action="store_true", help="no binary expansion: base tiles only")


def _add_estimate(sub, program, helps: bool, more: str) -> None:
    """`pto estimate`'s flags."""
    s = _program_command(sub, "estimate", "task counts and runtime memory against sequence length",
                         program, helps, more)
    s.add_argument("--no-adaptive", action="store_true",
                   help="measure the graph without adaptive tiles (Tiles, Edges, Build, Memory, B/task; Tasks and "
                   "No-Opt still show both counts)")
    s.add_argument("--json", action="store_true", help="one JSON object on stdout")
    s.add_argument("--plot", metavar="FILE.png", help="draw tasks and memory against length (needs matplotlib)")


def _add_bench(sub, program, helps: bool, more: str) -> None:
    """`pto bench`'s flags."""
    from pto.backends import names as backend_names
    from pto.exec import names as executor_names

    s = _program_command(sub, "bench", "time a program against PyTorch eager and torch.compile (a GPU)",
                         program, helps, more)
    s.add_argument("--backend", default="auto", choices=["auto", *backend_names()],
                   help="how InCore tasks run (default: auto)")
    s.add_argument("--executor", default="auto", metavar="NAME[,NAME]",
                   help=f"executors to time, comma-separated (default: auto; from {', '.join(executor_names())})")
    s.add_argument("--compare", default="eager,compile", metavar="LIST",
                   help="references to time, comma-separated: eager, compile, or none (default: eager,compile)")
    s.add_argument("--iterations", type=positive, default=20, metavar="N", help="timed runs (default: 20)")
    s.add_argument("--rounds", type=positive, default=1, metavar="R",
                   help="time every method R times in turn, --iterations runs each time, and report the median of "
                   "all its runs: a drift of the GPU's clocks then falls on every method alike (default: 1)")
    s.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed runs first (default: 3)")
    s.add_argument("--seed", type=seed, default=0, help="seed of the random inputs (default: 0)")
    s.add_argument("--json", metavar="FILE", help="write the results as JSON")
    s.add_argument("--plot", metavar="FILE.png", help="draw ms against sequence length (needs matplotlib)")


def _add_tune(sub, program, helps: bool, more: str) -> None:
    """`pto tune`'s flags."""
    s = _program_command(sub, "tune", "search each InCore function's launch parameters on the GPU; store the "
                       "winners in the schedule database", program, helps, more)
    s.add_argument("--budget-s", type=float, default=600.0, metavar="S", help="stop after S seconds (default: 600)")
    s.add_argument("--iterations", type=positive, default=10, metavar="N",
                   help="timed runs per candidate (default: 10)")
    s.add_argument("--show", action="store_true", help="print what applies to each variant now, and why; tune nothing")
    s.add_argument("--json", metavar="FILE", help="write every variant's search as JSON")


def _add_generate(sub, program, helps: bool, more: str) -> None:
    """`pto generate`'s flags: those of :class:`pto.generation.GenerateRequest`, then ``--json``."""
    from pto.exec import names as executor_names
    from pto.generation import flags

    s = sub.add_parser("generate", help="generate text token by token from a checkpoint (GGUF or Hugging Face), "
                       "each step one task graph", add_help=helps)
    converters = {"positive": positive, "int": int, "float": float, "text": None}
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for name, f, default in flags():
        if f.group is not None and f.group not in groups:
            groups[f.group] = s.add_mutually_exclusive_group()
        where = s if f.group is None else groups[f.group]
        flag, kw = "--" + (f.name or name).replace("_", "-"), {"dest": name, "help": f.help}
        if f.kind == "switch":
            where.add_argument(flag, action="store_true", **kw)
        elif f.kind == "repeat":
            where.add_argument(flag, action="append", metavar=f.metavar, **kw)
        else:
            choices = ["auto", *executor_names()] if f.kind == "executor" else f.choices
            where.add_argument(flag, type=converters.get(f.kind), default=default, choices=choices, metavar=f.metavar,
                               **kw)
    s.add_argument("--json", action="store_true", help="one JSON object on stdout (no streaming)")


def _add_visualize(sub, program, helps: bool, more: str) -> None:
    """`pto visualize`'s flags."""
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


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``: first by the generic parser, which knows every command's flags but no
    program's own options and imports neither torch nor a program, so that a typo in them, or an
    output that cannot be written (:func:`check_outputs`), is answered at once; then, a program's
    command, with the program's options."""
    from pto import programs

    program, helping = None, "-h" in argv or "--help" in argv
    if argv and argv[0] in PROGRAM_COMMANDS:
        # the program: the first registered name after the command (it may follow options), else
        # whatever the generic parser takes for it (an unknown name is reported here)
        known = set(programs.names())
        name = next((a for a in argv[1:] if a in known), None)
        try:
            first = build_parser(helps=False).parse_known_args(argv)[0]
        except UsageError:
            if not helping:
                raise
            first = None
        if first is not None and not helping:
            check_outputs(first)
        name = name or (first.program if first is not None else None)
        if name is not None:
            program = programs.get(name)
    parser = build_parser(program)
    args, extra = parser.parse_known_args(argv)
    if extra:
        raise UsageError(unrecognized(extra, parser, args.cmd, program))
    check_tp_options(args, program)
    return args
