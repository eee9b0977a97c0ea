"""Constrained output through llguidance: JSON (schema) answers and forced tool calls.

The grammar library builds the token masks; this module only writes grammars (llguidance's own
JSON-schema compiler, or a Lark grammar of the Qwen tool-call layout whose argument values are
llguidance `%json` schemas) and applies them through `GenerationParams.allowed_tokens`.

`OutputController` is the per-request mask callback the engine calls before sampling each token.
It also enforces the thinking budget: when the reasoning has used its tokens without closing
`</think>`, the next tokens are forced one by one (a one-token mask) to Qwen's early-close text,
so the model goes on to answer (product spec 7.4). Grammars apply to the answer only, after the
reasoning closed.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..text import Tokenizer
from .errors import ApiError, bad_request

THINK_CLOSE = "</think>"
# Qwen's standard text for closing a reasoning cut short by the budget.
BUDGET_CLOSE_TEXT = ("\n\nConsidering the limited time by the user, I have to give the solution based on the "
                     "thinking directly now.\n</think>\n\n")
_NO_WS = {"whitespace_flexible": False}


def _lark_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _string_types(schema: Any) -> bool:
    """Whether a parameter is written raw (its schema admits strings), as the parser reads it."""
    if not isinstance(schema, Mapping):
        return False
    declared = schema.get("type")
    if declared == "string" or (isinstance(declared, list) and "string" in declared):
        return True
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and any(isinstance(o, Mapping) and o.get("type") == "string" for o in options):
            return True
    return False


class Grammars:
    """Grammar compilation for one tokenizer (the llguidance tokenizer is built once, lazily)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._ll_tokenizer = None
        self._lock = threading.Lock()
        self.think_close_id = self._single_token(THINK_CLOSE)

    def _single_token(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text)
        return ids[0] if len(ids) == 1 else None

    @property
    def ll_tokenizer(self):
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance

                self._ll_tokenizer = llguidance.LLTokenizer(
                    self.tokenizer.backend.to_str(), n_vocab=self.vocab_size,
                    eos_token=self.eos_token_ids or None)
            return self._ll_tokenizer

    def _check(self, grammar: str, what: str, param: str) -> str:
        import llguidance

        try:
            error = llguidance.LLMatcher.validate_grammar(grammar, self.ll_tokenizer)
        except Exception as exc:  # noqa: BLE001 - whatever the client's schema breaks is a 400
            error = str(exc) or type(exc).__name__
        if error and not error.startswith("WARNING"):
            raise bad_request(f"{what} cannot be used for constrained output: {error.splitlines()[0]}", param)
        return grammar

    def json_schema(self, schema: Any, param: str = "response_format") -> str:
        """A grammar for JSON text matching `schema` (`{"type": "object"}` for JSON mode)."""
        import llguidance

        if not isinstance(schema, dict | bool):
            raise bad_request("the JSON schema must be an object", param)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_NO_WS)
        except Exception as exc:  # noqa: BLE001 - see _check
            raise bad_request(f"invalid JSON schema: {exc}", param) from None
        return self._check(grammar, "the JSON schema", param)

    def _token_or_text(self, text: str) -> str:
        token = self._single_token(text)
        if token is not None and self.tokenizer.added_tokens.get(token) == text:
            return f"<[{token}]>"  # llguidance matches added tokens only as themselves
        return _lark_literal(text)

    def tool_calls(self, tools: Sequence[Mapping[str, Any]], parallel: bool) -> str:
        """A grammar for one (or, with `parallel`, several) Qwen tool-call blocks over `tools`."""
        rules = []
        call_open, call_close = self._token_or_text("<tool_call>"), self._token_or_text("</tool_call>")
        names = []
        for i, tool in enumerate(tools):
            fn = tool["function"]
            schema = fn.get("parameters") or {}
            props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
            required = set(schema.get("required") or []) if isinstance(schema.get("required"), list) else set()
            parts = [_lark_literal(f"<function={fn['name']}>\n")]
            for j, (key, prop) in enumerate(props.items()):
                if not isinstance(key, str) or not key or any(c in key for c in "<>\r\n"):
                    raise bad_request(f"tool {fn['name']!r}: parameter name {key!r} cannot be written in the "
                                      "tool-call format", "tools")
                rule = f"f{i}_p{j}"
                rules.append(f"{rule}: {_lark_literal(f'<parameter={key}>' + chr(10))} {self._value(prop)}")
                parts.append(rule if key in required else f"{rule}?")
            rules.append(f"f{i}: " + " ".join(parts))
            names.append(f"f{i}")
        rules.insert(0, f"call: {call_open} \"\\n\" ({' | '.join(names)}) \"</function>\\n\" {call_close}")
        rules.insert(0, 'start: call ("\\n" call)*' if parallel else "start: call")
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(rules))
        return self._check(grammar, "the tool parameter schemas", "tools")

    def _value(self, prop: Any) -> str:
        """Lark for one parameter value and its closing marker."""
        close = _lark_literal("</parameter>\n")
        if _string_types(prop):
            enum = prop.get("enum") if isinstance(prop, Mapping) else None
            if isinstance(enum, list) and enum and all(isinstance(e, str) and "<" not in e for e in enum):
                return "(" + " | ".join(_lark_literal(e + "\n") for e in enum) + f") {close}"
            lo = prop.get("minLength", 0) if isinstance(prop.get("minLength"), int) else 0
            hi = prop.get("maxLength") if isinstance(prop.get("maxLength"), int) else None
            # Raw text without '<' (the format has no escape), closed by </parameter>.
            counts = f"{{{max(lo, 0)},{hi}}}" if hi is not None else ("*" if lo <= 0 else f"{{{lo},}}")
            return f"/[^<]{counts}/ {close}"
        schema = dict(prop) if isinstance(prop, Mapping) else {}
        schema["x-guidance"] = _NO_WS
        return f"%json {json.dumps(schema, ensure_ascii=False)} \"\\n\" {close}"

    def matcher(self, grammar: str):
        import llguidance

        try:
            matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar)
        except Exception as exc:  # noqa: BLE001 - see _check
            raise ApiError(400, f"constrained output: {exc}") from None
        if matcher.is_error():
            raise ApiError(400, f"constrained output: {matcher.get_error()}")
        return matcher


class OutputController:
    """The `allowed_tokens` callback of one request: thinking budget, then the answer grammar.

    Called by the engine thread only, with the request's output ids so far; returns a boolean
    mask over the vocabulary, or None for "anything goes".
    """

    def __init__(self, vocab_size: int, *, reasoning: bool, think_close_id: int | None,
                 budget: int | None = None, close_ids: Sequence[int] = (), matcher: Any = None,
                 eos_ids: Sequence[int] = ()) -> None:
        self.vocab_size = vocab_size
        self.reasoning = reasoning and think_close_id is not None
        self.think_close_id = think_close_id
        self.budget = budget
        self.close_ids = list(close_ids)
        self.matcher = matcher
        self._no_eos = None
        if matcher is not None and eos_ids:
            # A grammar-bound answer must follow the reasoning, so the reasoning cannot end the output.
            self._no_eos = np.ones(vocab_size, bool)
            self._no_eos[[t for t in eos_ids if 0 <= t < vocab_size]] = False
        self.failed: str | None = None
        self.reasoning_tokens = 0
        self.forced_tokens = 0
        self._forced: deque[int] = deque()
        self._seen = 0

    def __call__(self, output: list[int]) -> np.ndarray | None:
        for token in output[self._seen:]:
            self._advance(token)
        self._seen = len(output)
        return self._mask()

    def _advance(self, token: int) -> None:
        if self._forced:
            expected = self._forced.popleft()
            if token != expected:
                self._forced.clear()
            if token == self.think_close_id:
                self.reasoning = False
            return
        if self.reasoning:
            self.reasoning_tokens += 1
            if token == self.think_close_id:
                self.reasoning = False
            return
        if self.matcher is not None and self.failed is None and not self.matcher.consume_token(token):
            self.failed = self.matcher.get_error() or "token rejected by the grammar"

    def _one_hot(self, token: int) -> np.ndarray:
        mask = np.zeros(self.vocab_size, bool)
        mask[token] = True
        self.forced_tokens += 1
        return mask

    def _mask(self) -> np.ndarray | None:
        if self._forced:
            return self._one_hot(self._forced[0])
        if self.reasoning:
            if self.budget is not None and self.reasoning_tokens >= self.budget and self.close_ids:
                self._forced.extend(self.close_ids)
                return self._one_hot(self._forced[0])
            return self._no_eos
        if self.matcher is None or self.failed is not None:
            return None
        import llguidance.numpy as llnp

        bitmask = llnp.allocate_token_bitmask(1, self.vocab_size)
        llnp.fill_next_token_bitmask(self.matcher, bitmask)
        if self.matcher.is_error():
            self.failed = self.matcher.get_error()
            return None
        bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[: self.vocab_size]
        return bits.astype(bool)
