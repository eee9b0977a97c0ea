"""ReasoningSplitter: `<think>` channel split per product spec 7.3, chunking-independent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_runtime.text import ReasoningSplitter, split_reasoning

BATCH_CASES = [
    # (text, thinking, reasoning, answer)
    ("Let me think.</think>\n\nThe answer is 4.", True, "Let me think.", "The answer is 4."),
    ("still thinking when the budget ran out", True, "still thinking when the budget ran out", ""),
    ("</think>direct", True, "", "direct"),
    ("<think>\nself-opened\n</think>\n answer", True, "\nself-opened\n", "answer"),
    ("\n <think>x</think>y", True, "x", "y"),
    ("  not a marker <thinking", True, "  not a marker <thinking", ""),
    ("a</think>b</think>c", True, "a", "b</think>c"),
    ("r</think> \n\t ", True, "r", ""),
    ("<thi", True, "<thi", ""),
    ("r</thi", True, "r</thi", ""),
    ("plain <think>x</think> y", False, "", "plain <think>x</think> y"),
    ("", True, "", ""),
    ("", False, "", ""),
]


@pytest.mark.parametrize("text,thinking,reasoning,answer", BATCH_CASES)
def test_batch_split(text: str, thinking: bool, reasoning: str, answer: str) -> None:
    assert split_reasoning(text, thinking) == (reasoning, answer)


def _stream(chunks: list[str], thinking: bool) -> tuple[str, str]:
    splitter = ReasoningSplitter(thinking)
    reasoning, answer = [], []
    for chunk in [*chunks, None]:
        r, a = splitter.push(chunk) if chunk is not None else splitter.flush()
        reasoning.append(r)
        answer.append(a)
    return "".join(reasoning), "".join(answer)


@st.composite
def chunked_text(draw):
    pieces = draw(
        st.lists(
            st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", "a", " ", "\n", "😀"]),
            max_size=12,
        )
    )
    text = "".join(pieces)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    return text, [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@settings(max_examples=400, deadline=None)
@given(case=chunked_text(), thinking=st.booleans())
def test_any_chunking_matches_batch(case, thinking: bool) -> None:
    text, chunks = case
    assert _stream(chunks, thinking) == split_reasoning(text, thinking)


@pytest.mark.parametrize("text,thinking,reasoning,answer", BATCH_CASES)
def test_single_character_chunks_match_batch(
    text: str, thinking: bool, reasoning: str, answer: str
) -> None:
    assert _stream(list(text), thinking) == (reasoning, answer)


def test_partial_marker_is_held_then_resolved() -> None:
    splitter = ReasoningSplitter(thinking=True)
    assert splitter.in_reasoning
    assert splitter.push("step one</th") == ("step one", "")
    assert splitter.push("ink>") == ("", "")
    assert not splitter.in_reasoning
    assert splitter.push("\n\n") == ("", "")  # answer's leading whitespace is dropped
    assert splitter.push(" Answer</thi") == ("", "Answer</thi")
    assert splitter.flush() == ("", "")


def test_false_partial_marker_is_reasoning() -> None:
    splitter = ReasoningSplitter(thinking=True)
    assert splitter.push("a </t") == ("a ", "")
    assert splitter.push("able>") == ("</table>", "")


def test_thinking_off_is_all_answer() -> None:
    splitter = ReasoningSplitter(thinking=False)
    assert not splitter.in_reasoning
    assert splitter.push("  </think>x") == ("", "  </think>x")
