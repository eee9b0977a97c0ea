"""The startup configuration model: one frozen dataclass per TOML section.

Every field carries its kind (validation), a one-line doc, its command-line flag and, where one
is useful, its `NINFER_*` environment variable, so the loader, `ninfer config show`, the click
options of `run`/`serve` and the tests all read the same single source. A field whose default is
None is unset unless given ("use the model's preset", "no API key").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from .values import AUTO, Auto, Bool, Bytes, Choice, Float, Int, Kind, PathValue, Text, TextList

GiB, MiB = 2**30, 2**20
INT32_MAX, UINT64_MAX = 2**31 - 1, 2**64 - 1
KV_DTYPES = ("bf16", "fp8", "int8")
SPEC_METHODS = ("none", "mtp", "dflash", "dflash2")
# Draft-token range and recommended window per speculative method (MTP is trained for short
# windows; DFlash/DFlash2 propose a block: 15 for the 16-wide DFlash block, 7 for DFlash2's 8).
DRAFT_RANGE = {"mtp": (1, 5), "dflash": (1, 15), "dflash2": (1, 15)}
DRAFT_DEFAULT = {"mtp": 3, "dflash": 15, "dflash2": 7}
LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")


@dataclass(frozen=True)
class Meta:
    kind: Kind
    doc: str
    flag: str | None = None
    env: str | None = None
    secret: bool = False


def setting(default: object, kind: Kind, doc: str, *, flag: str | None = None,
            env: str | None = None, secret: bool = False):
    """A dataclass field with its validation kind, doc line, flag and environment variable."""
    return field(default=default, metadata={"ninfer": Meta(kind, doc, flag, env, secret)})


@dataclass(frozen=True)
class ModelConfig:
    path: Path | None = setting(None, PathValue(), "compiled package directory or .ninfer artifact; relative to the working directory", flag="--model", env="NINFER_MODEL")
    id: str | None = setting(None, Text(), "public model id in API responses; unset: the artifact's own id", flag="--model-id")
    chat_template: Path | None = setting(None, PathValue(), "Jinja chat template replacing the artifact's")


@dataclass(frozen=True)
class ServerConfig:
    host: str = setting("127.0.0.1", Text(), "listen address; 0.0.0.0 for LAN access (set api_key then)", env="NINFER_HOST")
    port: int = setting(8080, Int(1, 65535), "listen port", env="NINFER_PORT")
    api_key: str | None = setting(None, Text(), "required Bearer / x-api-key value; unset: no authentication", env="NINFER_API_KEY", secret=True)
    cors_origins: tuple[str, ...] = setting((), TextList(), 'origins allowed by CORS, e.g. ["*"]; empty: CORS off', flag="--cors-origin")
    request_log: Path | None = setting(None, PathValue(), "append-mode JSONL request log; the directory must exist")
    request_log_text: bool = setting(False, Bool(), "include prompt and output text in the request log")
    max_body_bytes: int = setting(384 * MiB, Bytes(1), "largest request body (413 above)")
    max_queue: int = setting(16, Int(0, 65536), "requests allowed to wait beyond engine.max_active (429 above)")
    queue_timeout_ms: int = setting(30_000, Int(1, 86_400_000), "deadline for preparation plus queue wait (503 after), milliseconds")
    metrics: bool = setting(True, Bool(), "serve Prometheus metrics at GET /metrics")
    response_store_records: int = setting(1024, Int(0, 1_000_000), "stored /v1/responses records (LRU); 0: none")
    response_store_bytes: int = setting(256 * MiB, Bytes(0), "byte budget of the stored responses")


@dataclass(frozen=True)
class ContextConfig:
    max_context: int | str = setting(AUTO, Auto(Int(1, INT32_MAX)), 'per-request limit of prompt plus output tokens; "auto": the model\'s native context')
    context_capacity: int | str = setting(AUTO, Auto(Bytes(1)), 'device bytes of the shared context pool (KV + state) per rank; "auto": what is left after weights')
    auto_headroom_bytes: int = setting(1 * GiB, Bytes(0), 'device memory left free when context_capacity = "auto"')
    kv_dtype: str = setting("bf16", Choice(*KV_DTYPES), "KV cache storage: bf16, fp8 (E4M3 row-256) or int8 (group-64)")
    prefix_cache: bool = setting(True, Bool(), "reuse cached prompt prefixes across requests")
    prefix_cache_entries: int = setting(16, Int(1, 65536), "prefixes and continuations kept for reuse (LRU)")
    host_pinned_bytes: int = setting(8 * GiB, Bytes(0), "pinned host memory for spilled context; 0: off")


@dataclass(frozen=True)
class EngineConfig:
    max_active: int = setting(8, Int(1, 8), "requests generating at once (decode batch rows)")
    prefill_chunk: int = setting(1024, Int(128, 65536, 128), "prompt tokens per prefill step, a multiple of 128")
    cuda_graphs: bool = setting(True, Bool(), "replay decode steps as CUDA graphs; false: eager")
    device: int = setting(0, Int(0, 255), "CUDA device index of this process")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = setting("none", Choice(*SPEC_METHODS), "speculative decoding backend; its component must be in the artifact", flag="--spec")
    draft_tokens: int | None = setting(None, Int(1, 15), "draft tokens per round: mtp 1..5, dflash/dflash2 1..15; unset: mtp 3, dflash 15, dflash2 7")
    draft_head: str = setting("full", Choice("full", "indexed"), "head that picks drafts: full, or the optimized indexed proposal head")

    @property
    def draft_window(self) -> int:
        """Draft tokens per round actually used (0 without speculation)."""
        if self.method == "none":
            return 0
        return self.draft_tokens or DRAFT_DEFAULT[self.method]


@dataclass(frozen=True)
class VisionConfig:
    enabled: bool = setting(False, Bool(), "load the vision encoder; allows image and video input", flag="--vision")
    max_tokens_per_item: int = setting(16384, Int(64, 16384), "vision tokens per image/video; larger media are resized", flag="--max-vision-tokens")
    media_cache_bytes: int = setting(1 * GiB, Bytes(0), "host cache of prepared media (LRU); 0: none")
    media_live_bytes: int = setting(2 * GiB, Bytes(1), "bound on all prepared media in flight")
    preprocess_threads: int = setting(0, Int(0, 16), "media decode/resize threads; 0: automatic", flag="--media-threads")


@dataclass(frozen=True)
class OffloadConfig:
    enabled: bool = setting(False, Bool(), "keep MoE expert weights in host memory and run them there", flag="--offload")
    gpu_experts: int = setting(0, Int(0, 4096), "experts per MoE layer kept resident on the GPU (the most used)")
    threads: int = setting(0, Int(0, 1024), "CPU threads for offloaded experts; 0: all physical cores", flag="--offload-threads")


@dataclass(frozen=True)
class DistributedConfig:
    ranks: int = setting(1, Int(1, 2), "processes (one GPU each) serving the model; must equal tp")
    rank: int = setting(0, Int(0, 1), "this process's rank; rank 0 schedules and serves HTTP", env="NINFER_RANK")
    tp: int = setting(1, Int(1, 2), "tensor-parallel degree")
    ep: int = setting(1, Int(1, 2), "expert-parallel degree over the same ranks (MoE models)")
    dp: int = setting(1, Int(1, 2), "attention data-parallel degree inside the tensor-parallel group")
    master_addr: str = setting("127.0.0.1", Text(), "address of rank 0, reachable from every rank", env="NINFER_MASTER_ADDR")
    master_port: int = setting(29500, Int(1, 65535), "rendezvous port on rank 0", env="NINFER_MASTER_PORT")
    interface: str | None = setting(None, Text(), "network interface for NCCL between nodes; unset: NCCL's choice", flag="--net-interface")


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float | None = setting(None, Float(0, 2), "default temperature; unset: the model's preset")
    top_p: float | None = setting(None, Float(0, 1), "default nucleus probability; unset: the model's preset")
    top_k: int | None = setting(None, Int(0, INT32_MAX), "default top-k, 0: off; unset: the model's preset")
    min_p: float | None = setting(None, Float(0, 1), "default min-p; unset: the model's preset")
    presence_penalty: float | None = setting(None, Float(-2, 2), "default presence penalty; unset: the model's preset")
    frequency_penalty: float | None = setting(None, Float(-2, 2), "default frequency penalty; unset: the model's preset")
    repetition_penalty: float | None = setting(None, Float(0, 2, lo_open=True), "default repetition penalty, 1: off; unset: the model's preset")
    seed: int | None = setting(None, Int(0, UINT64_MAX), "default seed; unset: a fresh seed per request")
    max_tokens: int = setting(8192, Int(1, INT32_MAX), "output tokens when a request gives no limit")
    greedy: bool = setting(False, Bool(), "argmax decoding for every request, overriding sampling fields")
    thinking: bool = setting(True, Bool(), "thinking mode for requests that do not choose")
    thinking_budget: int | None = setting(None, Int(0, INT32_MAX), "default cap on thinking tokens; unset: no cap")


@dataclass(frozen=True)
class LoggingConfig:
    level: str = setting("info", Choice(*LOG_LEVELS), "stderr verbosity", flag="--log-level", env="NINFER_LOG_LEVEL")
    stats_interval_ms: int = setting(5000, Int(0, 86_400_000), "period of throughput records, milliseconds; 0: off")


@dataclass(frozen=True)
class Config:
    """The whole startup configuration; `Config()` is the defaults."""

    model: ModelConfig = field(default_factory=ModelConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def components(self) -> tuple[str, ...]:
        """Artifact components this process loads; device residency is fixed at startup."""
        parts = ["text"]
        if self.vision.enabled:
            parts.append("vision")
        if self.speculative.method != "none":
            parts.append(self.speculative.method)
        if self.speculative.draft_head == "indexed":
            parts.append("proposal")
        return tuple(parts)


@dataclass(frozen=True)
class FieldSpec:
    """One configuration field: where it lives, its default and how it is given."""

    section: str
    name: str
    default: object
    kind: Kind
    doc: str
    flag: str
    env: str | None
    secret: bool

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(Config)}


def _specs() -> dict[str, FieldSpec]:
    specs = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            meta: Meta = f.metadata["ninfer"]
            flag = meta.flag or "--" + f.name.replace("_", "-")
            spec = FieldSpec(section, f.name, f.default, meta.kind, meta.doc, flag, meta.env, meta.secret)
            specs[spec.key] = spec
    return specs


FIELDS: dict[str, FieldSpec] = _specs()
"""Every field by "section.name", in declaration order."""
