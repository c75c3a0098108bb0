"""The persistent megakernel with the non-finite sentinel compiles for an H100 (sm_90, no GPU
needed: Triton's compiler in a subprocess without the interpreter), for the bf16 LLaMA layer
with the most branches (split attention), and needs no more shared memory than the plain kernel
(so as many programs stay resident)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pto import programs
from pto.codegen.triton.megakernel import render_megakernel
from pto.exec.persistent import make_plan
from pto.exec.sentinel import declared_infinities
from pto.graph import CompiledProgram
from pto.target import get as target

_DRIVER = r"""
import importlib.util, json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import triton

out = []
for i, job in enumerate(json.load(open(sys.argv[1]))):
    spec = importlib.util.spec_from_file_location(f"mk{i}", job["path"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        src = ASTSource(getattr(mod, job["name"]), job["signature"], constexprs=job["constexprs"])
        cc = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=job["options"])
        out.append({"ok": True, "shared": cc.metadata.shared, "ptx": len(cc.asm["ptx"])})
    except Exception as e:
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
"""

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
        path = tmp_path / f"mk{int(sentinel)}.py"
        path.write_text(k.source)
        sig = {**_POINTERS, **(_SENTINEL if sentinel else {}),
               **dict.fromkeys(("MAXM", "MAX_POLLS", "SUCC_BLOCK", "GPU_CLOCK"), "constexpr")}
        jobs.append({"path": str(path), "name": k.name, "signature": sig,
                     "constexprs": {"MAXM": k.max_memrefs, "MAX_POLLS": 1 << 24, "SUCC_BLOCK": 256, "GPU_CLOCK": True},
                     "options": {"num_warps": 8, "num_stages": 3, "enable_fp_fusion": True}})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    (tmp_path / "driver.py").write_text(_DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "jobs.json")],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        pytest.skip(f"Triton cannot compile for sm_90 here: {proc.stderr.strip().splitlines()[-1:]}")
    plain, sentinel = json.loads(proc.stdout.strip().splitlines()[-1])
    assert plain["ok"] and sentinel["ok"], sentinel.get("error")
    assert sentinel["shared"] <= plain["shared"]
