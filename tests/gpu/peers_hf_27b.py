#!/usr/bin/env python3
"""Hugging Face transformers end to end on the Qwen3.6-27B text shape: the peer of `bench_27b.py`.

    python3 tests/gpu/peers_hf_27b.py --out $OUT          # GPU machine: torch + transformers (qwen3_5)
    .venv/bin/python tests/gpu/peers_hf_27b.py --tiny     # 2-layer shape on this machine's CPU
    .venv/bin/python tests/gpu/peers_hf_27b.py --write-config   # refresh data/ from ninfer's synth

The model is transformers' own `Qwen3_5ForCausalLM` (architecture `qwen3_5`, text only) built from
the exact text config that `ninfer synth --like qwen3.6-27b` uses (tests/gpu/data/, written from
`ninfer_compiler.convert.synth.text_config`, since the GPU machine has no project venv). Weights
are bf16, created on the GPU (no host copy; rotary buffers stay float32) and re-drawn in place
from N(0, 0.02) (norms, A_log and dt_bias keep transformers' init); eval mode, no grad, sdpa.

Measured as `ninfer bench` measures (runtime/bench.py), with CUDA events after warm-up:
* prefill: one random prompt of 7,680 tokens, batch 1, a fresh cache, logits of the last token only
  (`logits_to_keep=1`, what `generate` asks); median of repeats after one warm-up;
* decode at batch 1 and 8: every sequence is prefilled with 64 random tokens into transformers' own
  `DynamicCache`, two warm-up steps, then 32 greedy steps (next token = argmax of the last logits,
  taken on the GPU outside the timed span); each step's `model(...)` forward call is timed with a
  pair of CUDA events and the host synchronises after each step, as `generate` does (it reads the
  stopping criteria); the median step is reported.

The GDN path transformers took is read off its kernel wrappers: flash-linear-attention (`fla`) for
the chunked and recurrent delta rule and `causal_conv1d` for the convolution when importable, else
its torch reference code. With `--modes fast,torch` the same model is measured a second time with
the wrappers pointed at the torch reference, and the two paths' prefill logits are compared. A
deadline (`--deadline-s`) skips what no longer fits; results are written after every stage.
Exits 1 with a message when the installed transformers has no `qwen3_5`. Prints a table last and writes
`peers_hf.json` under --out.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CONFIG_FILE = HERE / "data" / "qwen3.6-27b.text_config.json"
LIKE = "qwen3.6-27b"
PROMPT_LEN, DECODE_CONTEXT, DECODE_STEPS, BATCHES = 7680, 64, 32, (1, 8)
INIT_STD, SEED = 0.02, 0
MODULE = "transformers.models.qwen3_5.modeling_qwen3_5"
# module-level kernel wrappers of the GDN layer, and the package transformers takes each from
GDN_FUNCS = {"torch_chunk_gated_delta_rule": "fla", "torch_recurrent_gated_delta_rule": "fla",
             "causal_conv1d_fn": "causal_conv1d", "causal_conv1d_update": "causal_conv1d"}


def write_config() -> None:
    """Refresh the JSON that travels with this script from ninfer's own synth config."""
    sys.path.insert(0, str(HERE.parents[1]))
    from ninfer_compiler.convert.synth import text_config

    CONFIG_FILE.parent.mkdir(parents=True, exist_ok=True)
    CONFIG_FILE.write_text(json.dumps(text_config(LIKE), indent=1) + "\n")
    print(f"wrote {CONFIG_FILE}")


def tiny_config(full: dict) -> dict:
    """Two layers (one GDN, one gated attention: the 3:1 mix's two kinds) with small widths."""
    cfg = json.loads(json.dumps(full))
    cfg.update(hidden_size=128, vocab_size=512, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_num_key_heads=2,
               linear_key_head_dim=32, linear_num_value_heads=6, linear_value_head_dim=32, intermediate_size=256)
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "mrope_section": [3, 3, 2]}  # 64 * 0.25 / 2 = 8
    return cfg


def qwen3_5_module():
    """transformers' qwen3_5 modeling module; exits 1 with a clear message when it is missing."""
    import importlib

    import transformers

    try:
        return importlib.import_module(MODULE), transformers.__version__
    except ImportError as exc:
        sys.exit(f"transformers {transformers.__version__} at {Path(transformers.__file__).parent} has no "
                 f"architecture qwen3_5 ({exc}); install one that has it (5.17 and 5.23 do), e.g. a "
                 "carried wheel under --target /tmp/site with PYTHONPATH, and run again")


def build_model(mod, cfg: dict, device: str) -> torch.nn.Module:
    """Qwen3_5ForCausalLM in bf16 created on `device`, re-drawn in place from N(0, INIT_STD)."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device(device):
        model = mod.Qwen3_5ForCausalLM._from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    # parameters are bf16 already; buffers (rotary inv_freq) stay float32, as from_pretrained leaves them
    model.eval().requires_grad_(False)
    gen = torch.Generator(device=device).manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.device.type != torch.device(device).type or p.dtype != torch.bfloat16:
                raise RuntimeError(f"{name} was created as {p.dtype} on {p.device}, not bf16 on {device}")
            if p.ndim >= 2:  # embeddings, projections, lm_head, the depthwise convolution
                p.normal_(0.0, INIT_STD, generator=gen)
    if model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr():
        raise RuntimeError("lm_head is tied to the embedding; the config says it is not")
    return model


def _closure(fn: Callable) -> dict:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    return dict(zip(code.co_freevars, (c.cell_contents for c in cells), strict=True)) if code else {}


def gdn_paths(mod) -> dict[str, str]:
    """Which implementation each GDN kernel wrapper of transformers calls (module.qualname)."""
    out = {}
    for name, package in GDN_FUNCS.items():
        fn = getattr(mod, name)
        impl = _closure(fn).get("implementation", fn)
        torch_ref = getattr(fn, "__wrapped__", None)
        where = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', '?')}"
        out[name] = ("torch reference " if impl is torch_ref or impl is fn else f"{package}: ") + where
    return out


def fast_path_taken(paths: dict[str, str]) -> bool:
    return not paths["torch_chunk_gated_delta_rule"].startswith("torch reference")


@contextlib.contextmanager
def torch_reference(mod) -> Iterator[None]:
    """Point the GDN wrappers at transformers' torch reference code, as when fla is not installed."""
    saved = {name: getattr(mod, name) for name in GDN_FUNCS}

    def reference(fn: Callable) -> Callable:
        ref = fn.__wrapped__
        params = {k for k, p in inspect.signature(ref).parameters.items() if p.kind is not p.VAR_KEYWORD}

        def call(*args, **kwargs):
            return ref(*args, **{k: v for k, v in kwargs.items() if k in params})
        return call

    try:
        for name, fn in saved.items():
            setattr(mod, name, reference(fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(mod, name, fn)


class Timer:
    """CUDA events on a GPU (host synchronised after the end event), perf_counter on a CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")

    def __enter__(self) -> Timer:
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0


def measure_prefill(model, device: str, prompt_len: int, vocab: int, repeats: int, deadline: float) -> dict:
    """Median of `repeats` prefills of one fixed random prompt after one warm-up (fewer near the deadline)."""
    gen = torch.Generator(device=device).manual_seed(SEED + 1)
    ids = torch.randint(2, vocab, (1, prompt_len), device=device, generator=gen)
    times, first = [], None
    t_start = time.perf_counter()
    for i in range(repeats + 1):
        with Timer(device) as t:
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        if i == 0:
            warmup_s = t.seconds
            first = out.logits[0, -1].float().clone()
        else:
            times.append(t.seconds)
        del out
        per = (time.perf_counter() - t_start) / (i + 1)
        if times and time.perf_counter() + per > deadline:
            break
    s = statistics.median(times) if times else warmup_s
    return {"prompt_len": prompt_len, "ms": s * 1e3, "tok_s": prompt_len / s, "repeats": len(times),
            "warmup_ms": warmup_s * 1e3, "all_ms": [x * 1e3 for x in times], "_logits": first}


def measure_decode(model, device: str, batch: int, context: int, steps: int, vocab: int) -> dict:
    """Greedy decode steps over transformers' DynamicCache after a `context`-token batch prefill."""
    gen = torch.Generator(device=device).manual_seed(SEED + 2 + batch)
    ids = torch.randint(2, vocab, (batch, context), device=device, generator=gen)
    with Timer(device) as t:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    prefill_s = t.seconds
    cache = out.past_key_values

    def step() -> float:
        nonlocal out
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        with Timer(device) as t:
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return t.seconds

    step(), step()  # warm-up
    wall = time.perf_counter()
    step_s = [step() for _ in range(steps)]
    wall = (time.perf_counter() - wall) / steps
    finite = bool(torch.isfinite(out.logits).all())
    if cache.get_seq_length() != context + steps + 2:
        raise RuntimeError(f"cache holds {cache.get_seq_length()} tokens, expected {context + steps + 2}")
    ms = statistics.median(step_s) * 1e3
    return {"batch": batch, "context": context, "steps": steps, "ms_per_step": ms, "tok_s": batch * 1e3 / ms,
            "min_ms": min(step_s) * 1e3, "max_ms": max(step_s) * 1e3, "loop_ms_per_step": wall * 1e3,
            "context_prefill_ms": prefill_s * 1e3, "finite": finite}


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def tiny_cache_check(model, device: str, vocab: int) -> float:
    """Prefill + cached decode steps against one full forward over the same tokens (cosine of last logits)."""
    gen = torch.Generator(device=device).manual_seed(SEED + 9)
    ids = torch.randint(2, vocab, (2, 133), device=device, generator=gen)
    out = model(input_ids=ids[:, :130], use_cache=True, logits_to_keep=1)
    for j in range(130, 133):
        out = model(input_ids=ids[:, j:j + 1], past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
    full = model(input_ids=ids, use_cache=False, logits_to_keep=1)
    return min(cosine(out.logits[b, -1], full.logits[b, -1]) for b in range(2))


def table(res: dict) -> str:
    lines = [f"HF transformers {res['transformers']} / torch {res['torch']} on {res['device_name']}, "
             f"{res['params'] / 1e9:.2f} B params bf16, sdpa; fla importable: {res['fla_version'] or 'no'}",
             f"{'path':<34} {'prefill ' + str(res['prompt_len']) + ' tok/s':>20} " +
             " ".join(f"{'decode b' + str(b) + ' ms':>14}" for b in res["batches"])]
    for mode, r in res["modes"].items():
        pf = r.get("prefill")
        cells = [f"{pf['tok_s']:>20,.0f}" if pf else f"{'skipped':>20}"]
        for b in res["batches"]:
            d = r.get("decode", {}).get(str(b))
            cells.append(f"{d['ms_per_step']:>14.2f}" if d else f"{'skipped':>14}")
        lines.append(f"{mode + ' (' + r['label'] + ')':<34} " + " ".join(cells))
    if "fast_vs_torch_prefill_cosine" in res:
        lines.append(f"prefill last-token logits, fast vs torch path: cosine {res['fast_vs_torch_prefill_cosine']:.5f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="2-layer small shape; on the CPU unless CUDA is present")
    ap.add_argument("--write-config", action="store_true", help="rewrite data/ from ninfer_compiler (build machine)")
    ap.add_argument("--modes", default="fast,torch", help="fast: as installed; torch: GDN on the torch reference")
    ap.add_argument("--prompt-len", type=int, default=None)
    ap.add_argument("--steps", type=int, default=DECODE_STEPS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--deadline-s", type=float, default=135.0, help="skip stages that would end after this")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/peers-hf-out")))
    args = ap.parse_args()
    if args.write_config:
        write_config()
        return 0
    t0 = time.perf_counter()
    deadline = t0 + args.deadline_s
    mod, tf_version = qwen3_5_module()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not args.tiny and device == "cpu":
        sys.exit("the 27B shape needs a GPU; use --tiny on a CPU")
    cfg = json.loads(CONFIG_FILE.read_text())
    if args.tiny:
        cfg = tiny_config(cfg)
    prompt_len = args.prompt_len or (256 if args.tiny else PROMPT_LEN)
    steps = 4 if args.tiny and args.steps == DECODE_STEPS else args.steps
    torch.manual_seed(SEED)
    torch.set_grad_enabled(False)
    try:
        import fla
        fla_version = getattr(fla, "__version__", "?")
    except Exception as exc:  # any import failure means transformers falls back too
        fla_version, fla_error = None, f"{type(exc).__name__}: {exc}"
    else:
        fla_error = None
    paths = gdn_paths(mod)
    model = build_model(mod, cfg, device)
    vocab = min(cfg["vocab_size"], 1 << 15)  # the token range runtime/bench.py draws from
    res = {"like": LIKE, "tiny": args.tiny, "transformers": tf_version, "torch": torch.__version__,
           "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
           "params": sum(p.numel() for p in model.parameters()), "prompt_len": prompt_len,
           "batches": list(BATCHES), "fla_version": fla_version, "fla_import_error": fla_error,
           "gdn_paths_installed": paths, "build_s": time.perf_counter() - t0, "modes": {},
           "method": "CUDA events around each model() call, host sync after each; prefill: median after 1 warm-up, "
                     f"logits_to_keep=1; decode: {DECODE_CONTEXT}-token prefill, 2 warm-up steps, {steps} greedy "
                     "steps on DynamicCache, median step"}
    print(f"transformers {tf_version}, torch {torch.__version__}, {device}; built {res['params'] / 1e9:.3f} B "
          f"params in {res['build_s']:.1f} s; GDN paths: {json.dumps(paths, indent=1)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (args.out / "peers_hf.json").write_text(json.dumps(res, indent=1))

    if args.tiny:
        with torch_reference(mod) if device == "cpu" else contextlib.nullcontext():  # fla needs a GPU
            res["tiny_cache_cosine"] = tiny_cache_check(model, device, vocab)
        print(f"tiny: cached decode vs full forward, cosine {res['tiny_cache_cosine']:.5f}", flush=True)
        if res["tiny_cache_cosine"] < 0.99:
            raise SystemExit("cached decode disagrees with the full forward")
    logits = {}
    for mode in [m for m in args.modes.split(",") if m]:
        if mode not in ("fast", "torch"):
            sys.exit(f"unknown mode {mode!r}")
        if mode == "fast" and not fast_path_taken(paths):
            print("fast: fla is not importable here, transformers runs its torch reference; measuring that as 'torch'")
            continue
        if mode == "fast" and device == "cpu":
            print(f"fast: {paths['torch_chunk_gated_delta_rule']} needs a GPU; skipped on the CPU")
            continue
        label = "fla + " + ("causal_conv1d" if "causal_conv1d:" in paths["causal_conv1d_fn"] else "torch conv1d") \
            if mode == "fast" else "torch reference GDN"
        entry = res["modes"][mode] = {"label": label, "decode": {}}
        with contextlib.ExitStack() as stack:
            if mode == "torch":
                stack.enter_context(torch_reference(mod))
            entry["gdn_paths"] = gdn_paths(mod) if mode == "fast" else {k: "torch reference" for k in GDN_FUNCS}
            for stage in ("prefill", "decode") if mode == "fast" else ("decode", "prefill"):
                if stage == "prefill":
                    if time.perf_counter() > deadline:
                        print(f"{mode}: prefill skipped (deadline)", flush=True)
                        continue
                    print(f"{mode}: prefill {prompt_len} (warm-up first)...", flush=True)
                    pf = measure_prefill(model, device, prompt_len, vocab, args.repeats, deadline)
                    logits[mode] = pf.pop("_logits")
                    entry["prefill"] = pf
                    entry["prefill_logits_finite"] = bool(torch.isfinite(logits[mode]).all())
                    print(f"{mode}: prefill {prompt_len}: {pf['ms']:.1f} ms, {pf['tok_s']:,.0f} tok/s "
                          f"({pf['repeats']} repeats, warm-up {pf['warmup_ms']:.0f} ms); "
                          f"t={time.perf_counter() - t0:.0f} s", flush=True)
                    save()
                    continue
                for b in BATCHES:
                    if time.perf_counter() > deadline:
                        print(f"{mode}: decode b{b} skipped (deadline)", flush=True)
                        continue
                    entry["decode"][str(b)] = d = measure_decode(model, device, b, DECODE_CONTEXT, steps, vocab)
                    print(f"{mode}: decode b{b}: {d['ms_per_step']:.2f} ms/step (min {d['min_ms']:.2f}, loop "
                          f"{d['loop_ms_per_step']:.2f}), finite {d['finite']}; "
                          f"t={time.perf_counter() - t0:.0f} s", flush=True)
                    save()
        if device == "cuda":
            torch.cuda.empty_cache()
    if len(logits) == 2:
        res["fast_vs_torch_prefill_cosine"] = cosine(logits["fast"], logits["torch"])
    res["total_s"] = time.perf_counter() - t0
    if device == "cuda":
        res["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
    save()
    print(table(res))
    print(f"wrote {args.out / 'peers_hf.json'} after {res['total_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
