"""Automatic task fusion (docs/ARCHITECTURE.md, "Automatic task fusion"), in the order it builds:

- :mod:`.chains`: the candidates (loops whose calls carry a region between iterations);
- :mod:`.inline`: a member call's callee copied into the fused function's names;
- :mod:`.union`: a region's parameter of the fused function (the union of a moving region's
  iterations);
- :mod:`.promote`: regions written and read again kept on chip as state tiles;
- :mod:`.fuse_build`: the fused InCore function made from its members;
- :mod:`.fuse`: the pass (:func:`~.fuse.fuse`) and its report.

Each module imports only those above it in this list (and the expansion's prover,
:mod:`pto.passes.expansion`).
"""
