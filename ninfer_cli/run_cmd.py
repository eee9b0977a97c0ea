"""`ninfer run PKG --prompt TEXT | --messages FILE`: one request, answer on stdout, report on stderr."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ninfer_runtime.config import ResolvedConfig

from .config_options import config_options


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _sampling(cfg, generation_config: dict):
    """Config value, else the model's generation_config preset, else neutral."""
    from ninfer_runtime.sampling import SamplingParams

    s = cfg.sampling

    def pick(name: str, hf_name: str, default):
        value = getattr(s, name)
        if value is not None:
            return value
        return generation_config.get(hf_name, default)

    if s.greedy:
        return SamplingParams(temperature=0.0, greedy=True, seed=0)
    return SamplingParams(
        temperature=float(pick("temperature", "temperature", 1.0)),
        top_p=float(pick("top_p", "top_p", 1.0)),
        top_k=int(pick("top_k", "top_k", 0)),
        min_p=float(pick("min_p", "min_p", 0.0)),
        presence_penalty=float(pick("presence_penalty", "presence_penalty", 0.0)),
        frequency_penalty=float(pick("frequency_penalty", "frequency_penalty", 0.0)),
        repetition_penalty=float(pick("repetition_penalty", "repetition_penalty", 1.0)),
        seed=s.seed,  # None: the engine draws one and the report prints it
    )


# Engine finish reasons -> the report's names (docs: product spec 2.5).
_FINISH = {"stop": "stop-token", "stop_string": "stop-string", "length": "output-limit",
           "context_capacity": "context-capacity"}


def _row(group: str, label: str, value: str) -> str:
    return f"{group:<12}{label:<26}{value}"


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:.2f} tok/s" if seconds > 0 and tokens > 0 else "n/a"


@click.command("run")
@click.option("--prompt", help="A single user message.")
@click.option("--messages", "messages_file", type=click.Path(dir_okay=False, path_type=Path),
              help="JSON chat history (array of messages, or {messages, tools}).")
@click.option("--artifact", type=click.Path(dir_okay=False, path_type=Path),
              help="The artifact the package was compiled from, if it moved.")
@click.option("--stop", "stop_strings", multiple=True, help="Stop string on the answer channel (repeatable).")
@click.option("--stop-token-id", "stop_token_ids", multiple=True, type=click.IntRange(0, 2**31 - 1),
              help="Extra stop token id (repeatable).")
@click.option("--raw-output", is_flag=True, help="Print the raw decoded stream (no reasoning/answer split).")
@click.option("--print-token-ids", is_flag=True, help="Add a token_ids line with the generated ids to stderr.")
@config_options("model", "context", "engine", "speculative", "vision", "sampling", "logging", model_argument=True)
def run(config: ResolvedConfig, prompt: str | None, messages_file: Path | None, artifact: Path | None,
        stop_strings: tuple[str, ...], stop_token_ids: tuple[int, ...], raw_output: bool, print_token_ids: bool) -> None:
    """Run one request on a compiled package (PKG or model.path in the configuration)."""
    from ninfer_runtime.engine import Engine, GenerationParams, RequestError
    from ninfer_runtime.memory import human_bytes
    from ninfer_runtime.messages import MessagesError, from_prompt, load_messages_file
    from ninfer_runtime.package import PackageError, load_tokenizer, resource
    from ninfer_runtime.pools import PoolExhausted
    from ninfer_runtime.runner import ModelRunner, RunnerOptions
    from ninfer_runtime.sampling import SamplingError
    from ninfer_runtime.text import ChatTemplate, ChatTemplateError, ReasoningSplitter, StopMatcher

    cfg = config.config
    if (prompt is None) == (messages_file is None):
        _fail("exactly one of --prompt and --messages is required")
    if cfg.model.path is None:
        _fail("no model: give the package directory (ninfer run PKG ...) or set model.path in --config")
    package = Path(cfg.model.path)
    if package.suffix == ".ninfer" and package.is_file():
        _fail(f"{package} is an artifact; compile it first: ninfer compile {package} --target cpu -o PKG")
    if cfg.speculative.method != "none":
        _fail(f"speculative decoding ({cfg.speculative.method}) is not available in this build yet")
    if cfg.vision.enabled:
        _fail("vision input is not available in this build yet")
    try:
        request = from_prompt(prompt) if prompt is not None else load_messages_file(messages_file)
        if request.has_media:
            _fail("the messages contain images or video; vision input is not available in this build yet")
        t_load = time.perf_counter()
        runner = ModelRunner(package, artifact=artifact, options=RunnerOptions(
            max_active=1, context_capacity=cfg.context.context_capacity,
            auto_headroom_bytes=cfg.context.auto_headroom_bytes))
        load_seconds = time.perf_counter() - t_load
        generation_config = json.loads(resource(package, "generation_config.json"))
        tokenizer = load_tokenizer(package, Path(cfg.model.chat_template).read_bytes() if cfg.model.chat_template else None)
        max_context = None if cfg.context.max_context == "auto" else cfg.context.max_context
        engine = Engine(runner, tokenizer, max_active=1, max_queue=0, max_context=max_context)
        t_prep = time.perf_counter()
        thinking = cfg.sampling.thinking
        text = ChatTemplate.from_tokenizer(tokenizer).render(request.messages, tools=request.tools or None,
                                                             add_generation_prompt=True, enable_thinking=thinking)
        prompt_ids = tokenizer.encode(text)
        prepare_seconds = time.perf_counter() - t_prep
        # Stop strings belong to the answer channel, so they are matched here after the reasoning
        # split; with --raw-output there is no split and the engine matches them.
        params = GenerationParams(max_tokens=cfg.sampling.max_tokens, sampling=_sampling(cfg, generation_config),
                                  stop_token_ids=tuple(stop_token_ids), skip_special_tokens=not raw_output,
                                  stop_strings=tuple(stop_strings) if raw_output else ())
        handle = engine.submit(prompt_ids, params)
        splitter = ReasoningSplitter(thinking=thinking and not raw_output)
        stop = StopMatcher(stop_strings)
        answer_tail, reasoning_tail = "", ""
        finish = "none"
        out, err = sys.stdout, sys.stderr
        for event in handle.events():
            piece = event.text
            if event.finished:
                finish = _FINISH.get(event.finish_reason, event.finish_reason)
                if raw_output and event.finish_reason == "stop" and event.token is not None:
                    piece += tokenizer.decode([event.token])
            if raw_output:
                out.write(piece)
                out.flush()
                answer_tail = (answer_tail + piece)[-1:] if piece else answer_tail
                continue
            reasoning, answer = splitter.push(piece)
            if event.finished:
                r2, a2 = splitter.flush()
                reasoning, answer = reasoning + r2, answer + a2
            if reasoning:
                err.write(reasoning)
                err.flush()
                reasoning_tail = reasoning[-1]
            emitted, matched = stop.push(answer)
            if event.finished and not matched:
                emitted += stop.flush()
            if emitted:
                out.write(emitted)
                out.flush()
                answer_tail = emitted[-1]
            if matched:
                handle.cancel()
                finish = "stop-string"
                break
        if reasoning_tail and reasoning_tail != "\n":
            err.write("\n")
        if answer_tail != "\n":
            out.write("\n")
        out.flush()
        if handle.finish_reason == "error":
            _fail(f"generation failed: {handle.error}")
    except (MessagesError, ChatTemplateError, PackageError, RequestError, SamplingError, PoolExhausted) as exc:
        _fail(str(exc))
    stats = handle.stats
    s = params.sampling
    sampling_text = ("greedy (temperature 0)" if s.is_greedy else
                     f"temp={s.temperature:.2f} top_p={s.top_p:.2f} top_k={s.top_k} min_p={s.min_p:.2f} "
                     f"presence={s.presence_penalty:.2f} freq={s.frequency_penalty:.2f} seed={handle.seed}")
    decode_tokens = max(0, stats.generated_tokens - 1)
    model_seconds = stats.prefill_s + stats.decode_s
    memory = engine.describe()
    rows = [
        _row("phase", "detail", "elapsed/progress"),
        _row("load", "package and weights", f"{load_seconds:.3f} s"),
        _row("prepare", "render/preprocess", f"{prepare_seconds:.3f} s"),
        _row("generate", "text prefill", f"{stats.prefill_s:.3f} s"),
        _row("generate", "decode", f"{stats.decode_s:.3f} s"),
        _row("generate", "total", f"{model_seconds:.3f} s"),
        _row("summary", "sampling", sampling_text),
        _row("summary", "finish reason", finish),
        _row("summary", "prompt tokens", str(stats.prompt_tokens)),
        _row("summary", "reused prompt tokens", "0"),
        _row("summary", "generated tokens", str(stats.generated_tokens)),
        _row("summary", "time to first token", f"{stats.ttft_s:.3f} s" if stats.ttft_s is not None else "n/a"),
        _row("summary", "model elapsed", f"{model_seconds:.3f} s"),
        _row("summary", "prefill speed", _rate(stats.prompt_tokens, stats.prefill_s)),
        _row("summary", "decode speed", _rate(decode_tokens, stats.decode_s)),
        _row("summary", "throughput (overall)", _rate(stats.generated_tokens, model_seconds)),
        _row("summary", "device", f"{runner.manifest.target['name']} ({runner.manifest.target['device']})"),
        _row("summary", "max context", str(memory["max_context"])),
        _row("summary", "KV capacity policy", memory["capacity_policy"]),
        _row("summary", "KV capacity", f"{memory['token_capacity']} tokens"),
        _row("summary", "context pool", human_bytes(memory["pool_bytes"])),
        _row("summary", "gpu weights used", human_bytes(memory["weights_bytes"])),
    ]
    if print_token_ids:
        rows.insert(0, "token_ids: " + " ".join(map(str, handle.output_ids)))
    click.echo("\n".join(rows), err=True)
