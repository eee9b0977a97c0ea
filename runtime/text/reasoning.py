"""Split generated text into the reasoning channel and the answer (product spec 7.3).

With thinking on, the generation prompt already opened `<think>`, so output starts as reasoning and
switches to the answer at `</think>`; the marker is dropped and the answer's leading whitespace is
stripped. A marker split across chunks is held back until it is decided. A model that opens
`<think>` itself at the start has that marker dropped too. With thinking off everything is answer.
"""

from __future__ import annotations

__all__ = ["ReasoningSplitter", "split_reasoning"]

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
_ASCII_WS = " \t\n\r\x0b\x0c"

_START, _REASONING, _ANSWER_START, _ANSWER = range(4)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[len(text) - size :]):
            return size
    return 0


class ReasoningSplitter:
    """Streaming splitter: `push(text) -> (reasoning_delta, answer_delta)`, then `flush()`."""

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self._state = _START if thinking else _ANSWER
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        """Whether the next text still belongs to the reasoning channel."""
        return self._state in (_START, _REASONING)

    def push(self, text: str) -> tuple[str, str]:
        """Route `text`; returns the newly decided reasoning and answer text."""
        reasoning: list[str] = []
        answer: list[str] = []
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._state == _START:
                body = buffer.lstrip(_ASCII_WS)
                if body.startswith(OPEN_TAG):
                    buffer = body[len(OPEN_TAG) :]
                    self._state = _REASONING
                elif OPEN_TAG.startswith(body):
                    self._held = buffer  # whitespace and maybe the start of `<think>`
                    buffer = ""
                else:
                    self._state = _REASONING
            elif self._state == _REASONING:
                at = buffer.find(CLOSE_TAG)
                if at >= 0:
                    reasoning.append(buffer[:at])
                    buffer = buffer[at + len(CLOSE_TAG) :]
                    self._state = _ANSWER_START
                else:
                    keep = _partial_suffix(buffer, CLOSE_TAG)
                    reasoning.append(buffer[: len(buffer) - keep])
                    self._held = buffer[len(buffer) - keep :]
                    buffer = ""
            elif self._state == _ANSWER_START:
                buffer = buffer.lstrip(_ASCII_WS)
                if buffer:
                    self._state = _ANSWER
            else:
                answer.append(buffer)
                buffer = ""
        return "".join(reasoning), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """End of output: a held partial marker is reasoning text after all."""
        held, self._held = self._held, ""
        return (held, "") if self._state in (_START, _REASONING) else ("", held)


def split_reasoning(text: str, thinking: bool = True) -> tuple[str, str]:
    """Batch form: `(reasoning, answer)` of a complete output."""
    splitter = ReasoningSplitter(thinking)
    reasoning, answer = splitter.push(text)
    tail_reasoning, tail_answer = splitter.flush()
    return reasoning + tail_reasoning, answer + tail_answer
