"""A whole LLaMA-family model for text generation: checkpoints, tokenizer, chat template, and the
plain-torch reference model with a KV cache that the task-graph decode program is checked
against. Nothing here depends on the task-graph machinery.

A model comes from a GGUF file (llama.cpp's format, quantized or not) or a Hugging Face folder
(config.json, safetensors, tokenizer.json); every loader takes either path and tells them apart.

- :mod:`.config`: :class:`~.config.ModelConfig` (the per-layer
  :class:`~pto.orchestration.llama.config.LlamaConfig` and the whole model's vocabulary, layer
  count, tied embeddings, end tokens, context) -- :func:`~.config.load_config`;
- :mod:`.checkpoint`: :class:`~.checkpoint.ModelWeights` in the layer program's layout, in the
  dtype asked for -- :func:`~.checkpoint.load_weights`;
- :mod:`.tokenizer`: :class:`~.tokenizer.Tokenizer` (encode, decode, chat template) and
  :class:`~.tokenizer.StreamDecoder` -- :func:`~.tokenizer.load_tokenizer`; :mod:`.chat` renders
  chat templates;
- :mod:`.reference`: :class:`~.reference.ReferenceModel` (prefill, decode_step, generate) over an
  explicit :class:`~.reference.KVCache`; :mod:`.sampling`: :class:`~.sampling.Sampler`;
- :mod:`.gguf_file`: GGUF metadata and tensors through the ``gguf`` package.

The optional packages (``gguf``, ``tokenizers``, ``jinja2``: the ``model`` extra) are imported
when a file is read, so importing this package needs none of them.

Example::

    from pto.orchestration.model import load_weights, load_tokenizer, ReferenceModel, Sampler

    weights = load_weights("SmolLM2-135M-Instruct.Q4_1.gguf", torch.float32)
    tok = load_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
    model = ReferenceModel(weights)
    prompt = tok.encode_chat([{"role": "user", "content": "Hi!"}])
    stream = tok.stream()
    for step in model.generate_steps([prompt], 32, Sampler()):
        if step[0] is not None:
            print(stream.push(step[0]), end="")
    print(stream.flush())
"""

from pto.orchestration.model.checkpoint import ModelWeights, load_weights
from pto.orchestration.model.config import ModelConfig, load_config
from pto.orchestration.model.reference import KVCache, ReferenceModel, pad_prompts
from pto.orchestration.llm.sampling import Sampler
from pto.orchestration.llm.tokenizer import StreamDecoder, Tokenizer, load_tokenizer

__all__ = ["ModelConfig", "load_config", "ModelWeights", "load_weights", "KVCache", "ReferenceModel", "pad_prompts"]
