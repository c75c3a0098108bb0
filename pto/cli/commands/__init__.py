"""One function per ``pto`` command (:mod:`pto.cli`): the parsed arguments in, an exit status out.

What a command does, above the engine, is its module here: ``pto info`` (:mod:`.info`), ``pto
run`` (:mod:`.run`), ``pto codegen`` (:mod:`.codegen`), ``pto estimate`` (:mod:`.estimate`),
``pto graph`` (:mod:`.graph`), ``pto bench`` (:mod:`.bench`), ``pto tune`` (:mod:`.tune`). Each
is imported when its command runs, so that the first parse imports no torch.
"""

from __future__ import annotations

import json
import sys

from pto.cli.checks import check_distinct, check_output_file, value_list
from pto.errors import UsageError


def _job(args):
    from pto.engine import resolve
    from pto.programs import get

    prog = get(args.program)
    options = {o.name: getattr(args, o.name) for o in prog.options}
    return resolve(prog, device=args.device, backend=getattr(args, "backend", "auto"),
                   executor=getattr(args, "executor", "auto"), config=args.config, dtype=args.dtype,
                   target=args.target, options=options, tp=getattr(args, "tp", 1), shape=_given(args, prog))


def _given(args, prog) -> dict[str, int]:
    """The shape parameters given on the command line."""
    return {p.name: getattr(args, p.name) for p in prog.shape_params if getattr(args, p.name, None) is not None}


def _shape(args, prog):
    """The program's :class:`pto.program.Shape` from the flags (its defaults where not given)."""
    return prog.shape(_given(args, prog))


def _sweep(args, prog, required: bool = True) -> list:
    """The shapes of a sweeping command: each value of the swept parameter's list (``--seq
    1024,4096``), the others as given or their defaults."""
    from pto.cli.commands.estimate import check_values

    p = prog.swept
    text = getattr(args, p.name, None)
    values = check_values(value_list(text, p.flag), p.name) if text else [p.default]
    rest = {k: v for k, v in _given(args, prog).items() if k != p.name}
    return [prog.shape({**rest, p.name: v}) for v in values]


def _cmd_info(args) -> int:
    from pto.cli.commands.info import format_info, info

    d = info("auto")
    print(json.dumps(d) if args.json else format_info(d))
    return 0


def _cmd_run(args) -> int:  # its outputs and --inputs were checked as it was parsed (checks.check_outputs)
    from pto.cli.commands.run import RunOptions, run
    from pto.cli.progress import reporter
    from pto.cli.report import format_summary

    job = _job(args)
    with reporter(job.program.name, args.json, unit=None) as progress:
        opts = RunOptions(check=args.check, dump=args.dump, trace=args.trace, seed=args.seed, repeat=args.repeat,
                          profile=args.profile, progress=progress, phase=None if progress is None else progress.phase,
                          sentinel=args.sentinel, inputs=args.inputs,
                          save=args.save, save_inputs=args.save_inputs, check_schedule=args.check_schedule,
                          deterministic=args.deterministic, warn=lambda line: print(f"pto: {line}", file=sys.stderr))
        res = run(job, _shape(args, job.program), opts)
    from pto.machine import dist

    code = 1 if res.get("nonfinite") else 0
    if dist.rank() != 0:  # tensor parallelism: rank 0 reports for all
        dist.shutdown()
        return code
    if "trace" in res:
        from pto.exec.trace import flow_note

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
    from pto.cli.commands.graph import build_only, format_report

    job = _job(args)
    res = build_only(job, _shape(args, job.program), dump=args.dump, draw=args.draw)
    if "drawing_note" in res:
        print(f"pto graph: note: {res['drawing_note']}", file=sys.stderr)
    print(json.dumps(res) if args.json else format_report(res, tuple(o.name for o in job.program.options)))
    return 0


def _cmd_codegen(args) -> int:  # --out was checked as it was parsed (checks.check_outputs)
    from pto.cli.commands.codegen import check, codegen
    from pto.cli.progress import wanted

    check(args.out, args.force)
    job = _job(args)
    for path in codegen(job, args.out, _given(args, job.program), adaptive=not args.no_adaptive,
                        progress=wanted(False), force=args.force):
        print(path)
    return 0


def _cmd_estimate(args) -> int:
    from pto.cli.commands.estimate import check_plot_path, estimate, format_table, plot
    from pto.cli.progress import wanted

    job = _job(args)
    shapes = _sweep(args, job.program)
    values = [x[job.program.swept.name] for x in shapes]
    if args.plot:
        check_plot_path(args.plot)
    kw = dict(shape=shapes[0], adaptive=not args.no_adaptive)
    res = estimate(job.program, values, settings=job.settings, progress=wanted(args.json), **kw)
    if args.plot:
        from pto.program import Estimation

        mine = job.program.estimate_baselines(job.settings) if isinstance(job.program, Estimation) else []
        baselines = [(b, estimate(job.program, values, settings=b.settings, **kw)) for b in mine]
        plot(res, args.plot, baselines)
        res["plot"] = args.plot
    print(json.dumps(res) if args.json else format_table(res))
    if args.plot and not args.json:
        print(f"wrote the plot {args.plot}")
    return 0


def _cmd_bench(args) -> int:
    from pto.cli.commands.bench import Timing, bench, format_table, plot
    from pto.cli.commands.estimate import check_plot_path
    from pto.cli.progress import wanted
    from pto.programs import get

    prog = get(args.program)
    shapes = _sweep(args, prog)
    if args.plot:
        check_plot_path(args.plot)
    check_distinct({"--json": args.json, "--plot": args.plot})
    if args.device == "auto":
        from pto.machine.device import cuda_available

        if not cuda_available():
            raise UsageError("pto bench times a GPU and none is visible; --device cpu times it on the CPU "
                             "(small configs)")
    compare = tuple(c for c in args.compare.split(",") if c and c != "none")
    executors = tuple(e for e in args.executor.split(",") if e)
    res = bench(args.program, shapes, executors=executors or ("auto",), compare=compare,
                timing=Timing(args.iterations, args.warmup, args.seed, args.rounds), device=args.device,
                backend=args.backend, config=args.config, dtype=args.dtype, target=args.target,
                options={o.name: getattr(args, o.name) for o in prog.options}, progress=wanted(False))
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
    from pto.cli.commands.tune import Search, refuse_without_gpu, show, tune
    from pto.cli.progress import wanted
    from pto.programs import get

    prog = get(args.program)
    seqs = _sweep(args, prog)
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

    res = tune(args.program, seqs, Search(budget_s=args.budget_s, iterations=args.iterations, progress=wanted(False),
                                         on_measure=report), **kw)
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


def _cmd_generate(args) -> int:
    """``pto generate``: the request (:class:`pto.generation.GenerateRequest`) to the installed
    text generator (:func:`pto.generation.generator`)."""
    from pto.cli.progress import until_output
    from pto.generation import GenerateRequest, generator
    from pto.machine import dist

    answers = generator()
    try:
        with until_output("generate", None if args.json else sys.stdout,
                          "loading the model, compiling its steps (a first run) and reading the prompt") as out:
            res = answers.generate(GenerateRequest.of(args), out)
        rank = dist.rank()
    finally:
        dist.shutdown()
    if rank != 0:  # every rank made the same text: rank 0 prints it
        return 0
    if args.json:
        print(json.dumps(res))
    else:  # the texts went to stdout as they were generated
        print(answers.describe(res), file=sys.stderr)
    return 0


def _cmd_visualize(args) -> int:
    from pto.viz import PAGE_IN, draw

    d = draw(args.dump, args.out, fmt=args.format, max_nodes=args.max_nodes, page=args.page or PAGE_IN)
    print(d.path)
    if d.note:
        print(f"pto visualize: note: {d.note}", file=sys.stderr)
    return 0


COMMANDS = {"generate": _cmd_generate, "info": _cmd_info, "run": _cmd_run, "graph": _cmd_graph, "codegen": _cmd_codegen,
            "estimate": _cmd_estimate, "bench": _cmd_bench, "tune": _cmd_tune, "visualize": _cmd_visualize}


