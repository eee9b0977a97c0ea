"""Resolve the startup configuration: defaults < config file < environment < flags.

`load_config` records, for every field, where its value came from ("default", "file:PATH:LINE",
"env:NAME", "flag:--name"), so `ninfer config show` and startup logs can say why a value is what
it is. All problems are collected before raising, so one run of `ninfer config validate` lists
every mistake in a file.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .model import DRAFT_RANGE, FIELDS, SECTIONS, Config, FieldSpec
from .values import Invalid

CONFIG_ENV = "NINFER_CONFIG"
MASK = "********"


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: `where` is "FILE:LINE", "FILE", "env NAME" or "flag --name"."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class ConfigError(ValueError):
    """The configuration is invalid; `issues` lists every problem found."""

    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(map(str, issues)))


@dataclass(frozen=True)
class ResolvedConfig:
    """The effective configuration, where each value came from, and the file read (if any)."""

    config: Config
    sources: Mapping[str, str]
    file: Path | None = None

    def value(self, key: str) -> object:
        section, name = key.split(".")
        return getattr(getattr(self.config, section), name)

    def source(self, key: str) -> str:
        return self.sources[key]

    def fields(self) -> Iterator[tuple[FieldSpec, object, str]]:
        """(field, value, source) for every field, in declaration order."""
        for key, spec in FIELDS.items():
            yield spec, self.value(key), self.sources[key]

    def to_dict(self, *, mask_secrets: bool = True) -> dict:
        """{"config_file", "components", "sections": {section: {name: {"value", "source"}}}}."""
        sections: dict[str, dict] = {name: {} for name in SECTIONS}
        for spec, value, source in self.fields():
            if spec.secret and mask_secrets and value is not None:
                value = MASK
            sections[spec.section][spec.name] = {"value": jsonable(value), "source": source}
        return {"config_file": str(self.file) if self.file else None,
                "components": list(self.config.components), "sections": sections}


def jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    return list(value) if isinstance(value, tuple) else value


def show_value(value: object) -> str:
    """A value the way TOML writes it, for messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return "{...}" if isinstance(value, dict) else str(value)


def load_config(path: Path | None, env: Mapping[str, str], overrides: Mapping[str, object], *,
                flag_names: Mapping[str, str] | None = None) -> ResolvedConfig:
    """The effective configuration of a `run`/`serve` process.

    `path` is the --config file (None: $NINFER_CONFIG if set, else no file). `env` is usually
    os.environ; only documented NINFER_* variables are read, empty ones count as unset.
    `overrides` maps "section.name" to flag values: None (flag not given) is skipped, strings are
    parsed like environment values, other values must have the field's type. `flag_names`
    replaces a field's flag in source labels (e.g. {"model.path": "MODEL"} for a positional).
    Raises ConfigError listing every problem.
    """
    values = {key: spec.default for key, spec in FIELDS.items()}
    sources = dict.fromkeys(FIELDS, "default")
    issues: list[ConfigIssue] = []

    def assign(spec: FieldSpec, raw: object, source: str, text: bool) -> None:
        try:
            values[spec.key] = spec.kind.parse_text(raw) if text else spec.kind.check(raw)
            sources[spec.key] = source
        except Invalid as e:
            issues.append(ConfigIssue(_where(source), _bad_value(spec, raw, e, text)))

    if path is None and env.get(CONFIG_ENV):
        path = Path(env[CONFIG_ENV])
    if path is not None:
        for spec, raw, source in _read_file(path, issues):
            assign(spec, raw, source, text=False)
    for spec in FIELDS.values():
        if spec.env and env.get(spec.env):
            assign(spec, env[spec.env], f"env:{spec.env}", text=True)
    for key, raw in overrides.items():
        if key not in FIELDS:
            issues.append(ConfigIssue("flags", f"unknown configuration key {key}{_suggest(key, FIELDS)}"))
        elif raw is not None and raw != ():
            label = (flag_names or {}).get(key) or FIELDS[key].flag
            assign(FIELDS[key], raw, f"flag:{label}", text=isinstance(raw, str))
    if not issues:
        issues = _cross_checks(values, sources)
    if issues:
        raise ConfigError(issues)
    config = Config(**{
        section: cls(**{f.name: values[f"{section}.{f.name}"] for f in dataclasses.fields(cls)})
        for section, cls in SECTIONS.items()
    })
    return ResolvedConfig(config, MappingProxyType(sources), path)


def _where(source: str) -> str:
    return source.removeprefix("file:") if source.startswith("file:") else source.replace(":", " ", 1)


def _bad_value(spec: FieldSpec, raw: object, e: Invalid, text: bool) -> str:
    """`key = value problem; expected ...`; text from env/flags is shown as typed, secrets masked."""
    shown = show_value(MASK) if spec.secret else raw if text else show_value(raw)
    return f"{spec.key} = {shown} {e}; expected {spec.kind.expected}"


def _suggest(word: str, choices: Mapping[str, object] | list[str]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


def _read_file(path: Path, issues: list[ConfigIssue]) -> Iterator[tuple[FieldSpec, object, str]]:
    """Yield (field, TOML value, "file:PATH:LINE") for every known key; report the rest."""
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except OSError as e:
        issues.append(ConfigIssue(str(path), f"cannot read the configuration file: {e.strerror or e}"))
        return
    except UnicodeDecodeError:
        issues.append(ConfigIssue(str(path), "the configuration file is not UTF-8 text"))
        return
    except tomllib.TOMLDecodeError as e:
        match = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        detail = re.sub(r"\s*\(at .*\)$", "", str(e))
        where = f"{path}:{match.group(1)}" if match else str(path)
        column = f" (column {match.group(2)})" if match else ""
        issues.append(ConfigIssue(where, f"invalid TOML{column}: {detail}"))
        return
    lines = _key_lines(text)

    def at(key: str) -> str:
        line = lines.get(key) or lines.get(key.split(".")[0])
        return f"{path}:{line}" if line else str(path)

    for section, table in data.items():
        if section not in SECTIONS:
            issues.append(ConfigIssue(at(section), _unknown_section(section, table)))
        elif not isinstance(table, dict):
            issues.append(ConfigIssue(at(section), f"{section} must be a table [{section}], not a {show_value(table)} value"))
        else:
            for name, raw in table.items():
                key = f"{section}.{name}"
                if key in FIELDS:
                    yield FIELDS[key], raw, f"file:{at(key)}"
                else:
                    issues.append(ConfigIssue(at(key), _unknown_key(section, name)))


def _unknown_section(section: str, value: object) -> str:
    if not isinstance(value, dict):
        owners = [key for key, spec in FIELDS.items() if spec.name == section]
        hint = f"; did you mean {owners[0]}?" if owners else ""
        return f"unknown top-level key {section} (settings belong in a section){hint}"
    hint = _suggest(section, SECTIONS).replace("mean ", "mean [").replace("?", "]?")
    return f"unknown section [{section}]{hint} (sections: {', '.join(SECTIONS)})"


def _unknown_key(section: str, name: str) -> str:
    names = [spec.name for spec in FIELDS.values() if spec.section == section]
    hint = _suggest(name, names).replace("mean ", f"mean {section}.")
    if not hint:
        owners = [key for key, spec in FIELDS.items() if spec.name == name]
        hint = f"; did you mean {owners[0]}?" if owners else ""
    return f"unknown key {section}.{name}{hint} (keys of [{section}]: {', '.join(names)})"


_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]")
_ASSIGN = re.compile(r"^\s*([A-Za-z0-9_\-.\"' ]+?)\s*=")


def _key_lines(text: str) -> dict[str, int]:
    """First line of every table header and key ("server", "server.port"), found by scanning."""
    lines: dict[str, int] = {}
    table = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if header := _HEADER.match(line):
            table = _dotted(header.group(1))
            lines.setdefault(table, number)
        elif assign := _ASSIGN.match(line):
            lines.setdefault(".".join(filter(None, (table, _dotted(assign.group(1))))), number)
    return lines


def _dotted(key: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in key.split("."))


_PRECEDENCE = {"default": 0, "file": 1, "env": 2, "flag": 3}


def _cross_checks(values: dict[str, object], sources: dict[str, str]) -> list[ConfigIssue]:
    """Rules between fields. A problem is reported where the strongest of its fields was given
    (a flag before the file); on a tie, where the first field named in the message was."""
    issues = []

    def fail(keys: tuple[str, ...], message: str) -> None:
        key = max(keys, key=lambda k: _PRECEDENCE[sources[k].split(":")[0]])
        issues.append(ConfigIssue(_where(sources[key]), message))

    method, draft = values["speculative.method"], values["speculative.draft_tokens"]
    if method == "none":
        if draft is not None:
            fail(("speculative.draft_tokens", "speculative.method"), f"speculative.draft_tokens = {draft} "
                 "needs speculative.method mtp, dflash or dflash2 (it is none)")
        if values["speculative.draft_head"] != "full":
            fail(("speculative.draft_head", "speculative.method"), 'speculative.draft_head = "indexed" '
                 "needs speculative.method mtp, dflash or dflash2 (it is none)")
    elif draft is not None and not DRAFT_RANGE[method][0] <= draft <= DRAFT_RANGE[method][1]:
        lo, hi = DRAFT_RANGE[method]
        fail(("speculative.draft_tokens", "speculative.method"),
             f"speculative.draft_tokens = {draft} is out of range for method {method}; expected {lo}..{hi}")

    if values["sampling.thinking_budget"] is not None and not values["sampling.thinking"]:
        fail(("sampling.thinking_budget", "sampling.thinking"),
             "sampling.thinking_budget needs sampling.thinking = true")

    ranks, rank, tp, ep, dp = (values[f"distributed.{n}"] for n in ("ranks", "rank", "tp", "ep", "dp"))
    if tp != ranks:
        fail(("distributed.tp", "distributed.ranks"), f"distributed.tp = {tp} but distributed.ranks = "
             f"{ranks}; they must be equal (each rank holds one tensor-parallel shard; ep and dp reuse "
             "the same ranks)")
    elif ep > ranks:
        fail(("distributed.ep", "distributed.ranks"),
             f"distributed.ep = {ep} needs distributed.ranks = {ep} (it is {ranks})")
    elif dp > tp:
        fail(("distributed.dp", "distributed.tp"), f"distributed.dp = {dp} needs distributed.tp >= {dp} "
             f"(attention data parallelism splits the tensor-parallel group; tp is {tp})")
    elif rank >= ranks:
        fail(("distributed.rank", "distributed.ranks"), f"distributed.rank = {rank} is out of range for "
             f"distributed.ranks = {ranks}; expected 0..{ranks - 1}")
    return issues
