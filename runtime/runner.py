"""Runs a compiled package's entry functions over runtime-owned caches.

The runner owns the device tensors (weights, KV pool, GDN state and conv history) and turns
"these sequences, these new tokens" into calls of `prefill` / `decode` with page tables, cached
lengths and slot ids. It knows nothing about requests, sampling or text.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
import tvm.runtime
import tvm_ffi
from tvm.runtime import vm as tvm_vm

from .memory import CapacityError, MemoryPlan, auto_context_bytes
from .package import (
    LIBRARY,
    Manifest,
    PackageError,
    load_params_numpy,
    open_package_artifact,
    read_manifest,
)
from .pools import ContextPool, PoolPlan, SequenceCache
from .sampling import DEVICE_FILLER, device_selections
from .uploads import DeviceQueue, ReadBack, queue_for, stager_for

GiB = 1 << 30
AUTO = "auto"
KDL_CUDA = 2  # DLPack device type of CUDA GPUs


class _DrawParams:
    """`sample`'s parameter rows in one device tensor of the largest batch, uploaded from
    page-locked memory without waiting (`uploads.PinnedStager`) where the driver allows: a fresh
    tensor per call would be a device allocation and a blocking copy, which waits for the decode
    step queued before it, so the host would issue the draw's launches while the GPU idles."""

    def __init__(self, max_batch: int, device: tvm.runtime.Device) -> None:
        self.tensor = tvm.runtime.empty((max_batch, 5), "float64", device)
        kind = "cuda" if device.dlpack_device_type() == KDL_CUDA else str(device.dlpack_device_type())
        self._stager = stager_for([max_batch * 5 * 8], kind)

    def rows(self, params: np.ndarray) -> tvm.runtime.Tensor:
        """A `[len(params), 5]` view holding `params` by the time the GPU reaches what follows."""
        params = np.ascontiguousarray(params, np.float64)
        view = self.tensor._create_view(params.shape, "float64", 0)
        if self._stager is not None:
            self._stager.upload(0, params, self.tensor.data_ptr())
            self._stager.queued()
        else:
            view.copyfrom(params)
        return view


def int_input(value: int) -> tvm.runtime.ShapeTuple:
    """An int argument of a package function (`spec.Int`): Relax takes it as a one-value shape."""
    return tvm.runtime.ShapeTuple([int(value)])


@dataclass(frozen=True)
class RunnerOptions:
    """How many sequences the runner serves at once and how big its context pool is.

    `context_capacity` is the pool's byte budget (KV pages + state slots), or "auto" (see
    `memory.auto_context_bytes`); `context_bytes`, when given, is an explicit budget that wins
    over it (kept for callers that predate `context_capacity`).
    """

    max_active: int = 8  # sequences holding a state slot at once
    context_bytes: int | None = None
    context_capacity: int | str = AUTO
    auto_headroom_bytes: int = 1 * GiB  # host/device memory left free by "auto"
    cuda_graphs: bool = True  # CUDA packages: decode through the package's CUDA graphs (False: eagerly)
    device_id: int = 0  # CUDA packages: which GPU


def device_for(manifest: Manifest, device_id: int = 0) -> tvm.runtime.Device:
    kind = manifest.target["device"]
    if kind == "cpu":
        return tvm.cpu(0)
    if kind == "cuda":
        from .cuda import cuda_device

        return cuda_device(manifest, device_id)
    raise PackageError(f"target {manifest.target['name']}: unknown device kind {kind!r}")


class _GraphInputs:
    """Decode inputs of one batch bucket: host arrays refilled in place each step, and device tensors
    at fixed addresses, which the bucket's captured graph reads (ids, positions, page table,
    lengths, slots; rows past the batch are padding: length 0, the scratch page and slot).

    Only what changed is uploaded: the small arrays are compared with what their tensor holds, and
    a page-table row is rewritten (and the table uploaded) only when its sequence's page list
    changed: a different list object (pools.py replaces it on release; the row keeps a reference,
    so no new list can take its identity) or a different length (pools.py only appends). On CUDA
    uploads are queued from page-locked memory without waiting (`uploads.PinnedStager`);
    elsewhere, or without the driver, each is a synchronous copy on the step's critical path."""

    TABLE = 2  # index of the page table among the inputs

    def __init__(self, bucket: int, max_pages: int, device: tvm.runtime.Device, scratch_page: int,
                 scratch_slot: int) -> None:
        self.arrays = [np.zeros(bucket, np.int32), np.zeros((3, bucket), np.int32),
                       np.full((bucket, max_pages), scratch_page, np.int32), np.zeros(bucket, np.int32),
                       np.full(bucket, scratch_slot, np.int32)]
        self.tensors = [tvm.runtime.empty(a.shape, "int32", device) for a in self.arrays]
        self._held: list[np.ndarray | None] = [None] * len(self.arrays)  # what each small tensor holds
        self._rows: list[tuple[object, int] | None] = [None] * bucket  # (pages list, its length) per table row
        self._table_stale = True
        self._scratch_page, self._scratch_slot = scratch_page, scratch_slot
        kind = "cuda" if device.dlpack_device_type() == KDL_CUDA else str(device.dlpack_device_type())
        self._stager = stager_for([a.nbytes for a in self.arrays], kind)

    def step(self, tokens: np.ndarray, lengths: np.ndarray, seqs: list[SequenceCache]) -> list[tvm.runtime.Tensor]:
        """The tensors holding this step's inputs (positions of text: the cached length in all three rows)."""
        ids, positions, table, lens, slots = self.arrays
        n = len(seqs)
        ids[:n], ids[n:] = tokens, 0
        positions[:, :n], positions[:, n:] = lengths, 0
        lens[:n], lens[n:] = lengths, 0
        slots[:n], slots[n:] = [s.slot for s in seqs], self._scratch_slot
        for i, s in enumerate(seqs):
            row = self._rows[i]
            if row is None or row[0] is not s.pages or row[1] != len(s.pages):
                table[i, : len(s.pages)], table[i, len(s.pages):] = s.pages, 0
                self._rows[i], self._table_stale = (s.pages, len(s.pages)), True
        for i in range(n, len(self._rows)):
            if self._rows[i] is not None:
                table[i], self._rows[i], self._table_stale = self._scratch_page, None, True
        queued = False
        for i, (tensor, array) in enumerate(zip(self.tensors, self.arrays, strict=True)):
            if i == self.TABLE:
                if not self._table_stale:
                    continue
                self._table_stale = False
            elif self._held[i] is not None and np.array_equal(self._held[i], array):
                continue
            else:
                self._held[i] = array.copy()
            if self._stager is not None:
                self._stager.upload(i, array, tensor.data_ptr())
                queued = True
            else:
                tensor.copyfrom(array)
        if queued:
            self._stager.queued()
        return self.tensors

    def feed(self, queue: DeviceQueue, src_ptr: int, rows: dict[int, int]) -> None:
        """Token ids chosen on the device: row `dst` of the ids tensor gets element `rows[dst]` at
        `src_ptr` (queued after this step's uploads, so it overwrites their placeholders)."""
        _feed_copies(queue, self.tensors[0].data_ptr(), src_ptr, rows)
        self._held[0] = None  # the tensor no longer holds what was uploaded


def _tensor_to_bytes(tensor: tvm.runtime.Tensor, ptr: int, nbytes: int) -> None:
    """Copy a tensor into host memory at `ptr` (what `Tensor.numpy` does into its fresh array)."""
    from tvm.runtime import _ffi_api

    _ffi_api.TVMTensorCopyToBytes(tensor, ctypes.c_void_p(ptr), nbytes)


def _feed_copies(queue: DeviceQueue, dst_ptr: int, src_ptr: int, rows: dict[int, int]) -> None:
    """int32 element copies dst[d] = src[rows[d]], one device copy per run of consecutive rows."""
    items = sorted(rows.items())
    start = 0
    for i in range(1, len(items) + 1):
        if i == len(items) or items[i][0] != items[i - 1][0] + 1 or items[i][1] != items[i - 1][1] + 1:
            (d0, s0), count = items[start], i - start
            queue.copy(dst_ptr + 4 * d0, src_ptr + 4 * s0, 4 * count)
            start = i


class PendingGreedy:
    """A decode step's greedy choices `(token [n] int32, log-probability [n] fp32)`: on the device
    (`tokens`, which a next step can take as its input without the host) and, once `result()`
    has waited for the read-back queued behind the step, on the host."""

    def __init__(self, n: int, tokens: tvm.runtime.Tensor, logprobs: tvm.runtime.Tensor,
                 read_back: ReadBack | None, current: Callable[[], bool] = lambda: True) -> None:
        self.n, self.tokens = n, tokens
        self._read_back, self._current = read_back, current
        # without a read-back queue the arrays are read now, before anything can overwrite them
        self._result = None if read_back is not None else (tokens.numpy()[:n], logprobs.numpy()[:n])

    @property
    def on_device(self) -> bool:
        """Whether `tokens` still holds this step's choices on the device: a queued step whose
        output the same graph has not overwritten since (not after `result()` either)."""
        return self._read_back is not None and self._result is None and self._current()

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self._result is None:
            ids, logprobs = self._read_back.wait()
            self._result, self.tokens = (ids, logprobs), None  # (a later replay may overwrite the tensor)
        return self._result


class ModelRunner:
    """A loaded package, ready to run prefill and decode steps."""

    def __init__(self, package: str | os.PathLike, *, artifact: str | os.PathLike | None = None,
                 options: RunnerOptions | None = None) -> None:
        self.package = Path(package)
        self.options = options or RunnerOptions()
        self.manifest = read_manifest(self.package)
        self.device = device_for(self.manifest, self.options.device_id)
        limits = self.manifest.limits
        if self.options.max_active > limits["max_batch"]:
            raise PackageError(f"max_active {self.options.max_active} exceeds the package's compiled batch limit "
                               f"{limits['max_batch']}")
        self.max_context = limits["max_context"]
        self.prefill_chunk = limits["prefill_chunk"]
        with open_package_artifact(self.package, self.manifest, artifact) as art:
            self.artifact_path = art.path
            arrays = load_params_numpy(art, self.manifest)
            self.weights_bytes = sum(int(a.nbytes) for a in arrays)
            # one FFI array for every call: a Python list of ~1,700 tensors is converted anew per call
            self.params = tvm_ffi.convert([tvm.runtime.tensor(a, self.device) for a in arrays])
            del arrays
        lib = tvm.runtime.load_module(str(self.package / self.manifest.raw.get("library", LIBRARY)))
        self.vm = tvm_vm.VirtualMachine(lib, self.device)
        self._prefill = self.vm["prefill"]
        self._prefill_all = self.vm["prefill_all_logits"]
        self._decode_fn = self.vm["decode"]
        # CUDA graphs, one per batch bucket. Padding rows of a bucket write one scratch KV page and
        # one scratch state slot, allocated past the pool's own (which never hands them out).
        graphs = self.manifest.raw.get("cuda_graphs", {}).get("decode") if self.options.cuda_graphs else None
        self.graph_buckets: list[int] = sorted(graphs["buckets"]) if graphs else []
        self._decode_graph = self.vm[graphs["function"]] if graphs else None
        self._graph_inputs: dict[int, _GraphInputs] = {}
        self._replays = dict.fromkeys(self.graph_buckets, 0)  # calls of each bucket's graph
        self._logits_rows: np.ndarray | None = None  # `decode_rows(reuse=True)`'s host buffer
        scratch = 1 if graphs else 0
        cache = self.manifest.cache
        self.cache_layout = cache
        budget, policy = self._context_budget()
        self.pool = ContextPool(PoolPlan.from_budget(
            budget, page_size=cache.page_size, bytes_per_page=cache.bytes_per_page(),
            bytes_per_slot=cache.bytes_per_slot(), num_slots=self.options.max_active))
        self.memory = MemoryPlan(
            device=f"{self.manifest.target['name']} ({self.manifest.target['device']})",
            weights_bytes=self.weights_bytes, capacity_policy=policy, budget_bytes=budget,
            pool=self.pool.plan, max_context=self.max_context, max_active=self.options.max_active)
        self.max_pages_per_seq = -(-self.max_context // cache.page_size)
        plan = self.pool.plan
        self.scratch_page, self.scratch_slot = plan.num_pages, plan.num_slots
        self.kv_pool = tvm.runtime.empty(
            (cache.attention_layers, plan.num_pages + scratch, *cache.kv_per_page), cache.kv_dtype, self.device)
        self.gdn_state = tvm.runtime.empty(
            (cache.gdn_layers, plan.num_slots + scratch, *cache.gdn_state_per_slot), "float32", self.device)
        self.conv_state = tvm.runtime.empty(
            (cache.gdn_layers, plan.num_slots + scratch, *cache.conv_state_per_slot), cache.conv_dtype, self.device)
        # greedy choices read back behind their step (two int32/fp32 arrays of the largest batch)
        kind = "cuda" if self.device.dlpack_device_type() == KDL_CUDA else str(self.device.dlpack_device_type())
        self._queue = queue_for(2 * 16 * -(-4 * limits["max_batch"] // 16), kind) if self.device_greedy else None
        self._draw_params: _DrawParams | None = None  # `sample`'s parameter rows, on first use

    def _context_budget(self) -> tuple[int, str]:
        """The pool's byte budget and whether it was given ("explicit") or planned ("auto")."""
        explicit = self.options.context_bytes
        if explicit is None and self.options.context_capacity != AUTO:
            explicit = int(self.options.context_capacity)
        if explicit is not None:
            if explicit <= 0:
                raise PackageError(f"context capacity must be a positive byte count, got {explicit}")
            return explicit, "explicit"
        cache = self.cache_layout
        free = None
        if self.manifest.target["device"] == "cuda":  # the weights are on the device already
            free = self.device.available_global_memory
        try:
            budget = auto_context_bytes(
                device_kind=self.manifest.target["device"], bytes_per_page=cache.bytes_per_page(),
                bytes_per_slot=cache.bytes_per_slot(), page_size=cache.page_size, max_context=self.max_context,
                num_slots=self.options.max_active, headroom_bytes=self.options.auto_headroom_bytes,
                device_free_bytes=free)
        except CapacityError as exc:
            raise PackageError(str(exc)) from None
        return budget, "auto"

    def describe(self) -> dict:
        """The startup memory plan (weights, context pool, estimated token capacity) as a dict."""
        return self.memory.as_dict()

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

    def _call(self, fn, tokens: np.ndarray, positions: np.ndarray, seqs: list[SequenceCache],  # noqa: ANN202
              feed: tuple[PendingGreedy, dict[int, int]] | None = None):
        """The entry function's outputs (device tensors; the caches are taken over)."""
        ids = self._tensor(tokens.astype(np.int32))
        if feed is not None:
            _feed_copies(self._queue, ids.data_ptr(), feed[0].tokens.data_ptr(), feed[1])
        out = fn(
            ids,
            self._tensor(positions.astype(np.int32)),
            self._tensor(self._page_table(seqs)),
            self._tensor(np.array([s.length for s in seqs], np.int32)),
            self._tensor(np.array([s.slot for s in seqs], np.int32)),
            self.kv_pool, self.gdn_state, self.conv_state, self.params,
        )
        self.kv_pool, self.gdn_state, self.conv_state = out[1], out[2], out[3]
        return out

    # -- steps -------------------------------------------------------------------------------

    def embed(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Token embeddings `[n, hidden]` as the model computes them (for merging media features)."""
        tokens = np.asarray(tokens, np.int32)
        if tokens.size == 0:
            raise ValueError("embed needs at least one token")
        rows = [self.vm["embed"](self._tensor(tokens[i : i + self.prefill_chunk]), self.params).numpy()
                for i in range(0, tokens.size, self.prefill_chunk)]
        return np.concatenate(rows)

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
            logits = self._call(self._prefill_all if all_logits else self._prefill, chunk, pos, [seq])[0].numpy()
            seq.length += chunk.size
            pieces.append(logits)
        return np.concatenate(pieces) if all_logits else pieces[-1][0]

    def decode(self, seqs: list[SequenceCache], tokens: list[int] | np.ndarray) -> np.ndarray:
        """One new token for each sequence; logits `[len(seqs), vocab]`."""
        out, n = self._decode(seqs, tokens)
        return out[0].numpy()[:n]

    def decode_greedy(self, seqs: list[SequenceCache], tokens: list[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One new token for each sequence; each row's greedy choice `(token [n] int32, its
        log-probability [n] fp32)`. Packages that choose on the device copy only these 8 bytes
        per sequence; older ones fall back to the logits (same result)."""
        if self.device_greedy:
            return self.decode_greedy_async(seqs, tokens).result()
        out, n = self._decode(seqs, tokens)
        logits = out[0].numpy()[:n].astype(np.float64)
        token = np.argmax(logits, axis=-1).astype(np.int32)  # ties -> lowest id
        top = logits.max(axis=-1)
        lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=-1))
        return token, (logits[np.arange(n), token] - lse).astype(np.float32)

    def decode_rows(self, seqs: list[SequenceCache], tokens: list[int] | np.ndarray, logits_rows: list[int], *,
                    reuse: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One decode step: every row's greedy choice `(token [n], log-probability [n])` and the
        logits of `logits_rows` only (`[len(logits_rows), vocab]`), so a batch where a few rows
        sample on the host copies those rows' logits, not all of them (device-greedy packages).
        `reuse`: the rows land in a host buffer the runner keeps (valid until the next such call),
        which spares the page faults of a fresh megabyte per row."""
        if not self.device_greedy:
            raise PackageError("this package does not choose greedy tokens on the device (recompile it)")
        if not all(0 <= r < len(seqs) for r in logits_rows):
            raise ValueError(f"logits rows {logits_rows} are outside the batch of {len(seqs)}")
        result, n = self._decode(seqs, tokens)
        return result[4].numpy()[:n], result[5].numpy()[:n], self._logits_of(result[0], logits_rows, reuse)

    def _logits_of(self, logits: tvm.runtime.Tensor, logits_rows: list[int], reuse: bool) -> np.ndarray:
        """Rows `logits_rows` of a step's logits on the host (`decode_rows`' `reuse`)."""
        vocab = int(logits.shape[-1])
        row_bytes = vocab * np.dtype(logits.dtype).itemsize
        views = [logits._create_view((vocab,), logits.dtype, r * row_bytes) for r in logits_rows]
        if reuse and logits.dtype == "float32":
            if self._logits_rows is None or self._logits_rows.shape[1] != vocab:
                self._logits_rows = np.empty((self.manifest.limits["max_batch"], vocab), np.float32)
            for i, view in enumerate(views):
                _tensor_to_bytes(view, self._logits_rows[i].ctypes.data, row_bytes)
            return self._logits_rows[: len(views)]
        return np.stack([v.numpy() for v in views]) if views else np.zeros((0, vocab), np.float32)

    def decode_drawn(self, seqs: list[SequenceCache], tokens: list[int] | np.ndarray, draws: dict[int, list[float]],
                     logits_rows: list[int] = (), *, reuse: bool = False,
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[int, tuple[int, float]]]:
        """`decode_rows`, and rows `draws` (row -> `SamplingParams.device_row`) drawn on the
        device by the package's `sample` function from the step's logits, which stay there: each
        such row copies its token and log-probability (8 bytes), not its logits (~1 MB)."""
        self._check_draws(len(seqs), draws)
        result, n = self._decode(seqs, tokens)
        drawn = self._draw(result[0], draws)  # queued behind the step; read below
        ids, logprobs = result[4].numpy()[:n], result[5].numpy()[:n]
        rows = self._logits_of(result[0], logits_rows, reuse)
        if drawn is None:
            return ids, logprobs, rows, {}
        token, logprob = drawn[0].numpy(), drawn[1].numpy()
        return ids, logprobs, rows, {r: (int(token[r]), float(logprob[r])) for r in draws}

    def _check_draws(self, n: int, draws: dict[int, list[float]]) -> None:
        if not self.device_sampling:
            raise PackageError("this package does not draw sampled tokens on the device (recompile it for a CUDA "
                               "target with tuned kernels)")
        if not all(0 <= r < n for r in draws):
            raise ValueError(f"drawn rows {sorted(draws)} are outside the batch of {n}")
        for r, row in draws.items():
            if len(row) != 5 or not 0.0 < row[0] or not 0.0 <= row[4] < 1.0:
                raise ValueError(f"row {r}: a device draw takes (temperature > 0, top_k, top_p, min_p, u in [0, 1)), "
                                 f"got {row}")

    def _merge_draws(self, out, draws: dict[int, list[float]]) -> None:  # noqa: ANN001
        """Queue the draws of a step and copy each drawn row's token and log-probability over its
        greedy choice in the step's outputs (device copies behind the draw; on the host elsewhere)."""
        token, logprob = self._draw(out[0], draws)
        if self._queue is not None:
            rows = {r: r for r in draws}
            _feed_copies(self._queue, out[4].data_ptr(), token.data_ptr(), rows)
            _feed_copies(self._queue, out[5].data_ptr(), logprob.data_ptr(), rows)
            return
        ids, logprobs, t, lp = out[4].numpy(), out[5].numpy(), token.numpy(), logprob.numpy()
        for r in draws:
            ids[r], logprobs[r] = t[r], lp[r]
        out[4].copyfrom(ids)
        out[5].copyfrom(logprobs)

    def _draw(self, logits: tvm.runtime.Tensor, draws: dict[int, list[float]]):  # noqa: ANN202
        """Queue the `sample` function over the logits' first rows up to the last drawn one (rows
        between that are not drawn run as a plain draw, whose result is dropped), launching only
        the cuts the rows have; its (token, logprob) device tensors, or None without draws."""
        if not draws:
            return None
        rows, vocab = max(draws) + 1, int(logits.shape[-1])
        params = np.tile(np.array(DEVICE_FILLER), (rows, 1))
        for r, row in draws.items():
            params[r] = row
        view = logits._create_view((rows, vocab), logits.dtype, 0)
        if self._draw_params is None:
            self._draw_params = _DrawParams(self.manifest.limits["max_batch"], self.device)
        return self.vm["sample"](view, self._draw_params.rows(params), int_input(device_selections(params)))

    @property
    def device_sampling(self) -> bool:
        """Whether the package draws sampled tokens on the device (tuned CUDA packages since it does)."""
        return "sample" in self.manifest.raw.get("functions", {})

    def decode_greedy_async(self, seqs: list[SequenceCache], tokens: list[int] | np.ndarray, *,
                            feed: PendingGreedy | None = None, feed_rows: dict[int, int] | None = None,
                            draws: dict[int, list[float]] | None = None) -> PendingGreedy:
        """Queue one decode step and return without waiting for it (on CUDA; elsewhere the step
        has run when this returns). Row `i` in `feed_rows` takes as its token the choice of row
        `feed_rows[i]` of the step `feed` (its entry in `tokens` is ignored): on the device while
        `feed` is still queued, so a loop can queue step n + 1 before reading step n. Rows in
        `draws` (row -> `SamplingParams.device_row`) are drawn on the device (`sample`) and their
        tokens and log-probabilities take the place of the greedy ones in the step's choices."""
        if not self.device_greedy:
            raise PackageError("this package does not choose greedy tokens on the device (recompile it)")
        if draws:
            self._check_draws(len(seqs), draws)
        tokens = np.array(tokens, np.int32)
        rows = dict(feed_rows or {})
        if feed is not None and rows:
            if not all(0 <= d < len(seqs) and 0 <= r < feed.n for d, r in rows.items()):
                raise ValueError(f"feed rows {rows} are outside the batch ({len(seqs)}) or the fed step ({feed.n})")
            if not (feed.on_device and self._queue is not None):
                ids, _ = feed.result()
                for d, r in rows.items():
                    tokens[d] = ids[r]
                feed = None
        else:
            feed = None
        out, n = self._decode(seqs, tokens, None if feed is None else (feed, rows))
        if draws:
            self._merge_draws(out, draws)
        read_back = None
        if self._queue is not None:
            read_back = self._queue.read_back([(out[4].data_ptr(), n, np.int32), (out[5].data_ptr(), n, np.float32)])
        bucket = self._bucket(n)
        if bucket is None:  # a fresh output tensor, held by the result
            return PendingGreedy(n, out[4], out[5], read_back)
        replay = self._replays[bucket]  # the graph's outputs live until its next replay
        return PendingGreedy(n, out[4], out[5], read_back, lambda: self._replays[bucket] == replay)

    @property
    def device_greedy(self) -> bool:
        """Whether `decode` also returns each row's greedy choice (packages compiled since it does)."""
        outputs = self.manifest.raw.get("functions", {}).get("decode", {}).get("outputs", [])
        return "greedy_token" in outputs

    def _decode(self, seqs: list[SequenceCache], tokens: list[int] | np.ndarray,  # noqa: ANN202
                feed: tuple[PendingGreedy, dict[int, int]] | None = None):
        """Run one decode step; `(the function's outputs, rows that are real)`."""
        tokens = np.asarray(tokens, np.int32)
        if not seqs or tokens.shape != (len(seqs),):
            raise ValueError(f"decode takes one token per sequence: {len(seqs)} sequences, tokens of shape {tokens.shape}")
        lengths = np.fromiter((s.length for s in seqs), np.int32, len(seqs))
        if int(lengths.max()) + 1 > self.max_context:
            raise PackageError(f"sequence would exceed the package's max_context {self.max_context}")
        for s in seqs:
            self.pool.reserve(s, s.length + 1)
        bucket = self._bucket(len(seqs))
        if bucket is None:
            positions = np.broadcast_to(lengths, (3, lengths.size))  # text: three equal rows
            out = self._call(self._decode_fn, tokens, positions, seqs, feed)
        else:
            out = self._call_graph(bucket, tokens, lengths, seqs, feed)
        for s in seqs:
            s.length += 1
        return out, len(seqs)

    def _bucket(self, rows: int) -> int | None:
        """The CUDA graph bucket a batch of `rows` runs in (None: eagerly)."""
        return next((b for b in self.graph_buckets if b >= rows), None)

    def _call_graph(self, bucket: int, tokens: np.ndarray, lengths: np.ndarray, seqs: list[SequenceCache],  # noqa: ANN202
                    feed: tuple[PendingGreedy, dict[int, int]] | None = None):
        """Decode through the bucket's CUDA graph; rows past `len(seqs)` are padding (`_GraphInputs`)."""
        inputs = self._graph_inputs.get(bucket)
        if inputs is None:
            inputs = self._graph_inputs[bucket] = _GraphInputs(bucket, self.max_pages_per_seq, self.device,
                                                               self.scratch_page, self.scratch_slot)
        args = inputs.step(tokens, lengths, seqs)
        if feed is not None:
            inputs.feed(self._queue, feed[0].tokens.data_ptr(), feed[1])
        self._replays[bucket] += 1
        out = self._decode_graph(*args, self.kv_pool, self.gdn_state, self.conv_state, self.params)
        self.kv_pool, self.gdn_state, self.conv_state = out[1], out[2], out[3]
        return out
