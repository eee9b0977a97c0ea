"""Validation shared by the endpoints: typed field readers, sampling resolution, token limits.

A request body is untrusted JSON, so every field is read through a reader that checks its type
and range and raises a 400 naming the field; nothing reaches the engine that could make it fail
with a 500. JSON `null` counts as "not given" (many clients send it for unset fields).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..sampling import SamplingParams
from .errors import ApiError, bad_request

_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
               dict: "an object"}


def _present(body: Mapping[str, Any], name: str) -> bool:
    return body.get(name) is not None


def opt_bool(body: Mapping[str, Any], name: str, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise bad_request(f"{param or name} must be a boolean", param or name)
    return value


def opt_int(body: Mapping[str, Any], name: str, lo: int | None = None, hi: int | None = None,
            param: str | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    label = param or name
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{label} must be an integer", label)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise bad_request(f"{label} must be in {rng}, got {value}", label)
    return value


def opt_number(body: Mapping[str, Any], name: str, lo: float, hi: float, *, lo_open: bool = False,
               param: str | None = None) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    label = param or name
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{label} must be a number", label)
    value = float(value)
    if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
        raise bad_request(f"{label} must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value:g}", label)
    return value


def opt_str(body: Mapping[str, Any], name: str, param: str | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"{param or name} must be a string", param or name)
    return value


def opt_type(body: Mapping[str, Any], name: str, kind: type, param: str | None = None) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"{param or name} must be {_TYPE_NAMES.get(kind, kind.__name__)}", param or name)
    return value


def stop_strings(value: Any, param: str, limit: int = 16) -> tuple[str, ...]:
    """A string or an array of strings; empty strings are ignored."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad_request(f"{param} must be a string or an array of strings", param)
    items = [s for s in items if s]
    if len(items) > limit:
        raise bad_request(f"{param} allows at most {limit} strings", param)
    return tuple(dict.fromkeys(items))


def token_ids(value: Any, param: str, vocab_size: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise bad_request(f"{param} must be an array of token ids", param)
    bad = [t for t in value if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"{param}: token id {bad[0]} is outside the vocabulary of {vocab_size}", param)
    return tuple(value)


# -- sampling ---------------------------------------------------------------------------------

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")


@dataclass(frozen=True)
class SamplingDefaults:
    """Startup defaults: configured values over the model's generation_config preset."""

    values: dict[str, float | int] = field(default_factory=dict)
    seed: int | None = None
    greedy: bool = False

    @classmethod
    def from_config(cls, sampling: Any, generation_config: Mapping[str, Any]) -> SamplingDefaults:
        neutral = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
                   "frequency_penalty": 0.0, "repetition_penalty": 1.0}
        values = {}
        for key, fallback in neutral.items():
            configured = getattr(sampling, key)
            preset = generation_config.get(key)
            if configured is not None:
                values[key] = configured
            elif isinstance(preset, int | float) and not isinstance(preset, bool):
                values[key] = preset
            else:
                values[key] = fallback
        if not generation_config.get("do_sample", True) and sampling.temperature is None:
            values["temperature"] = 0.0
        return cls(values, sampling.seed, sampling.greedy)


def read_sampling(body: Mapping[str, Any], *, penalties: bool = True, seed: bool = True) -> dict[str, Any]:
    """The sampling fields a request gives, range-checked (product spec 3.6)."""
    out: dict[str, Any] = {}
    checks: list[tuple[str, Any]] = [
        ("temperature", lambda: opt_number(body, "temperature", 0.0, 2.0)),
        ("top_p", lambda: opt_number(body, "top_p", 0.0, 1.0)),
        ("top_k", lambda: opt_int(body, "top_k", -1, 2**31 - 1)),
        ("min_p", lambda: opt_number(body, "min_p", 0.0, 1.0)),
    ]
    if penalties:
        checks += [
            ("presence_penalty", lambda: opt_number(body, "presence_penalty", -2.0, 2.0)),
            ("frequency_penalty", lambda: opt_number(body, "frequency_penalty", -2.0, 2.0)),
            ("repetition_penalty", lambda: opt_number(body, "repetition_penalty", 0.0, 2.0, lo_open=True)),
        ]
    if seed:
        checks.append(("seed", lambda: opt_int(body, "seed", -(2**63), 2**64 - 1)))
    for key, read in checks:
        value = read()
        if value is not None:
            out[key] = value
    return out


def resolve_sampling(defaults: SamplingDefaults, given: Mapping[str, Any],
                     logprobs: int | None = None) -> SamplingParams:
    """Defaults < request fields < `greedy`; a seed is always fixed so the log can replay it."""
    values = dict(defaults.values)
    values.update({k: v for k, v in given.items() if k in SAMPLING_KEYS})
    if values["top_k"] < 0:
        values["top_k"] = 0  # vLLM spells "off" as -1
    seed = given.get("seed", defaults.seed)
    seed = secrets.randbits(63) if seed is None else seed & (2**64 - 1)
    if values["top_p"] <= 0.0:  # keep only the most likely token
        values["top_p"], values["top_k"] = 1.0, 1
    greedy = defaults.greedy
    if greedy or values["temperature"] < 1e-5:  # what users mean by a "zero" temperature
        values["temperature"] = 0.0
    try:
        return SamplingParams(temperature=float(values["temperature"]), top_p=float(values["top_p"]),
                              top_k=int(values["top_k"]), min_p=float(values["min_p"]),
                              presence_penalty=float(values["presence_penalty"]),
                              frequency_penalty=float(values["frequency_penalty"]),
                              repetition_penalty=float(values["repetition_penalty"]), seed=seed,
                              greedy=greedy, logprobs=logprobs)
    except ValueError as exc:  # SamplingError: a default from the model preset out of range
        raise ApiError(400, str(exc)) from None


def sampling_record(params: SamplingParams) -> dict[str, Any]:
    """The resolved sampler as logged."""
    return {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "min_p": params.min_p, "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty, "repetition_penalty": params.repetition_penalty,
            "seed": params.seed, "greedy": params.is_greedy}


def output_limit(requested: int | None, default: int, prompt_tokens: int, max_context: int) -> int:
    """Output tokens the request may use: asked for (or the default), within what the context leaves."""
    if prompt_tokens >= max_context:
        raise ApiError(400, f"the prompt has {prompt_tokens} tokens; the context limit is {max_context} "
                            "(prompt plus at least one output token)", code="context_length_exceeded",
                       param="messages")
    room = max_context - prompt_tokens
    return min(requested if requested is not None else default, room)
