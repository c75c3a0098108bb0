"""Orchestration programs and the application that drives them (installs as
``pto.orchestration``): ``softmax.py``, ``bgemm.py``, the LLaMA layer's package ``llama/`` (the
programs ``llama7b`` and ``llama``), a whole model's package ``model/`` (its checkpoints, its
reference, and its decode step: the program ``model``) and the generation application ``llm/``
(``pto generate``).

Each program builds its module with the builder and exposes a :class:`pto.program.Program` as
``PROGRAM`` (inputs, scalars and an independent torch reference), registered through the
``pto.programs`` entry points of ``pyproject.toml``; the application is registered in the
``pto.generators`` group.
"""
