"""Value kinds of configuration fields: how a TOML, environment or flag value is checked.

Each kind turns an input into the field's Python value or raises `Invalid` with what is wrong;
`expected` is the allowed-values text that every error message ends with. TOML values arrive
typed (and must have the right type: `true` is not an integer); environment variables and flags
arrive as text and go through `parse_text` first.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from fractions import Fraction
from pathlib import Path

AUTO = "auto"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_BYTES_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_BINARY_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


class Invalid(ValueError):
    """A value does not fit its field; the message says what is wrong with it."""


def parse_bytes(text: str) -> int:
    """'24GiB' -> 25769803776, '8GB' -> 8000000000, '4096' -> 4096 (KiB.. binary, KB.. decimal)."""
    match = _BYTES_RE.match(text.replace("_", ""))
    if not match or match.group(2).lower() not in _UNITS:
        raise Invalid("is not a byte size")
    size = Fraction(match.group(1)) * _UNITS[match.group(2).lower()]
    if size.denominator != 1:
        raise Invalid("is not a whole number of bytes")
    return int(size)


def format_bytes(n: int) -> str | int:
    """The largest binary unit that divides `n` exactly ('8GiB'), else the plain integer."""
    for name, size in _BINARY_UNITS:
        if n and n % size == 0:
            return f"{n // size}{name}"
    return n


def type_name(value: object) -> str:
    """The TOML name of a value's type, for wrong-type errors."""
    names = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}
    return names.get(type(value), type(value).__name__)


def _wrong_type(value: object) -> Invalid:
    return Invalid(f"has the wrong type ({type_name(value)})")


class Kind(ABC):
    """Base kind: `check` validates a typed value, `parse_text` reads one from text."""

    expected = "a value"
    metavar = "VALUE"

    @abstractmethod
    def check(self, value: object) -> object:
        """The field value for a typed (TOML or Python) input; raises Invalid."""

    def parse_text(self, text: str) -> object:
        return self.check(text)


class Int(Kind):
    def __init__(self, lo: int, hi: int, multiple_of: int = 1) -> None:
        self.lo, self.hi, self.multiple_of = lo, hi, multiple_of
        step = f", a multiple of {multiple_of}" if multiple_of > 1 else ""
        self.expected = f"an integer in {lo}..{hi}{step}"
        self.metavar = "N"

    def check(self, value: object) -> int:
        if type(value) is not int:
            raise _wrong_type(value)
        if not self.lo <= value <= self.hi:
            raise Invalid("is out of range")
        if value % self.multiple_of:
            raise Invalid(f"is not a multiple of {self.multiple_of}")
        return value

    def parse_text(self, text: str) -> int:
        try:
            number = int(text.strip())
        except ValueError:
            raise Invalid("is not an integer") from None
        return self.check(number)


class Float(Kind):
    """A number in [lo, hi] (or (lo, hi] with `lo_open`); TOML integers are accepted."""

    def __init__(self, lo: float, hi: float, lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open
        self.expected = f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        self.metavar = "X"

    def check(self, value: object) -> float:
        if type(value) not in (int, float):
            raise _wrong_type(value)
        value = float(value)
        low_ok = value > self.lo if self.lo_open else value >= self.lo
        if not (math.isfinite(value) and low_ok and value <= self.hi):
            raise Invalid("is out of range")
        return value

    def parse_text(self, text: str) -> float:
        try:
            number = float(text)
        except ValueError:
            raise Invalid("is not a number") from None
        return self.check(number)


class Bool(Kind):
    expected = "true or false"
    metavar = "BOOL"
    _TEXT = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}

    def check(self, value: object) -> bool:
        if type(value) is not bool:
            raise _wrong_type(value)
        return value

    def parse_text(self, text: str) -> bool:
        if text.strip().lower() not in self._TEXT:
            raise Invalid("is not a boolean")
        return self._TEXT[text.strip().lower()]


class Text(Kind):
    expected = "a non-empty string"
    metavar = "TEXT"

    def check(self, value: object) -> str:
        if type(value) is not str:
            raise _wrong_type(value)
        if not value:
            raise Invalid("is empty")
        return value


class PathValue(Text):
    """A file system path; `~` is expanded, relative paths stay relative to the working directory."""

    expected = "a path (non-empty string)"
    metavar = "PATH"

    def check(self, value: object) -> Path:
        return Path(super().check(str(value) if isinstance(value, Path) else value)).expanduser()


class Choice(Kind):
    def __init__(self, *values: str) -> None:
        self.values = values
        self.expected = "one of " + ", ".join(values)
        self.metavar = "[" + "|".join(values) + "]"

    def check(self, value: object) -> str:
        if type(value) is not str:
            raise _wrong_type(value)
        if value not in self.values:
            raise Invalid("is not allowed")
        return value


class Bytes(Kind):
    """A byte count: a TOML integer, or a string with a unit ("24GiB", "8GB", "512MiB")."""

    def __init__(self, lo: int = 0) -> None:
        self.lo = lo
        self.expected = f'a byte size of at least {lo}: an integer or a string such as "24GiB" or "8GB"'
        self.metavar = "BYTES"

    def check(self, value: object) -> int:
        if type(value) is str:
            value = parse_bytes(value)
        elif type(value) is not int:
            raise _wrong_type(value)
        if value < self.lo:
            raise Invalid("is out of range")
        return value

    def parse_text(self, text: str) -> int:
        return self.check(text)


class Auto(Kind):
    """The string "auto" (decided at startup) or a value of the inner kind."""

    def __init__(self, inner: Kind) -> None:
        self.inner = inner
        self.expected = f'"auto" or {inner.expected}'
        self.metavar = f"{inner.metavar}|auto"

    def check(self, value: object) -> object:
        return AUTO if value == AUTO else self.inner.check(value)

    def parse_text(self, text: str) -> object:
        return AUTO if text.strip() == AUTO else self.inner.parse_text(text)


class TextList(Kind):
    """An array of non-empty strings; as text, comma-separated."""

    expected = "an array of non-empty strings"
    metavar = "TEXT"

    def check(self, value: object) -> tuple[str, ...]:
        if type(value) not in (list, tuple) or any(type(v) is not str for v in value):
            raise _wrong_type(value)
        if not all(value):
            raise Invalid("holds an empty string")
        return tuple(value)

    def parse_text(self, text: str) -> tuple[str, ...]:
        return self.check([part.strip() for part in text.split(",")])
