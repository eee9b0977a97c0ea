"""Incremental decoding of generated ids into text pieces that never split a character.

Byte-level BPE can end a token in the middle of a UTF-8 sequence (an emoji is often 2-4 tokens), so
a streamed piece must wait until its last character is complete. For byte-level decoders each id
contributes fixed bytes (`Tokenizer.token_bytes`) and an incremental UTF-8 decoder holds back an
unfinished tail; other decoders fall back to re-decoding a short window of ids.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable

from .tokenizer import Tokenizer

__all__ = ["StreamingDetokenizer"]

_REPLACEMENT = "\ufffd"


class StreamingDetokenizer:
    """Feed ids one at a time; the concatenated pieces (plus `flush`) equal `tokenizer.decode(ids)`.

    `push` returns only newly completed text; `flush` ends the stream, emitting U+FFFD for an
    incomplete tail (a budget or stop cut inside a character), and resets for a new stream.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._byte_level = tokenizer.is_byte_level
        self._reset()

    def _reset(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids re-decoded only as context
        self._read = 0  # ids before this have had all their text emitted

    def push(self, token_id: int) -> str:
        """Text completed by `token_id` (often empty while a character is unfinished)."""
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        if self._byte_level:
            return self._utf8.decode(self._tokenizer.token_bytes(token_id))
        self._ids.append(token_id)
        before, after = self._window_texts()
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def push_many(self, token_ids: Iterable[int]) -> str:
        """`push` each id and join the pieces."""
        return "".join(self.push(i) for i in token_ids)

    def flush(self) -> str:
        """Remaining text (U+FFFD for an incomplete character); the detokenizer starts over."""
        if self._byte_level:
            tail = self._utf8.decode(b"", final=True)
        else:
            before, after = self._window_texts()
            tail = after[len(before) :]
        self._reset()
        return tail

    def _window_texts(self) -> tuple[str, str]:
        # Decoders such as Metaspace or WordPiece depend on the neighbouring token, so decode the
        # window with and without the unread ids and emit the difference.
        decode = self._tokenizer.decode
        window = self._ids[self._prefix :]
        before = decode(
            self._ids[self._prefix : self._read], skip_special_tokens=self._skip_special
        )
        return before, decode(window, skip_special_tokens=self._skip_special)
