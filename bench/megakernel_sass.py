"""The persistent megakernel's registers, spills and instructions, from its SASS (no GPU needed):
a model's decode step planned and rendered as the persistent executor builds it for an H200 (132
multiprocessors, the megakernel settings of each variant's environment), every segment compiled for
sm_90 by Triton's compiler and read back with its bundled ``cuobjdump``.

    python bench/megakernel_sass.py [--config llama3-8b] [--quant q4_k/q6_k] [--batch 1]
        [--cache 1024] [--variants 'base|;after|PTO_MK_AHEAD=after;calls|PTO_MK_CALLS=noinline']
        [--python /tmp/t36/bin/python] [--branches] [--json FILE]

A variant is ``NAME|ENV`` (space-separated ``KEY=VALUE`` settings of the megakernel's environment:
``PTO_MK_AHEAD``, ``PTO_MK_CALLS``, ``PTO_MK_STRIDES``, ``PTO_MK_SPLIT``, ``PTO_PER_SM``,
``PTO_MK_WARPS``, ``PTO_MK_RUNS``, ``PTO_DISPATCH``, ...). ``PTO_PER_SM`` caps the registers as the
executor does (64K a multiprocessor shared by that many programs); without it the kernel is
compiled uncapped (the executor's ``auto`` first compiles so, then makes room for two programs a
multiprocessor where one fits: that second compile is a variant with ``PTO_PER_SM=2``). Per segment:
its branches, warps, the register cap, registers, the stack a thread (spills: local memory), the
local loads and stores in its SASS and those of them in a loop other than the run loop over the
items (``hot``: a GEMV's K loop, a wait's poll: they cost every trip), its calls (branches not
inlined are calls), its SASS instructions, its shared memory (the pipelines lowered to the
segment's share where ``PTO_PER_SM`` asks, by the estimate the executor's fit starts from: the
fit itself compiles on a GPU), and the programs a multiprocessor its registers, warps and shared
memory allow (and which holds them); ``--branches``: each branch of a segment compiled alone too
(a kernel of one branch, the segment's warps, cap and stages), which says which branches set the
kernel's registers.
``--python``: the interpreter whose Triton compiles (the GPU machine's version, 3.6: a scratch venv
with ``triton==3.6.0`` installed will do). Numbers go in docs/PERF.md (issue 45)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sm90_compile import compile_jobs  # noqa: E402

#: the variants measured by default: today's kernel, then each of the register study's changes
#: (docs/PERF.md, "Thirty-seventh session") alone and all together
DEFAULT_VARIANTS = ("base|;after|PTO_MK_AHEAD=after;noinline|PTO_MK_CALLS=noinline;"
                    "constant|PTO_MK_STRIDES=constant;"
                    "all|PTO_MK_AHEAD=after PTO_MK_CALLS=noinline PTO_MK_STRIDES=constant;"
                    "all128|PTO_MK_AHEAD=after PTO_MK_CALLS=noinline PTO_MK_STRIDES=constant PTO_PER_SM=4;"
                    "all168|PTO_MK_AHEAD=after PTO_MK_CALLS=noinline PTO_MK_STRIDES=constant PTO_PER_SM=3;"
                    "all128head|PTO_MK_AHEAD=after PTO_MK_CALLS=noinline PTO_MK_STRIDES=constant PTO_PER_SM=4,2 "
                    "PTO_MK_SPLIT=-2")
#: an H200's multiprocessors (the plan's programs), registers and shared memory a multiprocessor
SMS = 132
REGS = 65536
SRAM = 232448


@contextmanager
def environment(settings: dict[str, str]):
    """The process's environment with ``settings`` for the duration (restored after)."""
    old = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def parse_variants(text: str) -> list[tuple[str, dict[str, str]]]:
    """``NAME|KEY=VALUE ...;...`` as (name, settings) pairs; SystemExit naming a malformed one."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, env = part.partition("|")
        try:
            settings = dict(kv.split("=", 1) for kv in env.split())
        except ValueError:
            raise SystemExit(f"--variants: {part!r} is not NAME|KEY=VALUE ...") from None
        out.append((name.strip(), settings))
    return out


def step_graph(config: str, quant: str, batch: int, cache: int):
    """The decode step's built graph and each tensor's row stride (as the executor's tensors
    have them), planned for the persistent executor on an H200."""
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for_executor
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.data.buffers import tensor_shapes
    from pto.engine import build_module_graph
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg, tg = CONFIGS[config], get("cuda_h200")
    wt = WeightTypes() if quant == "bf16" else WeightTypes.of_spec(quant)
    tiling = for_weights(tiling_for_executor(cfg, "persistent", tg), wt, batch)
    built = build_module_graph(build_step(cfg, DType.BF16, tg, batch, tiling, cache=cache, wtypes=wt),
                               {"B": batch, "C": cache})
    fn = built.module.entry_function
    shapes = tensor_shapes(fn, built.scalars)
    dtypes = {t.name: t.dtype for t in fn.tensors}

    def stride(name: str) -> int:
        s = dtypes[name].storage_shape(*shapes[name])
        return int(np.prod(s[1:])) if len(s) > 1 else 1

    return built.graph, np.array([stride(n) for n in built.graph.tensor_ids], np.int64)


def h200_backend():
    """The Triton backend as a persistent run on an H200 builds it, constructed on the CPU: its
    render options those a compiling backend of compute capability 9.0 takes from the environment."""
    from pto.backends.triton import TritonBackend
    from pto.backends.triton.modes import qgemv_mode, tma_mode

    be = TritonBackend("cpu")
    pdl = os.environ.get("PTO_PDL", "late")
    be.options = replace(be.options, qgemv=qgemv_mode(True), tma=tma_mode((9, 0), True), asm=True,
                         pdl="" if pdl == "off" else "late" if pdl == "auto" else pdl)
    return be


def segment_jobs(graph, strides, tag: str, folder: Path, alone: bool = False) -> list[dict]:
    """The compile jobs of the step's megakernels (one a segment of the split plan; ``alone``: and
    one of each branch of a segment by itself, at the segment's warps) under the current
    environment's settings, planned and rendered as the persistent executor and
    :class:`pto.backends.triton.megakernel.Megakernel` plan and render them on an H200 (the
    pipeline stages before the fit to shared memory, which needs a GPU: a step of quantized
    GEMVs runs one stage, which fits)."""
    from pto.backends.triton.launch import merged
    from pto.backends.triton.megakernel import (
        MegakernelSettings,
        branch_configs,
        branch_stages,
        per_sm_of,
        resolve_ahead,
        resolve_calls,
        resolve_dispatch,
        resolve_poll,
        resolve_prefetch,
        resolve_prefetch_kb,
        resolve_warps,
        run_loop_of,
        runs_share,
    )
    from pto.codegen.triton.megakernel import kernel_signature, render_megakernel
    from pto.exec.item_deps import resolve_deps
    from pto.exec.plan import (
        make_plan,
        resolve_affinity,
        resolve_early,
        resolve_prefetch_rule,
        resolve_runs,
        resolve_strides,
    )
    from pto.exec.segments import split_plan

    be = h200_backend()
    s = be.megakernel_settings(MegakernelSettings())
    names = list(graph.tensor_ids)
    per_variant = graph.tasks_per_variant()
    groups = {fn.name: be.launch_config(fn, per_variant.get(fn, 1)).get("GROUP", 0) for fn in graph.variants}
    plan = make_plan(graph, names, groups, None, programs=SMS, early=resolve_early(s.early), flags=be.task_flags,
                     runs=resolve_runs(s.runs, SMS, runs_share(s.per_sm)), prefetch=resolve_prefetch_rule(s.prefetch),
                     deps=resolve_deps(s.deps), affinity=resolve_affinity(s.affinity),
                     tensor_strides=strides if resolve_strides(s.strides) == "constant" else None)
    _, segments = split_plan(plan, be, s.split, s.stages)
    prefetch = resolve_prefetch(s.prefetch)
    out = []
    for k, seg in enumerate(segments):
        configs = branch_configs(be, seg)
        cfg = merged(configs)
        warps = resolve_warps(s.warps)
        if warps is not None:
            cfg = replace(cfg, num_warps=warps)
        opts = replace(be.options, prefetch_bytes=resolve_prefetch_kb(s.prefetch_kb) * 1024,
                       run_loop=run_loop_of(seg, be.options.run_loop))
        dispatch = resolve_dispatch(s.dispatch)
        per_sm = per_sm_of(s.per_sm, k)
        options = {key: v for key, v in cfg.kwargs().items() if key != "GROUP"}
        if isinstance(per_sm, int) and per_sm > 0:  # (as Megakernel.consts caps them)
            options["maxnreg"] = min(255, REGS // (per_sm * 32 * cfg.num_warps) // 8 * 8)
        limit = SRAM if not isinstance(per_sm, int) else min(SRAM, SRAM // per_sm - 1024)
        kw = {"dispatch": dispatch, "poll": resolve_poll(s.poll), "ahead": resolve_ahead(s.ahead),
              "calls": resolve_calls(s.calls)}
        whole, stages = fitted(seg.branches, opts, kw, branch_stages(seg, configs, SMS, s.stages), limit)
        kernels = [(f"{tag}/{k}", whole, seg.n_items)]
        if alone:
            counts = np.bincount(seg.items[:, 0], minlength=seg.n_tasks)  # (items a task)
            kernels += [(f"{tag}/{k}:{b.fn.variant_name}", render_megakernel([b], opts, stages=stages, **kw),
                         int(counts[seg.task_branch == j].sum())) for j, b in enumerate(seg.branches)]
        for job_tag, kernel, items in kernels:
            branches = kernel.branches
            path = folder / (re.sub(r"\W", "_", job_tag) + ".py")
            path.write_text(kernel.source)
            out.append({"tag": job_tag, "path": str(path), "name": kernel.name, "signature": kernel_signature(),
                        "constexprs": {"MAXM": kernel.max_memrefs, "MAX_POLLS": 1 << 24,
                                       "SUCC_BLOCK": 32 * cfg.num_warps, "GPU_CLOCK": True,
                                       "PREFETCH": 1 if prefetch == "light" else int(prefetch)},
                        "options": options, "branches": len(branches), "items": items,
                        "stages": {v: n for v, n in stages.items() if n > 1}, "share": limit,
                        "functions": sorted({b.fn.name for b in branches})})
    return out


def fitted(branches, opts, kw: dict, stages: dict[str, int], limit: int):
    """The megakernel of ``branches`` (rendered with ``opts`` and the keywords ``kw``) with its
    pipelines lowered from ``stages`` to ``limit`` bytes of shared memory as the executor's fit
    lowers them, but by the estimate (the fit compiles on the GPU; the estimate is within a few
    hundred bytes for the GEMVs, a third short for attention's products): (kernel, stages)."""
    from pto.codegen.triton.megakernel import fit_megakernel, render_megakernel, shared_estimate

    last: dict[str, int] = {}

    def render(st: dict[str, int]):
        last.clear()
        last.update(st)
        return render_megakernel(branches, opts, stages=st, **kw)

    def estimate(kernel) -> int:
        return max((shared_estimate(b.fn, last.get(b.fn.variant_name, 1), b.runs) for b in kernel.branches),
                   default=0)

    kernel, st, _ = fit_megakernel(branches, stages, estimate, limit, render)
    return kernel, st


def facts(job: dict, got: dict) -> dict:
    """The resources and SASS counts of one compiled segment (module docstring)."""
    if "error" in got:
        return {"segment": job["tag"], "error": got["error"]}
    # (the kernel's line: -res-usage lists the device functions of a noinline kernel too)
    res = re.search(r"Function pto_persistent:\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", got["res"])
    ins = [(int(at, 16), op) for at, op in
           re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*[^;]*);", got["sass"])
           if not op.startswith("NOP")]
    ops = [op.split()[0] for _, op in ins]
    # the loops (a backward branch's range); the widest is the run loop over the items: a local
    # access whose innermost loop is another (a GEMV's K loop, a wait's poll) costs every trip
    loops = sorted(((int(m.group(1), 16), at) for at, op in ins
                    if (m := re.match(r"BRA\s+(?:`\()?0x([0-9a-f]+)", op)) and int(m.group(1), 16) < at),
                   key=lambda r: r[1] - r[0])
    run = loops[-1] if loops else None
    hot = sum(1 for at, op in ins if op.startswith(("LDL", "STL"))
              and next((lp for lp in loops if lp[0] <= at <= lp[1]), run) != run)
    warps = job["options"]["num_warps"]
    regs = int(res.group(1)) if res else None
    # the programs a multiprocessor holds, by each resource (as the executor counts them)
    by = {"registers": REGS // (regs * 32 * warps) if regs else 0, "threads": 2048 // (32 * warps),
          "shared memory": (SRAM + 1024) // (got["shared"] + 1024) if got["shared"] else 32}
    per_sm = max(1, min(32, *by.values()))
    return {"segment": job["tag"], "functions": job["functions"], "branches": job["branches"], "items": job["items"],
            "warps": warps, "maxnreg": job["options"].get("maxnreg"), "regs": regs,
            "stack": int(res.group(2)) if res else None, "local_loads": sum(o.startswith("LDL") for o in ops),
            "local_stores": sum(o.startswith("STL") for o in ops), "hot_local": hot,
            "calls": sum(o.startswith("CALL") for o in ops), "sass": len(ops), "shared": got["shared"],
            "programs_per_sm": per_sm, "held_by": min(by, key=by.get), "stages": job["stages"],
            # (the estimate fitted the pipelines, the compiled kernel needs more: the executor's
            # fit, which compiles, lowers them further)
            "over_share": got["shared"] > job["share"],
            "triton": got["triton"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="llama3-8b")
    ap.add_argument("--quant", default="q4_k/q6_k", help="the weights' types (bf16, LAYERS/HEAD, e.g. q4_k/q6_k)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cache", type=int, default=1024)
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose Triton compiles")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--branches", action="store_true", help="also compile each branch alone (a kernel of one)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    os.environ.pop("TRITON_INTERPRET", None)
    variants = parse_variants(args.variants)
    graph, strides = step_graph(args.config, args.quant, args.batch, args.cache)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            jobs = []
            for name, settings in variants:
                with environment(settings):
                    for job in segment_jobs(graph, strides, re.sub(r"\W", "_", name), folder, args.branches):
                        jobs.append({**job, "variant": name})
            got = compile_jobs(jobs, folder, args.python, args.workers)
            for job, res in zip(jobs, got):
                row = {"variant": job["variant"], **facts(job, res)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        graph.close()
    head = f"{'variant':<12} {'segment':<36} {'branches':>8} {'warps':>5} {'cap':>4} {'regs':>4} {'stack':>5} " \
           f"{'LDL':>4} {'STL':>4} {'hot':>4} {'calls':>5} {'SASS':>6} {'smem':>6} {'per SM':>6}"
    print(f"\n{args.config} {args.quant}, batch {args.batch}, cache {args.cache}\n{head}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<12} {r['segment'][:36]:<36} {r['error'][:80]}")
            continue
        print(f"{r['variant']:<12} {r['segment'][:36]:<36} {r['branches']:>8} {r['warps']:>5} {r['maxnreg'] or '-':>4} "
              f"{r['regs']:>4} {r['stack']:>5} {r['local_loads']:>4} {r['local_stores']:>4} {r['hot_local']:>4} "
              f"{r['calls']:>5} {r['sass']:>6} {r['shared']:>6} {r['programs_per_sm']:>3} "
              f"({r['held_by']}){' (past its share: the fit lowers more)' if r['over_share'] else ''}")
    if args.json:
        Path(args.json).write_text(json.dumps({"config": args.config, "quant": args.quant, "batch": args.batch,
                                               "cache": args.cache, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
