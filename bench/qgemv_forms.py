"""Forms of the 8B step's quantized gate/up GEMV (the norm, gate, up and SwiGLU; 40-45% of a
quantized layer), measured before either is built into the renderer:

- ``rendered``: the kernel as pto renders it (a program a block of 4 outputs of each matrix, one
  K step of 4,096: it loads its weights, waits, then computes; about 1,370 SASS instructions a
  thread);
- ``rendered maxnreg R``: the same compiled to at most R registers a thread (more programs a
  multiprocessor);
- ``x prequantized``: the same with the x work taken out (its ``_pto_dqx16_dot_q4_k`` helpers'
  rounding and packing of x, and the norm's sum of squares, replaced by loads of x's packed
  16-bit integers, their group scales and sums and the row factor from one buffer, as a kernel
  before the GEMV would write them; its arithmetic is not the GEMV's, only its work; Q4_K only);
- ``loop P/S``: ``P`` persistent programs, each normalizing x once and then taking blocks
  ``j, j + P, ...`` in a ``tl.range`` loop of ``num_stages=S`` (Triton's pipeliner: from 2 the
  next block's weights copied into shared memory, ``cp.async``, while this one computes; the
  helpers are the rendered ones, x's rounding hoisted out of the loop by the compiler);
  ``ahead``: the next block's weights loaded into registers before this block's products;
  ``maxnreg R``: compiled to at most R registers a thread (Triton's ``maxnreg``);
- ``blocks``: the kernel as pto renders it by default since the sixteenth session for the 4-bit
  types (persistent "blocks": 4 programs a multiprocessor, each looping over its blocks with the
  next block's weights ahead, at most 128 registers). (A ``blocks paired`` form measured the
  Q4_K scale planes interleaved before pto stored them so: docs/PERF.md, sixteenth session.)

    python bench/qgemv_forms.py [--specs q4_k/q6_k,q8_0,fp8] [--sass /tmp/t36/bin/python] [--iters 100]
                                [--json FILE]

On a GPU: each form launched alone (one sequence, weights past L2: four copies in turn, the
bytes below 64: every scale and e4m3 value finite), microseconds a call and the largest difference of its outputs
from the rendered kernel's. ``--sass PYTHON``: instead compile them for sm_90 with that
interpreter's Triton (no GPU) and print bench/qgemv_sass.py's facts (registers, SASS
instructions a weight of the loop's body or the kernel, barriers, shuffles, ``cp.async``
copies). It depends on the rendered text's names and fails loudly when they change.
"""

# ruff: noqa: E501  (the loop form's kernel text, as the renderer writes its lines)
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
        raise SystemExit("qgemv_forms: the rendered kernel has no _pto_dqx16_dot_q4_k helper")
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


#: the rendered gate/up kernel's memref parameters (its device function's and kernel's)
_PARAMS = """        P_x, S_x,
        P_wg, S_wg,
        P_wu, S_wu,
        P_y, S_y,
        P_g, S_g,
        EVEN_x: tl.constexpr, EVEN_wg: tl.constexpr, EVEN_wu: tl.constexpr, EVEN_y: tl.constexpr, EVEN_g: tl.constexpr,
        ALIGN_x: tl.constexpr, ALIGN_wg: tl.constexpr, ALIGN_wu: tl.constexpr, ALIGN_y: tl.constexpr, ALIGN_g: tl.constexpr,"""

#: the loop form's device function and kernel (module docstring), after the rendered helpers
_LOOP = """@triton.jit
def d_gemv_norm_swiglu_tile__R1(
        row,
        i_j,
{params}
        NPROG, NIT, STAGES: tl.constexpr):
    m_wg_rows = tl.load(row + 6)
    _c13 = tl.arange(0, 4096)[None, :]
    t_xt = tl.load(P_x + _c13)
    t_gt = tl.load(P_g + _c13)
    t_xf = (t_xt).to(tl.float32)
    t_ss = tl.sum(t_xf * t_xf, axis=1)[:, None]
    t_xf = t_xf * (t_gt).to(tl.float32)
    t_a32 = (t_xf).to(tl.bfloat16).to(tl.float32)
    t_ss = tl.math.rsqrt(t_ss * 0.000244140625 + 9.999999747378752e-06)
{loads}{dots}        t_accg = (t_accg * t_ss).to(tl.bfloat16).to(tl.float32)
        t_accu = (t_accu * t_ss).to(tl.bfloat16).to(tl.float32)
        t_accg = tl.math.div_rn(t_accg, 1.0 + tl.exp(-t_accg))
        t_gb = (t_accg * t_accu).to(tl.bfloat16)
        _c16 = (jj * 4) + tl.arange(0, 4)[None, :]
        tl.store(P_y + _c16, t_gb)


@triton.jit
def gemv_norm_swiglu_tile__R1(
        tab,
{params}
        NB, NP, GROUP: tl.constexpr, NPROG, NIT, STAGES: tl.constexpr):
    d_gemv_norm_swiglu_tile__R1(tab, tl.program_id(1), P_x, S_x, P_wg, S_wg, P_wu, S_wu, P_y, S_y, P_g, S_g, EVEN_x, EVEN_wg, EVEN_wu, EVEN_y, EVEN_g, ALIGN_x, ALIGN_wg, ALIGN_wu, ALIGN_y, ALIGN_g, NPROG, NIT, STAGES)
"""

#: the loop's loads of its block's weights: as they are used, or (``ahead``) the next block's
#: into registers before this one's products (past a program's last block, the task's last one)
_BLOCK = """        _r1 = ({j} * 4) + tl.arange(0, 4)[:, None]
        _rm4 = (_r1 < m_wg_rows)
        {g} = {load}(P_wg, S_wg, _r1, 0, _rm4, 4096, 4, 4096, False)
        {u} = {load}(P_wu, S_wu, _r1, 0, _rm4, 4096, 4, 4096, False)
"""


def _loop_source(src: str, ahead: bool) -> str:
    """The loop form's kernel (module docstring) with the rendered kernel's helpers, its weights'
    load helper and planes and its dot helper taken from the rendered text."""
    load = re.search(r"\n +(t_bg__\w+(?:, t_bg__\w+)*) = (_pto_dqg_load_\w+)\(P_wg,", src)
    dots = re.findall(r"\n    t_acc([gu]) = t_acc[gu] \+ (_pto_\w+_dot_\w+)\((.*), t_a32, (\d+), (\d+)\)\[None, :\]", src)
    if load is None or len(dots) != 2:
        raise SystemExit("qgemv_forms: the rendered gate/up kernel's loads or dots are not where expected")
    planes, helper = load.group(1).split(", "), load.group(2)
    names = {m: ", ".join(p.replace("t_bg__", f"t_b{m}__") for p in planes) for m in "gu"}
    ahead_names = {m: names[m].replace("t_b", "n_b") for m in "gu"}

    def block(j, named):
        return _BLOCK.format(j=j, g=named["g"], u=named["u"], load=helper)

    head = "    for it in tl.range(0, NIT, num_stages=STAGES):\n        jj = i_j + it * NPROG\n"
    if ahead:
        loads = (block("i_j", ahead_names).replace("        ", "    ") + head
                 + "".join(f"        {names[m]} = {ahead_names[m]}\n" for m in "gu")
                 + "        jn = tl.minimum(jj + NPROG, NIT * NPROG - 1)\n" + block("jn", ahead_names))
    else:
        loads = head + block("jj", names)
    dot = "".join(f"        t_acc{m} = {h}({args}, t_a32, {br}, {bc})[None, :]\n" for m, h, args, br, bc in dots)
    loop = _LOOP.replace("{params}", _PARAMS).replace("{loads}", loads).replace("{dots}", dot)
    return src[:src.index("@triton.jit\ndef d_")] + loop

#: the rendered kernel compiled to at most these registers a thread as well
RENDERED_REGS = (96, 80, 64)

#: the loop forms measured: (programs, the loop's stages, the next block ahead, the most registers
#: a thread or 0); the programs divide the 3,584 blocks
LOOPS = ((512, 1, False, 0), (896, 1, False, 0), (512, 2, False, 0), (896, 1, False, 64), (896, 1, False, 80),
         (512, 1, True, 0), (448, 1, True, 128), (512, 1, True, 128), (896, 1, True, 128))


def _jobs(folder: Path, spec: str, loops=LOOPS) -> list[dict]:
    """The forms' compile jobs for weights ``spec`` (bench/qgemv_sass.py's), each tagged with
    the spec and its form; the prequantized form for Q4_K only."""
    jobs = qgemv_sass.jobs(spec, "auto", "default", folder, pdl="late")
    (job,) = [j for j in jobs if j["kernel"] == "gate_up"]
    job = dict(job, tag=f"{spec} rendered", spec=spec)
    src = Path(job["path"]).read_text()
    out = [job] + [dict(job, tag=f"{spec} rendered maxnreg {r}", options=dict(job["options"], maxnreg=r))
                   for r in RENDERED_REGS]
    if spec.startswith("q4_k"):
        pre = dict(job, tag=f"{spec} x prequantized", path=str(folder / "pre_gate_up.py"))
        Path(pre["path"]).write_text(prequantized(src))
        out.append(pre)
    (blocks,) = [dict(j, tag=f"{spec} blocks", spec=spec, blocks=True)
                 for j in qgemv_sass.jobs(spec, "auto", "default", folder, pdl="late", persistent="blocks")
                 if j["kernel"] == "gate_up"]
    out.append(blocks)
    sig = dict(job["signature"], NPROG="i32", NIT="i32", STAGES="constexpr")
    for ahead in (False, True):
        loop = folder / f"loop_gate_up_{int(ahead)}.py"
        loop.write_text(_loop_source(src, ahead))
        for programs, stages, _, regs in (x for x in loops if x[2] == ahead):
            tag = f"{spec} loop {programs}/{stages}" + (" ahead" if ahead else "") + (f" maxnreg {regs}" if regs else "")
            options = dict(job["options"], **({"maxnreg": regs} if regs else {}))
            out.append(dict(job, tag=tag, path=str(loop), signature=sig, programs=programs, options=options,
                            constexprs=dict(job["constexprs"], STAGES=stages)))
    return out


def sass(python: str, specs: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        jobs = []
        for spec in specs:
            (folder / spec.replace("/", "_")).mkdir()
            jobs += _jobs(folder / spec.replace("/", "_"), spec)
        (folder / "jobs.json").write_text(json.dumps(jobs))
        (folder / "driver.py").write_text(qgemv_sass._DRIVER)
        run = subprocess.run([python, str(folder / "driver.py"), str(folder / "jobs.json")], capture_output=True,
                             text=True)
        if run.returncode:
            raise SystemExit(f"qgemv_forms: the sm_90 compile failed:\n{run.stderr[-2000:]}")
        got = {g["tag"]: g for g in json.loads(run.stdout)}
        return [dict(qgemv_sass.facts(j, got[j["tag"]]), tag=j["tag"], cp_async=got[j["tag"]]["sass"].count("LDGSTS"))
                for j in jobs]


def timed(iters: int, specs: list[str], only: tuple[str, ...] = ()) -> list[dict]:
    import torch
    from pto.orchestration.model.program import CONFIGS

    from pto.codegen.triton.common import BLOCK_PROGRAMS
    from pto.ir.dtypes import dtype_of

    layer = CONFIGS["llama3-8b"].layer
    K, N, bn = layer.hidden, layer.ffn, 4
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(16 * K, device=dev, generator=gen).to(torch.bfloat16)  # (the prequantized form's buffer too)
    g = (1 + 0.1 * torch.randn(K, device=dev, generator=gen)).to(torch.bfloat16)
    tab = torch.tensor([0, 0, 1, K, 0, 0, N, K, 0, 0, N, K, 0, 0, 1, N, 0, 0, 1, K], dtype=torch.int32, device=dev)

    def measure(jobs, copies, row) -> list[dict]:
        """Each form of ``jobs`` timed on ``copies`` of the weights (rows of ``row`` bytes)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out, first = [], None
        for job in jobs:
            found = importlib.util.spec_from_file_location(f"k{len(out)}", job["path"])
            mod = importlib.util.module_from_spec(found)
            found.loader.exec_module(mod)
            kern = getattr(mod, job["name"])
            y = torch.zeros(N, device=dev, dtype=torch.bfloat16)
            programs = job.get("programs")
            grid = (1, min(N // bn, BLOCK_PROGRAMS * sms) if job.get("blocks") else programs or N // bn)
            extra = {"NPROG": programs, "NIT": N // bn // programs} if programs else {}

            def call(wg, wu, kern=kern, job=job, y=y, grid=grid, extra=extra):
                kern[grid](tab, x, K, wg, row, wu, row, y, N, g, K, **job["constexprs"], NB=1, NP=N // bn, **extra,
                           **job["options"])

            for wg, wu in reversed(copies):  # compile, warm; the first copy's results last
                call(wg, wu)
            torch.cuda.synchronize()
            diff = None
            if job["tag"].endswith(" rendered"):  # (the forms after it compare with it)
                first = y.float().clone()
            elif not job["tag"].endswith(" x prequantized"):
                diff = float((y.float() - first).abs().max() / first.abs().max())
            start.record()
            for k in range(iters):
                call(*copies[k % len(copies)])
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1e3 / iters
            out.append({"tag": job["tag"], "us": round(us, 2), "TB/s": round(2 * N * row / us * 1e-6, 3),
                        "rel_diff": diff})
        return out

    # the clocks up first (an idle H200 runs at 345 MHz; a cold first form measured 15-60% slower)
    warm = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
    for _ in range(200):
        warm.add_(1)
    torch.cuda.synchronize()
    del warm
    out = []
    for spec in specs:
        # every byte below 64: the f16 scales and e4m3 values finite, whatever plane they are in
        row = dtype_of(spec.partition("/")[0]).quant.row_bytes(K)
        copies = [[torch.randint(0, 64, (N, row), dtype=torch.uint8, device=dev, generator=gen) for _ in range(2)]
                  for _ in range(4)]
        with tempfile.TemporaryDirectory() as tmp:
            jobs = [j for j in _jobs(Path(tmp), spec)
                    if not only or j["tag"].endswith(" rendered") or j["tag"].split(" ", 1)[1] in only]
            out += measure(jobs, copies, row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sass", default=None, metavar="PYTHON", help="compile for sm_90 with this interpreter instead")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--specs", default="q4_k/q6_k,q8_0,fp8", help="the weights' types (bench/qgemv_sass.py's)")
    ap.add_argument("--forms", default="", help="the forms to time, ','-separated (e.g. 'blocks,x prequantized'; "
                    "the rendered kernel always, first: the others' reference); default every form")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    specs = args.specs.split(",")
    only = tuple(f for f in args.forms.split(",") if f)
    rows = sass(args.sass, specs) if args.sass else timed(args.iters, specs, only)
    for r in rows:
        print(r["tag"], {k: v for k, v in r.items() if k != "tag" and k in (
            "us", "TB/s", "rel_diff", "regs", "local_bytes", "programs_per_sm", "ins_per_weight", "barriers", "shuffles", "cp_async")})
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
