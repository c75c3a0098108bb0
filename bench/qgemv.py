"""The decode step's GEMVs alone on quantized weights: microseconds per kernel and the bandwidth
it reads its weights at, each weight type by units (the unit helpers) and by groups
(``PTO_QGEMV=groups``, :mod:`pto.codegen.triton.quant_groups`) over a few tiles, against the bf16
GEMV of the same shape and a large copy's bandwidth (a GPU).

    python bench/qgemv.py [--specs q4_k/q6_k,q8_0,fp8] [--shapes o,down,gate_up,head]
                          [--tiles 'units:default;groups:default;groups:bn=8,bk=2048,...']
                          [--runs 20] [--json FILE]

The shapes are Llama-3-8B's at batch 1 (bf16 activations): ``o`` the residual GEMV 4096 x
4096 (``gemv_residual_tile``), ``down`` 14336 -> 4096, ``gate_up`` the norm, gate and up and
SwiGLU 4096 -> 2 x 14336 (``gemv_norm_swiglu_tile``), ``head`` the LM head 4096 -> 128256 with
the norm and the argmax epilogue (``lmhead_argmax_gemv_tile``); ``qkv`` (4096 -> 6144, the
norm folded) on request. A tile ``MODE:TILING`` reads the weights by ``MODE`` (units, groups, int8, int16) in
the 8B decode tiling with ``TILING``'s fields (``default``, or bench/decode.py's ``k=v,...``),
fitted to the type (:func:`~pto.orchestration.model.quantized.for_weights`): each shape its
output block and K step of it (o: ``o_bn``, ``o_bk``; down: ``bn``, ``bk``; gate_up: ``ffn_*``;
head: ``bv``, ``lm_bk``; qkv: ``qkv_*``). Each kernel runs on random blocks of the real shapes, rotating over
enough copies of its weights that they never stay in L2; the time is the kernels' own (CUPTI,
:func:`pto.exec.timing.kernel_times`), so launch gaps are left out. ``GB/s``: the weights' bytes per
kernel time; ``x copy``: that over the copy bandwidth (read + write of a 1 GiB buffer). One GPU
call of a few minutes on an H200 (most of it compiling)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import copy_bandwidth  # noqa: E402
from pto.incore.decode import lmhead_argmax_gemv_tile  # noqa: E402
from pto.incore.gemv import gemv_norm_swiglu_tile, gemv_norm_tile, gemv_residual_tile  # noqa: E402
from pto.orchestration.model.program import CONFIGS, tiling_for  # noqa: E402
from pto.orchestration.model.quantized import WeightTypes, for_weights, random_quantized  # noqa: E402

from pto.backends.triton import TritonBackend  # noqa: E402
from pto.codegen.triton.common import RenderOptions  # noqa: E402
from pto.codegen.triton.quant_groups import reads_by_groups_in  # noqa: E402
from pto.data.batch import RegionBatch, TaskBatch  # noqa: E402
from pto.exec import timing  # noqa: E402
from pto.ir.analysis import specialize  # noqa: E402
from pto.ir.dtypes import DType, dtype_of  # noqa: E402

#: the L2 the weights' copies must not fit (bytes; an H200's is 60 MiB)
L2_BYTES = 256 << 20
#: the tiling the groups read best with on paper (docs/PERF.md, "Quantized GEMVs by groups"):
#: 8 rows a program in 4096-wide steps (the down projection's 14336 in steps of 2048, whole
#: steps), gate and up 4 rows each, the head 16 rows in steps of 2048
GROUPS_TILING = "bn=8,bk=2048,o_bn=8,o_bk=4096,qkv_bn=8,qkv_bk=4096,ffn_bn=4,ffn_bk=4096,lm_bk=2048,bv=16"

CFG = CONFIGS["llama3-8b"]
H, F, V = CFG.layer.hidden, CFG.layer.ffn, CFG.vocab
#: shape -> (K, N, weights, what builds it)
SHAPES = {"o": (H, H, ("w",), "residual"), "down": (F, H, ("w",), "residual"),
          "gate_up": (H, F, ("wg", "wu"), "swiglu"), "head": (H, V, ("w",), "head"),
          "qkv": (H, CFG.layer.q_dim + 2 * CFG.layer.kv_dim, ("w",), "norm")}


def tile_of(shape: str, wdtype: DType | None, tiling: str = "default") -> tuple[int, int]:
    """The (output block, K step) of ``shape`` in the 8B decode tiling with ``tiling``'s fields
    (``default`` or ``k=v,...``, as bench/decode.py's ``--tilings``) fitted to ``wdtype``."""
    kinds = {"lm_head": wdtype} if shape == "head" else {k: wdtype for k in ("w_qkv", "wo", "wg", "wu", "wd")}
    wt = WeightTypes(tuple(sorted(kinds.items()))) if wdtype is not None else WeightTypes()
    t = tiling_for(CFG)
    if tiling != "default":
        t = t.with_fields(**{k: int(v) for k, v in (kv.split("=") for kv in tiling.split(","))})
    t = for_weights(t, wt)
    if shape == "head":
        return t.bv, t.lm_bk
    field = {"gate_up": "ffn", "o": "o", "qkv": "qkv"}.get(shape)
    if field is None:  # the down projection: the plain block and step
        return t.bn, t.bk
    return getattr(t, f"{field}_bn") or t.bn, getattr(t, f"{field}_bk") or t.bk


def build(shape: str, bn: int, bk: int, wdtype: DType | None):
    K, N, _, kind = SHAPES[shape]
    kw = {"wdtype": wdtype} if wdtype is not None else {}
    if kind == "residual":
        fn = gemv_residual_tile(DType.BF16, 1, K, N, bn, bk, **kw)
    elif kind == "swiglu":
        fn = gemv_norm_swiglu_tile(DType.BF16, 1, K, N, bn, bk, CFG.layer.eps, **kw)
    elif kind == "norm":
        fn = gemv_norm_tile(DType.BF16, 1, K, N, bn, bk, CFG.layer.eps, **kw)
    else:
        fn = lmhead_argmax_gemv_tile(DType.BF16, 1, K, N, bn, bk, CFG.layer.eps, **kw)
    return specialize(fn)


def weights(shape: str, wdtype: DType | None, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One copy of the shape's weights (``[N, K]``; quantized: rows of planes)."""
    K, N, names, _ = SHAPES[shape]
    if wdtype is None:
        return {n: torch.randn(N, K, generator=g, device=g.device).mul_(K ** -0.5).to(torch.bfloat16) for n in names}
    return {n: random_quantized(wdtype, N, K, K ** -0.5, g).data for n in names}


def regions(fn, ws: dict[str, torch.Tensor], shape: str, bn: int, g: torch.Generator) -> dict[str, RegionBatch]:
    """The task's regions: the weights ``ws`` and every other memref a fresh tensor of its shape
    (the LM head's block maxima and their columns: one per block of ``bn``)."""
    K, N, _, _ = SHAPES[shape]
    sizes = {"x": (1, K), "g": (1, K), "r": (1, N), "y": (1, N), "best": (1, -(-N // bn)), "index": (1, -(-N // bn))}
    out = {}
    for p in fn.memrefs:
        if p.name in ws:
            t = ws[p.name]
            rows, cols = t.shape[0], K
        else:
            rows, cols = sizes[p.name]
            dt = torch.float32 if p.dtype is DType.F32 else torch.bfloat16
            t = torch.randn(rows, cols, generator=g, device=g.device).to(dt)
        out[p.name] = RegionBatch(t, *(torch.tensor([v]) for v in (0, 0, rows, cols)))
    return out


def measure(shape: str, wdtype: DType | None, mode: str, bn: int, bk: int, runs: int, g: torch.Generator) -> dict:
    """One kernel's microseconds and its weights' bandwidth (module docstring)."""
    fn = build(shape, bn, bk, wdtype)
    backend = TritonBackend("cuda", options=RenderOptions(qgemv=mode))
    one = weights(shape, wdtype, g)
    nbytes = sum(t.numel() * t.element_size() for t in one.values())
    copies = [one] + [weights(shape, wdtype, g) for _ in range(max(0, -(-L2_BYTES // nbytes) - 1))]
    launches = [backend.prepare(TaskBatch(fn, regions(fn, ws, shape, bn, g), {}, 1)) for ws in copies]
    kernel = backend.kernel(fn, backend.render_options(fn, backend.launch_config(fn)))  # (as launched)
    grouped = reads_by_groups_in(kernel.source)

    def rotate():
        for launch in launches:
            launch()

    per, _ = timing.kernel_times(rotate, runs)
    name = next((k for k in per if kernel.name[:40] in k), None) or max(per, key=lambda k: per[k][1])
    n, ms = per[name]
    us = ms * 1e3 / n
    return {"us": round(us, 2), "GBps": round(nbytes / us / 1e3, 1), "weight_bytes": nbytes, "copies": len(copies),
            "grouped": grouped, "num_warps": kernel.launch["num_warps"], "persistent": kernel.persistent}


def parse_tiles(text: str) -> list[tuple[str, str]]:
    """``units:default;groups:bn=8,bk=2048`` -> [(mode, tiling)]."""
    out = []
    for item in text.split(";"):
        mode, _, tiling = item.partition(":")
        out.append((mode, tiling or "default"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", default="q4_k/q6_k,q8_0,fp8", help="weight types, LAYERS[/HEAD] (the head's type "
                    "for the head, the layers' for the others)")
    ap.add_argument("--shapes", default="o,down,gate_up,head")
    ap.add_argument("--tiles", default="units:default;groups:default;groups:" + GROUPS_TILING,
                    help="MODE:TILING;... (TILING: default or bench/decode.py's k=v,...)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        print("bench/qgemv.py needs a CUDA GPU (and no TRITON_INTERPRET)", file=sys.stderr)
        return 2
    bw = copy_bandwidth()
    print(json.dumps({"device": torch.cuda.get_device_name(0), "copy_GBps": round(bw / 1e9, 1)}), flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for shape in args.shapes.split(","):
        bf = tile_of(shape, None)
        base = {"shape": shape, "type": "bf16", "mode": "-", "tile": f"{bf[0]}x{bf[1]}"}
        try:
            base.update(measure(shape, None, "units", *bf, args.runs, g))
        except Exception as e:  # report it, measure the rest
            base["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(base)
        print(json.dumps(base), flush=True)
        for spec in args.specs.split(","):
            layers, _, head = spec.partition("/")
            wdtype = dtype_of(head or layers) if shape == "head" else dtype_of(layers)
            for mode, tiling in parse_tiles(args.tiles):
                bn, bk = tile_of(shape, wdtype, tiling)
                row = {"shape": shape, "type": wdtype.short, "mode": mode, "tiling": tiling, "tile": f"{bn}x{bk}"}
                try:
                    row.update(measure(shape, wdtype, mode, bn, bk, args.runs, g))
                    row["x_copy"] = round(row["GBps"] * 1e9 / bw, 3)
                    if "us" in base:
                        row["x_bf16_time"] = round(row["us"] / base["us"], 3)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "copy_bandwidth": bw,
                                               "rows": rows}, indent=1))
    print(f"\n{'shape':8} {'type':6} {'mode':7} {'tile':9} {'us':>8} {'GB/s':>7} {'x copy':>7} {'x bf16':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:8} {r['type']:6} {r['mode']:7} {r['tile']:9} {r['error'][:80]}")
            continue
        print(f"{r['shape']:8} {r['type']:6} {r['mode']:7} {r['tile']:9} {r['us']:8.2f} {r['GBps']:7.0f} "
              f"{r.get('x_copy', r['GBps'] * 1e9 / bw):7.3f} {r.get('x_bf16_time', 1.0):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
