"""Generated Triton kernels compiled for sm_90 (an H100/H200) without a GPU, for the SASS tools
(bench/qgemv_sass.py, bench/megakernel_sass.py): each job's ``@triton.jit`` function compiled by
another interpreter's Triton (the GPU machine's version) in a subprocess, its cubin read back with
Triton's bundled ``cuobjdump`` (SASS and resource usage)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

DRIVER = r"""
import importlib.util, json, os, subprocess, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import triton

bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
out = []
for job in json.load(open(sys.argv[1])):
    spec = importlib.util.spec_from_file_location("k", job["path"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sig = job["signature"]
    attrs = {(a,): [["tt.divisibility", 16]] for a, t in enumerate(sig.values()) if t != "constexpr"}
    try:
        src = ASTSource(getattr(mod, job["name"]), sig, constexprs=job["constexprs"], attrs=attrs)
        cc = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=job["options"])
    except Exception as e:
        out.append({"tag": job["tag"], "error": f"{type(e).__name__}: {e}"[:2000]})
        continue
    cubin = job["path"] + ".cubin"
    open(cubin, "wb").write(cc.asm["cubin"])
    run = lambda *a: subprocess.run([os.path.join(bindir, "cuobjdump"), *a, cubin], capture_output=True,
                                    text=True).stdout
    out.append({"tag": job["tag"], "sass": run("-sass"), "res": run("-res-usage"), "shared": cc.metadata.shared,
                "triton": triton.__version__})
print(json.dumps(out))
"""


def compile_jobs(jobs: list[dict], folder: Path, python: str, workers: int = 1) -> list[dict]:
    """Every job (``tag``, ``path`` of its source, ``name`` of its function, ``signature``,
    ``constexprs``, compiler ``options``; every non-constexpr argument 16-divisible) compiled by
    ``python``'s Triton for sm_90, ``workers`` processes at once: per job, in order, ``tag``,
    ``sass``, ``res`` (``cuobjdump -res-usage``), ``shared`` and ``triton`` (its version), or
    ``error``. SystemExit where the interpreter cannot compile at all."""
    driver = folder / "driver.py"
    driver.write_text(DRIVER)
    workers = max(1, min(workers, len(jobs)))
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    procs = []
    for w in range(workers):
        (folder / f"jobs{w}.json").write_text(json.dumps(jobs[w::workers]))
        procs.append(subprocess.Popen([python, str(driver), str(folder / f"jobs{w}.json")], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      env={**env, "TRITON_CACHE_DIR": str(folder / f"cache{w}")}))
    got: list = [None] * len(jobs)
    for w, proc in enumerate(procs):
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"the sm_90 compile failed ({python}): {err.strip()[-3000:]}")
        got[w::workers] = json.loads(out.strip().splitlines()[-1])
    return got
