"""Runs a compiled package's entry functions over runtime-owned caches.

The runner owns the device tensors (weights, KV pool, GDN state and conv history) and turns
"these sequences, these new tokens" into calls of `prefill` / `decode` with page tables, cached
lengths and slot ids. It knows nothing about requests, sampling or text.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
import tvm.runtime
from tvm.runtime import vm as tvm_vm

from .package import (
    LIBRARY,
    Manifest,
    PackageError,
    load_params_numpy,
    open_package_artifact,
    read_manifest,
)
from .pools import ContextPool, PoolPlan, SequenceCache

DEFAULT_CPU_CONTEXT_BYTES = 256 << 20


@dataclass(frozen=True)
class RunnerOptions:
    max_active: int = 8  # sequences holding a state slot at once
    context_bytes: int | None = None  # KV + state budget; None = a default for the device


def device_for(manifest: Manifest) -> tvm.runtime.Device:
    kind = manifest.target["device"]
    if kind == "cpu":
        return tvm.cpu(0)
    raise PackageError(f"target {manifest.target['name']}: {kind} packages need the CUDA runtime, not available here")


class ModelRunner:
    """A loaded package, ready to run prefill and decode steps."""

    def __init__(self, package: str | os.PathLike, *, artifact: str | os.PathLike | None = None,
                 options: RunnerOptions | None = None) -> None:
        self.package = Path(package)
        self.options = options or RunnerOptions()
        self.manifest = read_manifest(self.package)
        self.device = device_for(self.manifest)
        limits = self.manifest.limits
        if self.options.max_active > limits["max_batch"]:
            raise PackageError(f"max_active {self.options.max_active} exceeds the package's compiled batch limit "
                               f"{limits['max_batch']}")
        self.max_context = limits["max_context"]
        self.prefill_chunk = limits["prefill_chunk"]
        with open_package_artifact(self.package, self.manifest, artifact) as art:
            self.artifact_path = art.path
            self.params = [tvm.runtime.tensor(a, self.device) for a in load_params_numpy(art, self.manifest)]
        lib = tvm.runtime.load_module(str(self.package / self.manifest.raw.get("library", LIBRARY)))
        self.vm = tvm_vm.VirtualMachine(lib, self.device)
        self._prefill = self.vm["prefill"]
        self._prefill_all = self.vm["prefill_all_logits"]
        self._decode = self.vm["decode"]
        cache = self.manifest.cache
        self.cache_layout = cache
        budget = self.options.context_bytes or DEFAULT_CPU_CONTEXT_BYTES
        self.pool = ContextPool(PoolPlan.from_budget(
            budget, page_size=cache.page_size, bytes_per_page=cache.bytes_per_page(),
            bytes_per_slot=cache.bytes_per_slot(), num_slots=self.options.max_active))
        self.max_pages_per_seq = -(-self.max_context // cache.page_size)
        plan = self.pool.plan
        self.kv_pool = tvm.runtime.empty(
            (cache.attention_layers, plan.num_pages, *cache.kv_per_page), cache.kv_dtype, self.device)
        self.gdn_state = tvm.runtime.empty((cache.gdn_layers, plan.num_slots, *cache.gdn_state_per_slot), "float32", self.device)
        self.conv_state = tvm.runtime.empty(
            (cache.gdn_layers, plan.num_slots, *cache.conv_state_per_slot), cache.conv_dtype, self.device)

    # -- helpers -----------------------------------------------------------------------------

    def _tensor(self, array: np.ndarray) -> tvm.runtime.Tensor:
        return tvm.runtime.tensor(np.ascontiguousarray(array), self.device)

    def _page_table(self, seqs: list[SequenceCache]) -> np.ndarray:
        table = np.zeros((len(seqs), self.max_pages_per_seq), np.int32)
        for i, s in enumerate(seqs):
            table[i, : len(s.pages)] = s.pages
        return table

    @staticmethod
    def text_positions(start: int, count: int) -> np.ndarray:
        """MRoPE positions of plain text: three equal rows."""
        return np.broadcast_to(np.arange(start, start + count, dtype=np.int32), (3, count)).copy()

    def _call(self, fn, tokens: np.ndarray, positions: np.ndarray, seqs: list[SequenceCache]) -> np.ndarray:
        out = fn(
            self._tensor(tokens.astype(np.int32)),
            self._tensor(positions.astype(np.int32)),
            self._tensor(self._page_table(seqs)),
            self._tensor(np.array([s.length for s in seqs], np.int32)),
            self._tensor(np.array([s.slot for s in seqs], np.int32)),
            self.kv_pool, self.gdn_state, self.conv_state, self.params,
        )
        logits, self.kv_pool, self.gdn_state, self.conv_state = out[0], out[1], out[2], out[3]
        return logits.numpy()

    # -- steps -------------------------------------------------------------------------------

    def prefill(self, seq: SequenceCache, tokens: list[int] | np.ndarray, *, all_logits: bool = False,
                positions: np.ndarray | None = None) -> np.ndarray:
        """Feed `tokens` after `seq.length` cached ones (in chunks); logits of the last (or every) token."""
        tokens = np.asarray(tokens, np.int32)
        if tokens.size == 0:
            raise ValueError("prefill needs at least one token")
        if seq.length + tokens.size > self.max_context:
            raise PackageError(f"{seq.length + tokens.size} tokens exceed the package's max_context {self.max_context}")
        self.pool.reserve(seq, seq.length + tokens.size)
        pieces = []
        for start in range(0, tokens.size, self.prefill_chunk):
            chunk = tokens[start : start + self.prefill_chunk]
            pos = (self.text_positions(seq.length, chunk.size) if positions is None
                   else positions[:, start : start + chunk.size])
            logits = self._call(self._prefill_all if all_logits else self._prefill, chunk, pos, [seq])
            seq.length += chunk.size
            pieces.append(logits)
        return np.concatenate(pieces) if all_logits else pieces[-1][0]

    def decode(self, seqs: list[SequenceCache], tokens: list[int] | np.ndarray) -> np.ndarray:
        """One new token for each sequence; logits `[len(seqs), vocab]`."""
        tokens = np.asarray(tokens, np.int32)
        for s in seqs:
            if s.length + 1 > self.max_context:
                raise PackageError(f"sequence would exceed the package's max_context {self.max_context}")
            self.pool.reserve(s, s.length + 1)
        positions = np.stack([self.text_positions(s.length, 1)[:, 0] for s in seqs], axis=1)
        logits = self._call(self._decode, tokens, positions, seqs)
        for s in seqs:
            s.length += 1
        return logits
