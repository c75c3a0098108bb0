"""Orchestration programs (installs as ``pto.orchestration``): softmax, bgemm, llama7b.

Each module builds its module with the builder and registers a :class:`pto.programs.Program`
as ``PROGRAM`` (inputs, scalars and an independent torch reference).
"""
