"""Passes over the IR, between the builders and code generation:

- :mod:`.tiling`: the SRAM check (a function's live tiles on the target's on-chip memory);
- :mod:`.collective`: the cut of a collective task around its sum over the ranks;
- :mod:`.expansion`: binary loop expansion and the proofs that make it exact;
- :mod:`.fusion`: automatic task fusion (which builds on the expansion's prover).

Passes import the IR and the machine's targets, nothing above them.
"""
