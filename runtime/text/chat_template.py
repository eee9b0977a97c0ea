"""Render an artifact's Jinja chat template exactly as `transformers` `apply_chat_template` does.

The prompt a model was trained on is defined by its template as transformers renders it, so the
environment here matches transformers 5.x: an immutable sandbox with `trim_blocks`/`lstrip_blocks`,
the loop-control extension, a `{% generation %}` block tag, a `tojson` filter that does not escape
HTML, `raise_exception`, `strftime_now`, restricted `dict`/`namespace` globals, and the same
variables (messages with None-valued keys dropped and reasoning aliases filled, tools, documents,
add_generation_prompt, the named special tokens, then the caller's extra keyword arguments).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError"]

# Names a message's reasoning may come under; templates read `reasoning_content` (gpt-oss: `thinking`).
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """The chat template failed to compile or raised while rendering (message says which)."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; render the body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Same parameters, in the same order, as transformers' override (not Jinja's HTML-safe filter).
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` for templates without exposing the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore-prefixed attributes (sandbox hardening)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - mirrors Namespace's signature
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore-prefixed namespace attributes ({name!r})"
            )


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def _plain(value: Any) -> Any:
    """Deep copy into plain JSON-like types, so the sandboxed template sees only data."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    prepared = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"message {index} must be an object, got {type(message).__name__}"
            )
        # None-valued keys are dropped (templates handle a missing key, not `None`).
        message = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_KEYS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        prepared.append(message)
    return prepared


class ChatTemplate:
    """A compiled chat template plus the special-token variables it is rendered with.

    `source` is the template text, or a mapping of named templates (`default`, `tool_use`, ...)
    as a tokenizer config may carry; `special_tokens` is `Tokenizer.special_tokens_map`.
    """

    def __init__(
        self, source: str | Mapping[str, str], special_tokens: Mapping[str, str] | None = None
    ) -> None:
        if isinstance(source, Mapping):
            self._templates = dict(source)
            if not self._templates:
                raise ChatTemplateError("no chat template given")
        elif isinstance(source, str):
            self._templates = {"default": source}
        else:
            raise ChatTemplateError(f"chat template must be a string, got {type(source).__name__}")
        self.special_tokens = dict(special_tokens or {})
        # Compile now, so syntax errors surface at load rather than at the first request.
        for name in self._templates:
            self._template(name)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """The template of a `Tokenizer` (its config or chat_template.jinja) with its special tokens."""
        if tokenizer.chat_template is None:
            raise ChatTemplateError("the tokenizer resources carry no chat template")
        return cls(tokenizer.chat_template, tokenizer.special_tokens_map)

    def _select(self, name: str | None, tools: Any) -> str:
        if name is not None:
            if name not in self._templates:
                raise ChatTemplateError(
                    f"no chat template named {name!r}; available: {sorted(self._templates)}"
                )
            return name
        if tools is not None and "tool_use" in self._templates:
            return "tool_use"
        if "default" in self._templates:
            return "default"
        raise ChatTemplateError(
            f"several chat templates and none named 'default': {sorted(self._templates)}"
        )

    def _template(self, name: str) -> jinja2.Template:
        try:
            return _compile(self._templates[name])
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"chat template {name!r} does not compile (line {exc.lineno}): {exc.message}"
            ) from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        *,
        documents: Sequence[Mapping[str, Any]] | None = None,
        template_name: str | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (extra kwargs such as `enable_thinking` reach the template)."""
        if not messages:
            raise ChatTemplateError("cannot render an empty conversation")
        name = self._select(template_name, tools)
        template = self._template(name)
        variables = _plain({**self.special_tokens, **kwargs})
        try:
            return template.render(
                messages=_prepare_messages(messages),
                tools=_plain(list(tools)) if tools is not None else None,
                documents=_plain(list(documents)) if documents is not None else None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            # raise_exception(...) and undefined-variable/security errors from the sandbox.
            raise ChatTemplateError(f"chat template {name!r} raised: {exc}") from exc
        except Exception as exc:
            raise ChatTemplateError(
                f"chat template {name!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
