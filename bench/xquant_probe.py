"""What x quantized once a step would save the quantized GEMVs, measured before it is built:
the 8B step's Q4_K gate/up kernel (the norm, gate, up and SwiGLU; 45% of the Q4_K layer) as pto
renders it, against the same kernel with the x work taken out (its ``_pto_dqx16_dot_q4_k``
helpers' rounding and packing of x, and the norm's sum of squares, replaced by loads of x's
packed 16-bit integers, their group scales and sums and the row factor from one buffer, as a
kernel before the GEMV would write them).

    python bench/xquant_probe.py [--sass /tmp/t36/bin/python] [--iters 50] [--json FILE]

On a GPU: both kernels launched alone (one sequence, weights past L2: four copies in turn),
microseconds a call and the fraction of a device copy's bandwidth. ``--sass PYTHON``: instead
compile both for sm_90 with that interpreter's Triton (no GPU) and print bench/qgemv_sass.py's
facts (registers, SASS instructions a weight, barriers, shuffles). The probe's kernel computes
with whatever the buffer holds (its arithmetic is not checked: it measures a design, see
docs/PERF.md); it depends on the rendered text's names and fails loudly when they change.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import qgemv_sass  # noqa: E402  (bench/ is not a package)

#: the x words of the dot helper (the lanes' 16-bit pairs, each [G, 1, 1]) as the renderer names them
_WORDS = ["_v23", "_v24", "_v25", "_v26", "_v30", "_v31", "_v32", "_v33",
          "_v42", "_v43", "_v44", "_v45", "_v49", "_v50", "_v51", "_v52"]


def _split_tree(t: str, n: int, lines: list[str], tag: list[int]) -> list[str]:
    """``t``'s ``n`` minor elements as ``[G, 1, 1]`` tensors, by splits (within the thread)."""
    if n == 1:
        return [t]
    tag[0] += 1
    e, o = f"_e{tag[0]}", f"_o{tag[0]}"
    lines.append(f"    {e}, {o} = tl.split(tl.reshape({t}, (BC // 32, 1, {n // 2}, 2)))")
    a, b = _split_tree(e, n // 2, lines, tag), _split_tree(o, n // 2, lines, tag)
    return [w for pair in zip(a, b) for w in pair]


def _pre_helper(src: str) -> str:
    """``_pre_dot_q4_k``: the rendered ``_pto_dqx16_dot_q4_k`` with x's values ``_v4``-``_v52``
    (rounding, packing, sums) replaced by loads from ``X``: 16 words a group, then the groups'
    scales and sums as f32."""
    m = re.search(r"@triton.jit\ndef _pto_dqx16_dot_q4_k\(.*?\n(?=\n\n@triton.jit)", src, re.S)
    if m is None:
        raise SystemExit("xquant_probe: the rendered kernel has no _pto_dqx16_dot_q4_k helper")
    lines = m.group(0).splitlines()
    head = lines[1].replace("_pto_dqx16_dot_q4_k", "_pre_dot_q4_k").replace(", x, BR", ", X, BR")

    def x_work(line: str) -> bool:
        v = re.match(r"\s+_v(\d+)", line)
        return v is not None and 4 <= int(v.group(1)) <= 52

    body = [line for line in lines[2:] if not x_work(line)]
    first, rest = body[:4], body[4:]
    new = ["    lane = tl.arange(0, 16)[None, None, :]",
           "    xw = tl.load(X + _v1 * 16 + lane) + _v3",
           "    _v7 = tl.load(X.to(tl.pointer_type(tl.float32)) + BC // 2 + _v1)",
           "    _v9 = tl.load(X.to(tl.pointer_type(tl.float32)) + BC // 2 + BC // 32 + _v1)"]
    splits: list[str] = []
    words = _split_tree("xw", 16, splits, [0])
    new += splits + [f"    {name} = {w}" for name, w in zip(_WORDS, words)]
    return "\n".join(["@triton.jit", head, *first, *new, *rest])


def prequantized(src: str) -> str:
    """The gate/up kernel's source with x prequantized (module docstring)."""
    src = src.replace("\n\n@triton.jit\ndef d_", "\n\n" + _pre_helper(src) + "\n\n\n@triton.jit\ndef d_", 1)
    start = src.index("    _r12 = tl.arange(0, 1)[:, None]")
    stop = "    t_ss = tl.math.rsqrt(t_ss)\n"
    end = src.index(stop) + len(stop)
    dots = "".join(f"    t_acc{m} = t_acc{m} + _pre_dot_q4_k(t_b{m}__q, t_b{m}__sc, t_b{m}__m, t_b{m}__d, "
                   f"t_b{m}__dmin, P_w{m}, S_w{m}, _X, 4, 4096)[None, :]\n" for m in ("g", "u"))
    new = ("    t_ss = tl.load(P_x.to(tl.pointer_type(tl.float32)))\n"
           "    _X = P_x.to(tl.pointer_type(tl.int32)) + 16\n" + dots)
    return src[:start] + new + src[end:]


def _jobs(folder: Path) -> list[dict]:
    jobs = qgemv_sass.jobs("q4_k/q6_k", "auto", "default", folder, pdl="late")
    (job,) = [j for j in jobs if j["kernel"] == "gate_up"]
    pre = dict(job, tag=job["tag"] + "|x prequantized", path=str(folder / "pre_gate_up.py"))
    Path(pre["path"]).write_text(prequantized(Path(job["path"]).read_text()))
    return [job, pre]


def sass(python: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        jobs = _jobs(folder)
        (folder / "jobs.json").write_text(json.dumps(jobs))
        (folder / "driver.py").write_text(qgemv_sass._DRIVER)
        run = subprocess.run([python, str(folder / "driver.py"), str(folder / "jobs.json")], capture_output=True,
                             text=True)
        if run.returncode:
            raise SystemExit(f"xquant_probe: the sm_90 compile failed:\n{run.stderr[-2000:]}")
        got = {g["tag"]: g for g in json.loads(run.stdout)}
        return [dict(qgemv_sass.facts(j, got[j["tag"]]), tag=j["tag"]) for j in jobs]


def timed(iters: int) -> list[dict]:
    import torch
    from pto.orchestration.model.program import CONFIGS

    layer = CONFIGS["llama3-8b"].layer
    K, N, bn = layer.hidden, layer.ffn, 4
    row = 148 * K // 256  # a Q4_K row's bytes (repacked planes: 128 + 8 + 8 + 2 + 2 a block of 256)
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    copies = [[torch.randint(0, 256, (N, row), dtype=torch.uint8, device=dev, generator=gen) for _ in range(2)]
              for _ in range(4)]
    x = torch.randn(16 * K, device=dev, generator=gen).to(torch.bfloat16) * 0.01  # (the probe's buffer too)
    y = torch.empty(N, device=dev, dtype=torch.bfloat16)
    g = torch.ones(K, device=dev, dtype=torch.bfloat16)
    tab = torch.tensor([0, 0, 1, K, 0, 0, N, K, 0, 0, N, K, 0, 0, 1, N, 0, 0, 1, K], dtype=torch.int32, device=dev)
    src = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    src.clone()
    end.record()
    torch.cuda.synchronize()
    copy = 2 * src.numel() / (start.elapsed_time(end) * 1e-3)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for job in _jobs(Path(tmp)):
            spec = importlib.util.spec_from_file_location(f"k{len(out)}", job["path"])
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            kern = getattr(mod, job["name"])

            def call(wg, wu, kern=kern, job=job):
                kern[(1, N // bn)](tab, x, K, wg, row, wu, row, y, N, g, K, **job["constexprs"], NB=1, NP=N // bn,
                                   **job["options"])

            for wg, wu in copies:  # compile, warm
                call(wg, wu)
            torch.cuda.synchronize()
            start.record()
            for k in range(iters):
                call(*copies[k % len(copies)])
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1e3 / iters
            out.append({"tag": job["tag"], "us": round(us, 2), "of_copy": round(2 * N * row / (us * 1e-6) / copy, 3)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sass", default=None, metavar="PYTHON", help="compile for sm_90 with this interpreter instead")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = sass(args.sass) if args.sass else timed(args.iters)
    for r in rows:
        print(r["tag"], {k: v for k, v in r.items() if k != "tag" and k in (
            "us", "of_copy", "regs", "local_bytes", "programs_per_sm", "ins_per_weight", "barriers", "shuffles")})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
