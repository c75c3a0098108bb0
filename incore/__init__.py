"""InCore function library (installs as ``pto.incore``): tile kernels written with the builder,
one module per op family, usable by any program.

- :mod:`.matmul`: GEMM blocks and row-tile x weight matmuls (plain, residual and SwiGLU epilogues);
- :mod:`.attention`: flash attention (split, pair and fused granularities);
- :mod:`.norm`: RMSNorm; :mod:`.rope`: rotary embedding; :mod:`.softmax`: row softmax;
- :mod:`.elementwise`: residual add and SwiGLU of two row tiles;
- :mod:`.gemv` and :mod:`.decode`: a decode step's projections and the rest of its tasks;
  :mod:`.dequantize`: a quantized matrix made dense.

Each module exposes factories that build an InCore function for a dtype and sizes; the tile
height is a dim (``R``) so one definition yields every tile-height variant.
"""
