"""StopMatcher: any chunking of a text gives the text cut before the first stop string."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer_runtime.text import StopMatcher


def run(stops: list[str], chunks: list[str]) -> tuple[str, bool, list[str]]:
    matcher = StopMatcher(stops)
    out: list[str] = []
    matched = False
    for chunk in chunks:
        emit, matched = matcher.push(chunk)
        out.append(emit)
    out.append(matcher.flush())
    return "".join(out), matched, out


def expected(text: str, stops: list[str]) -> tuple[str, bool]:
    """Cut before the stop string that is complete first (earliest end, then earliest start)."""
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s and s in text]
    return (text[: min(hits)[1]], True) if hits else (text, False)


@st.composite
def text_stops_and_split(draw):
    alphabet = st.sampled_from("ab<|>\n😀 ")
    stops = draw(st.lists(st.text(alphabet, max_size=5), max_size=4))
    pieces = draw(
        st.lists(
            st.one_of(st.text(alphabet, max_size=6), st.sampled_from(stops or ["x"])), max_size=8
        )
    )
    text = "".join(pieces)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return text, stops, chunks


@settings(max_examples=500, deadline=None)
@given(case=text_stops_and_split())
def test_any_chunking_truncates_before_first_completed_stop(case) -> None:
    text, stops, chunks = case
    output, matched, _ = run(stops, chunks)
    assert (output, matched) == expected(text, stops)


def test_stop_split_across_tokens_is_never_emitted() -> None:
    output, matched, pieces = run(["<|end|>"], ["Hello <", "|e", "nd", "|> tail"])
    assert output == "Hello " and matched
    assert pieces == ["Hello ", "", "", "", ""]


def test_false_start_is_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("go ST") == ("go ", False)
    assert matcher.held == "ST"
    assert matcher.push("ART") == ("START", False)
    assert matcher.push("ST") == ("", False)
    assert matcher.flush() == "ST"


def test_first_completed_stop_wins_and_later_pushes_are_empty() -> None:
    matcher = StopMatcher(["bc", "abcd", ""])
    assert matcher.push("xxabcd") == ("xxa", True)  # "bc" completes before "abcd"
    assert matcher.matched == "bc"
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""
    tie = StopMatcher(["bc", "xabc"])
    assert tie.push("xxabcd") == ("x", True)  # both end together: the earlier start wins
    assert tie.matched == "xabc"


def test_no_stop_strings_passes_through() -> None:
    matcher = StopMatcher(["", ""])
    assert matcher.push("abc") == ("abc", False)
    assert matcher.flush() == ""
