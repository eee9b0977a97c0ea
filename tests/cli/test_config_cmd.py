"""`ninfer config show/validate` and the click options that `run` and `serve` share."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ninfer_cli.config_options import config_options, option_fields
from ninfer_cli.main import cli
from ninfer_runtime.config import FIELDS, ResolvedConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples" / "configs").glob("*.toml"))


def run(*args: str, env: dict[str, str] | None = None):
    clean = {name: None for name in ["NINFER_CONFIG", *(s.env for s in FIELDS.values() if s.env)]}
    return CliRunner().invoke(cli, list(args), env={**clean, **(env or {})}, catch_exceptions=False)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "site.toml"
    path.write_text('[server]\nport = 9000\napi_key = "from-file-secret"\n\n[context]\nkv_dtype = "fp8"\n')
    return path


def test_show_defaults():
    result = run("config", "show")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[:2] == ["# config file: none", "# components loaded: text"]
    assert any(line.startswith('host = "127.0.0.1"') and line.endswith("# default") for line in lines)
    assert any(line.startswith('max_body_bytes = "384MiB"') for line in lines)
    assert any(line.startswith("# api_key is unset") for line in lines)
    assert sum(line.startswith("[") for line in lines) == 10


def test_show_names_every_source_and_masks_the_key(config_file):
    result = run("config", "show", "--config", str(config_file), "--kv-dtype", "int8", "--no-cuda-graphs",
                 env={"NINFER_API_KEY": "env-secret", "NINFER_HOST": "0.0.0.0"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"# config file: {config_file}" in out
    rows = {line.split(" = ")[0]: line for line in out.splitlines() if " = " in line}
    assert rows["port"].endswith(f"# file:{config_file}:2")
    assert rows["host"].endswith("# env:NINFER_HOST")
    assert rows["api_key"].startswith('api_key = "********"') and rows["api_key"].endswith("# env:NINFER_API_KEY")
    assert rows["kv_dtype"].startswith('kv_dtype = "int8"') and rows["kv_dtype"].endswith("# flag:--kv-dtype")
    assert rows["cuda_graphs"].endswith("# flag:--no-cuda-graphs")
    vision = run("config", "show", "--vision", "--spec", "mtp", "--draft-head", "indexed").output
    assert "# components loaded: text, vision, mtp, proposal" in vision
    assert "secret" not in out


def test_show_json(config_file):
    result = run("config", "show", "--json", "--config", str(config_file), "--port", "9100",
                 "--context-capacity", "24GiB", "--cors-origin", "https://a.example", "--cors-origin", "*")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["config_file"] == str(config_file)
    assert data["components"] == ["text"]
    server, context = data["sections"]["server"], data["sections"]["context"]
    assert server["port"] == {"value": 9100, "source": "flag:--port"}
    assert server["api_key"] == {"value": "********", "source": f"file:{config_file}:3"}
    assert server["cors_origins"]["value"] == ["https://a.example", "*"]
    assert context["context_capacity"] == {"value": 24 * 2**30, "source": "flag:--context-capacity"}
    assert context["max_context"] == {"value": "auto", "source": "default"}
    assert {f"{s}.{k}" for s, table in data["sections"].items() for k in table} == set(FIELDS)


def test_show_reads_the_file_named_by_the_environment(config_file):
    result = run("config", "show", "--json", env={"NINFER_CONFIG": str(config_file)})
    assert json.loads(result.output)["sections"]["context"]["kv_dtype"]["value"] == "fp8"


def test_show_rejects_bad_flags_and_files(tmp_path):
    result = run("config", "show", "--port", "0", "--spec", "eagle")
    assert result.exit_code == 1
    assert "flag --port: server.port = 0 is out of range; expected an integer in 1..65535" in result.output
    assert 'flag --spec: speculative.method = eagle is not allowed' in result.output
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine]\nmax_activ = 2\n")
    result = run("config", "show", "--config", str(bad))
    assert result.exit_code == 1
    assert f"{bad}:2: unknown key engine.max_activ; did you mean engine.max_active?" in result.output


@pytest.mark.parametrize("path", [ROOT / "ninfer.example.toml", *EXAMPLES], ids=lambda p: p.name)
def test_validate_shipped_files(path):
    result = run("config", "validate", str(path))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{path}: ok")


def test_validate_lists_every_problem_and_ignores_the_environment(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[context]\nkv_dtype = "fp16"\n[distributed]\ntp = 2\n')
    result = run("config", "validate", str(bad), env={"NINFER_PORT": "not-a-port"})
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f'{bad}:2: context.kv_dtype = "fp16" is not allowed; expected one of bf16, fp8, int8',
    ]
    bad.write_text("[distributed]\ntp = 2\n")
    result = run("config", "validate", str(bad))
    assert result.exit_code == 1 and f"{bad}:2: distributed.tp = 2 but distributed.ranks = 1" in result.stderr
    bad.write_text("[server\n")
    result = run("config", "validate", str(bad))
    assert result.exit_code == 1 and f"{bad}:1: invalid TOML" in result.stderr


# -- the shared click options --------------------------------------------------------------------

@click.command()
@click.option("--prompt")
@config_options("model", "context", "speculative.method", model_argument=True)
def fake_run(config: ResolvedConfig, prompt: str | None) -> None:
    click.echo(json.dumps({"prompt": prompt, "path": str(config.config.model.path),
                           "model_source": config.source("model.path"), "spec": config.config.speculative.method,
                           "kv": config.config.context.kv_dtype, "kv_source": config.source("context.kv_dtype")}))


def test_config_options_for_a_command(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('[model]\npath = "from/file"\n[context]\nkv_dtype = "fp8"\n')
    result = CliRunner().invoke(fake_run, ["pkg/", "--prompt", "hi", "--config", str(cfg), "--spec", "mtp"],
                                env={"NINFER_CONFIG": None, "NINFER_MODEL": None})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"prompt": "hi", "path": "pkg", "model_source": "flag:MODEL", "spec": "mtp",
                                         "kv": "fp8", "kv_source": f"file:{cfg}:4"}
    result = CliRunner().invoke(fake_run, ["--config", str(cfg)], env={"NINFER_CONFIG": None, "NINFER_MODEL": None})
    assert json.loads(result.output)["model_source"] == f"file:{cfg}:2"


def test_config_options_add_only_the_selected_flags():
    help_text = CliRunner().invoke(fake_run, ["--help"]).output
    assert "--kv-dtype [bf16|fp8|int8]" in help_text and "--spec [none|mtp|dflash|dflash2]" in help_text
    assert "--port" not in help_text and "--draft-tokens" not in help_text
    assert "--model " not in help_text  # the positional MODEL replaces it
    assert "[context.kv_dtype]" in help_text and "$NINFER_CONFIG" in help_text
    result = CliRunner().invoke(fake_run, ["--port", "1"])
    assert result.exit_code == 2 and "No such option" in result.output and "--port" in result.output


def test_config_option_errors_exit_one():
    result = CliRunner().invoke(fake_run, ["--kv-dtype", "fp16"], env={"NINFER_CONFIG": None})
    assert result.exit_code == 1
    assert 'invalid configuration:\nflag --kv-dtype: context.kv_dtype = fp16 is not allowed' in result.output


def test_option_fields_selectors():
    assert [s.key for s in option_fields("speculative")] == [
        "speculative.method", "speculative.draft_tokens", "speculative.draft_head"]
    assert len(option_fields()) == len(FIELDS)
    with pytest.raises(ValueError, match="unknown configuration sections or keys: spec"):
        option_fields("spec")


def test_every_field_has_its_own_flag():
    flags = [spec.flag for spec in FIELDS.values()]
    assert len(set(flags)) == len(flags)
    assert all(flag.startswith("--") and flag != "--config" for flag in flags)
