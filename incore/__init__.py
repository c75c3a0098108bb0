"""InCore function library (installs as ``pto.incore``): tile kernels written with the builder.

Each module exposes factories that build an InCore function for a dtype and sizes; the tile
height is a dim (``R``) so one definition yields every tile-height variant.
"""
