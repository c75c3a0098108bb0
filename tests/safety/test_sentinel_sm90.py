"""The persistent megakernel with the non-finite sentinel compiles for an H100 (sm_90, no GPU
needed: Triton's compiler in a subprocess without the interpreter), for the bf16 LLaMA layer
with the most branches (split attention), and needs no more shared memory than the plain kernel
(so as many programs stay resident)."""

from __future__ import annotations

import pytest

from pto import programs
from pto.backends.triton import TritonBackend
from pto.codegen.triton.megakernel import render_megakernel
from pto.exec.plan import make_plan
from pto.exec.sentinel import declared_infinities
from pto.machine.target import get as target
from pto.runtime.graph import CompiledProgram
from tests.sm90 import compile_sm90, megakernel_job


@pytest.mark.sm90
@pytest.mark.slow
def test_the_sentinel_megakernel_compiles_for_sm90(tmp_path):
    prog = programs.get("llama7b")
    s = prog.settings(device="cuda", config="tiny", dtype="bf16", target=target("cuda_h100"), attention="split")
    graph = CompiledProgram.get(prog.build(s), target=s.target).build_graph(prog.scalars(s, prog.shape(300)))
    try:
        plan = make_plan(graph, list(graph.tensor_ids), {}, flags=TritonBackend("cpu").task_flags)
        ignore = declared_infinities(graph.variants)
    finally:
        graph.close()
    opts = {"num_warps": 8, "num_stages": 1, "enable_fp_fusion": True}
    jobs = [megakernel_job(render_megakernel(plan.branches, sentinel=sentinel, ignore=ignore), opts, sentinel)
            for sentinel in (False, True)]
    plain, sentinel = compile_sm90(jobs, tmp_path)
    assert plain["ok"] and sentinel["ok"], sentinel.get("error")
    assert sentinel["shared"] <= plain["shared"]
