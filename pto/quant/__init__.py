"""Quantized weights on torch tensors: the rows of planes of :mod:`pto.ir.quant`'s formats
packed and read (:mod:`.planes`), GGUF's blocks repacked (:mod:`.gguf_blocks`), pto's own
quantizers (:mod:`.quantize`) and a quantized matrix (:class:`QTensor`)."""

from pto.quant.gguf_blocks import format_of_gguf, from_gguf
from pto.quant.planes import dequantize_rows, dequantize_tiles, pack_rows
from pto.quant.quantize import quantize
from pto.quant.tensor import QTensor

__all__ = ["QTensor", "format_of_gguf", "from_gguf", "pack_rows", "dequantize_rows", "dequantize_tiles", "quantize"]
