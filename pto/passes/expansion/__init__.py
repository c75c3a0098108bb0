"""Binary loop expansion (docs/ARCHITECTURE.md, "Binary expansion") and its proofs:

- :mod:`.affine`: the small symbolic prover of affine offsets;
- :mod:`.merged_tiles`: merged iterations' tiles in order (the placement proof);
- :mod:`.independence`: merged iterations independent;
- :mod:`.binary_expansion`: the lowering (and ``strip_adaptive``, the ``--no-adaptive`` one).

Each module imports only those above it in this list. Fusion (:mod:`pto.passes.fusion`) reuses
the prover and the merged-loop proof.
"""
