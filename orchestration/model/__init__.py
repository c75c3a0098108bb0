"""A whole LLaMA-family model: what it is, its checkpoints, the plain-torch reference with a KV
cache, and its decode step as a program (``model``).

A model comes from a GGUF file (llama.cpp's format, quantized or not) or a Hugging Face folder
(config.json, safetensors); every loader takes either path and tells them apart.

- :mod:`.config`: :class:`~.config.ModelConfig` (the per-layer
  :class:`~pto.orchestration.llama.config.LlamaConfig` and the whole model's vocabulary, layer
  count, tied embeddings, end tokens, context) -- :func:`~.config.load_config`;
- :mod:`.checkpoint`: :class:`~.checkpoint.ModelWeights` in the layer program's layout, in the
  dtype asked for -- :func:`~.checkpoint.load_weights`; :mod:`.gguf_file`: GGUF metadata and
  tensors through the ``gguf`` package;
- :mod:`.reference`: :class:`~.reference.ReferenceModel` (prefill, decode_step, generate) over an
  explicit :class:`~.reference.KVCache` (the decode step's oracle);
- the decode step as one task graph: :mod:`.decode` (its builder, ``build_step``), :mod:`.tiling`
  (its block sizes, :class:`~.tiling.DecodeTiling`), :mod:`.program` (the ``model`` program).

The checkpoint formats live here, below the program, because the program reads them itself
(``pto run model --weights FILE``); the generation application (tokenizer, chat template,
sampling, the generation loop: ``pto generate``) is :mod:`pto.orchestration.llm`, above both.

The optional packages (``gguf``, ``tokenizers``, ``jinja2``: the ``model`` extra) are imported
when a file is read, so importing this package needs none of them.

Example::

    from pto.orchestration.model import load_weights, ReferenceModel

    weights = load_weights("SmolLM2-135M-Instruct.Q4_1.gguf", torch.float32)
    tokens = ReferenceModel(weights).generate([[1, 504, 3458]], 16)  # greedy
"""

from pto.orchestration.model.checkpoint import ModelWeights, load_weights
from pto.orchestration.model.config import ModelConfig, load_config
from pto.orchestration.model.reference import KVCache, ReferenceModel, pad_prompts

__all__ = ["ModelConfig", "load_config", "ModelWeights", "load_weights", "KVCache", "ReferenceModel", "pad_prompts"]
