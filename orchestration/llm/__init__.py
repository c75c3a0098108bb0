"""The text-generation application (``pto generate``), apart from the library and the programs,
as tinygrad's ``llm`` is: it uses the programs through their typed builders and runs them by the
engine's recipe; nothing imports it (the command finds it through the ``pto.generators`` entry
point, :mod:`pto.generation`).

- :mod:`.textgen`: the request in, the JSON-able result out (``GENERATOR``: what the command
  calls; ``run``, ``format_speed``);
- :mod:`.generate`: :class:`~.generate.Generator`: prefill through the layer program's module
  (its keys and values declared outputs), then the decode step's graph replayed per token;
- :mod:`.tokenizer`: :class:`~.tokenizer.Tokenizer` (encode, decode, chat template) and
  :class:`~.tokenizer.StreamDecoder` of a GGUF file or a Hugging Face folder; :mod:`.chat`
  renders chat templates; :mod:`.sampling`: :class:`~.sampling.Sampler` (temperature, top-k,
  top-p, seeded).

The checkpoints (configuration, weights) are read by :mod:`pto.orchestration.model`, which the
``model`` program shares.

Example::

    from pto.orchestration.llm.tokenizer import load_tokenizer
    from pto.orchestration.llm.sampling import Sampler
    from pto.orchestration.model import ReferenceModel, load_weights

    weights = load_weights("SmolLM2-135M-Instruct.Q4_1.gguf", torch.float32)
    tok = load_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
    prompt = tok.encode_chat([{"role": "user", "content": "Hi!"}])
    stream = tok.stream()
    for step in ReferenceModel(weights).generate_steps([prompt], 32, Sampler()):
        if step[0] is not None:
            print(stream.push(step[0]), end="")
    print(stream.flush())
"""
