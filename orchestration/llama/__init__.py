"""One LLaMA decoder layer as a tiled task graph: the ``llama7b`` program.

- :mod:`.config`: the model dimensions (:class:`~.config.LlamaConfig`, ``CONFIGS``) and the
  attention modes;
- :mod:`.tiling`: tile sizes from the target's on-chip memory and the InCore functions built
  with them;
- :mod:`.llama7b`: the orchestration (``build_module``);
- :mod:`.reference`: the independent torch reference, RoPE tables and flops;
- :mod:`.counts`: exact task and edge counts in closed form (docs/ESTIMATE.md);
- :mod:`.program`: the :class:`pto.program.Program` registered as ``llama7b`` (``PROGRAM``).
"""
