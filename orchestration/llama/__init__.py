"""One LLaMA-family decoder layer as a tiled task graph: the ``llama7b`` and ``llama`` programs.

- :mod:`.config`: the layer's dimensions (:class:`~.config.LlamaConfig`, ``CONFIGS``) and the
  attention modes; :mod:`.hf`: a Hugging Face config.json as a ``LlamaConfig``;
  :mod:`.weights`: one layer's weights from a safetensors checkpoint;
- :mod:`.tiling`: tile sizes from the target's on-chip memory, the InCore functions built with
  them, and which layer (:class:`~.tiling.LayerForm`);
- :mod:`.llama7b`: the orchestration (``build_module``);
- :mod:`.reference`: the independent torch reference, RoPE tables and flops;
- :mod:`.counts`: exact task and edge counts in closed form (docs/ESTIMATE.md);
- :mod:`.program`: the :class:`pto.program.Program` registered as ``llama7b`` (``PROGRAM``) and
  as ``llama`` (``FAMILY``), and ``layer_module``, the layer's builder as the programs build it.
"""
