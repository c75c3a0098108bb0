"""The reference interpreter: orchestration functions in program order (:mod:`.orchestration`),
their InCore functions through the reference tile evaluator (:mod:`.incore`, :mod:`pto.evaluator`):
the oracle of every other stage."""
