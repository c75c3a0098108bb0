"""The megakernel's lookahead (pto/exec/lookahead.py): what each work item reads before its wait,
found on the host by bounding its loads' offsets, against every offset its loops take; the byte
ranges the kernel prefetches, line by line against the bytes of each region; under the
interpreter the kernel runs the lookahead and changes no bit; on sm_90 it prefetches."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from pto.errors import BuildError, UsageError
from pto.exec.lookahead import BOXES, LINE, item_boxes, line_addresses, look_table
from pto.exec.plan import make_plan
from pto.ir.expr import evaluate
from pto.ir.facts import spanned, tile_shape
from pto.ir.nodes import ForRange
from pto.ir.ops import Op
from pto.machine.target import get as target


def _decode_plan(batch: int = 1, cache: int = 64):
    from pto.orchestration.model.decode import build_step
    from pto.orchestration.model.program import CONFIGS, tiling_for

    from pto.engine import build_module_graph
    from pto.ir.dtypes import DType

    cfg = CONFIGS["tiny"]
    built = build_module_graph(build_step(cfg, DType.F32, target("cuda_h200"), batch, tiling_for(cfg), cache=cache),
                               {"B": batch, "C": cache})
    try:
        return make_plan(built.graph, list(built.graph.tensor_ids), {})
    finally:
        built.graph.close()


def _reads_by_enumeration(fn, pre, env: dict) -> dict[str, tuple[int, int, int, int]]:
    """Per early memref, the box (row lo, row hi, col lo, col hi) of every load of it at every
    value its loops take, one iteration at a time (the oracle: no bounds analysis); a load whose
    offset comes from a loaded value is left out, as the host must."""
    dims = dict(fn.variant)
    tiles = {t.name: t for t in fn.tiles}
    early = {m.name for m, ok in zip(fn.memrefs, pre) if ok and not m.dtype.is_quantized}
    out: dict[str, list] = {}

    def visit(body, env):
        for s in body:
            if isinstance(s, ForRange):
                try:
                    lb, ub, step = (int(evaluate(e, env)) for e in (s.lb, s.ub, s.step))
                except BuildError:  # bounds a loaded value gives: nothing in it is known before
                    continue
                for v in range(lb, ub, step):
                    visit(s.body, {**env, s.var: v})
            elif s.op is Op.LOAD and s.srcs[0] in early:
                rows, cols = tile_shape(spanned(tiles[s.dst], int(s.attr("step"))), dims)
                try:
                    r, c = int(evaluate(s.srcs[1], env)), int(evaluate(s.srcs[2], env))
                except BuildError:  # an offset a loaded value gives (a token's row): not known before
                    continue
                out.setdefault(s.srcs[0], []).append((r, r + rows, c, c + cols))

    visit(fn.body, env)
    return {m: (min(b[0] for b in v), max(b[1] for b in v), min(b[2] for b in v), max(b[3] for b in v))
            for m, v in out.items()}


def test_each_item_s_regions_are_what_its_loads_read_at_every_iteration():
    """The decode step (every InCore function of a model's step): per work item, the boxes the
    host derives by bounding the loads' offsets over the loops are the boxes of every offset the
    loops take, clipped to the task's region, the largest first; a GEMV task's items cover its
    weight matrix once (each row in one item, every column)."""
    from pto.codegen.triton.common import TableLayout

    plan = _decode_plan()
    boxes = item_boxes(plan)
    assert boxes.shape == (plan.n_items, BOXES, 5)
    gemv_rows: dict[tuple[int, int], list] = {}
    seen = 0
    for q, (task, p) in enumerate(plan.items):
        b = plan.branches[plan.task_branch[task]]
        fn = b.fn
        layout = TableLayout(tuple(m.name for m in fn.memrefs), tuple(s.name for s in fn.scalars))
        row = plan.tab[plan.task_row[task]:]
        env = {s.name: int(row[layout.column(s.name)]) for s in fn.scalars}
        region = {}
        for j, m in enumerate(fn.memrefs):
            r0, c0, nr, nc = (int(row[layout.column(m.name, f)]) for f in TableLayout.FIELDS)
            env[f"{m.name}.rows"], env[f"{m.name}.cols"] = nr, nc
            region[m.name] = (int(plan.task_tensor[task, j]), r0, c0, nr, nc)
        if fn.parallel is not None:
            env[fn.parallel.var] = int(p)
        want = []
        for m, (rlo, rhi, clo, chi) in _reads_by_enumeration(fn, b.pre, env).items():
            t, r0, c0, nr, nc = region[m]
            rlo, rhi, clo, chi = max(rlo, 0), min(rhi, nr), max(clo, 0), min(chi, nc)
            if rhi > rlo and chi > clo:
                want.append((t, r0 + rlo, rhi - rlo, c0 + clo, chi - clo))
        want.sort(key=lambda x: -x[2] * x[4])
        got = [tuple(int(v) for v in x) for x in boxes[q] if x[2] > 0]
        assert sorted(got) == sorted(want[:BOXES]), (fn.variant_name, int(p))
        assert [g[2] * g[4] for g in got] == sorted((g[2] * g[4] for g in got), reverse=True)
        seen += bool(got)
        if fn.name.startswith("gemv") and got:
            gemv_rows.setdefault((int(task), got[0][0]), []).append(got[0])
    assert seen > plan.n_items // 3  # the GEMVs and the LM head: most of the step's items
    for (task, _), bxs in gemv_rows.items():
        rows = sorted((b[1], b[1] + b[2]) for b in bxs)
        assert all(a[1] == b[0] for a, b in zip(rows, rows[1:])), task  # one item a row, no gap
        assert len({(b[3], b[4]) for b in bxs}) == 1  # every item the whole K


def test_the_prefetched_lines_are_the_lines_of_each_region():
    """A lookahead row's addresses (the kernel's rule, in numpy) touch exactly the 128-byte lines
    of its region's bytes, for rows of any alignment and stride, and never a byte outside the
    region; past the budget an item keeps each region's share, the first bytes of its rows."""
    rng = np.random.default_rng(0)
    base = np.array([4096 * 7 + 32, 1 << 20], np.int64)  # (a base that is not line-aligned)
    stride = np.array([1000, 96], np.int64)  # elements: rows not line-aligned
    size = np.array([2, 4], np.int64)
    for _ in range(200):
        t = int(rng.integers(0, 2))
        rows, cols = int(rng.integers(1, 9)), int(rng.integers(1, stride[t] // 2))
        r0, c0 = int(rng.integers(0, 50)), int(rng.integers(0, stride[t] - cols))
        boxes = np.zeros((1, BOXES, 5), np.int64)
        boxes[0, 0] = (t, r0, rows, c0, cols)
        table = look_table(boxes, base, stride, size, budget=1 << 30)
        got = line_addresses(table[0, :4])
        first = base[t] + (r0 + np.arange(rows)[:, None]) * stride[t] * size[t] + c0 * size[t]
        byte = (first + np.arange(cols * size[t])[None, :]).reshape(-1)
        assert set(got // LINE) == set(byte // LINE)
        assert np.isin(got, byte).all()
        assert not table[0, 4:].any()  # no second region
        small = look_table(boxes, base, stride, size, budget=256)
        part = line_addresses(small[0, :4])
        assert small[0, 1] * small[0, 2] <= max(256, small[0, 2])  # within the budget (a byte a row at least)
        assert np.isin(part, byte).all() and small[0, 0] == table[0, 0]


def test_the_lookahead_is_refused_where_it_cannot_work(monkeypatch):
    """``PTO_MK_LOOKAHEAD`` takes KiB; a queue has no known next item (no lookahead there)."""
    from pto.backends.triton.megakernel import resolve_lookahead
    from pto.codegen.triton.megakernel import render_megakernel

    monkeypatch.setenv("PTO_MK_LOOKAHEAD", "64k")
    with pytest.raises(UsageError, match=r"PTO_MK_LOOKAHEAD='64k': KiB"):
        resolve_lookahead(None, "static")
    monkeypatch.setenv("PTO_MK_LOOKAHEAD", "64")
    assert resolve_lookahead(None, "static") == resolve_lookahead(None, "stream") == 64 * 1024
    assert resolve_lookahead(None, "queue") == 0 and resolve_lookahead(0, "static") == 0
    with pytest.raises(UsageError, match="lookahead of -1 KiB"):
        resolve_lookahead(-1, "static")
    plan = _decode_plan()
    with pytest.raises(ValueError, match="needs ranged dispatch"):
        render_megakernel(plan.branches, dispatch="queue", lookahead=BOXES)


@pytest.mark.interpret
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the Triton interpreter")
def test_the_lookahead_changes_no_bit(monkeypatch):
    """The decode step on the persistent executor with the lookahead (each item's next item's
    weights loaded under the interpreter, prefetched on a GPU) computes the wave executor's bits;
    its table names a region for every GEMV item."""
    from pto.engine import Runner, resolve

    def run(executor):
        job = resolve("model", device="cpu", backend="triton", executor=executor)
        runner = Runner(job, None)
        inputs = job.program.inputs(job.settings, job.program.shape(None), "cpu", seed=3)
        return runner, {k: v.clone() for k, v in runner(inputs).items()}

    rw, want = run("waves")
    rw.close()
    monkeypatch.setenv("PTO_MK_LOOKAHEAD", "64")
    rp, got = run("persistent")
    try:
        kernel = rp.executor.kernels[0]
        assert kernel.lookahead == 64 * 1024 and "_pto_lookahead(" in kernel.rendered.source
        look = kernel.buf["look"].cpu().numpy()
        plan = kernel.plan
        gemv = np.array([plan.branches[plan.task_branch[t]].fn.name.startswith("gemv")
                         for t in plan.items[kernel.order, 0]])
        assert gemv.any() and (look[gemv, 2] > 0).all()
        for k in want:
            assert torch.equal(got[k], want[k]), k
    finally:
        rp.close()


@pytest.mark.slow
def test_the_lookahead_compiles_for_sm90_and_prefetches(tmp_path):
    """The decode step's megakernel with the lookahead compiles for an H100/H200 (no GPU needed),
    and its PTX prefetches into L2 where the kernel without it does not."""
    from pto.codegen.triton.megakernel import render_megakernel
    from tests.sm90 import compile_sm90, megakernel_job

    plan = _decode_plan()
    opts = {"num_warps": 4, "num_stages": 1, "enable_fp_fusion": True}
    jobs = [{**megakernel_job(render_megakernel(plan.branches, dispatch="static", lookahead=k), opts),
             "count": ["prefetch.global.L2"]} for k in (0, BOXES)]
    off, on = compile_sm90(jobs, tmp_path)
    assert off["ok"] and on["ok"], (off.get("error"), on.get("error"))
    assert off["counts"]["prefetch.global.L2"] == 0 < on["counts"]["prefetch.global.L2"]
