"""Startup configuration (TOML) shared by `ninfer run` and `ninfer serve`.

    resolved = load_config(Path("ninfer.toml"), os.environ, {"server.port": 9000})
    resolved.config.server.port        # 9000
    resolved.source("server.port")     # "flag:--port"

The model is in `model` (one frozen dataclass per section), value kinds in `values`, resolution
and errors in `loader`. docs/config.md is the user guide; ninfer.example.toml lists every field.
"""

from .loader import ConfigError, ConfigIssue, ResolvedConfig, load_config
from .model import (
    FIELDS,
    SECTIONS,
    Config,
    ContextConfig,
    DistributedConfig,
    EngineConfig,
    FieldSpec,
    LoggingConfig,
    ModelConfig,
    OffloadConfig,
    SamplingConfig,
    ServerConfig,
    SpeculativeConfig,
    VisionConfig,
)
from .values import AUTO, format_bytes, parse_bytes

__all__ = [
    "AUTO", "FIELDS", "SECTIONS", "Config", "ConfigError", "ConfigIssue", "ContextConfig",
    "DistributedConfig", "EngineConfig", "FieldSpec", "LoggingConfig", "ModelConfig",
    "OffloadConfig", "ResolvedConfig", "SamplingConfig", "ServerConfig", "SpeculativeConfig",
    "VisionConfig", "format_bytes", "load_config", "parse_bytes",
]
