"""The planes of quantized rows on torch tensors: packing fields into rows
(:func:`pack_rows`), reading a plane's values back per element (:func:`plane_values`), and the
format's dequantization run on them (:func:`dequantize_rows`, and the tile evaluator's
:func:`dequantize_tiles`). The layout and the routines are :mod:`pto.ir.quant`'s.

A *field* is one plane's values before packing: ``rows x values`` integers (uint8 for unsigned,
int8 for signed planes, e4m3 bytes as uint8) or floats (float16, float32): a value per element,
per group of elements, or one per row (a header plane: ``rows x 1``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pto.ir.quant import Plane, QuantFormat, round_up

_FLOAT = {"f16": torch.float16, "f32": torch.float32}


def _dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with unit stride along its last dim (what viewing it as another dtype needs)."""
    if t.is_contiguous() and (t.dim() == 0 or t.stride(-1) == 1):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _field_bytes(p: Plane, v: torch.Tensor) -> torch.Tensor:
    """A field's values as the plane's bytes (rows x bytes)."""
    if p.kind in _FLOAT:
        return _dense(v.to(_FLOAT[p.kind])).view(torch.uint8)
    v = _dense(v).view(torch.uint8) if v.dtype == torch.int8 else v.to(torch.uint8)
    if p.bits == 8:
        return v
    per = 8 // p.bits  # values per byte, the first in the lowest bits
    shifts = torch.arange(per, device=v.device, dtype=torch.uint8) * p.bits
    parts = (v.view(v.shape[0], -1, per) & ((1 << p.bits) - 1)) << shifts
    return parts.sum(-1, dtype=torch.int32).to(torch.uint8)  # disjoint bits: the sum is the or


def pack_rows(fmt: QuantFormat, fields: dict[str, torch.Tensor], cols: int) -> torch.Tensor:
    """The ``rows x row_bytes`` uint8 rows of ``fields`` (one per plane of ``fmt``)."""
    fmt.check_cols(cols)
    parts = [_field_bytes(p, fields[p.name]) for p in fmt.planes if p.header]
    rows = next(iter(fields.values())).shape[0]
    dev = next(iter(fields.values())).device
    if parts:
        head = torch.cat(parts, 1)
        parts = [head, torch.zeros(rows, fmt.header_bytes - head.shape[1], dtype=torch.uint8, device=dev)]
    body = []
    for p in fmt.planes:
        pair = fmt.pair_of(p.name)
        if p.header or (pair and pair[1] == p.name):
            continue
        b = _field_bytes(p, fields[p.name])
        if pair:  # interleaved: a value of the first, then the second's
            v, second = p.bits // 8, _field_bytes(fmt.plane(pair[1]), fields[pair[1]])
            b = torch.stack((b.view(rows, -1, v), second.view(rows, -1, v)), 2).reshape(rows, -1)
        body.append(b)
    size = sum(b.shape[1] for b in body)
    body.append(torch.zeros(rows, round_up(size) - size, dtype=torch.uint8, device=dev))
    out = torch.cat(parts + body, 1)
    assert out.shape[1] == fmt.row_bytes(cols)
    return out.contiguous()


#: fetch(byte offsets into a row, a long tensor ``[..., W]``) -> those bytes of the rows read
Fetch = Callable[[torch.Tensor], torch.Tensor]


def plane_values(fmt: QuantFormat, fetch: Fetch, blocks: int, c0, c: int, device,
                 clamp: bool = False) -> dict[str, torch.Tensor]:
    """Every plane's f32 value at each of the ``c`` elements from column ``c0`` (an int, or an
    ``M x 1`` long tensor: one per instance; a multiple of the block) of rows of ``blocks``
    blocks: ``{name: [..., c]}``, the leading dims ``fetch``'s. ``clamp``: the elements may run
    past the row's end (their values are then unspecified, finite where the planes' are)."""
    out = {}
    for p in fmt.planes:
        off = fmt.plane_offset(p.name, blocks)
        vbytes = max(p.bits // 8, 1)
        if p.header:
            raw = fetch(off + torch.arange(vbytes, device=device))
        else:
            stride = vbytes if p.group == 1 else fmt.stride(p.name)  # (a pair's values interleaved)
            if p.group == 1 and p.bits < 8:
                local = c0 * p.bits // 8 + torch.arange(c * p.bits // 8, device=device)
            else:
                each = torch.arange(c // p.group, device=device)[:, None] * stride + torch.arange(vbytes, device=device)
                local = (c0 // p.group) * stride + each.reshape(-1)
            if clamp:  # a tile past the row's last block reads the plane's last bytes again (masked)
                last = blocks * p.block_bytes(fmt.block) if p.group == 1 else \
                    (blocks * fmt.block // p.group - 1) * stride + vbytes
                local = local.clamp(0, last - 1)
            raw = fetch(off + local)
        out[p.name] = _values(p, raw, c)
    return out


def _values(p: Plane, raw: torch.Tensor, c: int) -> torch.Tensor:
    """f32 values of the plane's bytes ``raw`` ``[..., W]``, one per element (``[..., c]``)."""
    lead = raw.shape[:-1]
    if p.bits < 8:
        per = 8 // p.bits
        shifts = torch.arange(per, device=raw.device, dtype=torch.uint8) * p.bits
        v = ((raw.unsqueeze(-1) >> shifts) & ((1 << p.bits) - 1)).reshape(*lead, -1).float()
    elif p.kind in _FLOAT:
        v = _dense(raw).view(_FLOAT[p.kind]).float()
    elif p.kind == "e4m3":
        v = _dense(raw).view(torch.float8_e4m3fn).float()
    elif p.kind == "i":
        v = _dense(raw).view(torch.int8).float()
    else:
        v = raw.float()
    if p.header:
        return v.expand(*lead, c)
    if p.group > 1:
        v = v.repeat_interleave(p.group, dim=-1)
    return v


def row_values(fmt: QuantFormat, data: torch.Tensor, cols: int, c0: int = 0,
               c: int | None = None) -> dict[str, torch.Tensor]:
    """Every plane's f32 value at columns ``[c0, c0 + c)`` (all by default) of every row of
    ``data`` (``rows x row_bytes`` uint8, a matrix of ``cols`` columns in ``fmt``): ``{name:
    [rows, c]}`` (:func:`plane_values` of whole rows)."""
    c = cols - c0 if c is None else c

    def fetch(offs: torch.Tensor) -> torch.Tensor:
        lo, n = int(offs.reshape(-1)[0]), offs.shape[-1]
        if int(offs.reshape(-1)[-1]) == lo + n - 1:  # offsets of one run: a slice, no gather
            return data[:, lo:lo + n]
        return data[:, offs.reshape(-1)]  # (a pair's plane: every other value)

    return plane_values(fmt, fetch, cols // fmt.block, c0, c, data.device)


def dequantize_rows(fmt: QuantFormat, data: torch.Tensor, cols: int, c0: int = 0, c: int | None = None) -> torch.Tensor:
    """The f32 values of columns ``[c0, c0 + c)`` (all by default) of every row of ``data``
    (``rows x row_bytes`` uint8, a matrix of ``cols`` columns in ``fmt``)."""
    return fmt.dequantize(row_values(fmt, data, cols, c0, c))


def dequantize_parts(fmt: QuantFormat, data: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's f32 values (:func:`dequantize_rows`) in the two parts of the format's affine
    form: ``A * E`` (the part proportional to the element planes' fields) and ``B`` (the values
    with every field zero: a minimum, an offset); their sum is the values."""
    vals = row_values(fmt, data, cols)
    whole = fmt.dequantize(vals)
    const = fmt.dequantize({n: torch.zeros_like(v) if fmt.plane(n).group == 1 else v for n, v in vals.items()})
    return whole - const, const


def dequantize_tiles(fmt: QuantFormat, data: torch.Tensor, cols: int, rows: torch.Tensor,
                     c0: torch.Tensor, c: int) -> torch.Tensor:
    """The tile evaluator's load: for each of M instances the ``r x c`` f32 tile of rows ``rows``
    (``M x r``, inside the tensor) from column ``c0`` (``M``, multiples of the block inside the
    row; the tile's columns past the row's end are unspecified) of ``data``."""
    blocks = cols // fmt.block
    starts = rows * data.shape[1]  # flat index of each row's first byte
    flat = data.reshape(-1)

    def fetch(offs: torch.Tensor) -> torch.Tensor:
        if offs.dim() == 1:
            offs = offs.view(1, -1)
        return flat[starts.unsqueeze(-1) + offs.unsqueeze(1)]  # M x r x W

    return fmt.dequantize(plane_values(fmt, fetch, blocks, c0.view(-1, 1), c, data.device, clamp=True))


__all__ = ["pack_rows", "plane_values", "row_values", "dequantize_rows", "dequantize_parts", "dequantize_tiles"]
