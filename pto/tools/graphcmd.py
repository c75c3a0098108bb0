"""``pto graph``: build a program's task graph the way ``pto run`` does, and execute nothing.

The same pipeline as a run (:func:`pto.engine.build_graph`: the program's module, binary
expansion, the generated orchestration C compiled with the runtime, run for the program's
scalars), so the dump it writes is the dump ``pto run --dump`` writes for the same program and
options; but no tensor is allocated and no executor is made, so a graph whose execution takes an
hour on a CPU is dumped or drawn in seconds. It reports the task and edge counts, the build time
and how long an execution would take by the rough cost model of :mod:`pto.progress`.
"""

from __future__ import annotations

import os
import tempfile

from pto.engine import Job, build_graph, check_memory, module_of
from pto.errors import UsageError
from pto.passes.chains import Chain, find_chains
from pto.passes.fusion import Fusion
from pto.program import Shape
from pto.progress import estimate_run_s


def check_outputs(dump: str | None, draw: str | None) -> None:
    """Refuse, before any work, a drawing graphviz cannot write there (the format from its
    suffix, the folder, ``dot`` installed) or one that is the dump itself."""
    if draw is None:
        return
    from pto.viz import check_output, dot_binary, resolve_format

    if dump is not None and os.path.realpath(dump) == os.path.realpath(draw):
        raise UsageError(f"--dump and --draw are the same file ({draw}): one would overwrite the other")
    check_output(dump or os.devnull, draw)  # without a dump there is no input to overwrite
    if resolve_format(draw, None) != "dot":
        dot_binary()


def build_only(job: Job, shape: Shape | None = None, *, dump: str | None = None, draw: str | None = None,
               max_nodes: int | None = None) -> dict:
    """Build the graph of ``job`` at ``shape`` (the program's defaults when None), write the dump
    (``dump``) and the drawing (``draw``, pdf, svg, png or dot by its suffix, as ``pto
    visualize`` draws it); returns the JSON-able report of ``pto graph --json``."""
    prog, s = job.program, job.settings
    shape = prog.shape(shape)
    check_outputs(dump, draw)
    module = module_of(job, shape)
    check_memory(job, shape, module, check=False, execute=False)
    built = build_graph(job, shape, module=module)
    graph = built.graph
    try:
        out = {k: v for k, v in job.to_json().items() if k != "executor"}
        est = estimate_run_s(job, shape, graph.tasks)
        out.update(**shape.to_json(), shape=shape.to_json(), tasks=graph.tasks, edges=graph.edges,
                   build_ms=round(graph.build_ms, 3),
                   compile_ms=round(built.compile_ms, 1),
                   bytes_per_task=round(float(graph.stats["bytes_per_task"]), 1),
                   exec_estimate_s=None if est is None else round(est, 1),
                   **fusion_json(prog, s, shape, built.module))
        if dump:
            graph.dump(dump)
            out["dump"] = str(dump)
        if draw:
            out.update(_draw(graph, dump, draw, max_nodes, setting_line(out, tuple(o.name for o in prog.options))))
        return out
    finally:
        graph.close()


def fusion_json(prog, s, shape, module) -> dict:
    """What ``--json`` says of fusion: the chains of the module that ran (``fusable``: those
    left to fuse, :func:`find_chains`), and where the program fuses (``--fuse``), what it fused
    and what it refused (:func:`pto.passes.fusion.fuse`)."""
    out: dict = {"fusable": [c.to_json() for c in find_chains(module)]}
    report = prog.fusion(s, shape)
    if report is not None:
        out.update(report.to_json())
    return out


def _draw(graph, dump: str | None, path: str, max_nodes: int | None, title: str) -> dict:
    """Draw the graph through its dump (a temporary one without ``--dump``), titled with the
    program, its shape and settings (never the temporary file's name)."""
    from pto.viz import draw

    with tempfile.TemporaryDirectory(prefix="pto-graph-") as tmp:
        source = dump or os.path.join(tmp, "graph.txt")
        if not dump:
            graph.dump(source)
        d = draw(source, path, max_nodes=max_nodes, title=title)
    return {"drawing": d.path, **({"drawing_note": d.note} if d.note else {})}


def setting_line(res: dict, options: tuple[str, ...] = ()) -> str:
    """The program, its shape and settings in a line: the report's first and the drawing's title."""
    opts = "".join(f" {k}={res[k]}" for k in options if k in res)
    shape = " ".join(f"{k}={v}" for k, v in res["shape"].items())
    return f"{res['program']} {shape} config={res['config']} dtype={res['dtype']} target={res['target']}{opts}"


def format_report(res: dict, options: tuple[str, ...] = ()) -> str:
    """The text ``pto graph`` prints."""
    from pto.progress import human_duration

    lines = [setting_line(res, options),
             f"tasks {res['tasks']:,}  edges {res['edges']:,}  build {res['build_ms']:.2f} ms "
             f"(module and C {res['compile_ms']:.0f} ms); not executed"]
    if res["exec_estimate_s"] is not None:
        about = human_duration(res["exec_estimate_s"], rough=True)
        lines.append(f"executing it would take about {about} on {res['device']} with the {res['backend']} backend "
                     "(a rough estimate)")
    for c in res.get("fusable", ()):
        lines.append(f"fusable: {Chain(**{**c, 'handoffs': tuple(map(tuple, c['handoffs']))}).describe()}")
    for f in res.get("fused", ()):
        lists = {k: tuple(f[k]) for k in ("calls", "on_chip", "removed")}
        lines.append(f"fused: {Fusion(**{**f, **lists}).describe()}")
    if "dump" in res:
        lines.append(f"wrote the dump {res['dump']}")
    if "drawing" in res:
        lines.append(f"wrote the drawing {res['drawing']}")
    return "\n".join(lines)


__all__ = ["build_only", "check_outputs", "format_report", "setting_line"]
