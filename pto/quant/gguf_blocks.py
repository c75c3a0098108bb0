"""GGUF's blocks (llama.cpp's ``block_q4_0``, ..., ``block_q6_K``: each block's scales and
quantized values interleaved, as a file stores them) repacked into rows of planes
(:mod:`pto.ir.quant`), once, at load.

:func:`fields_from_gguf` decodes a matrix's blocks into fields (every quantized value and every
scale as its own integer or float, in element order); :func:`pack_rows` lays them out. Whether
the decoding is right is checked against the ``gguf`` package: the repacked rows dequantize to
``gguf.quants.dequantize``'s values bit for bit (tests/quant).
"""

from __future__ import annotations

import torch

from pto.ir.quant import BY_GGUF, QuantFormat
from pto.quant.planes import pack_rows


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte ``at`` of every block (``rows x blocks x bytes`` -> ``rows x blocks``)."""
    return b[..., at:at + 2].contiguous().view(torch.float16).squeeze(-1)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` bytes -> ``[..., 2n]`` values: the n low nibbles, then the n high ones."""
    return torch.cat([qs & 15, qs >> 4], -1)


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's 12 bytes of 6-bit scales and minimums -> 8 of each per block."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 63, (md & 15) | ((d >> 2) & 48)], -1)
    mn = torch.cat([m & 63, (md >> 4) | ((m >> 2) & 48)], -1)
    return sc, mn


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1)


def _q4_0(b):
    return {"q": _flat(_nibbles(b[..., 2:18])), "d": _f16(b, 0)}


def _q4_1(b):
    return {"q": _flat(_nibbles(b[..., 4:20])), "d": _f16(b, 0), "m": _f16(b, 2)}


def _q5_high(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0's and Q5_1's fifth bits: 4 bytes a block, a 32-bit little-endian word whose bit k is
    value k's (``[..., 4]`` -> ``[..., 32]``)."""
    bits = (qh.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8, device=qh.device)) & 1
    return bits.reshape(*qh.shape[:-1], 32)


def _q5_0(b):
    return {"ql": _flat(_nibbles(b[..., 6:22])), "qh": _flat(_q5_high(b[..., 2:6])), "d": _f16(b, 0)}


def _q5_1(b):
    return {"ql": _flat(_nibbles(b[..., 8:24])), "qh": _flat(_q5_high(b[..., 4:8])), "d": _f16(b, 0),
            "m": _f16(b, 2)}


def _q8_0(b):
    return {"q": _flat(b[..., 2:34].contiguous().view(torch.int8)), "d": _f16(b, 0)}


def _k_low(qs: torch.Tensor) -> torch.Tensor:
    """The 4 low bits of a k-quant's 256 values: 4 runs of 32 bytes, each the low nibbles of
    64 values then their high nibbles."""
    return _flat(_nibbles(qs.reshape(*qs.shape[:-1], 4, 32)))


def _q4_k(b):
    sc, m = _k_scales(b[..., 4:16])
    return {"q": _k_low(b[..., 16:144]), "sc": _flat(sc), "m": _flat(m), "d": _f16(b, 0), "dmin": _f16(b, 2)}


def _q5_k(b):
    sc, m = _k_scales(b[..., 4:16])
    qh = b[..., 16:48]  # bit j of byte l: value 32 j + l
    bits = (qh.unsqueeze(-2) >> torch.arange(8, dtype=torch.uint8, device=b.device).view(8, 1)) & 1
    return {"ql": _k_low(b[..., 48:176]), "qh": _flat(bits), "sc": _flat(sc), "m": _flat(m), "d": _f16(b, 0),
            "dmin": _f16(b, 2)}


def _q6_k(b):
    ql = b[..., 0:128].reshape(*b.shape[:-1], 2, 64)  # halves of 128 values: low nibbles, then high
    low = torch.stack([ql & 15, ql >> 4], -2)
    qh = b[..., 128:192].reshape(*b.shape[:-1], 2, 32)  # bits 2t, 2t + 1 of byte l: value 32 t + l of a half
    high = (qh.unsqueeze(-2) >> (2 * torch.arange(4, dtype=torch.uint8, device=b.device)).view(4, 1)) & 3
    return {"ql": _flat(low), "qh": _flat(high), "sc": _flat(b[..., 192:208].contiguous().view(torch.int8)),
            "d": _f16(b, 208)}


_DECODE = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k,
           "Q6_K": _q6_k}


def format_of_gguf(qtype: str) -> QuantFormat | None:
    """The format a GGUF type runs as natively (None: pto dequantizes it at load)."""
    return BY_GGUF.get(qtype) if qtype in _DECODE else None


def fields_from_gguf(fmt: QuantFormat, raw: torch.Tensor, cols: int) -> dict[str, torch.Tensor]:
    """The fields of a ``rows x cols`` matrix stored as GGUF blocks of ``fmt`` (``raw``: the
    file's bytes, ``rows x (cols / block * block bytes)`` uint8)."""
    fmt.check_cols(cols)
    blocks = raw.reshape(raw.shape[0], cols // fmt.block, fmt.gguf_block_bytes)
    return _DECODE[fmt.gguf](blocks)


def from_gguf(fmt: QuantFormat, raw: torch.Tensor, cols: int) -> torch.Tensor:
    """GGUF blocks of a ``rows x cols`` matrix repacked into rows of planes (``rows x
    row_bytes`` uint8)."""
    return pack_rows(fmt, fields_from_gguf(fmt, raw, cols), cols)


__all__ = ["format_of_gguf", "fields_from_gguf", "from_gguf"]
