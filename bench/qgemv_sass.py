"""What the decode step's GEMV kernels execute per weight, from their SASS (no GPU needed):
Llama-3-8B's (``--config``: another model's) quantized GEMVs (and the bf16 ones) rendered by the
Triton backend, compiled for sm_90 by Triton's compiler, disassembled by its bundled ``cuobjdump``.

    python bench/qgemv_sass.py [--specs bf16,q4_k/q6_k,q8_0,fp8] [--modes units,groups]
                               [--tilings 'default;bk=4096,ffn_bn=4,ffn_bk=4096,lm_bk=4096,bv=8']
                               [--config llama3-8b] [--batch 1] [--warps 0] [--persistent auto]
                               [--python /tmp/t36/bin/python] [--json FILE]

Per kernel (``qkv`` the norm and q, k, v projection, ``proj`` the residual projection, o and
down, ``gate_up`` the norm, gate, up and SwiGLU, ``lm`` the LM head), on the mask-free path
(EVEN, ALIGN), launched as the step launches them (``--pdl``: a programmatic dependent launch,
the weights and norm gains loaded before its wait): registers and bytes of local memory
(spills) a thread, shared memory, warps, the
SASS instructions of the K loop's body (the whole kernel where the loop is unrolled: one step)
divided by the weights a thread takes a step (``ins/w``), the global loads by width, barriers
and shuffles in that body; the programs a multiprocessor holds at once (by registers, warps,
shared memory) and the weight bytes of one K step of each of them (``KiB/SM``: what the
multiprocessor has in flight while every program waits on a step's loads; an H200 needs about
4.8 TB/s x 1 us / 132 = 36 KiB for its bandwidth). ``--python``: the interpreter whose Triton compiles (a GPU machine's
version, say 3.6, may lay tensors out otherwise than this one's; a scratch venv with only
``triton`` installed will do). Numbers go in docs/PERF.md ("Quantized weights")."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sm90_compile import compile_jobs  # noqa: E402

KERNELS = ("qkv", "proj", "proj_o", "gate_up", "lm")


def jobs(spec: str, mode: str, tiling: str, folder: Path, pdl: str = "", batch: int = 1, config: str = "llama3-8b",
         warps: int = 0, cols: int = 0, persistent: str = "", sms: int = 132) -> list[dict]:
    """The compile jobs of the step's GEMV kernels for weights ``spec`` (``bf16`` or
    ``LAYERS/HEAD``) read by ``mode`` with ``tiling`` (``default`` or ``k=v,...``); ``pdl``: as
    the step launches them, a programmatic dependent launch whose weights and norm gains (the
    memory the launch before does not write) load before its wait; ``batch``: the step of that
    many sequences (from 2 the projections are the dot path's tensor-core products); ``config``:
    the model's configuration; ``warps``: ``RenderOptions.qgemv_warps``; ``cols``:
    ``RenderOptions.qgemv_cols``; ``persistent``: "blocks", every kernel a loop over its task's
    blocks, "auto" the kernels the backend's default policy loops (``RenderedKernel.loops_blocks``
    in the formats ``PTO_BLOCKS_FORMATS`` names
    and blocks enough a program on a GPU of ``sms`` multiprocessors), each compiled as the backend
    would (at most BLOCK_MAXNREG registers where it carries the next
    block's weights in 4 warps or fewer). The down projection
    (``proj``) is specialized to the step's call (K the FFN's width)."""
    from pto.orchestration.model.decode import functions
    from pto.orchestration.model.program import CONFIGS, tiling_for
    from pto.orchestration.model.quantized import WeightTypes, for_weights

    from pto.backends.triton import TritonBackend
    from pto.backends.triton.modes import blocks_formats, k_ahead_mode, qscales_mode
    from pto.codegen.triton import render
    from pto.codegen.triton.common import BLOCK_MAXNREG, BLOCK_PROGRAMS, RenderOptions
    from pto.codegen.triton.quant_groups import reads_by_groups_in
    from pto.ir.analysis import specialize
    from pto.ir.dtypes import DType
    from pto.machine.target import get

    cfg = CONFIGS[config]
    ahead_rule = TritonBackend("cpu")  # (its k_ahead_of: the interpreter's estimate of the multiprocessors, 132)
    formats = blocks_formats()  # (the formats "auto" loops: PTO_BLOCKS_FORMATS, as the backend's)
    wt = WeightTypes() if spec == "bf16" else WeightTypes.of_spec(spec)
    t = tiling_for(cfg)
    if tiling != "default":
        t = t.with_fields(**{k: int(v) for k, v in (kv.split("=") for kv in tiling.split(","))})
    t = for_weights(t, wt, batch)
    fns = functions(cfg, DType.BF16, get("cuda_h100"), t, batch, wtypes=wt)
    out = []
    for f in fields(fns):
        fn = getattr(fns, f.name)
        if f.name not in KERNELS or fn is None:
            continue
        pre = tuple(p.name for p in fn.memrefs if p.name.startswith(("w", "g"))) if pdl else ()
        dims = {"K": cfg.layer.ffn, "N": cfg.layer.hidden} if f.name == "proj" else None
        opts = RenderOptions(qgemv=mode, pdl=pdl, pre=pre, asm=True, qgemv_warps=warps, qgemv_cols=cols,
                             qscales=qscales_mode(), k_ahead=k_ahead_mode())
        kern = render(specialize(fn, dims), opts)
        if persistent == "blocks" or (persistent == "auto" and kern.loops_blocks(BLOCK_PROGRAMS * sms, formats)):
            kern = render(specialize(fn, dims), replace(opts, persistent="blocks"))
        elif opts.k_ahead == "auto":  # (the backend's rule at the launch's warps, an H200's multiprocessors)
            ahead = ahead_rule.k_ahead_of(kern.fn, kern.launch["num_warps"])
            kern = render(specialize(fn, dims), replace(opts, k_ahead=ahead)) if ahead != "off" else kern
        tag = f"{spec}|{mode}|{tiling}|{batch}|{persistent}|{f.name}".replace("/", "_")
        path = folder / (re.sub(r"[^\w.-]", "_", tag) + ".py")
        path.write_text(kern.source)
        flags = {f"{w}_{p.name}": True for w in ("EVEN", "ALIGN") for p in kern.fn.memrefs}
        weights = sum(1 for p in kern.fn.memrefs if p.name.startswith("w"))
        blocks = _blocks(specialize(fn, dims))  # (the down projection at the step's K)
        out.append({"tag": tag, "path": str(path), "name": kern.name, "signature": kern.signature(),
                    "constexprs": {**flags, **{k: v for k, v in kern.launch.items() if k.isupper()}},
                    "options": {k: v for k, v in kern.launch.items() if not k.isupper()} |
                    ({"maxnreg": BLOCK_MAXNREG} if kern.block_ahead and kern.launch["num_warps"] <= 4 else {}),
                    "kernel": f.name, "spec": spec, "mode": mode, "tiling": tiling,
                    "weights_per_step": weights * blocks[0] * blocks[1], "K": blocks[2], "bk": blocks[1],
                    "bits_per_weight": _bits(fn),
                    "grouped": reads_by_groups_in(kern.source)})
    return out


def _bits(fn) -> float:
    """Bits a weight of ``fn``'s weight memrefs (their format's, with its scales; 16 dense)."""
    p = next(p for p in fn.memrefs if p.name.startswith("w"))
    return p.dtype.quant.bits_per_weight if p.dtype.is_quantized else 8 * p.dtype.itemsize


def _blocks(fn) -> tuple[int, int, int]:
    """The weight tile's rows and columns and the contraction K of a GEMV function."""
    from pto.ir.analysis import specialize, tile_shape
    from pto.ir.nodes import walk_instrs
    from pto.ir.ops import Op

    fn = specialize(fn)
    mems = {p.name: p for p in fn.memrefs}
    tiles = {t.name: t for t in fn.tiles}
    for ins in walk_instrs(fn.body):
        if ins.op is Op.LOAD and ins.srcs[0] in mems and ins.srcs[0].startswith("w"):
            r, c = tile_shape(tiles[ins.dst], dict(fn.variant))
            K = mems[ins.srcs[0]].shape[1] if mems[ins.srcs[0]].shape else c
            return r, c, int(str(K)) if str(K).isdigit() else c
    raise ValueError(f"{fn.name}: no weight tile")


def facts(job: dict, got: dict) -> dict:
    """The SASS facts of one kernel (module docstring)."""
    res = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", got["res"])
    ins = []
    for line in got["sass"].splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and not m.group(2).startswith("NOP"):
            ins.append((int(m.group(1), 16), re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip())))
    # the K loop: the widest backward branch's body; none (unrolled, one step): the whole kernel
    body, loop = ins, False
    for at, text in ins:
        m = re.match(r"BRA\s+(?:`\()?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < at:
            start = int(m.group(1), 16)
            cand = [i for i in ins if start <= i[0] <= at]
            if len(cand) > len(body) or not loop:
                body, loop = cand, True
    ops = [t.split()[0] for _, t in body]
    threads = 32 * job["options"]["num_warps"]
    per_thread = job["weights_per_step"] / threads * (1 if loop else max(1, job["K"] // job["bk"]))
    loads = {}
    for o in ops:
        if o.startswith("LDG"):
            width = o.removeprefix("LDG.E").lstrip(".") or "32"
            loads[width] = loads.get(width, 0) + 1
    # resident programs a multiprocessor (sm_90: 64K registers, 64 warps, 32 blocks, 228 KiB of
    # shared memory) and the weight bytes they have in flight at one K step each
    warps = job["options"]["num_warps"]
    regs = -(-int(res.group(1)) // 8) * 8 if res else 255
    programs = min(32, 64 // warps, 65536 // (regs * 32 * warps), (228 << 10) // max(got["shared"], 1))
    in_flight = programs * job["weights_per_step"] * job["bits_per_weight"] / 8 / 1024
    return {"kernel": job["kernel"], "spec": job["spec"], "mode": job["mode"], "tiling": job["tiling"],
            "programs_per_sm": programs, "kib_in_flight_per_sm": round(in_flight, 1),
            "grouped": job["grouped"], "regs": int(res.group(1)) if res else None,
            "local_bytes": int(res.group(4)) + int(res.group(2)) if res else None, "shared": got["shared"],
            "warps": job["options"]["num_warps"], "body_ins": len(body), "loop": loop,
            "ins_per_weight": round(len(body) / per_thread, 2), "loads": loads,
            "barriers": sum(o.startswith("BAR") for o in ops), "shuffles": sum(o.startswith("SHFL") for o in ops),
            "lds_sts": sum(o.startswith(("LDS", "STS", "STSM", "LDSM")) for o in ops), "triton": got["triton"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", default="bf16,q4_k/q6_k,q8_0,fp8")
    ap.add_argument("--modes", default="units,groups")
    ap.add_argument("--tilings", default="default")
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose Triton compiles")
    ap.add_argument("--pdl", default="late", help="the kernels' programmatic dependent launch, as the step's (late; "
                    "'' none)")
    ap.add_argument("--batch", type=int, default=1, help="the step's sequences (from 2: the dot path's products)")
    ap.add_argument("--config", default="llama3-8b", help="the model's configuration (pto's CONFIGS)")
    ap.add_argument("--warps", type=int, default=0, help="the grouped GEMVs' fewest warps (PTO_QGEMV_WARPS)")
    ap.add_argument("--cols", type=int, default=0, help="the grouped GEMVs' columns a warp (PTO_QGEMV_COLS)")
    ap.add_argument("--persistent", default="", help="'blocks': every kernel a loop over its blocks; 'auto': those "
                    "the backend's default policy loops (PTO_PERSISTENT's) on --sms multiprocessors; '' (default): "
                    "the plain grid")
    ap.add_argument("--sms", type=int, default=132, help="the GPU's multiprocessors, for --persistent auto (an H200's)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="compiles at once")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sass", default=None, help="a folder to write each kernel's SASS and Triton source in")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        todo = []
        for spec in args.specs.split(","):
            for mode in (args.modes.split(",") if spec != "bf16" else ["units"]):
                for tiling in args.tilings.split(";"):
                    todo += jobs(spec, mode, tiling, folder, args.pdl, args.batch, args.config, args.warps,
                                 args.cols, args.persistent, args.sms)
        got = {g["tag"]: g for g in compile_jobs(todo, folder, args.python, args.workers)}
        failed = [g for g in got.values() if "error" in g]
        if failed:
            print(f"{failed[0]['tag']}: {failed[0]['error']}", file=sys.stderr)
            return 1
        if args.sass:
            Path(args.sass).mkdir(parents=True, exist_ok=True)
            for j in todo:
                name = re.sub(r"[^\w.-]", "_", j["tag"])
                (Path(args.sass) / f"{name}.sass").write_text(got[j["tag"]]["sass"])
                (Path(args.sass) / f"{name}.py").write_text(Path(j["path"]).read_text())
    rows = [facts(j, got[j["tag"]]) for j in todo]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(f"triton {rows[0]['triton'] if rows else '?'}, sm_90")
    print(f"{'spec':10} {'mode':6} {'tiling':42} {'kernel':8} {'regs':>4} {'spill':>5} {'warps':>5} {'prg/SM':>6} "
          f"{'KiB/SM':>6} {'ins/w':>6} {'bar':>4} {'shfl':>4} {'smem':>4}  loads (LDG width: count)")
    for r in rows:
        loads = " ".join(f"{k}:{v}" for k, v in sorted(r["loads"].items()))
        note = "" if r["grouped"] or r["mode"] == "units" else "  (not by groups)"
        print(f"{r['spec']:10} {r['mode']:6} {r['tiling'][:42]:42} {r['kernel']:8} {r['regs']:>4} "
              f"{r['local_bytes']:>5} {r['warps']:>5} {r['programs_per_sm']:>6} {r['kib_in_flight_per_sm']:>6} "
              f"{r['ins_per_weight']:>6} {r['barriers']:>4} {r['shuffles']:>4} "
              f"{r['lds_sts']:>4}  {loads}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
