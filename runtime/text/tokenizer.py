"""The artifact's tokenizer, loaded from the bytes of its text resources.

An artifact ships `tokenizer.json` (the `tokenizers` pipeline), `tokenizer_config.json` (added tokens,
special flags, named special tokens, chat template), optionally `chat_template.jinja` and
`generation_config.json` (the stop ids). `Tokenizer` applies the config on top of the pipeline the
way `transformers` (5.x, `TokenizersBackend`) does when it loads the same files, so prompts get the
same ids here as in the reference stack, without importing `transformers` at serving time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as BackendTokenizer

__all__ = ["NAMED_SPECIAL_TOKENS", "Tokenizer", "TokenizerError", "byte_level_char_to_byte"]

# The named special-token attributes of transformers; `*_token` keys of the config join them.
NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_ADDED_TOKEN_FIELDS = ("content", "single_word", "lstrip", "rstrip", "normalized", "special")


class TokenizerError(ValueError):
    """A tokenizer resource is missing, malformed or inconsistent."""


def byte_level_char_to_byte() -> dict[str, int]:
    """Char -> byte table of the GPT-2 byte-level alphabet.

    Byte-level BPE spells every byte as one printable character: the printable Latin-1 bytes stand
    for themselves, the other 68 bytes are moved, in byte order, to the code points from U+0100 on.
    """
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept_set = set(kept)
    table = {chr(b): b for b in kept}
    moved = 0
    for b in range(256):
        if b not in kept_set:
            table[chr(0x100 + moved)] = b
            moved += 1
    return table


_CHAR_TO_BYTE = byte_level_char_to_byte()


def _load_json(data: bytes | str | None, what: str) -> dict[str, Any]:
    if data is None:
        return {}
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise TokenizerError(f"{what} must be a JSON object, got {type(obj).__name__}")
    return obj


def _added_token(value: Any, what: str, *, named: bool = False) -> AddedToken | str:
    """A config token value (string, or serialized AddedToken object) as transformers reads it."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        fields = {k: value[k] for k in _ADDED_TOKEN_FIELDS if k in value}
        content = fields.pop("content")
        if named and "special" not in value:
            fields["special"] = True
        return AddedToken(content, **fields)
    raise TokenizerError(
        f"tokenizer_config.json {what}: expected a token string or object, got {value!r}"
    )


class Tokenizer:
    """Encode/decode for one artifact: `tokenizers` pipeline + transformers-style config.

    Build it with `from_bytes` (artifact resources) or `from_dir` (a Hugging Face directory).
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        config: Mapping[str, Any] | None = None,
        generation_config: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> None:
        config = dict(config or {})
        self._backend = backend
        self._named: dict[str, AddedToken | str] = {}
        self._extra: list[AddedToken | str] = []
        self._read_special_tokens(config)
        self._apply_config(config)
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.chat_template = self._pick_chat_template(config, chat_template)
        self.eos_token_ids = self._read_eos_ids(dict(generation_config or {}))
        self.is_byte_level = type(backend.decoder).__name__ == "ByteLevel"
        self._model_type = type(backend.model).__name__
        self._bytes_cache: dict[int, bytes] = {}
        added = sorted(backend.get_added_tokens_decoder().items())
        self._special_ids = {i for i, tok in added if tok.special}
        self._added_ids: dict[str, int] = {}
        for i, tok in added:
            self._added_ids.setdefault(tok.content, i)

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_bytes(
        cls,
        tokenizer_json: bytes | str,
        tokenizer_config: bytes | str | None = None,
        generation_config: bytes | str | None = None,
        chat_template: bytes | str | None = None,
    ) -> Tokenizer:
        """Load from the raw bytes of the artifact's text resources (only tokenizer.json required)."""
        text = (
            tokenizer_json.decode("utf-8") if isinstance(tokenizer_json, bytes) else tokenizer_json
        )
        try:
            backend = BackendTokenizer.from_str(text)
        except Exception as exc:  # the Rust side raises a bare Exception
            raise TokenizerError(f"tokenizer.json cannot be loaded: {exc}") from exc
        if isinstance(chat_template, bytes):
            chat_template = chat_template.decode("utf-8")
        return cls(
            backend,
            _load_json(tokenizer_config, "tokenizer_config.json"),
            _load_json(generation_config, "generation_config.json"),
            chat_template,
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load the same four files from a Hugging Face style directory (missing ones skipped)."""
        root = Path(path)

        def read(name: str) -> bytes | None:
            file = root / name
            return file.read_bytes() if file.is_file() else None

        data = read("tokenizer.json")
        if data is None:
            raise TokenizerError(f"{root}: no tokenizer.json")
        return cls.from_bytes(
            data,
            read("tokenizer_config.json"),
            read("generation_config.json"),
            read("chat_template.jinja"),
        )

    def _read_special_tokens(self, config: dict[str, Any]) -> None:
        # Named tokens first (bos, eos, ...), then model-specific `*_token` keys, as transformers v5.
        added_by_content = {}
        for key, value in (config.get("added_tokens_decoder") or {}).items():
            token = _added_token(value, f"added_tokens_decoder[{key}]")
            added_by_content[str(token)] = token
        for key in NAMED_SPECIAL_TOKENS:
            if config.get(key) is not None:
                value = _added_token(config[key], key, named=True)
                self._named[key] = added_by_content.get(str(value), value)
        for key, value in config.items():
            if key.endswith("_token") and key not in self._named and isinstance(value, str):
                self._named[key] = value
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        if isinstance(extra, Mapping):
            for key, value in extra.items():
                self._named[key] = _added_token(value, f"extra_special_tokens.{key}", named=True)
        elif isinstance(extra, list):
            self._extra = [_added_token(v, "extra_special_tokens") for v in extra]
        else:
            raise TokenizerError(
                f"tokenizer_config.json extra_special_tokens: expected a list, got {extra!r}"
            )

    def _apply_config(self, config: dict[str, Any]) -> None:
        backend = self._backend
        # Serving never truncates or pads a prompt; a tokenizer.json may carry either setting.
        backend.no_truncation()
        backend.no_padding()
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        # transformers re-adds every added_tokens_decoder entry (in id order) with the config's
        # flags, then adds the special tokens that are not added tokens yet as special.
        decoder = config.get("added_tokens_decoder") or {}
        ordered = sorted(decoder.items(), key=lambda item: int(item[0]))
        to_add: list[AddedToken | str] = [
            _added_token(v, f"added_tokens_decoder[{k}]") for k, v in ordered
        ]
        known = {tok.content for tok in backend.get_added_tokens_decoder().values()}
        known.update(str(tok) for tok in to_add)
        named = {str(tok) for tok in self._named.values()}
        for tok in [*self._named.values(), *self._extra]:
            if str(tok) not in known and tok not in to_add:
                to_add.append(tok)
                known.add(str(tok))
        resolved = []
        for tok in to_add:
            if isinstance(tok, str):
                tok = AddedToken(tok, special=True)
            elif not tok.special and str(tok) in named:
                tok = AddedToken(tok.content, **{**_token_flags(tok), "special": True})
            resolved.append(tok)
        if resolved:
            backend.add_tokens(resolved)

    @staticmethod
    def _pick_chat_template(
        config: dict[str, Any], file_template: str | None
    ) -> str | dict[str, str] | None:
        # A chat_template.jinja file wins over the config entry, as in transformers.
        if file_template is not None:
            return file_template
        value = config.get("chat_template")
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            try:
                return {item["name"]: item["template"] for item in value}
            except (TypeError, KeyError) as exc:
                raise TokenizerError(
                    "tokenizer_config.json chat_template: list items need 'name' and 'template'"
                ) from exc
        if isinstance(value, Mapping):
            return dict(value)
        raise TokenizerError(
            f"tokenizer_config.json chat_template: unexpected {type(value).__name__}"
        )

    def _read_eos_ids(self, generation_config: dict[str, Any]) -> list[int]:
        value = generation_config.get("eos_token_id")
        if value is None:
            eos = self.eos_token_id
            return [] if eos is None else [eos]
        ids = value if isinstance(value, list) else [value]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise TokenizerError(
                f"generation_config.json eos_token_id: expected ids, got {value!r}"
            )
        return list(ids)

    # -- vocabulary -------------------------------------------------------------------------

    @property
    def backend(self) -> BackendTokenizer:
        """The configured `tokenizers.Tokenizer` (shared, do not reconfigure)."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """Named special tokens (`bos_token`, `eos_token`, ...), the chat template's extra variables."""
        return {key: str(tok) for key, tok in self._named.items()}

    @property
    def added_tokens(self) -> dict[int, str]:
        """Id -> content of the added tokens (control tokens, think and tool markers...)."""
        return {
            i: tok.content for i, tok in sorted(self._backend.get_added_tokens_decoder().items())
        }

    def _named_id(self, key: str) -> int | None:
        tok = self._named.get(key)
        return None if tok is None else self._backend.token_to_id(str(tok))

    @property
    def bos_token(self) -> str | None:
        tok = self._named.get("bos_token")
        return None if tok is None else str(tok)

    @property
    def eos_token(self) -> str | None:
        tok = self._named.get("eos_token")
        return None if tok is None else str(tok)

    @property
    def pad_token(self) -> str | None:
        tok = self._named.get("pad_token")
        return None if tok is None else str(tok)

    @property
    def bos_token_id(self) -> int | None:
        return self._named_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._named_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._named_id("pad_token")

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry or added token, spelled as stored (None when absent)."""
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def special_token_id(self, text: str) -> int:
        """Id of an added (control) token such as `<|im_end|>` or `</think>`; raises when unknown."""
        token_id = self._added_ids.get(text)
        if token_id is None:
            raise TokenizerError(f"{text!r} is not an added token of this tokenizer")
        return token_id

    def is_special(self, token_id: int) -> bool:
        """Whether `decode(..., skip_special_tokens=True)` drops this id."""
        return token_id in self._special_ids

    # -- encode / decode --------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of `text`; added tokens in the text are matched as such."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids` (invalid UTF-8 becomes U+FFFD), as transformers' `decode` gives it."""
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        # transformers ignores the clean-up for BPE models (it would corrupt spacing).
        if self.clean_up_tokenization_spaces and self._model_type != "BPE":
            text = _clean_up_tokenization(text)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id contributes to the decoded text (byte-level decoders only).

        The decoded text of a sequence is the lossy UTF-8 decoding of the concatenation of these,
        which is what lets a streaming detokenizer hold back an unfinished character.
        """
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        if not self.is_byte_level:
            raise TokenizerError("token_bytes needs a ByteLevel decoder")
        token = self._backend.id_to_token(token_id)
        if token is None:
            data = b""  # the backend skips unknown ids when decoding
        else:
            try:
                data = bytes(_CHAR_TO_BYTE[ch] for ch in token)
            except KeyError:
                # Like the ByteLevel decoder: a token outside the alphabet is taken as plain text.
                data = token.encode("utf-8")
        self._bytes_cache[token_id] = data
        return data


def _token_flags(tok: AddedToken) -> dict[str, bool]:
    return {k: getattr(tok, k) for k in _ADDED_TOKEN_FIELDS if k != "content"}


def _clean_up_tokenization(text: str) -> str:
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text
