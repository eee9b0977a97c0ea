"""ninfer runtime: loads compiled packages and serves them; never imports the compiler.

`Engine`, `GenerationParams`, `TokenEvent`, `RequestHandle`, `RequestError`, `QueueFull`,
`ModelRunner` and `RunnerOptions` are importable from here; they load lazily (TVM and numpy only
when first used), so `import ninfer_runtime` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Engine": "engine",
    "GenerationParams": "engine",
    "TokenEvent": "engine",
    "RequestHandle": "engine",
    "RequestError": "engine",
    "QueueFull": "engine",
    "ModelRunner": "runner",
    "RunnerOptions": "runner",
    "SamplingParams": "sampling",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ninfer_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
