"""pto's own quantizers, for weights that come as floats (a Hugging Face checkpoint's, random
ones): q8_0 and q4_0 with GGUF's block layouts and rounding (bit for bit those of the ``gguf``
package's reference quantizer, llama.cpp's ``quantize_row_q8_0_ref`` and ``q4_0``), and fp8
(E4M3, an f32 scale per row: the row's largest magnitude maps to 448, E4M3's largest finite
value; rounding to nearest even). Torch on any device, so a GPU quantizes a large model in
seconds.
"""

from __future__ import annotations

import torch

from pto.errors import UsageError
from pto.ir.quant import FORMATS, QuantFormat
from pto.quant.planes import pack_rows

E4M3_MAX = 448.0


def _roundf(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero, as C's roundf and gguf's ``np_roundf``, in x's dtype."""
    a = x.abs()
    fl = a.floor()
    return torch.sign(x) * (fl + (2 * (a - fl)).floor())


def _blocks(w: torch.Tensor, block: int) -> torch.Tensor:
    return w.to(torch.float32).reshape(w.shape[0], -1, block)


def _q8_0(w: torch.Tensor) -> dict:
    b = _blocks(w, 32)
    d = b.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = _roundf(b * inv).to(torch.int8)
    return {"q": q.reshape(w.shape[0], -1), "d": d.squeeze(-1).to(torch.float16)}


def _q4_0(w: torch.Tensor) -> dict:
    b = _blocks(w, 32)
    at = b.abs().argmax(-1, keepdim=True)  # the first of equal magnitudes, as numpy's argmax
    d = b.gather(-1, at) / -8
    inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    q = (b * inv + 8.5).trunc().clamp(0, 15).to(torch.uint8)
    return {"q": q.reshape(w.shape[0], -1), "d": d.squeeze(-1).to(torch.float16)}


def _fp8(w: torch.Tensor) -> dict:
    w = w.to(torch.float32)
    s = w.abs().amax(-1, keepdim=True) / E4M3_MAX
    s = torch.where(s == 0, torch.ones_like(s), s)
    q = (w / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    return {"q": q, "s": s}


QUANTIZERS = {"q8_0": _q8_0, "q4_0": _q4_0, "fp8": _fp8}


def quantize(fmt: QuantFormat | str, w: torch.Tensor) -> torch.Tensor:
    """The rows of planes (``rows x row_bytes`` uint8) of the float matrix ``w`` (``rows x
    cols``, blocks along the columns) quantized to ``fmt`` (q8_0, q4_0 or fp8)."""
    fmt = FORMATS[fmt] if isinstance(fmt, str) else fmt
    if fmt.name not in QUANTIZERS:
        raise UsageError(f"pto quantizes to {', '.join(QUANTIZERS)}, not {fmt.name} (a GGUF file keeps its own types)")
    fmt.check_cols(w.shape[1], f"a row of a {w.shape[0]} x {w.shape[1]} matrix")
    return pack_rows(fmt, QUANTIZERS[fmt.name](w), w.shape[1])


__all__ = ["quantize", "QUANTIZERS", "E4M3_MAX"]
