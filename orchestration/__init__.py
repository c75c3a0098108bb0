"""Orchestration programs (installs as ``pto.orchestration``): ``softmax.py``, ``bgemm.py`` and
the LLaMA layer's package ``llama/`` (the program ``llama7b``).

Each program builds its module with the builder and exposes a :class:`pto.program.Program` as
``PROGRAM`` (inputs, scalars and an independent torch reference), registered through the
``pto.programs`` entry points of ``pyproject.toml``.
"""
