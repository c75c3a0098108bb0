"""Compile generated Triton kernels for an H100 (sm_90) without a GPU: Triton's compiler in a
subprocess without the interpreter (``TRITON_INTERPRET`` is read at import). The tests that check
what the renderers emit call :func:`compile_sm90`; where this Triton cannot target sm_90 they
skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

_DRIVER = r"""
import importlib.util, json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import triton

out = []
for i, job in enumerate(json.load(open(sys.argv[1]))):
    spec = importlib.util.spec_from_file_location(f"k{i}", job["path"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sig = job["signature"]
    attrs = {(a,): [["tt.divisibility", 16]] for a, t in enumerate(sig.values()) if t != "constexpr"} \
        if job["aligned"] else {}
    try:
        src = ASTSource(getattr(mod, job["name"]), sig, constexprs=job["constexprs"], attrs=attrs)
        cc = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=job["options"])
        ptx = cc.asm["ptx"]
        out.append({"name": job["name"], "ok": True, "shared": cc.metadata.shared, "ptx": ptx[-200000:],
                    "counts": {text: ptx.count(text) for text in job.get("count", [])}})
    except Exception as e:
        out.append({"name": job["name"], "ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
"""


def compile_sm90(jobs: list[dict], tmp_path: Path, timeout: int = 900) -> list[dict]:
    """Compile each job (``source``, ``name`` of its @triton.jit function, ``signature``,
    ``constexprs``, compiler ``options``, ``aligned``: every non-constexpr argument 16-divisible)
    for sm_90 (``count``, optional: strings to count in the whole PTX); one result per job:
    ``name``, ``ok``, ``shared`` (bytes), the PTX's tail and ``counts`` (of each string), or
    ``error``. The jobs are shared among a compiler process a CPU (a few rows' GEMV takes
    minutes to compile)."""
    spec = []
    for i, job in enumerate(jobs):
        path = tmp_path / f"k{i}_{job['name']}.py"
        path.write_text(job["source"])
        spec.append({"path": str(path), "aligned": False, **{k: v for k, v in job.items() if k != "source"}})
    (tmp_path / "driver.py").write_text(_DRIVER)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = max(1, min(len(spec), cpus))
    procs = []
    for w in range(workers):
        (tmp_path / f"jobs{w}.json").write_text(json.dumps(spec[w::workers]))
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_CACHE_DIR"] = str(tmp_path / f"triton-cache{w}")
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / f"jobs{w}.json")],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                pytest.skip(f"Triton cannot compile for sm_90 here: {err.strip().splitlines()[-1:]}")
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = [None] * len(spec)
    for w, out in enumerate(outs):
        results[w::workers] = out
    return results


def megakernel_job(kernel, options: dict, sentinel: bool = False, prefetch: int = 0, inline: bool = False) -> dict:
    """A :func:`compile_sm90` job for a rendered persistent megakernel with launch ``options``
    (``prefetch``: its L2 prefetch, :class:`pto.backends.triton.MegakernelSettings`; ``inline``:
    rendered with inline items, its ``inl_cnt`` and ``inl_item`` tables)."""
    from pto.codegen.triton.megakernel import kernel_signature

    sig = kernel_signature(sentinel, inline)
    return {"source": kernel.source, "name": kernel.name, "signature": sig,
            "constexprs": {"MAXM": kernel.max_memrefs, "MAX_POLLS": 1 << 24,
                           "SUCC_BLOCK": 32 * options["num_warps"], "GPU_CLOCK": True, "PREFETCH": prefetch},
            "options": options}


def kernel_jobs(functions, options=None, paths: tuple[bool, ...] = (False, True)) -> list[dict]:
    """Compile jobs (:func:`compile_sm90`) of the batched kernels of InCore ``functions`` (each
    rendered once, with ``options``), every one on each of ``paths``: the masked (False) and the
    mask-free (True) path."""
    from pto.codegen.triton import render
    from pto.ir.analysis import specialize

    jobs, seen = [], set()
    for fn in functions:
        kern = render(specialize(fn), options)
        if kern.digest in seen:
            continue
        seen.add(kern.digest)
        for even in paths:
            flags = {f"{w}_{p.name}": even for w in ("EVEN", "ALIGN") for p in kern.fn.memrefs}
            jobs.append({"source": kern.source, "name": kern.name, "signature": kern.signature(), "aligned": True,
                         "constexprs": {**flags, **{k: v for k, v in kern.launch.items() if k.isupper()}},
                         "options": {k: v for k, v in kern.launch.items() if not k.isupper()}})
    return jobs
