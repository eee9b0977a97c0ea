"""Startup configuration: precedence and sources, every validation error, the shipped TOML files."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from ninfer_runtime.config import (
    FIELDS,
    SECTIONS,
    Config,
    ConfigError,
    format_bytes,
    load_config,
    parse_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "ninfer.example.toml"
DEPLOYMENTS = sorted((ROOT / "examples" / "configs").glob("*.toml"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ninfer.toml"
    path.write_text(text)
    return path


def errors(tmp_path: Path, text: str | None = None, env=None, overrides=None) -> list[str]:
    """The issue lines load_config reports (the test fails if it accepts the input)."""
    path = write(tmp_path, text) if text is not None else None
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {}, overrides or {})
    return [str(issue) for issue in info.value.issues]


# -- defaults and precedence ---------------------------------------------------------------------

def test_defaults_without_file_env_or_flags():
    resolved = load_config(None, {}, {})
    assert resolved.config == Config()
    assert set(resolved.sources.values()) == {"default"}
    assert resolved.file is None
    assert resolved.config.server.host == "127.0.0.1"
    assert resolved.config.engine.max_active == 8
    assert resolved.config.components == ("text",)


@pytest.mark.parametrize("layers, value, source", [
    ((), 8080, "default"),
    (("file",), 9000, "file:{path}:3"),
    (("file", "env"), 9100, "env:NINFER_PORT"),
    (("file", "env", "flag"), 9200, "flag:--port"),
    (("env", "flag"), 9200, "flag:--port"),
    (("file", "flag"), 9200, "flag:--port"),
])
def test_precedence_default_file_env_flag(tmp_path, layers, value, source):
    path = write(tmp_path, '[server]\nhost = "0.0.0.0"\nport = 9000\n')
    resolved = load_config(path if "file" in layers else None,
                           {"NINFER_PORT": "9100"} if "env" in layers else {},
                           {"server.port": 9200} if "flag" in layers else {})
    assert resolved.config.server.port == value
    assert resolved.source("server.port") == source.format(path=path)


def test_sources_name_the_line_of_each_key(tmp_path):
    path = write(tmp_path, "# comment\n\n[context]\nkv_dtype = \"fp8\"\n\n[engine]\n  max_active = 2\n")
    resolved = load_config(path, {}, {})
    assert resolved.source("context.kv_dtype") == f"file:{path}:4"
    assert resolved.source("engine.max_active") == f"file:{path}:7"
    assert resolved.source("engine.device") == "default"


def test_dotted_keys_and_inline_tables_load(tmp_path):
    path = write(tmp_path, 'server.port = 9001\nvision = { enabled = true }\n')
    resolved = load_config(path, {}, {})
    assert resolved.config.server.port == 9001 and resolved.config.vision.enabled
    assert resolved.source("server.port") == f"file:{path}:1"
    assert resolved.source("vision.enabled") == f"file:{path}:2"


def test_config_file_from_environment_and_explicit_path_wins(tmp_path):
    from_env = write(tmp_path, "[server]\nport = 9000\n")
    explicit = tmp_path / "other.toml"
    explicit.write_text("[server]\nport = 9001\n")
    assert load_config(None, {"NINFER_CONFIG": str(from_env)}, {}).config.server.port == 9000
    resolved = load_config(explicit, {"NINFER_CONFIG": str(from_env)}, {})
    assert resolved.config.server.port == 9001 and resolved.file == explicit


def test_environment_variables(tmp_path):
    env = {"NINFER_API_KEY": "k", "NINFER_HOST": "0.0.0.0", "NINFER_MODEL": "out/m",
           "NINFER_LOG_LEVEL": "debug", "NINFER_RANK": "1", "NINFER_MASTER_ADDR": "10.0.0.1",
           "NINFER_MASTER_PORT": "29600", "NINFER_PORT": "", "UNRELATED": "x"}
    flags = {"distributed.ranks": 2, "distributed.tp": 2}
    config = load_config(None, env, flags).config
    assert config.server.api_key == "k" and config.server.host == "0.0.0.0"
    assert config.model.path == Path("out/m") and config.logging.level == "debug"
    assert config.distributed.rank == 1 and config.distributed.master_addr == "10.0.0.1"
    assert config.distributed.master_port == 29600
    assert config.server.port == 8080  # an empty variable counts as unset
    documented = {spec.env for spec in FIELDS.values() if spec.env}
    assert documented == {k for k in env if k.startswith("NINFER_")}


def test_flags_accept_typed_values_and_text(tmp_path):
    overrides = {"context.context_capacity": "24GiB", "context.max_context": "32768", "vision.enabled": True,
                 "server.cors_origins": ("*",), "sampling.temperature": "0.7", "engine.cuda_graphs": "false",
                 "sampling.seed": None, "server.port": None}
    resolved = load_config(None, {}, overrides, flag_names={"vision.enabled": "MY-VISION"})
    config = resolved.config
    assert config.context.context_capacity == 24 * 2**30 and config.context.max_context == 32768
    assert config.server.cors_origins == ("*",) and config.sampling.temperature == 0.7
    assert config.engine.cuda_graphs is False
    assert resolved.source("vision.enabled") == "flag:MY-VISION"
    assert resolved.source("sampling.seed") == "default"  # None means "flag not given"


# -- values --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * 2**30), ("8GB", 8 * 10**9), ("512 MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
    ("4096", 4096), ("10_000 B", 10_000), ("2kib", 2048), ("0.1GB", 10**8), ("0", 0),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_format_bytes_round_trips():
    for n in (8 * 2**30, 384 * 2**20, 3 * 2**10, 1000, 0):
        shown = format_bytes(n)
        assert (parse_bytes(shown) if isinstance(shown, str) else shown) == n
    assert format_bytes(8 * 2**30) == "8GiB" and format_bytes(1000) == 1000


def test_byte_sizes_in_files(tmp_path):
    path = write(tmp_path, '[context]\ncontext_capacity = "24GiB"\nhost_pinned_bytes = 8_000_000\n')
    config = load_config(path, {}, {}).config
    assert config.context.context_capacity == 24 * 2**30 and config.context.host_pinned_bytes == 8_000_000


def test_floats_accept_integers_and_paths_expand_home(tmp_path):
    path = write(tmp_path, '[sampling]\ntemperature = 1\n[model]\npath = "~/models/m.ninfer"\n')
    config = load_config(path, {}, {}).config
    assert config.sampling.temperature == 1.0 and isinstance(config.sampling.temperature, float)
    assert config.model.path == Path.home() / "models/m.ninfer"


def test_derived_values():
    mtp = load_config(None, {}, {"speculative.method": "mtp", "speculative.draft_head": "indexed",
                                 "vision.enabled": True}).config
    assert mtp.components == ("text", "vision", "mtp", "proposal")
    assert mtp.speculative.draft_window == 3
    assert load_config(None, {}, {"speculative.method": "dflash2"}).config.speculative.draft_window == 7
    assert Config().speculative.draft_window == 0


# -- validation errors ---------------------------------------------------------------------------

def test_unknown_key_suggests_the_closest(tmp_path):
    (line,) = errors(tmp_path, "[server]\nhost = \"h\"\nprot = 1\n")
    assert line.startswith(f"{tmp_path / 'ninfer.toml'}:3: unknown key server.prot; did you mean server.port?")
    assert "keys of [server]: host, port," in line


def test_unknown_key_that_belongs_to_another_section(tmp_path):
    (line,) = errors(tmp_path, "[context]\nport = 1\n")
    assert ":2: unknown key context.port; did you mean server.port?" in line


def test_unknown_section_and_top_level_key(tmp_path):
    lines = errors(tmp_path, "port = 1\n[sever]\nport = 2\n")
    assert lines[0].endswith(":1: unknown top-level key port (settings belong in a section); did you mean server.port?")
    assert ":2: unknown section [sever]; did you mean [server]? (sections: model, server," in lines[1]


def test_section_must_be_a_table(tmp_path):
    (line,) = errors(tmp_path, "server = 5\n")
    assert line.endswith(":1: server must be a table [server], not a 5 value")


@pytest.mark.parametrize("text, message", [
    ('[server]\nport = "8080"\n', ':2: server.port = "8080" has the wrong type (string); expected an integer in 1..65535'),
    ("[server]\nport = true\n", ":2: server.port = true has the wrong type (boolean); expected an integer in 1..65535"),
    ("[engine]\nmax_active = 2.0\n", ":2: engine.max_active = 2.0 has the wrong type (float); expected an integer in 1..8"),
    ("[engine]\ncuda_graphs = 1\n", ":2: engine.cuda_graphs = 1 has the wrong type (integer); expected true or false"),
    ("[sampling]\ntemperature = false\n", ":2: sampling.temperature = false has the wrong type (boolean); expected a number in [0, 2]"),
    ("[server]\ncors_origins = \"*\"\n", ':2: server.cors_origins = "*" has the wrong type (string); expected an array of non-empty strings'),
    ("[server]\ncors_origins = [\"\"]\n", ':2: server.cors_origins = [""] holds an empty string'),
    ("[model]\npath = \"\"\n", ':2: model.path = "" is empty; expected a path'),
])
def test_wrong_types(tmp_path, text, message):
    (line,) = errors(tmp_path, text)
    assert message in line


@pytest.mark.parametrize("text, message", [
    ("[server]\nport = 70000\n", "server.port = 70000 is out of range; expected an integer in 1..65535"),
    ("[engine]\nmax_active = 9\n", "engine.max_active = 9 is out of range; expected an integer in 1..8"),
    ("[engine]\nmax_active = 0\n", "engine.max_active = 0 is out of range"),
    ("[sampling]\ntemperature = 2.5\n", "sampling.temperature = 2.5 is out of range; expected a number in [0, 2]"),
    ("[sampling]\nrepetition_penalty = 0\n", "is out of range; expected a number in (0, 2]"),
    ("[speculative]\nmethod = \"mtp\"\ndraft_tokens = 16\n", "speculative.draft_tokens = 16 is out of range; expected an integer in 1..15"),
    ("[engine]\nprefill_chunk = 1000\n", "engine.prefill_chunk = 1000 is not a multiple of 128; expected an integer in 128..65536, a multiple of 128"),
    ("[context]\nmax_context = 0\n", 'context.max_context = 0 is out of range; expected "auto" or an integer in 1..'),
])
def test_out_of_range(tmp_path, text, message):
    (line,) = errors(tmp_path, text)
    assert message in line


@pytest.mark.parametrize("text, message", [
    ('[context]\nkv_dtype = "fp16"\n', 'context.kv_dtype = "fp16" is not allowed; expected one of bf16, fp8, int8'),
    ('[speculative]\nmethod = "eagle"\n', "expected one of none, mtp, dflash, dflash2"),
    ('[speculative]\ndraft_head = "small"\n', "expected one of full, indexed"),
    ('[logging]\nlevel = "verbose"\n', "expected one of trace, debug, info, warning, error, critical, off"),
    ('[context]\nmax_context = "native"\n', 'context.max_context = "native" has the wrong type (string); expected "auto" or an integer'),
])
def test_bad_enums(tmp_path, text, message):
    (line,) = errors(tmp_path, text)
    assert message in line


@pytest.mark.parametrize("value", ['"24G"', '"lots"', '"-1GiB"', "-1", '"1.5 XB"', "1.5", '"1.5B"', '""'])
def test_bad_byte_sizes(tmp_path, value):
    (line,) = errors(tmp_path, f"[context]\nhost_pinned_bytes = {value}\n")
    assert f":2: context.host_pinned_bytes = {value} " in line
    assert 'expected a byte size of at least 0: an integer or a string such as "24GiB" or "8GB"' in line


def test_auto_capacity_rejects_a_bad_size(tmp_path):
    (line,) = errors(tmp_path, '[context]\ncontext_capacity = "big"\n')
    assert 'context.context_capacity = "big" is not a byte size; expected "auto" or a byte size' in line


@pytest.mark.parametrize("distributed, message", [
    ("tp = 2", "distributed.tp = 2 but distributed.ranks = 1; they must be equal"),
    ("ranks = 2", "distributed.tp = 1 but distributed.ranks = 2; they must be equal"),
    ("ep = 2", "distributed.ep = 2 needs distributed.ranks = 2 (it is 1)"),
    ("dp = 2", "distributed.dp = 2 needs distributed.tp >= 2"),
    ("rank = 1", "distributed.rank = 1 is out of range for distributed.ranks = 1; expected 0..0"),
    ("tp = 3", "distributed.tp = 3 is out of range; expected an integer in 1..2"),
])
def test_inconsistent_distributed_settings(tmp_path, distributed, message):
    (line,) = errors(tmp_path, f"[distributed]\n{distributed}\n")
    assert f"ninfer.toml:2: {message}" in line


def test_two_rank_layouts_are_consistent():
    for layout in ({"tp": 2}, {"tp": 2, "ep": 2}, {"tp": 2, "dp": 2}, {"tp": 2, "ep": 2, "dp": 2, "rank": 1}):
        overrides = {"distributed.ranks": 2, **{f"distributed.{k}": v for k, v in layout.items()}}
        assert load_config(None, {}, overrides).config.distributed.ranks == 2


@pytest.mark.parametrize("speculative, message", [
    ("draft_tokens = 3", "speculative.draft_tokens = 3 needs speculative.method mtp, dflash or dflash2 (it is none)"),
    ('draft_head = "indexed"', 'speculative.draft_head = "indexed" needs speculative.method'),
    ('method = "mtp"\ndraft_tokens = 6', "speculative.draft_tokens = 6 is out of range for method mtp; expected 1..5"),
])
def test_speculative_cross_checks(tmp_path, speculative, message):
    (line,) = errors(tmp_path, f"[speculative]\n{speculative}\n")
    assert f"ninfer.toml:{speculative.count(chr(10)) + 2}: {message}" in line


def test_dflash_accepts_fifteen_drafts():
    config = load_config(None, {}, {"speculative.method": "dflash", "speculative.draft_tokens": 15}).config
    assert config.speculative.draft_window == 15


def test_thinking_budget_needs_thinking(tmp_path):
    (line,) = errors(tmp_path, "[sampling]\nthinking = false\nthinking_budget = 100\n")
    assert line.endswith(":3: sampling.thinking_budget needs sampling.thinking = true")


def test_cross_check_is_reported_where_the_flag_came_from(tmp_path):
    path = write(tmp_path, "[distributed]\nranks = 2\ntp = 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {}, {"distributed.tp": 1})
    assert str(info.value).startswith("flag --tp: distributed.tp = 1 but distributed.ranks = 2")
    path.write_text("[distributed]\ntp = 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {}, {"distributed.ranks": 1})
    assert str(info.value).startswith("flag --ranks: distributed.tp = 2 but distributed.ranks = 1")


def test_bad_toml_syntax_names_file_and_line(tmp_path):
    (line,) = errors(tmp_path, '[server]\nhost = "a"\nport = \n')
    assert line.startswith(f"{tmp_path / 'ninfer.toml'}:3: invalid TOML (column 8): ")


def test_duplicate_key_is_a_toml_error(tmp_path):
    (line,) = errors(tmp_path, "[server]\nport = 1\nport = 2\n")
    assert ":3: invalid TOML" in line


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml: cannot read the configuration file"):
        load_config(tmp_path / "nope.toml", {}, {})
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[model]\nid = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(bad, {}, {})


def test_bad_environment_and_flag_values():
    lines = errors(None, env={"NINFER_PORT": "http", "NINFER_RANK": "one"},
                   overrides={"context.kv_dtype": "fp16", "engine.cuda_graphs": "maybe", "vision.enabled": 1})
    assert 'env NINFER_PORT: server.port = http is not an integer; expected an integer in 1..65535' in lines
    assert 'env NINFER_RANK: distributed.rank = one is not an integer; expected an integer in 0..1' in lines
    assert 'flag --kv-dtype: context.kv_dtype = fp16 is not allowed; expected one of bf16, fp8, int8' in lines
    assert 'flag --cuda-graphs: engine.cuda_graphs = maybe is not a boolean; expected true or false' in lines
    assert "flag --vision: vision.enabled = 1 has the wrong type (integer); expected true or false" in lines


def test_unknown_override_key():
    (line,) = errors(None, overrides={"server.prot": 1})
    assert line == "flags: unknown configuration key server.prot; did you mean server.port?"


def test_all_problems_are_reported_at_once(tmp_path):
    lines = errors(tmp_path, '[server]\nport = 0\nhots = "x"\n[context]\nkv_dtype = "fp4"\n[nope]\n')
    assert [int(line.split(":")[1]) for line in lines] == [2, 3, 5, 6]


def test_api_key_never_appears_in_errors(tmp_path):
    (line,) = errors(tmp_path, '[server]\napi_key = ""\n')
    assert line.endswith(':2: server.api_key = "********" is empty; expected a non-empty string')
    lines = errors(tmp_path, "[server]\napi_key = 12345\n", env={"NINFER_PORT": "x"})
    assert all("12345" not in line for line in lines)
    assert ':2: server.api_key = "********" has the wrong type (integer)' in lines[0]


def test_to_dict_masks_secrets():
    resolved = load_config(None, {"NINFER_API_KEY": "sekrit"}, {})
    server = resolved.to_dict()["sections"]["server"]
    assert server["api_key"] == {"value": "********", "source": "env:NINFER_API_KEY"}
    assert resolved.to_dict(mask_secrets=False)["sections"]["server"]["api_key"]["value"] == "sekrit"
    assert resolved.config.server.api_key == "sekrit"


# -- the shipped files ---------------------------------------------------------------------------

_COMMENTED = re.compile(r"^#\s*([a-z_]+)\s*=\s*(.+?)\s+#\s*\S")


def _documented_keys(text: str) -> tuple[set[str], dict[str, str]]:
    """(keys set in the file, {key: example value} of commented-out `# key = value  # doc` lines)."""
    data = tomllib.loads(text)
    present = {f"{section}.{name}" for section, table in data.items() for name in table}
    commented, section = {}, ""
    for line in text.splitlines():
        if header := re.match(r"^\[(\w+)\]", line):
            section = header.group(1)
        elif (match := _COMMENTED.match(line)) and section:
            commented[f"{section}.{match.group(1)}"] = match.group(2)
    return present, commented


def test_example_file_loads_to_the_defaults():
    resolved = load_config(EXAMPLE, {}, {})
    assert resolved.config == Config()


def test_example_file_documents_every_field_and_nothing_else():
    present, commented = _documented_keys(EXAMPLE.read_text())
    assert not present & set(commented), "a key is both set and commented out"
    documented = present | set(commented)
    assert sorted(set(FIELDS) - documented) == [], "fields missing from ninfer.example.toml"
    assert sorted(documented - set(FIELDS)) == [], "ninfer.example.toml documents non-existent fields"
    unset = {key for key, spec in FIELDS.items() if spec.default is None}
    assert set(commented) == unset, "exactly the fields without a default are commented out"


def test_example_file_values_are_valid_and_commented():
    text = EXAMPLE.read_text()
    _, commented = _documented_keys(text)
    for key, value in commented.items():
        section, name = key.split(".")
        uncommented = tomllib.loads(f"[{section}]\n{name} = {value}\n")
        FIELDS[key].kind.check(uncommented[section][name])  # raises if the example value is invalid
    assignments = [line for line in text.splitlines() if re.match(r"^[a-z_]+\s*=", line)]
    assert len(assignments) == len(FIELDS) - len(commented)
    assert all(" # " in line for line in assignments), "every setting has a one-line comment"
    assert [s for s in re.findall(r"^\[(\w+)\]", text, re.M)] == list(SECTIONS)


def test_deployment_examples_exist():
    names = {path.name for path in DEPLOYMENTS}
    assert {"cpu-tiny.toml", "rtx5090-qwen3_8-27b-nvfp4.toml", "qwen3_6-35b-a3b-offload.toml",
            "flash-next-tp2-ep2-node0.toml", "flash-next-tp2-ep2-node1.toml", "glm-tp2-dp2.toml",
            "h200.toml"} <= names


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda p: p.name)
def test_deployment_example_validates(path):
    resolved = load_config(path, {}, {})
    assert resolved.config.model.path is not None and not resolved.config.model.path.is_absolute()
    assert resolved.config.server.api_key is None


def _example(name: str) -> Config:
    return load_config(ROOT / "examples" / "configs" / name, {}, {}).config


def test_deployment_examples_say_what_their_names_promise():
    rtx = _example("rtx5090-qwen3_8-27b-nvfp4.toml")
    assert rtx.components == ("text", "vision", "mtp", "proposal")
    assert (rtx.context.kv_dtype, rtx.speculative.draft_window) == ("fp8", 3)
    assert _example("qwen3_6-35b-a3b-offload.toml").offload.enabled
    assert _example("cpu-tiny.toml").model.path == Path("out/tiny/pkg")
    assert not _example("cpu-tiny.toml").engine.cuda_graphs
    nodes = [_example(f"flash-next-tp2-ep2-node{r}.toml") for r in (0, 1)]
    assert [(n.distributed.tp, n.distributed.ep, n.distributed.rank) for n in nodes] == [(2, 2, 0), (2, 2, 1)]
    assert nodes[0].distributed.master_addr == nodes[1].distributed.master_addr
    glm = _example("glm-tp2-dp2.toml").distributed
    assert (glm.ranks, glm.tp, glm.dp) == (2, 2, 2)
    node1 = load_config(ROOT / "examples/configs/glm-tp2-dp2.toml", {"NINFER_RANK": "1"}, {})
    assert node1.config.distributed.rank == 1 and node1.source("distributed.rank") == "env:NINFER_RANK"
