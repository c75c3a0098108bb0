"""What pto compiles and keeps: where the caches live (:mod:`.cachedir`: ``$PTO_CACHE_DIR``,
checked once) and the content-hash-cached cffi compiler (:mod:`.cbuild`) that the runtime
binding and the generated orchestration C go through. Below the runtime and the backends;
imports nothing of pto but :mod:`pto.errors`.
"""
