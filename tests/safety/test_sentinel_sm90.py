"""The persistent megakernel with the non-finite sentinel compiles for an H100 (sm_90, no GPU
needed: Triton's compiler in a subprocess without the interpreter), for the bf16 LLaMA layer
with the most branches (split attention), and needs no more shared memory than the plain kernel
(so as many programs stay resident)."""

from __future__ import annotations

import pytest

from pto import programs
from pto.codegen.triton.megakernel import render_megakernel
from pto.exec.persistent import make_plan
from pto.exec.sentinel import declared_infinities
from pto.graph import CompiledProgram
from pto.target import get as target
from tests.sm90 import compile_sm90

_POINTERS = {"items": "*i32", "n_items": "i32", "nxt": "*i32", "task_branch": "*i32", "task_row": "*i64",
             "tab": "*i32", "task_tensor": "*i32", "ptrs": "*i64", "strides": "*i64", "pending": "*i32",
             "done": "*i32", "nitems": "*i32", "succ_ptr": "*i32", "succ": "*i32", "err": "*i32", "trace": "*i64",
             "clock": "*i32", "tracing": "i32"}
_SENTINEL = {"spend": "*i32", "sread": "*i64", "swrite": "*i64", "stab": "*i32"}


@pytest.mark.slow
def test_the_sentinel_megakernel_compiles_for_sm90(tmp_path):
    prog = programs.get("llama7b")
    s = prog.settings(device="cuda", config="tiny", dtype="bf16", target=target("cuda_h100"), attention="split")
    graph = CompiledProgram.get(prog.build(s), target=s.target).build_graph(prog.scalars(s, 300))
    try:
        plan = make_plan(graph, list(graph.tensor_ids), {})
        ignore = declared_infinities(graph.variants)
    finally:
        graph.close()
    jobs = []
    for sentinel in (False, True):
        k = render_megakernel(plan.branches, sentinel=sentinel, ignore=ignore)
        sig = {**_POINTERS, **(_SENTINEL if sentinel else {}),
               **dict.fromkeys(("MAXM", "MAX_POLLS", "SUCC_BLOCK", "GPU_CLOCK"), "constexpr")}
        jobs.append({"source": k.source, "name": k.name, "signature": sig,
                     "constexprs": {"MAXM": k.max_memrefs, "MAX_POLLS": 1 << 24, "SUCC_BLOCK": 256, "GPU_CLOCK": True},
                     "options": {"num_warps": 8, "num_stages": 3, "enable_fp_fusion": True}})
    plain, sentinel = compile_sm90(jobs, tmp_path)
    assert plain["ok"] and sentinel["ok"], sentinel.get("error")
    assert sentinel["shared"] <= plain["shared"]
