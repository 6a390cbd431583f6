"""The GPU runtime: adapter and device, device-resident arrays, the pipeline cache, executables.

An executable records one command encoder with one compute pass holding every dispatch of a call,
and submits it once. Calls return as soon as the work is submitted; reading an output waits.
The numpy interpreter (fusec.interpret) runs the program instead where there is no adapter, where
the only adapter is a software one (lavapipe, llvmpipe: the interpreter is faster there, see
docs/architecture.md) unless FUSEC_BACKEND=gpu asks for it, or with FUSEC_BACKEND=cpu.
"""

from __future__ import annotations

import atexit
import operator
import os
import threading
import time
import warnings
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from itertools import compress
from operator import is_not, itemgetter
from typing import TYPE_CHECKING, Any, Optional, cast

import numpy as np

from . import cache, config, dtypes
from . import numpy as fnp
from .errors import DeviceLimitError, DTypeError, FusecError
from .interpret import evaluate
from .ir import Eqn, Lit, Op, Program, Var, buffer_bytes, itemsize, kernel_cost
from .native import Encoder, Pass, open_native, poll_function
from .passes import run_interpreter_pipeline, used_inputs
from .trace import register_array_type

BIND_GROUP_CACHE = 8  # bind groups kept per kernel launch of an executable
_WAIT_MODES = ("spin", "poll", "thread")  # FUSEC_WAIT (see Runtime.wait_idle)
_BACKENDS = {"vulkan": "Vulkan", "metal": "Metal", "dx12": "D3D12", "gl": "OpenGL"}
_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 1, "OpenGL": 2}


@dataclass
class DeviceInfo:
    """A device: what ``fusec.devices()`` lists and ``fusec.default_device()`` reports. Pass one
    (or its ``index``) wherever fusec takes a device (``device_put``, ``Array.to``,
    ``gpu_jit(device=...)``, ``fusec.shard``)."""

    backend: str  # "Vulkan", "Metal", ..., or "cpu" for the numpy fallback
    adapter: str
    adapter_type: str
    limits: dict[str, int] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    # why this device was chosen, where it is not the obvious one (the interpreter with an
    # adapter present, or a software adapter asked for): "" otherwise
    reason: str = ""
    index: int = -1  # its position in fusec.devices() (-1: the numpy interpreter)

    @property
    def is_cpu_fallback(self) -> bool:
        """True when the numpy interpreter runs the programs (no wgpu device is used)."""
        return self.backend == "cpu"

    def __str__(self) -> str:
        return f"{self.adapter} ({self.adapter_type}, {self.backend})"

    @property
    def name(self) -> str:
        return self.adapter

    def label(self) -> str:
        """How error messages name it: "device 1 (llvmpipe (CPU, OpenGL))"."""
        if self.index < 0:
            return "the numpy interpreter"
        return f"device {self.index} ({self})"


F16_FEATURE = "shader-f16"  # the WebGPU feature float16 storage needs
SUBGROUP_FEATURE = "subgroup"  # wgpu-native's feature for WGSL's subgroup builtins
SUBGROUP_BARRIER_FEATURE = "subgroup-barrier"  # and for subgroupBarrier()
NVIDIA_VENDOR_ID = 0x10DE  # (PCI) an NVIDIA GPU's subgroups are its warps: 32 lanes


def _float16_values(prog: Program) -> Iterator[Var]:
    """The float16 values of ``prog`` (loop and kernel bodies included)."""
    for v in prog.vars():
        if v.dtype == "float16":
            yield v
    for e in prog.eqns:
        body = e.params.get("body")
        if isinstance(body, Program):
            yield from _float16_values(body)


def check_float16(prog: Program, features: Sequence[str], adapter: str, name: str = "") -> None:
    """Raise a DTypeError if ``prog`` holds float16 values and the device lacks ``shader-f16``
    (``features``: the device's feature names; ``adapter``: its name, for the message)."""
    if F16_FEATURE in features or next(_float16_values(prog), None) is None:
        return
    what = f"{name} uses" if name else "this program uses"
    raise DTypeError(
        f"{what} dtype float16, but the adapter {adapter} lacks the WebGPU feature "
        f"'{F16_FEATURE}' that float16 arrays need on the GPU. Convert with "
        "x.astype(np.float32) (inside or outside the function), or run on the numpy "
        "interpreter with FUSEC_BACKEND=cpu.")


class DeviceBuffer:
    """A wgpu storage buffer shared by the arrays that view it; when the last reference goes, the
    buffer returns to the runtime's pool instead of being freed (allocation is slow)."""

    __slots__ = ("raw", "size", "rt")

    def __init__(self, raw: Any, size: int, rt: Runtime) -> None:
        self.raw = raw
        self.size = size
        self.rt = rt

    def __del__(self) -> None:
        try:
            self.rt.release(self.raw, self.size)
        except Exception:  # interpreter shutdown: nothing left to recycle into
            pass


def _stop_poller(device_ref: weakref.ref[Any]) -> None:
    """Stop the poller thread of wgpu-py's device, and wait for it to end, at interpreter exit.

    wgpu-py gives each device a daemon thread that waits on a ``threading.Event``. Daemon threads
    are frozen where they stand once the interpreter starts finalising; one frozen inside
    ``Event.wait`` holds the event's lock for good. The device's ``__del__`` then sets that
    event (to stop the thread) during the final garbage collection and waits forever: the process
    printed everything and never exited (3 of 72 processes, three at a time on lavapipe on 2
    busy cores; none of 360 with this). An atexit function runs while threads still run, so the
    thread ends cleanly here and the later ``__del__`` finds the lock free."""
    device = device_ref()
    poller = getattr(device, "_poller", None)
    if poller is None:
        return
    try:
        poller.stop()
        if poller.is_alive():
            poller.join(timeout=5.0)  # a poll waiting on the GPU returns when its work ends
    except Exception:  # noqa: BLE001 - wgpu-py's private thread changed: nothing to stop here
        pass


class Runtime:
    """The wgpu device and everything cached on it. One per process (see :func:`get_runtime`)."""

    def __init__(self, adapter: Any) -> None:
        import wgpu

        self.wgpu = wgpu
        self.adapter = adapter
        # shader-f16: float16 arrays (kernels declare array<f16>; see check_float16)
        # subgroup, subgroup-barrier: subgroup operations (the radix sort; Runtime.subgroups)
        wanted = ["timestamp-query", F16_FEATURE]
        if config.get("subgroups"):
            wanted += [SUBGROUP_FEATURE, SUBGROUP_BARRIER_FEATURE]
        feats = [f for f in wanted if f in adapter.features]
        try:
            self.device = adapter.request_device_sync(required_features=feats)
        except Exception as exc:
            # an adapter wgpu lists but cannot compute on: the H100 machine's NVIDIA OpenGL
            # adapter failed here ("The selected version doesn't support ... COMPUTE_SHADER")
            why = "; ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())[:300]
            raise FusecError(
                f"the adapter {_adapter_label(adapter)} cannot be used for compute: opening it "
                f"failed ({why}). "
                "Choose another device of fusec.devices()") from exc
        # wgpu-py's poller thread must end before the interpreter finalises (see _stop_poller)
        atexit.register(_stop_poller, weakref.ref(self.device))
        self._poll = poll_function()
        # the calls' recording and submits through wgpu-native directly (fusec.native)
        self.native = open_native(self.device) if config.get("native") else None
        info = adapter.info
        self.info = DeviceInfo(
            backend=str(info["backend_type"]),
            adapter=str(info["device"]),
            adapter_type=str(info["adapter_type"]),
            limits=dict(self.device.limits),
            features=tuple(sorted(self.device.features)),
        )
        self.pipelines: dict[str, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._free: dict[int, list[Any]] = {}  # size class -> buffers nobody references
        # the pooled buffers, oldest release first: a full pool destroys its oldest (id -> size,
        # buffer), so that buffers of sizes in use stay while those of past work go
        self._pooled: OrderedDict[int, tuple[int, Any]] = OrderedDict()
        self._free_bytes = 0
        self.destroyed = 0
        self.pool_limit = config.env_int("FUSEC_POOL_BYTES", 1 << 30)
        self._staging: dict[int, Any] = {}
        # reads started ahead (read_ahead): free staging buffers by size, and the flags of
        # mappings whose callback has not run yet (kept alive until it does)
        self._ahead_staging: dict[int, list[Any]] = {}
        self._map_flags: list[Any] = []
        self._sync_src: Any = None
        # GPU timing: when ``profile`` is set (and the adapter has timestamp queries), each call
        # brackets its compute pass with timestamps; ``last_gpu_ns`` reads the last call's time
        self.profile = False
        self._query: Any = None
        # fusec.profile(): (kernel name, GPU microseconds) of every kernel run while it is on
        self.kernel_profile: Optional[list[tuple[str, float]]] = None
        self._kernel_query: Any = None
        # Lazy submission: small calls are recorded into one open compute pass of a pending
        # encoder (the batch) and submitted together by flush(): when a result is read or
        # waited for, before an upload, when BATCH_CALLS calls are pending, or with a large call
        # (see GpuExecutable.run). One lock serialises recording across threads.
        self.lock = threading.RLock()
        self._batch_enc: Any = None
        self._batch_pass: Any = None
        self._batch_dirty = False  # whether the open batch has anything recorded
        self.batch_calls = 0
        self.flushes = 0  # batches submitted (tests count them)
        self._doomed: list[Any] = []  # buffers to destroy once the batch naming them is submitted
        self._batch_t0 = 0.0  # when the pending batch's first call began recording
        # the last large call's executable and its inputs' buffers: a wait that finds the GPU
        # busy may record that executable's next call meanwhile (GpuExecutable.record_ahead)
        self.ahead: Optional[tuple[Any, list[Any]]] = None
        self.ahead_recorded = 0  # calls recorded ahead (tests count them)
        self.ahead_used = 0  # ...and submitted by the call they were recorded for
        self.submitted = 0  # submission counter; arrays remember theirs
        self.completed = 0  # every submission up to this one has finished
        # the thread that runs this device's share of multi-device work (see on_device)
        self._worker: Optional[ThreadPoolExecutor] = None
        self._worker_ident: Optional[int] = None
        cache.register(self)

    def clear(self) -> None:
        self.pipelines.clear()

    @property
    def target(self) -> str:
        """What codegen tunes for: "cpu" on a software adapter (lavapipe, llvmpipe), else "gpu"."""
        forced = str(config.get("target") or "")
        if forced in ("cpu", "gpu"):
            return forced
        return "cpu" if self.info.adapter_type == "CPU" else "gpu"

    @property
    def lowering_key(self) -> tuple[Any, ...]:
        """Everything about this device that the lowering of a program depends on: devices with
        equal keys (two GPUs of one model) share one lowering, each compiles its own pipelines."""
        return (self.info.backend, self.info.adapter, self.max_binding_size, self.max_bindings,
                self.target, self.max_workgroup_storage, F16_FEATURE in self.info.features,
                self.subgroups)

    @property
    def subgroups(self) -> int:
        """Which subgroup operations kernels may use: 0 none, 1 the builtins (the device was
        opened with wgpu-native's "subgroup" feature), 2 those and subgroupBarrier() (also
        "subgroup-barrier"), 3 those on a device whose subgroups have at most 32 lanes: an
        NVIDIA GPU's, whose warps have 32 (wgpu-native 0.32 reports no subgroup sizes).
        FUSEC_SUBGROUPS=0 leaves them off."""
        if SUBGROUP_FEATURE not in self.info.features:
            return 0
        if SUBGROUP_BARRIER_FEATURE not in self.info.features:
            return 1
        return 3 if self.adapter.info.get("vendor_id") == NVIDIA_VENDOR_ID else 2

    # -- limits --
    @property
    def max_binding_size(self) -> int:
        return int(self.info.limits.get("max-storage-buffer-binding-size", 1 << 27))

    @property
    def max_workgroup_storage(self) -> int:
        """Bytes of workgroup memory one kernel may use (WebGPU guarantees 16384)."""
        return int(self.info.limits.get("max-compute-workgroup-storage-size", 16384))

    @property
    def max_bindings(self) -> int:
        override = os.environ.get("FUSEC_MAX_STORAGE_BUFFERS")
        real = int(self.info.limits.get("max-storage-buffers-per-shader-stage", 8))
        return min(real, int(override)) if override else real

    # -- buffers --
    def _size_class(self, nbytes: int) -> int:
        """Round up so buffers of similar sizes can be reused (at most 1/16 wasted)."""
        n = max(4, nbytes)
        step = max(256, 1 << max(0, n.bit_length() - 5))
        size = -(-n // step) * step
        return max(n, min(size, self.max_binding_size))

    def buffer(self, nbytes: int) -> DeviceBuffer:
        """A storage buffer of at least ``nbytes``, recycled from the pool when one is free.
        Creating one costs milliseconds for large sizes (allocation and zero-filling)."""
        return self.buffer_of_class(self._size_class(nbytes))

    def buffer_of_class(self, size: int) -> DeviceBuffer:
        with self.lock:
            return self._buffer_of_class(size)

    def _buffer_of_class(self, size: int) -> DeviceBuffer:
        free = self._free.get(size)
        while free:
            self._free_bytes -= size
            raw = free.pop()
            self._pooled.pop(id(raw), None)
            # A pooled buffer may have died after it was pooled: when the garbage collector
            # finalises a reference cycle, a DeviceBuffer's finaliser can pool its wgpu buffer and
            # then that buffer's own finaliser release it (the check in release() sees only the
            # other order). Handing it out would crash wgpu-native at the next bind group.
            if getattr(raw, "_internal", True) is not None:
                return DeviceBuffer(raw, size, self)
        usage = (self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC
                 | self.wgpu.BufferUsage.COPY_DST)
        return DeviceBuffer(self.device.create_buffer(size=size, usage=usage), size, self)

    def take_free(self, raw: Any) -> Optional[DeviceBuffer]:
        """``raw`` itself from the pool, where it lies there unused (else None): host data for a
        call recorded ahead goes into the buffer the recording binds."""
        with self.lock:
            got = self._pooled.get(id(raw))
            if got is None or got[1] is not raw:
                return None
            size = got[0]
            free = self._free.get(size, [])
            at = next((i for i, b in enumerate(free) if b is raw), None)
            if at is None:
                return None
            del free[at]
            del self._pooled[id(raw)]
            self._free_bytes -= size
            return DeviceBuffer(raw, size, self)

    def release(self, raw: Any, size: int) -> None:
        """Take back a buffer nobody references. Work already submitted that uses it runs before
        any later submission that reuses it (the queue is ordered), so reuse is safe."""
        with self.lock:
            self._release(raw, size)

    def _release(self, raw: Any, size: int) -> None:
        if getattr(raw, "_internal", True) is None:
            # Already released: the garbage collector finalises a reference cycle in any order,
            # so wgpu's buffer object may have gone first. Pooling it would hand wgpu a dead
            # handle (a panic in wgpu-native at the next bind group).
            return
        self._free.setdefault(size, []).append(raw)
        self._free_bytes += size
        self._pooled[id(raw)] = (size, raw)
        doomed = False
        while self._free_bytes > self.pool_limit and self._pooled:
            # the oldest goes (this one last): a loop that keeps releasing and taking buffers of
            # its own sizes must not find them destroyed because buffers of earlier work fill
            # the pool (each destroy also drops every executable's cached bind groups). The
            # buffer is destroyed at the next flush: a pending batch may still name it (this
            # may run in the middle of recording, from the garbage collector: no flush here)
            _, (old_size, old) = self._pooled.popitem(last=False)
            pooled = self._free.get(old_size, [])
            at = next((i for i, b in enumerate(pooled) if b is old), None)
            if at is None:
                continue
            del pooled[at]
            self._free_bytes -= old_size
            self._doomed.append(old)
            doomed = True
        if doomed and self._batch_enc is None:
            self._destroy_doomed()

    def _destroy_doomed(self) -> None:
        doomed, self._doomed = self._doomed, []
        for raw in doomed:
            raw.destroy()
        self.destroyed += len(doomed)  # cached bind groups may name them: executables drop theirs

    def encoder(self) -> Any:
        """A command encoder for the calls' own recording: through wgpu-native directly
        (:mod:`fusec.native`) where it can be, else wgpu-py's. Submit it with :meth:`submit`.
        (The profilers' encoders, which take timestamp writes, are wgpu-py's.)"""
        if self.native is not None:
            return self.native.encoder()
        return self.device.create_command_encoder()

    def submit(self, enc: Any) -> None:
        """Finish and submit an encoder from :meth:`encoder` (or wgpu-py's)."""
        if type(enc) is Encoder:
            enc.submit()
        else:
            self.device.queue.submit([enc.finish()])

    def batch_pass(self, clears: Sequence[Any]) -> Any:
        """The batch's open compute pass, with ``clears`` (buffers to zero) recorded before it."""
        if self._batch_enc is None:
            self._batch_enc = self.encoder()
        if not self._batch_dirty:
            self._batch_dirty = True
            self._batch_t0 = time.perf_counter()
        if clears:
            if self._batch_pass is not None:
                self._batch_pass.end()
                self._batch_pass = None
            for raw in clears:
                self._batch_enc.clear_buffer(raw)
        if self._batch_pass is None:
            self._batch_pass = self._batch_enc.begin_compute_pass()
        return self._batch_pass

    def _close_batch(self) -> None:
        if self._batch_dirty:
            self.flushes += 1
        self._batch_enc = self._batch_pass = None
        self._batch_dirty = False
        self.batch_calls = 0

    def take_batch(self) -> Any:
        """The batch's encoder with its pass ended, for a copy to ride on the batch's submit (a
        read or a copy after the calls recorded); a fresh encoder when no batch is open. The
        caller submits it and then calls :meth:`submitted_batch`."""
        with self.lock:
            enc = self._batch_enc
            if enc is None:
                return self.encoder()
            if self._batch_pass is not None:
                self._batch_pass.end()
            self._close_batch()
            return enc

    def take_pass(self) -> tuple[Any, Any]:
        """A command encoder and an open compute pass for a call of its own: the batch's when
        nothing is recorded in it yet (one opened while the host waited), else after it."""
        with self.lock:
            if self._batch_enc is not None and not self._batch_dirty and \
                    self._batch_pass is not None:
                enc, cpass = self._batch_enc, self._batch_pass
                self._close_batch()
                return enc, cpass
            enc = self.take_batch()
            return enc, enc.begin_compute_pass()

    def open_call(self, clears: Sequence[Any], timestamps: Any = None, wgpu_py: bool = False
                  ) -> tuple[Any, Any]:
        """The encoder and open compute pass of a call that does not join the batch, after the
        calls recorded before it, with ``clears`` (buffers to zero) recorded first. A pass with
        ``timestamps``, or ``wgpu_py`` (the per-kernel profiler's passes take timestamps), needs
        wgpu-py's encoder; otherwise the batch's own is used where nothing is recorded in it."""
        if timestamps or wgpu_py:
            self.flush()
            enc = self.device.create_command_encoder()
            for raw in clears:
                enc.clear_buffer(raw)
            return enc, (enc.begin_compute_pass(timestamp_writes=timestamps) if timestamps
                         else enc.begin_compute_pass())
        if not clears:
            return self.take_pass()
        enc = self.take_batch()
        for raw in clears:
            enc.clear_buffer(raw)
        return enc, enc.begin_compute_pass()

    def submit_chunk(self, enc: Any, cpass: Any) -> tuple[Any, Any]:
        """End the pass, submit what a call has recorded so far (the GPU starts on it while the
        host records the rest), and go on in a new encoder and pass."""
        cpass.end()
        self.submit(enc)
        return self.take_pass()

    def submitted_batch(self) -> None:
        """After the submit of an encoder from :meth:`take_batch`: buffers released while it
        was recorded can go now."""
        if self._doomed:
            self._destroy_doomed()

    def flush(self) -> None:
        """Submit the calls recorded in the batch (lazy submission); nothing if none is."""
        with self.lock:
            if self._batch_dirty:
                self.submit(self.take_batch())
            self.submitted_batch()

    def upload(self, data: np.ndarray, into: Any = None) -> DeviceBuffer:
        """``data`` in a device buffer: the pooled wgpu buffer ``into`` where it is free and of
        the size class, else any (see :meth:`buffer`)."""
        with self.lock:
            return self._upload(data, into)

    def _upload(self, data: np.ndarray, into: Any = None) -> DeviceBuffer:
        # queue.write_buffer takes effect at the next submit, before the commands it carries:
        # the batch recorded so far must go first (it may read the buffer's old contents)
        self.flush()
        raw = np.ascontiguousarray(data)
        if raw.nbytes == 0:
            raw = np.zeros(1, dtype=np.uint32)
        elif raw.nbytes % 4:  # (an odd number of float16) writes go in whole 32-bit words
            raw = np.concatenate([raw.reshape(-1).view(np.uint8),
                                  np.zeros(4 - raw.nbytes % 4, np.uint8)])
        buf = None
        if into is not None and into.size == self._size_class(raw.nbytes):
            buf = self.take_free(into)
        if buf is None:
            buf = self.buffer(raw.nbytes)
        # takes effect at the next submit, before the commands it carries
        if self.native is not None:
            self.native.write(buf.raw, raw)
        else:
            self.device.queue.write_buffer(buf.raw, 0, memoryview(raw).cast("B"))  # type: ignore[arg-type]
        return buf

    def _new_staging(self, size: int) -> Any:
        return self.device.create_buffer(
            size=size, usage=self.wgpu.BufferUsage.MAP_READ | self.wgpu.BufferUsage.COPY_DST)

    def _staging_buffer(self, nbytes: int) -> Any:
        size = _staging_size(nbytes)
        buf = self._staging.get(size)
        if buf is None:
            buf = self._staging[size] = self._new_staging(size)
        return buf

    def read(self, buffer: Any, nbytes: int) -> bytes:
        """Copy ``nbytes`` from a device buffer to the host (waits for all submitted work)."""
        with self.lock:  # one staging buffer per size: one reader at a time
            return self._read(buffer, nbytes)

    def _copy_to_stage(self, pieces: Sequence[tuple[Any, int, int]], stage: Any) -> None:
        """Copy byte ranges (buffer, offset, nbytes) of device buffers one after another into
        the staging buffer ``stage`` and submit: the copies ride on the batch's submit, after the
        calls recorded in it (one submit, not two). Under the lock."""
        enc = self.take_batch()
        pos = 0
        for buf, off, n in pieces:
            raw = buf.raw if isinstance(buf, DeviceBuffer) else buf
            enc.copy_buffer_to_buffer(raw, off, stage, pos, n)
            pos += n
        self.submit(enc)
        self.submitted_batch()
        self.submitted += 1

    def _read(self, buffer: Any, nbytes: int) -> bytes:
        words = _whole_words(nbytes)
        stage = self._staging_buffer(words)
        self._copy_to_stage([(buffer, 0, words)], stage)
        self._map_read(stage, words)
        try:
            data = bytes(stage.read_mapped(0, words))
        finally:
            stage.unmap()
        self.completed = self.submitted
        cache.STATS.readbacks += 1
        return data[:nbytes]

    def read_ahead(self, buffer: Any, nbytes: int) -> Optional[PendingRead]:
        """Start copying ``nbytes`` of a device buffer to the host: the copy is submitted now,
        behind the work submitted (or batched) so far, into a staging buffer of its own whose
        mapping is requested at once; :meth:`finish_read` then waits for that copy only, not
        for work submitted after it (Array.copy_to_host_async). None without wgpu-native's
        functions (the read then waits for the queue as :meth:`read` does)."""
        native = self.native
        if native is None or self._poll is None:
            return None
        words = _whole_words(nbytes)
        size = _staging_size(words)
        with self.lock:
            free = self._ahead_staging.get(size)
            stage = free.pop() if free else self._new_staging(size)
            self._copy_to_stage([(buffer, 0, words)], stage)
            # an abandoned read's flag is written when its buffer goes: keep every flag until
            # its callback has run
            self._map_flags = [f for f in self._map_flags if not f[0]]
            flag = native.map_read(stage, words)
            self._map_flags.append(flag)
            return PendingRead(stage, size, words, nbytes, flag)

    def finish_read(self, pending: PendingRead) -> bytes:
        """The bytes of a read started by :meth:`read_ahead`, once its copy is done: polls
        wgpu-native (without blocking, for up to FUSEC_SPIN_US, then blocking; with
        FUSEC_WAIT=poll blocking at once) until the staging buffer is mapped."""
        assert self.native is not None and self._poll is not None
        raw = self.device._internal
        poll, null = self._poll
        flag = pending.flag
        # (no call is recorded ahead here, as a wait does: tried, in a loop that reads a
        # step's tokens after calling the next step, as Llama.generate does, on the H100 none
        # of those recordings was used (0 of 32 steps; lavapipe used some) and the synthetic
        # SmolLM2 step streamed at 1.222-1.310 ms with them, 1.181-1.299 without, 5
        # interleaved rounds; docs/bench/h100-streaming-b-2026-12-06.log)
        # FUSEC_WAIT=poll blocks at once (a blocking poll returns once the queue is idle: it
        # then waits for the calls made since too); otherwise spin, then block
        spin = 0 if config.get("wait") == "poll" else int(config.get("spin_us"))
        deadline = time.perf_counter() + 1e-6 * spin
        while not flag[0]:
            poll(raw, time.perf_counter() > deadline, null)
        if flag[0] != 1:
            raise FusecError("reading an array back failed: wgpu could not map the staging "
                             "buffer its copy went to")
        data = self.native.take_mapped(pending.stage, pending.words)
        with self.lock:
            self._ahead_staging.setdefault(pending.size, []).append(pending.stage)
        cache.STATS.readbacks += 1
        return data[:pending.nbytes]

    def read_pieces(self, pieces: Sequence[tuple[Any, int, int]]) -> memoryview:
        """Byte ranges of device buffers, one after another in one host buffer: one submit and one
        mapped read for all of them (multi-device copies and all_reduce read in chunks made of
        pieces). Each piece is (buffer, offset, nbytes), offsets and sizes whole 32-bit words."""
        with self.lock:
            total = max(4, sum(n for _, _, n in pieces))
            stage = self._staging_buffer(total)
            self._copy_to_stage(pieces, stage)
            self._map_read(stage, total)
            try:
                data = stage.read_mapped(0, total)  # (a copy)
            finally:
                stage.unmap()
            self.completed = self.submitted
            cache.STATS.readbacks += 1
            return cast(memoryview, data)

    def write_pieces(self, pieces: Sequence[tuple[DeviceBuffer, int, Any]]) -> int:
        """Write host bytes into device buffers, each piece (buffer, offset, bytes) a whole
        number of 32-bit words, and submit at once so that the transfers start while the caller
        goes on: wgpu copies the data into its own staging memory before ``write_buffer``
        returns. Returns the submission number after which the bytes are there."""
        with self.lock:
            # the batch recorded so far may use the buffers' old contents (pooled buffers): it
            # goes first
            self.flush()
            for buf, offset, data in pieces:
                self.device.queue.write_buffer(buf.raw, offset, data)
            self.device.queue.submit([])  # (an empty submit carries the queued writes)
            self.submitted += 1
            return self.submitted

    def _map_read(self, stage: Any, nbytes: int) -> None:
        """Map ``stage`` for reading once the queue is done with it.

        wgpu-py's ``map_sync`` first submits an empty command buffer, then waits on an event that
        its poller thread sets after its own blocking poll: two thread hand-offs under the GIL.
        Here the calling thread waits in wgpu-native's poll itself (:meth:`wait_idle`;
        FUSEC_WAIT=thread: the wgpu-py way, for comparison)."""
        if config.get("wait") == "thread":
            stage.map_sync(self.wgpu.MapMode.READ, 0, nbytes)
            return
        promise = stage.map_async("READ_NOSYNC", 0, nbytes)
        self.wait_idle()  # the queue is idle: the map callback has run
        promise.sync_wait()

    def gpu_busy(self) -> bool:
        """Whether work submitted before is still running on the GPU: a poll of wgpu-native
        that does not block (a few us). False where that poll is not available."""
        if self._poll is None:
            return False
        poll, null = self._poll
        # the low byte only (see wait_idle)
        return not poll(self.device._internal, False, null) & 0xFF

    def wait_idle(self) -> None:
        """Return once the queue has no work left.

        FUSEC_WAIT=spin (the default): poll wgpu-native without blocking until the queue is
        empty, for up to FUSEC_SPIN_US, then block. A blocking poll sleeps on the driver's fence
        and wakes late: on the H100 a tiny call's round trip took 96.2 us blocking against 56.5
        spinning (bench/round_trip_floor.py, interleaved in one process). The cap (20 ms) bounds
        the CPU a long wait burns; past it the late wake-up costs well under 1%. (With a 2 ms
        cap, a 3.1 ms matmul's call + wait took 3.44 ms, 3.31 spinning throughout:
        bench/overhead_probe.py.)"""
        mode = config.get("wait")
        if mode not in _WAIT_MODES:
            raise FusecError(f"FUSEC_WAIT must be one of {', '.join(_WAIT_MODES)}; got {mode!r}")
        ahead, self.ahead = self.ahead, None
        if mode == "spin" and self._poll is not None:
            raw = self.device._internal
            poll, null = self._poll
            # the low byte only: wgpu-native returns a C bool, which cffi reads as its 32-bit
            # WGPUBool, upper bytes undefined (they are set: treating them as true made the
            # wait return before the GPU was done)
            if poll(raw, False, null) & 0xFF:
                if ahead is not None:
                    ahead[0].record_ahead(ahead[1], idle=True)
                return
            t0 = time.perf_counter()
            if self._batch_enc is None and PREOPEN_BATCH and self.lock.acquire(blocking=False):
                # the GPU is busy: open the next batch (encoder and pass) now, while it works,
                # not after the wait (a tiny call's round trip on the H100: 56.5 us, 60.5
                # without). An open batch with nothing in it is not submitted (flush). (Not
                # while another thread records: it may be taking the batch.)
                try:
                    if self._batch_enc is None:
                        enc = self.encoder()
                        self._batch_pass = enc.begin_compute_pass()
                        self._batch_enc = enc
                finally:
                    self.lock.release()
            # ...and record the last large call's next one, if the rule says so
            if ahead is not None:
                ahead[0].record_ahead(ahead[1])
            deadline = t0 + 1e-6 * int(config.get("spin_us"))
            while not poll(raw, False, null) & 0xFF:
                if time.perf_counter() > deadline:
                    break
            else:
                return
        self.device._poll_wait()

    def timestamp_writes(self) -> Optional[dict[str, Any]]:
        if not self.profile or "timestamp-query" not in self.info.features:
            return None
        if self._query is None:
            qs = self.device.create_query_set(type=self.wgpu.QueryType.timestamp, count=2)
            buf = self.device.create_buffer(
                size=16, usage=self.wgpu.BufferUsage.QUERY_RESOLVE | self.wgpu.BufferUsage.COPY_SRC)
            self._query = (qs, buf)
        return {"query_set": self._query[0], "beginning_of_pass_write_index": 0,
                "end_of_pass_write_index": 1}

    def kernel_queries(self, n: int) -> tuple[Any, Any]:
        """A timestamp query set of at least 2n entries and its resolve buffer (fusec.profile)."""
        if self._kernel_query is None or self._kernel_query[2] < n:
            cap = max(64, 1 << (n - 1).bit_length())
            qs = self.device.create_query_set(type=self.wgpu.QueryType.timestamp, count=2 * cap)
            buf = self.device.create_buffer(size=16 * cap, usage=self.wgpu.BufferUsage.QUERY_RESOLVE
                                            | self.wgpu.BufferUsage.COPY_SRC)
            self._kernel_query = (qs, buf, cap)
        return self._kernel_query[0], self._kernel_query[1]

    def resolve_timestamps(self, enc: Any) -> None:
        if self.profile and self._query is not None:
            enc.resolve_query_set(self._query[0], 0, 2, self._query[1], 0)

    def last_gpu_ns(self) -> Optional[int]:
        """GPU nanoseconds of the last call's compute pass (profile mode only; waits)."""
        if self._query is None:
            return None
        t0, t1 = np.frombuffer(self.read(self._query[1], 16), dtype=np.uint64)
        cache.STATS.readbacks -= 1
        return int(t1) - int(t0)

    def sync(self) -> None:
        """Wait for every submitted command: the calling thread waits in wgpu-native's poll
        until the queue is idle (:meth:`wait_idle`; FUSEC_WAIT=thread: a mapped read through
        wgpu-py's poller thread; its on_submitted_work_done is unusable)."""
        if self.completed >= self.submitted:
            return
        self.flush()
        if config.get("wait") != "thread":
            self.wait_idle()
            self.completed = self.submitted
            return
        if self._sync_src is None:
            self._sync_src = self.buffer(4)
        self.read(self._sync_src, 4)
        cache.STATS.readbacks -= 1  # a wait, not a readback of user data

    # -- pipelines --
    def pipeline(self, key: str, wgsl: str, n_in: int, n_out: int, name: str) -> tuple[Any, Any]:
        checked = bool(config.get("shader_checks"))
        if checked:
            key += ":checked"  # a pipeline compiled either way is kept apart from the other
        hit = self.pipelines.get(key)
        if hit is not None:
            with self._lock:
                cache.STATS.pipeline_hits += 1
            return hit
        wgpu = self.wgpu
        t0 = time.perf_counter()
        try:
            module = _shader_module(self.device, wgsl, name, checked)
            entries = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.read_only_storage
                                   if i < n_in else wgpu.BufferBindingType.storage}}
                       for i in range(n_in + n_out)]
            bgl = self.device.create_bind_group_layout(entries=entries)
            layout = self.device.create_pipeline_layout(bind_group_layouts=[bgl])
            pipe = self.device.create_compute_pipeline(
                layout=layout, compute={"module": module, "entry_point": "main"}, label=name)
        except Exception as exc:  # a compiler bug, never a user error: say where to look
            raise FusecError(f"internal error: the WGSL generated for kernel {name} did not "
                             f"compile ({exc}); run with FUSEC_DEBUG=4 to see it, and please "
                             "report it") from exc
        with self._lock:  # warm-up compiles pipelines from several threads
            if key in self.pipelines:
                return self.pipelines[key]  # type: ignore[no-any-return]
            cache.STATS.pipelines_compiled += 1
            self.pipelines[key] = (pipe, bgl)
        config.log_compile(f"compiled pipeline {name} in {1e3 * (time.perf_counter() - t0):.1f} ms")
        return pipe, bgl


def _next_submit(split: int, growth: int) -> int:
    """The dispatch count at which a long call submits next, after submitting at ``split``
    (FUSEC_SUBMIT_GROWTH ``growth``; 1 or less: the rest of the call in one submit)."""
    return split * growth if growth > 1 else 1 << 62


def _shader_module(device: Any, wgsl: str, label: str, checked: bool) -> Any:
    """Compile ``wgsl``. Unless ``checked``, as a trusted module: wgpu then adds no bounds check to
    array indices and no iteration bound to loops. Every kernel fusec generates keeps its own
    indices in range: each load and store of a buffer is behind a test of the index against the
    array's static size, workgroup and register arrays are indexed by the thread's id within
    sizes the templates fix, and no index comes from data (there is no gather). Every loop counts
    up to a static bound. The checks cost 5-17% of the time of matmul-heavy workloads and 16-31%
    of skinny products' on the H100 (FUSEC_SHADER_CHECKS=1 puts them back). Where the wgpu build
    lacks wgpuDeviceCreateShaderModuleTrusted the module is compiled checked."""
    if not checked:
        try:
            from wgpu.backends.wgpu_native import _api
        except ImportError:  # another backend: only checked modules
            _api = None
        create = getattr(getattr(_api, "libf", None), "wgpuDeviceCreateShaderModuleTrusted", None)
        if _api is not None and create is not None and isinstance(device, _api.GPUDevice):
            ffi, lib = _api.ffi, _api.lib
            src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(wgsl))
            src[0].chain.next = ffi.NULL
            src[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
            desc = _api.new_struct_p(
                "WGPUShaderModuleDescriptor *", nextInChain=ffi.cast("WGPUChainedStruct *", src),
                label=_api.to_c_string_view(label))
            handle = create(device._internal, desc, lib.WGPUShaderRuntimeChecks_None)
            if handle == ffi.NULL:
                raise RuntimeError("shader module creation failed")
            return _api.GPUShaderModule(label, handle, device)
    return device.create_shader_module(code=wgsl, label=label)


_RUNTIME: Optional[Runtime] = None
_RESOLVED = False
_REASON = ""  # DeviceInfo.reason of the chosen device
_NO_ADAPTER = "no GPU adapter found"


def _adapter_label(a: Any) -> str:
    return f"{a.info['device']} on {a.info['backend_type']}"


def _choose_adapter() -> tuple[Any, str]:
    """The adapter to run on (None: the numpy interpreter) and why, where the why is worth
    saying. FUSEC_BACKEND: "" or "auto" picks the best hardware adapter, and the interpreter
    where the only adapters are software ones; "gpu" takes the best adapter of any kind; vulkan,
    metal, dx12, gl one of that backend; "cpu" the interpreter."""
    want = str(config.get("backend") or "auto")
    if want == "cpu":
        return None, "FUSEC_BACKEND=cpu"
    if want not in _BACKENDS and want not in ("auto", "gpu"):
        raise FusecError(f"FUSEC_BACKEND={want!r} is not one of auto, gpu, cpu, "
                         f"{', '.join(_BACKENDS)}")
    adapters = _adapters()
    pick = str(config.get("adapter") or "").strip()
    if pick:
        if not pick.isdigit() or int(pick) >= len(adapters):
            raise FusecError(f"FUSEC_ADAPTER={pick!r} is not an index of fusec.devices() "
                             f"(0 to {len(adapters) - 1}: "
                             f"{', '.join(_adapter_label(a) for a in adapters) or 'none'})")
        return adapters[int(pick)], f"FUSEC_ADAPTER={pick}"
    if want in _BACKENDS:
        found = [a for a in adapters if a.info["backend_type"] == _BACKENDS[want]]
        if not found:
            have = sorted({str(a.info["backend_type"]) for a in adapters}) or ["none"]
            raise FusecError(f"FUSEC_BACKEND={want} but no {_BACKENDS[want]} adapter was found "
                             f"(available backends: {', '.join(have)})")
        adapters = found
    if not adapters:
        return None, _NO_ADAPTER
    best = min(adapters, key=lambda a: (_TYPE_RANK.get(a.info["adapter_type"], 4),
                                        _BACKEND_RANK.get(a.info["backend_type"], 3)))
    if best.info["adapter_type"] != "CPU":
        return best, ""
    if want == "auto":
        # A software adapter runs WGSL on the CPU far slower than numpy runs the same program
        # (MiniLM-L6 at 24x37 tokens on 2 cores: lavapipe 6.5 s, the interpreter 0.23 s; see
        # docs/architecture.md): numpy by default, the adapter on request (the tests ask for it,
        # to exercise the WGSL)
        return None, (f"only a software adapter ({_adapter_label(best)}) is present, slower "
                      "than numpy; FUSEC_BACKEND=gpu to use it")
    return best, f"a software adapter, as FUSEC_BACKEND={want} asks"


def _user_stacklevel() -> int:
    """The stacklevel that points a warning at the first frame outside fusec (the user's call)."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


_ADAPTERS: Optional[list[Any]] = None


def _adapters() -> list[Any]:
    """wgpu's adapters, enumerated once: their positions are the devices' indices."""
    global _ADAPTERS
    if _ADAPTERS is None:
        os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # quiets Mesa on headless Linux
        try:
            import wgpu

            _ADAPTERS = list(wgpu.gpu.enumerate_adapters_sync())
        except Exception as exc:  # no wgpu-native library, no loader, ...
            config.debug(1, f"wgpu unavailable: {exc}")
            _ADAPTERS = []
    return _ADAPTERS


def devices() -> list[DeviceInfo]:
    """Every adapter wgpu finds, in a fixed order: ``index`` (what ``FUSEC_ADAPTER`` names),
    name, backend, type, limits and features. The numpy interpreter is not among them."""
    out = []
    for i, a in enumerate(_adapters()):
        info = a.info
        out.append(DeviceInfo(backend=str(info["backend_type"]), adapter=str(info["device"]),
                              adapter_type=str(info["adapter_type"]), limits=dict(a.limits),
                              features=tuple(sorted(a.features)), index=i))
    return out


# The runtime the calls of this thread (context) run on, where it is not the default device's: a
# jitted call on another device's arrays sets it while it traces, lowers and runs (the many
# get_runtime() callers then see that device), and each device's worker thread has its own.
_CURRENT: ContextVar[Optional[Runtime]] = ContextVar("fusec_runtime", default=None)
_RUNTIMES: dict[int, Runtime] = {}  # by index into fusec.devices(), created on first use
_CREATE_LOCK = threading.RLock()


def get_runtime() -> Optional[Runtime]:
    """The runtime calls run on: the current one where a call on another device set it (see
    :func:`on_runtime`), else the default device's, created on first use; None means the numpy
    interpreter runs the programs (see :func:`_choose_adapter` for when)."""
    rt = _CURRENT.get()
    if rt is not None:
        return rt
    if _RESOLVED:
        return _RUNTIME
    return _default_runtime()


def _default_runtime() -> Optional[Runtime]:
    """The default device's runtime (FUSEC_BACKEND, FUSEC_ADAPTER), whatever the context."""
    global _RUNTIME, _RESOLVED, _REASON
    with _CREATE_LOCK:
        if not _RESOLVED:
            os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # quiets Mesa on headless Linux
            adapter, _REASON = _choose_adapter()
            _RESOLVED = True
            if adapter is None:
                if _REASON == _NO_ADAPTER:
                    warnings.warn("fusec: no GPU adapter found; running on the numpy interpreter. "
                                  "Install a Vulkan driver (e.g. mesa-vulkan-drivers).",
                                  RuntimeWarning, stacklevel=_user_stacklevel())
                config.debug(1, f"device: numpy interpreter ({_REASON})")
            else:
                index = next(i for i, a in enumerate(_adapters()) if a is adapter)
                _RUNTIME = _RUNTIMES.get(index) or Runtime(adapter)
                _RUNTIME.info.reason = _REASON
                _RUNTIME.info.index = index
                _RUNTIMES[index] = _RUNTIME
                config.debug(1, f"device: {_RUNTIME.info}" + (f" ({_REASON})" if _REASON else ""))
    return _RUNTIME


def runtime_for(index: int) -> Runtime:
    """The runtime of device ``index`` of :func:`devices`, created on first use (the default
    device's is the one :func:`get_runtime` returns: one wgpu device per adapter)."""
    rt = _RUNTIMES.get(index)
    if rt is not None:
        return rt
    with _CREATE_LOCK:
        _default_runtime()  # first, so that the default adapter is not opened twice
        rt = _RUNTIMES.get(index)
        if rt is None:
            rt = Runtime(_adapters()[index])
            rt.info.index = index
            _RUNTIMES[index] = rt
            config.debug(1, f"device {index}: {rt.info}")
    return rt


def resolve_device(device: Any, what: str) -> Optional[Runtime]:
    """The runtime of ``device``: a :class:`DeviceInfo` (from :func:`devices` or
    :func:`default_device`) or an index into :func:`devices`. None: the numpy interpreter (its
    DeviceInfo, which ``default_device()`` reports where it is the backend). ``what`` names the
    caller in the error message."""
    if isinstance(device, DeviceInfo):
        if device.index < 0:
            if device.backend == "cpu":
                return None
            raise FusecError(f"{what}: {device} has no index into fusec.devices(); pass a device "
                             "from fusec.devices()")
        index = device.index
    elif isinstance(device, (int, np.integer)) and not isinstance(device, (bool, np.bool_)):
        index = int(device)
    else:
        hint = ""
        if isinstance(device, (str, type, np.dtype)):
            try:
                np.dtype(device)
                hint = " (a dtype? device_put takes it as dtype=...)"
            except TypeError:
                pass
        raise FusecError(f"{what}: device must be a fusec.DeviceInfo (from fusec.devices()) or an "
                         f"index into fusec.devices(); got {type(device).__name__} {device!r}"
                         f"{hint}")
    found = _adapters()
    if not 0 <= index < len(found):
        have = ", ".join(f"{i}: {_adapter_label(a)}" for i, a in enumerate(found)) or "none"
        raise FusecError(f"{what}: device {index} is not one of fusec.devices() ({have})")
    return runtime_for(index)


def device_label(rt: Optional[Runtime]) -> str:
    """How messages name a runtime's device: "device 1 (llvmpipe (CPU, OpenGL))"."""
    return "the numpy interpreter" if rt is None else rt.info.label()


class on_runtime:
    """``with on_runtime(rt):`` calls in this thread run on ``rt`` (get_runtime() returns it);
    None, or the runtime already current, changes nothing."""

    __slots__ = ("rt", "token")

    def __init__(self, rt: Optional[Runtime]) -> None:
        self.rt = rt
        self.token: Any = None

    def __enter__(self) -> None:
        if self.rt is not None and self.rt is not get_runtime():
            self.token = _CURRENT.set(self.rt)

    def __exit__(self, *exc: Any) -> None:
        if self.token is not None:
            _CURRENT.reset(self.token)
            self.token = None


def on_device(rt: Runtime, fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``fn(*args)`` on ``rt``'s worker thread (one per device, started on first use; work
    for one device runs in the order it was given), with ``rt`` current there. Called from that
    worker itself, it runs at once (a task waiting on its own thread would never finish)."""
    def task() -> Any:
        token = _CURRENT.set(rt)
        try:
            return fn(*args)
        finally:
            _CURRENT.reset(token)

    if rt._worker_ident == threading.get_ident():
        fut: Future[Any] = Future()
        try:
            fut.set_result(task())
        except BaseException as exc:  # handed to whoever waits on it, as from a worker
            fut.set_exception(exc)
        return fut
    if rt._worker is None:
        with _CREATE_LOCK:
            if rt._worker is None:
                pool = ThreadPoolExecutor(1, thread_name_prefix=f"fusec-device-{rt.info.index}")
                # the worker's thread id, so that work it gives itself runs inline
                pool.submit(lambda: setattr(rt, "_worker_ident", threading.get_ident())).result()
                rt._worker = pool
    return rt._worker.submit(task)


def on_devices(rts: Sequence[Runtime], fns: Sequence[Callable[[], Any]]) -> list[Any]:
    """``fns[i]()`` on device ``rts[i]``, all at the same time: the first on the calling thread,
    the others on their devices' worker threads. The results in order; the first error raised
    (after every function has finished)."""
    futs = [on_device(rt, fn) for rt, fn in zip(rts[1:], fns[1:])]
    first: list[Any] = []
    err: Optional[BaseException] = None
    if rts:
        try:
            with on_runtime(rts[0]):
                first.append(fns[0]())
        except BaseException as exc:  # the others still finish before it is raised
            err = exc
    rest = []
    for f in futs:
        try:
            rest.append(f.result())
        except BaseException as exc:
            err = err or exc
    if err is not None:
        raise err
    return first + rest


def default_device() -> DeviceInfo:
    """The device fusec runs on: backend, adapter name and type, limits, features, and (in
    ``reason``) why, where it is not simply the best GPU: the numpy interpreter reports backend
    "cpu" with the reason it was chosen. Inside a call on another device's arrays (and on a
    device's worker thread) that device."""
    rt = get_runtime()
    if rt is None:
        return DeviceInfo(backend="cpu", adapter="numpy interpreter", adapter_type="CPU",
                          reason=_REASON)
    return rt.info


# --- arrays ---------------------------------------------------------------------------------------


class Array:
    """An immutable array that lives on a device (``a.device``). Outputs of jitted functions are
    Arrays; feed them back in and nothing is copied. ``np.asarray(a)``, ``a.numpy()`` read it
    back (and wait); ``a.to(device)`` copies it to another device."""

    __array_priority__ = 100  # ndarray + Array -> Array.__radd__ (runs on the device)
    # slots: every call makes one Array per output, so creating one is on the hot path
    __slots__ = ("_shape", "_dtype", "_buffer", "_host", "_submission", "_donated_to",
                 "_shared", "_rt", "_reading", "__weakref__")

    def __init__(self, shape: Sequence[int], dtype: str, buffer: Any = None,
                 host: Optional[np.ndarray] = None, submission: int = 0) -> None:
        self._shape = tuple(int(d) for d in shape)
        self._dtype = dtype
        self._buffer = buffer
        self._host = host
        self._submission = submission
        # the runtime (device) holding the buffer; None: host data not yet uploaded anywhere,
        # which goes to whatever device a call runs on (and then lives there)
        self._rt: Optional[Runtime] = buffer.rt if buffer is not None else None
        self._donated_to: Optional[str] = None
        # another Array views the same buffer (an output returned twice, a reshape of an input):
        # donating this one must not overwrite what the other holds (see donation_copy)
        self._shared = False
        self._reading: Optional[PendingRead] = None  # (copy_to_host_async)

    def _check_alive(self) -> None:
        if self._donated_to is not None:
            raise FusecError(
                f"this array was donated to {self._donated_to} (donate_argnums) and its buffer now "
                "holds that call's output; use the output, or stop donating this argument")

    def donation_copy(self, rt: Runtime) -> Array:
        """A copy in a buffer of its own, to donate in place of an Array that shares its buffer
        with another: the donated buffer gets overwritten, the other Array must not change."""
        src = self.device_buffer(rt)
        nbytes = max(4, buffer_bytes(self.size, self._dtype))
        dst = rt.buffer(nbytes)
        # the copy follows the calls that wrote the source, on the batch's submit
        enc = rt.take_batch()
        enc.copy_buffer_to_buffer(src.raw, 0, dst.raw, 0, nbytes)
        rt.submit(enc)
        rt.submitted_batch()
        rt.submitted += 1
        return Array(self._shape, self._dtype, buffer=dst, submission=rt.submitted)

    def donate(self, to: str) -> None:
        """Give the buffer away (used by jitted functions with donate_argnums)."""
        self._donated_to = to
        self._buffer = None
        self._host = None

    @property
    def is_deleted(self) -> bool:
        return self._donated_to is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:  # type: ignore[type-arg]
        return np.dtype(self._dtype)

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return int(np.prod(self._shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes the elements take on the device (2 each for float16, else 4: a bool is a 32-bit
        word); the buffer rounds up to whole 32-bit words."""
        return self.size * itemsize(self._dtype)

    def device_buffer(self, rt: Runtime, into: Any = None) -> Any:
        """The wgpu buffer on ``rt``, uploading host data on first use (the array then lives on
        ``rt``; ``into``: the pooled wgpu buffer to upload into where it is free)."""
        self._check_alive()
        if self._buffer is None:
            assert self._host is not None
            self._buffer = rt.upload(to_storage(self._host, self._dtype), into)
            self._rt = rt
        elif self._rt is not rt:
            raise FusecError(f"this array is on {device_label(self._rt)}, not on "
                             f"{device_label(rt)}; copy it there with .to(device)")
        return self._buffer

    @property
    def device(self) -> DeviceInfo:
        """The device the array lives on (an array of host data not yet used on a device: the
        default device, where a call would upload it)."""
        return self._rt.info if self._rt is not None else default_device()

    def to(self, device: Any) -> Array:
        """A copy on ``device`` (a :class:`DeviceInfo` from ``fusec.devices()`` or an index);
        the array itself where it is there already. WebGPU devices share no memory and have no
        peer copies: the copy goes through the host, in chunks (see :func:`copy_array`)."""
        rt = resolve_device(device, "Array.to")
        self._check_alive()
        if rt is not None and rt is self._rt:
            return self
        if rt is None:  # the numpy interpreter: host data
            host = np.array(self._host_value())
            host.flags.writeable = False
            return Array(self._shape, self._dtype, host=host)
        if self._host is not None or self._buffer is None:
            return Array(self._shape, self._dtype, buffer=rt.upload(
                to_storage(self._host_value(), self._dtype)))
        return copy_array(self, rt)

    def copy_to_host_async(self) -> None:
        """Start copying the values to the host, behind the work submitted so far; a later read
        (``np.asarray(a)``, ``a.numpy()``) then waits for this array's computation and the
        copy only, not for calls made after this one (as JAX's ``copy_to_host_async``). A decode
        loop calls it on a step's tokens, calls the next step, then reads the tokens while the
        GPU computes that step (``Llama.generate``). Nothing to do for values already on the
        host, or without wgpu-native's functions (the read then waits for every call)."""
        self._check_alive()
        rt = self._rt
        if self._host is None and self._reading is None and rt is not None \
                and self._buffer is not None:
            self._reading = rt.read_ahead(self._buffer, self.nbytes)

    def _host_value(self) -> np.ndarray:
        self._check_alive()
        if self._host is None:
            rt = self._rt
            assert rt is not None and self._buffer is not None
            reading, self._reading = self._reading, None
            raw = (rt.finish_read(reading) if reading is not None
                   else rt.read(self._buffer, self.nbytes))
            st = np.frombuffer(raw, dtype=dtypes.NUMPY_STORAGE[self._dtype],
                               count=self.size).reshape(self._shape)
            host = np.asarray(st != 0) if self._dtype == "bool" else st.copy()
            host.flags.writeable = False
            self._host = host
        return self._host

    def numpy(self) -> np.ndarray:
        """A numpy copy of the values (waits for the computation)."""
        return np.array(self._host_value())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        h = self._host_value()
        if dtype is not None and np.dtype(dtype) != h.dtype:
            return h.astype(dtype)
        return np.array(h) if copy else h

    def block_until_ready(self) -> Array:
        """Wait until the computation producing this array has finished; returns self."""
        rt = self._rt
        if rt is not None and self._host is None and rt.completed < self._submission:
            rt.sync()
        return self

    def is_ready(self) -> bool:
        rt = self._rt
        ready = rt is None or self._host is not None or rt.completed >= self._submission
        if not ready and rt is not None:
            rt.flush()  # a call still in the batch: send it, so that it does get ready
        return ready

    def __repr__(self) -> str:
        body = np.array2string(self._host_value(), separator=", ", prefix="fusec.Array(")
        return f"fusec.Array({body}, dtype={self._dtype})"

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d array")
        return self._shape[0]

    # __getitem__ (indexing on the device) is attached by fusec.numpy, with the operators

    def __iter__(self) -> Any:
        return iter(self._host_value())

    def __bool__(self) -> bool:
        return bool(self._host_value())

    def __float__(self) -> float:
        return float(self._host_value())

    def __int__(self) -> int:
        return int(self._host_value())

    __hash__ = None  # type: ignore[assignment]

    # numpy's operators and methods run eagerly on the device through fusec.numpy; they are
    # attached below the class, as on traced values.

    if TYPE_CHECKING:  # attached by fusec.numpy.attach_operators; declared for type checkers
        def __add__(self, o: Any) -> Array: ...
        def __radd__(self, o: Any) -> Array: ...
        def __sub__(self, o: Any) -> Array: ...
        def __rsub__(self, o: Any) -> Array: ...
        def __mul__(self, o: Any) -> Array: ...
        def __rmul__(self, o: Any) -> Array: ...
        def __truediv__(self, o: Any) -> Array: ...
        def __rtruediv__(self, o: Any) -> Array: ...
        def __pow__(self, o: Any) -> Array: ...
        def __rpow__(self, o: Any) -> Array: ...
        def __matmul__(self, o: Any) -> Array: ...
        def __rmatmul__(self, o: Any) -> Array: ...
        def __mod__(self, o: Any) -> Array: ...
        def __rmod__(self, o: Any) -> Array: ...
        def __floordiv__(self, o: Any) -> Array: ...
        def __rfloordiv__(self, o: Any) -> Array: ...
        def __and__(self, o: Any) -> Array: ...
        def __rand__(self, o: Any) -> Array: ...
        def __or__(self, o: Any) -> Array: ...
        def __ror__(self, o: Any) -> Array: ...
        def __xor__(self, o: Any) -> Array: ...
        def __rxor__(self, o: Any) -> Array: ...
        def __lshift__(self, o: Any) -> Array: ...
        def __rlshift__(self, o: Any) -> Array: ...
        def __rshift__(self, o: Any) -> Array: ...
        def __rrshift__(self, o: Any) -> Array: ...
        def __gt__(self, o: Any) -> Array: ...
        def __ge__(self, o: Any) -> Array: ...
        def __lt__(self, o: Any) -> Array: ...
        def __le__(self, o: Any) -> Array: ...
        def __eq__(self, o: Any) -> Array: ...  # type: ignore[override]
        def __ne__(self, o: Any) -> Array: ...  # type: ignore[override]
        def __neg__(self) -> Array: ...
        def __abs__(self) -> Array: ...
        def __invert__(self) -> Array: ...
        def __pos__(self) -> Array: ...
        def sum(self, *args: Any, **kwargs: Any) -> Array: ...
        def max(self, *args: Any, **kwargs: Any) -> Array: ...
        def min(self, *args: Any, **kwargs: Any) -> Array: ...
        def mean(self, *args: Any, **kwargs: Any) -> Array: ...
        def astype(self, *args: Any, **kwargs: Any) -> Array: ...
        def prod(self, *args: Any, **kwargs: Any) -> Array: ...
        def all(self, *args: Any, **kwargs: Any) -> Array: ...
        def any(self, *args: Any, **kwargs: Any) -> Array: ...
        def argmax(self, *args: Any, **kwargs: Any) -> Array: ...
        def argmin(self, *args: Any, **kwargs: Any) -> Array: ...
        def var(self, *args: Any, **kwargs: Any) -> Array: ...
        def std(self, *args: Any, **kwargs: Any) -> Array: ...
        def cumsum(self, *args: Any, **kwargs: Any) -> Array: ...
        def cumprod(self, *args: Any, **kwargs: Any) -> Array: ...
        def sort(self, *args: Any, **kwargs: Any) -> Array: ...
        def argsort(self, *args: Any, **kwargs: Any) -> Array: ...
        def clip(self, *args: Any, **kwargs: Any) -> Array: ...
        def round(self, *args: Any, **kwargs: Any) -> Array: ...
        def squeeze(self, *args: Any, **kwargs: Any) -> Array: ...
        def flatten(self, *args: Any, **kwargs: Any) -> Array: ...
        def ravel(self, *args: Any, **kwargs: Any) -> Array: ...
        def take(self, *args: Any, **kwargs: Any) -> Array: ...
        def repeat(self, *args: Any, **kwargs: Any) -> Array: ...
        def swapaxes(self, *args: Any, **kwargs: Any) -> Array: ...
        def reshape(self, *args: Any, **kwargs: Any) -> Array: ...
        def transpose(self, *args: Any, **kwargs: Any) -> Array: ...
        @property
        def T(self) -> Array: ...
        @property
        def at(self) -> Any: ...


fnp.attach_operators(Array)
register_array_type(Array)


def _device_array(shape: tuple[int, ...], dtype: str, buffer: DeviceBuffer,
                  submission: int, rt: Runtime) -> Array:
    """An Array over a call's output buffer: ``Array(...)`` without re-checking the shape (the
    executable's shapes are tuples of ints already); a jitted call makes one per output."""
    a = Array.__new__(Array)
    a._shape = shape
    a._dtype = dtype
    a._buffer = buffer
    a._host = None
    a._submission = submission
    a._donated_to = None
    a._shared = False
    a._rt = rt  # (the buffer's)
    a._reading = None
    return a


# Copies between devices (and all_reduce) go through the host in chunks of this many bytes (a
# whole number of 32-bit words): large enough that a chunk's fixed costs (a submit, a map, a
# wait: tens of microseconds) are small against its transfer (8 MiB: about 0.4 ms at 20 GB/s),
# small enough that the pipeline fills at once and the host holds little at a time.
COPY_CHUNK = 8 << 20


def _chunks(nbytes: int) -> list[tuple[int, int]]:
    """(offset, size) of the chunks covering ``nbytes`` rounded up to whole 32-bit words."""
    chunk = COPY_CHUNK
    words = _whole_words(nbytes)
    return [(off, min(chunk, words - off)) for off in range(0, words, chunk)]


def copy_array(a: Array, dst: Runtime) -> Array:
    """``a`` (in a buffer on another device) copied to ``dst`` through the host, pipelined: the
    source device's worker thread reads chunk k + 1 back (a copy into its staging buffer, a map,
    a copy out) while this thread hands chunk k to the destination (``write_buffer`` copies it
    into wgpu's staging memory and returns; the submit after it starts the transfer to the
    device). So the readback from the source overlaps the upload to the destination, and at most
    two chunks are held on the host at a time."""
    src, buf = a._rt, a._buffer
    assert src is not None and buf is not None
    out = dst.buffer(a.nbytes)
    chunks = _chunks(a.nbytes)

    def read(off: int, n: int) -> memoryview:
        return src.read_pieces([(buf, off, n)])

    nxt = on_device(src, read, *chunks[0])
    sub = 0
    for k, (off, _) in enumerate(chunks):
        cur = nxt
        if k + 1 < len(chunks):
            nxt = on_device(src, read, *chunks[k + 1])  # read while chunk k is uploaded
        sub = dst.write_pieces([(out, off, cur.result())])
    return Array(a._shape, a._dtype, buffer=out, submission=sub)


def to_storage(host: np.ndarray, dtype: str) -> np.ndarray:
    """``host`` as the device stores ``dtype``: C-contiguous, same shape (0-d stays 0-d, which
    ``np.ascontiguousarray`` would make 1-d: exports save constants with their shapes)."""
    return np.asarray(host, dtype=dtypes.NUMPY_STORAGE[dtype], order="C")


def device_put(x: Any, device: Any = None, dtype: Any = None) -> Array:
    """Upload ``x`` (a numpy array or scalar) once; pass the result to jitted functions.

    ``device``: a :class:`DeviceInfo` from ``fusec.devices()`` or an index into it (default: the
    default device). An Array ``x`` is copied there (``x.to(device)``), or returned as it is
    where ``device`` is None or its own. ``dtype`` converts (on the array's device)."""
    if isinstance(x, Array):
        if dtype is not None:
            x = x.astype(dtype)
        return x if device is None else x.to(device)
    rt = get_runtime() if device is None else resolve_device(device, "device_put")
    arr = np.asarray(x)
    dt = dtypes.canonicalize(dtype if dtype is not None else arr.dtype, "device_put argument")
    host = np.asarray(arr, dtype=dt, order="C")  # (ascontiguousarray would make 0-d 1-d)
    if rt is None:  # the interpreter: a copy of its own, which later changes to x do not reach
        host = np.array(host, copy=True)
        host.flags.writeable = False
        return Array(host.shape, dt, host=host)
    if host.nbytes > rt.max_binding_size:
        raise DeviceLimitError(
            f"device_put argument of {host.nbytes} bytes exceeds the device's maximum storage "
            f"buffer binding size of {rt.max_binding_size} bytes ({rt.info.adapter})")
    return Array(host.shape, dt, buffer=rt.upload(to_storage(host, dt)))


# --- executables ----------------------------------------------------------------------------------

# A while loop runs on the device in chunks of iterations, one submit and one read of its flag
# per chunk; chunks double from 2 up to this many iterations (FUSEC_WHILE_CHUNK_MAX overrides
# it; even sizes: the final carries end in the same one of their two buffers whatever the number
# of chunks). See docs/architecture.md for the measurements behind it.
WHILE_CHUNK_MAX = 64


def while_chunk_max() -> int:
    cap = int(config.get("while_chunk_max") or WHILE_CHUNK_MAX)
    return max(2, cap + cap % 2)


# Lazy submission (see Runtime.flush): a call joins the batch when it has at most
# BATCH_MAX_LAUNCHES kernels and BATCH_MAX_WORKGROUPS workgroups in all; the batch is submitted
# after a call that ends BATCH_SECONDS or more after the batch began, after BATCH_CALLS calls
# (FUSEC_BATCH_CALLS; 0 submits every call at once), or earlier by a read, a wait, an upload, or a
# call that does not join it.
BATCH_CALLS = int(config.get("batch_calls") or 0)
BATCH_MAX_LAUNCHES = 32
BATCH_MAX_WORKGROUPS = 4096
BATCH_SECONDS = 100e-6
# a wait that finds the GPU busy opens the next batch meanwhile (Runtime.wait_idle)
PREOPEN_BATCH = True
# Calls recorded ahead (GpuExecutable.record_ahead): FUSEC_RECORD_AHEAD's values
_AHEAD_MODES = ("auto", "always", "off")
# ...and only for calls whose fresh output buffers (held from the recording to the call) take at
# most this many bytes
AHEAD_MAX_FRESH_BYTES = 256 << 20

# Where a long call submits (see submit_cuts). Each submit after the first costs the GPU time: on
# the H200 about 16 us idle between the command buffers and 8 us more in the passes
# (bench/call_timeline.py). So on GPUs a chunk goes on growing, past the doubling rule, while
# the work already submitted is estimated to keep the GPU busy until it is submitted too. The
# estimates err on the safe side (a fast GPU, a slow host): where they are wrong the doubling
# rule decides, as it does on software adapters (FUSEC_SUBMIT_PLAN=0: always).
HOST_US_PER_DISPATCH = 6.0  # recording and finishing one dispatch (H200's host: 3-3.5 + 1.8)
HOST_US_PER_SUBMIT = 40.0  # a chunk's finish and submit beyond that, the next encoder and pass
GPU_START_US = 10.0  # from a submit to the GPU starting on it
SUBMIT_MARGIN_US = 20.0
GPU_US_PER_KERNEL = 2.0  # a kernel's estimated time: this, plus its bytes and flops at
GPU_BYTES_PER_US = 4.0e6  # 4 TB/s and
GPU_FLOPS_PER_US = 5.0e7  # 50 TFLOP/s (the H200 measures 3.3-4.1 TB/s, 34 TFLOP/s in products)


def gpu_estimate_us(e: Eqn) -> float:
    """An under-estimate of kernel equation ``e``'s GPU time on a fast GPU, in us."""
    flops, nbytes = kernel_cost(e)
    return GPU_US_PER_KERNEL + nbytes / GPU_BYTES_PER_US + flops / GPU_FLOPS_PER_US


def submit_cuts(costs: Sequence[float], first: int, growth: int, plan: bool) -> list[int]:
    """The dispatch counts after which a call of ``len(costs)`` dispatches submits what it has
    recorded (the last submit, at its end, not listed): the first after ``first``
    (FUSEC_SUBMIT_FIRST; 0: none), then at ``growth`` (FUSEC_SUBMIT_GROWTH) times the count of
    the one before (1 or less: none). With ``plan``, a chunk grows beyond that while the GPU is
    estimated to have work until it is submitted: a simulation of the host recording
    (HOST_US_PER_DISPATCH, HOST_US_PER_SUBMIT) against the GPU running the chunks submitted
    before (``costs``: each dispatch's estimated GPU us, gpu_estimate_us), with a margin."""
    n = len(costs)
    if first <= 0 or first >= n:
        return []
    cuts = [first]
    host = first * HOST_US_PER_DISPATCH + HOST_US_PER_SUBMIT  # when each chunk is submitted
    gpu = host + GPU_START_US + sum(costs[:first])  # when the GPU runs out of submitted work
    i = first
    while True:
        nxt = _next_submit(i, growth)
        if plan:
            room = gpu - SUBMIT_MARGIN_US - host - HOST_US_PER_SUBMIT
            nxt = max(nxt, i + int(room // HOST_US_PER_DISPATCH))
        if nxt >= n:
            return cuts
        cuts.append(nxt)
        host += (nxt - i) * HOST_US_PER_DISPATCH + HOST_US_PER_SUBMIT
        gpu = max(gpu, host + GPU_START_US) + sum(costs[i:nxt])
        i = nxt


@dataclass(eq=False)
class _Launch:
    pipeline: Any
    layout: Any
    reads: list[int]
    writes: list[int]
    slots: tuple[str, ...]  # where each write lives: "new", "pN" (pooled), "inK" (donated input)
    grid: tuple[int, int, int]
    # bind groups by the buffers they bind: with pooled buffers a steady loop reuses a few
    bind_groups: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    gather: Any = None  # slot handles -> the bound ones (reads, then writes) as a tuple (_plan)
    alloc: list[tuple[int, int, Any]] = field(default_factory=list)  # (slot, kind, arg)
    cap: int = BIND_GROUP_CACHE  # bind groups kept (more inside a loop: three per call)
    name: str = ""  # the kernel's name (fusec.profile reports it)
    gpu_us: float = 0.0  # its estimated GPU time (gpu_estimate_us), for where a call submits


class _NativePlan:
    """An executable's steps as ``_record_native`` walks them (a program without loops): the
    slots' buffer assignments in step order, aliases included (``allocs``: (slot, kind, arg) as
    in ``_Launch.alloc``, an alias as kind 3); the dispatching launches, their pipelines' and
    grids; for each slot the launches that bind it; and the bind groups (and their native
    handles) of the last call, with the slots' wgpu buffers they were made for (``raws``; None
    after the bind groups were dropped)."""

    def __init__(self, steps: Sequence[Any]) -> None:
        self.allocs: list[tuple[int, int, Any]] = []
        self.launches: list[_Launch] = []
        for st in steps:
            if type(st) is _Alias:
                self.allocs.append((st.dst, 3, st.src))
                continue
            assert type(st) is _Launch, "a program with loops is walked, not recorded so"
            self.allocs += [a for a in st.alloc if a[1] != 4]
            if st.grid[0]:
                self.launches.append(st)
        self.users: dict[int, list[int]] = {}
        for i, st in enumerate(self.launches):
            for s in dict.fromkeys(st.reads + st.writes):
                self.users.setdefault(s, []).append(i)
        self.pipes = [st.pipeline._internal for st in self.launches]
        self.grids = [st.grid for st in self.launches]
        self.groups: list[Any] = [None] * len(self.launches)
        self.handles: list[Any] = [None] * len(self.launches)
        self.raws: Optional[list[Any]] = None


def _whole_words(nbytes: int) -> int:
    """``nbytes`` rounded up to whole 32-bit words, at least one: copies and maps move words."""
    return max(4, -(-nbytes // 4) * 4)


def _staging_size(nbytes: int) -> int:
    """The staging buffers' power-of-two size class for ``nbytes`` (256 bytes at least)."""
    return 1 << max(8, (nbytes - 1).bit_length())


class PendingRead:
    """A read started by Runtime.read_ahead: its staging buffer (of ``size`` bytes, ``words``
    of them copied, ``nbytes`` wanted) and the flag its mapping sets."""

    __slots__ = ("stage", "size", "words", "nbytes", "flag")

    def __init__(self, stage: Any, size: int, words: int, nbytes: int, flag: Any) -> None:
        self.stage, self.size, self.words, self.nbytes, self.flag = stage, size, words, nbytes, flag


class _Ahead:
    """A call recorded ahead: its finished command buffer, the slots' buffers it binds, the
    inputs' wgpu buffers it was recorded for, and ``Runtime.destroyed`` then."""

    __slots__ = ("native", "cb", "bufs", "inputs", "destroyed")

    def __init__(self, native: Any, cb: Any, bufs: list[Any], inputs: list[Any],
                 destroyed: int) -> None:
        self.native, self.cb, self.bufs, self.inputs = native, cb, bufs, inputs
        self.destroyed = destroyed

    def take(self) -> Any:
        cb, self.cb = self.cb, None
        return cb

    def drop(self) -> None:
        """Release the command buffer unsubmitted (its output buffers go back to the pool)."""
        cb = self.take()
        if cb is not None:
            self.native.release_cb(cb)

    def __del__(self) -> None:
        try:
            self.drop()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to release
            pass


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Are the two lists of wgpu buffers (or None) the same objects, place by place?"""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _fed_back(last: Optional[Sequence[Any]], key: Sequence[Any], outs: Sequence[Any]
              ) -> list[tuple[int, int]]:
    """(input, output) where a call's input buffer (``key``) is not the last call's input
    (``last``) there but the last call's output (``outs``): a loop carrying a value from one
    call to the next (a model's step fed its last token, an optimizer's step its parameters)."""
    if last is None or not outs:
        return []
    where = {id(r): j for j, r in enumerate(outs) if r is not None}
    return [(i, where[id(r)]) for i, r in enumerate(key)
            if r is not None and r is not last[i] and id(r) in where]


@dataclass
class _Alias:
    src: int
    dst: int
    shape: tuple[int, ...]


class _Steps:
    """A lowered program's steps (kernel launches, reshape aliases, loops) and the slot (one per
    value) each reads and writes; buffers are bound to slots when the steps are walked."""

    def __init__(self, rt: Runtime, prog: Program, codes: Iterator[Any], in_loop: bool = False
                 ) -> None:
        self.rt = rt
        self.prog = prog
        slot: dict[int, int] = {}
        self.var_of: list[Var] = []

        def slot_of(v: Var) -> int:
            if id(v) not in slot:
                slot[id(v)] = len(self.var_of)
                self.var_of.append(v)
            return slot[id(v)]

        for v in prog.inputs:
            slot_of(v)
        self.steps: list[Any] = []
        self.pool_sizes: dict[int, int] = {}
        self.pool: dict[int, Any] = {}  # pooled intermediate buffers, persistent across calls
        self.zeroed: list[int] = []  # pooled buffers cleared to zeros at the start of each call
        self.root: dict[int, int] = {}  # slot -> the slot whose buffer it is (aliases, "=J")
        self.has_loops = False
        self.has_while = False
        cap = 4 * BIND_GROUP_CACHE if in_loop else BIND_GROUP_CACHE
        for e in prog.eqns:
            if e.op is Op.KERNEL:
                code = next(codes)
                pipe, layout = rt.pipeline(code.key, code.wgsl, code.n_inputs, code.n_outputs,
                                           code.name)
                slots = tuple(e.params.get("slots", ("new",) * len(e.outs)))
                aliased = {j for j, _ in e.params.get("inplace", ())}
                reads = [slot_of(a) for j, a in enumerate(e.inputs)
                         if isinstance(a, Var) and j not in aliased]
                # "=J": the output is written into input J's buffer (resolved to its slot)
                slots = tuple(f"={slot_of(cast(Var, e.inputs[int(sl[1:])]))}"
                              if sl.startswith("=") else sl for sl in slots)
                writes = [slot_of(o) for o in e.outs]
                self.steps.append(_Launch(pipe, layout, reads, writes, slots, code.grid,
                                          cap=cap, name=code.name, gpu_us=gpu_estimate_us(e)))
                self._note_slots(e.outs, writes, slots)
            elif e.op is Op.LOOP:
                loop = _LoopRun(rt, e, [slot_of(cast(Var, a)) for a in e.inputs], codes)
                slots = tuple(e.params.get("slots", ("new",) * len(e.outs)))
                slots = tuple(f"={slot_of(cast(Var, e.inputs[int(sl[1:])]))}"
                              if sl.startswith("=") else sl for sl in slots)
                loop.writes = [slot_of(o) for o in e.outs]
                loop.slots = slots
                self.steps.append(loop)
                self._note_slots(e.outs, loop.writes, slots)
                self.has_loops = True
                self.has_while = self.has_while or loop.trips is None or loop.body.has_while
            else:
                assert e.op is Op.RESHAPE and isinstance(e.inputs[0], Var)
                src, dst = slot_of(e.inputs[0]), slot_of(e.out)
                self.steps.append(_Alias(src, dst, e.out.shape))
                self.root[dst] = self.root.get(src, src)
        self.n_inputs = len(prog.inputs)
        self.out_slots: list[Optional[int]] = [slot_of(a) if isinstance(a, Var) else None
                                               for a in prog.outputs]
        self.n_slots = len(self.var_of)
        self._plan_steps()

    def _note_slots(self, outs: Sequence[Var], writes: list[int], slots: tuple[str, ...]) -> None:
        for o, w, sl in zip(outs, writes, slots):
            if sl.startswith(("p", "z")):
                b = int(sl[1:])
                self.pool_sizes[b] = max(self.pool_sizes.get(b, 0), o.nbytes)
            if sl.startswith("z"):
                self.zeroed.append(int(sl[1:]))
            if sl.startswith("="):
                src = int(sl[1:])
                self.root[w] = self.root.get(src, src)

    def _plan_steps(self) -> None:
        """Per-call work decided once: where each write goes."""
        rt = self.rt
        for st in self.steps:
            if isinstance(st, _Alias):
                continue
            if isinstance(st, _Launch):
                bound = tuple(st.reads + st.writes)
                # fetches the bound buffers' handles as one tuple (the bind-group cache key)
                st.gather = (itemgetter(*bound) if len(bound) > 1
                             else (lambda r, s=bound[0]: (r[s],)))
            st.alloc = []
            for w, sl in zip(st.writes, st.slots):
                if sl == "new":
                    st.alloc.append((w, 0, rt._size_class(self.var_of[w].nbytes)))
                elif sl.startswith(("p", "z")):
                    st.alloc.append((w, 1, int(sl[1:])))
                elif sl.startswith("="):
                    st.alloc.append((w, 3, int(sl[1:])))  # the buffer of another slot
                else:
                    st.alloc.append((w, 2, int(sl[2:])))  # a donated input's buffer

    def preset(self, slots: set[int]) -> None:
        """Writes to ``slots`` go to buffers bound before the steps are walked (a loop body's
        carry results: the loop's two buffers per carry)."""
        for st in self.steps:
            if isinstance(st, _Alias):
                continue
            st.alloc = [(w, 4, None) if w in slots else (w, kind, arg)
                        for w, kind, arg in st.alloc]

    def drop_bind_groups(self) -> None:
        for st in self.steps:
            if isinstance(st, _Launch):
                st.bind_groups.clear()
            elif isinstance(st, _LoopRun):
                st.body.drop_bind_groups()

    def _take_buffers(self, st: Any, bufs: list[Any], raws: list[Any]) -> None:
        """Bind the buffers a step writes to its slots (as planned in ``st.alloc``)."""
        rt = self.rt
        for w, kind, arg in st.alloc:
            if kind == 4:
                continue  # bound by the loop running these steps
            b: Any
            if kind == 0:
                b = rt.buffer_of_class(arg)
            elif kind == 1:
                b = self.pool.get(arg)
                if b is None:
                    b = self.pool[arg] = rt.buffer(self.pool_sizes[arg])
            else:
                b = bufs[arg]  # a donated input's buffer (2), or another slot's (3)
            bufs[w] = b
            raws[w] = b.raw

    def walk(self, bufs: list[Any], raws: list[Any], sink: Any) -> None:
        """Bind buffers to the slots step by step and hand each dispatch to ``sink`` (the
        pass being recorded, or a list that a loop replays)."""
        rt = self.rt
        for st in self.steps:
            if type(st) is _Alias:
                bufs[st.dst] = bufs[st.src]
                raws[st.dst] = raws[st.src]
                continue
            self._take_buffers(st, bufs, raws)
            if type(st) is _LoopRun:
                st.run(bufs, raws, sink)
                continue
            if st.grid[0] == 0:
                continue
            bound = st.gather(raws)
            bg = st.bind_groups.get(bound)
            if bg is None:
                bg = _bind_group(rt, st, bound)
            sink.dispatch(st.pipeline, bg, st.grid)


def _bind_group(rt: Runtime, st: _Launch, bound: tuple[Any, ...]) -> Any:
    entries = [{"binding": i, "resource": {"buffer": raw, "offset": 0, "size": raw.size}}
               for i, raw in enumerate(bound)]
    bg = rt.device.create_bind_group(layout=st.layout, entries=entries)
    if len(st.bind_groups) >= st.cap:
        st.bind_groups.pop(next(iter(st.bind_groups)))
    st.bind_groups[bound] = bg
    return bg


class _ListSink(list):  # type: ignore[type-arg]
    """Dispatches collected for replay: one iteration of a loop body."""

    def dispatch(self, pipe: Any, bg: Any, grid: tuple[int, int, int]) -> None:
        self.append((pipe, bg, grid))

    def replay(self, cmds: Sequence[tuple[Any, Any, tuple[int, int, int]]]) -> None:
        self.extend(cmds)  # a loop nested in a loop's body


class _Recorder:
    """The command encoder and compute pass of a call being recorded. A while loop's chunk ends
    the pass and submits (:meth:`read_flag`); recording goes on in a new pass."""

    def __init__(self, rt: Runtime, zeroed: Sequence[Any], timestamps: Any = None) -> None:
        self.rt = rt
        self.timed = bool(timestamps)
        self.enc, self.cpass = rt.open_call(zeroed, timestamps)
        self.last: Any = None  # the pipeline set last: a loop of one kernel sets it once

    def dispatch(self, pipe: Any, bg: Any, grid: tuple[int, int, int]) -> None:
        cp = self.cpass
        if pipe is not self.last:
            cp.set_pipeline(pipe)
            self.last = pipe
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(*grid)

    def replay(self, cmds: Sequence[tuple[Any, Any, tuple[int, int, int]]]) -> None:
        cp = self.cpass
        last = self.last
        for pipe, bg, grid in cmds:
            if pipe is not last:
                cp.set_pipeline(pipe)
                last = pipe
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(*grid)
        self.last = last

    def read_flag(self, raw: Any) -> bool:
        """Submit what is recorded with a copy of a bool scalar (a while loop's flag) to the
        staging buffer, wait, and read it: one submit and one mapped read."""
        rt = self.rt
        self.cpass.end()
        stage = rt._staging_buffer(4)
        self.enc.copy_buffer_to_buffer(raw, 0, stage, 0, 4)
        rt.submit(self.enc)
        rt.submitted += 1
        rt._map_read(stage, 4)
        try:
            flag = bool(np.frombuffer(bytes(stage.read_mapped(0, 4)), dtype=np.uint32)[0])
        finally:
            stage.unmap()
        rt.completed = rt.submitted
        cache.STATS.readbacks += 1
        self.enc, self.cpass = rt.take_pass()
        self.last = None
        return flag

    def finish(self) -> None:
        self.cpass.end()
        if self.timed:
            self.rt.resolve_timestamps(self.enc)
        self.rt.submit(self.enc)


class _LoopRun:
    """A ``loop`` equation: its body's steps recorded ``trips`` times into the call's pass.

    A carry updated in place (``inplace``) has one buffer, the loop's input (a private copy)
    that is also its result. Every other carry has two, A (the loop's result buffer) and B (the
    loop's own, kept across calls): iteration i writes one and reads the other, so three sets of
    bind groups cover every iteration (the first reads the initial values). Each set's
    dispatches are collected once per call and replayed: no host work per iteration beyond
    encoding. A while loop replays chunks of even length and reads its flag after each."""

    def __init__(self, rt: Runtime, e: Eqn, ins: list[int], codes: Iterator[Any]) -> None:
        body: Program = e.params["body"]
        self.body = _Steps(rt, body, codes, in_loop=True)
        self.ins = ins  # the slots of the loop's inputs in the enclosing steps
        self.n = n = int(e.params["carries"])
        self.trips: Optional[int] = e.params["trips"]
        self.flag: Optional[int] = e.params.get("flag")
        inplace = {k for _, k in e.params.get("inplace", ())}
        self.stationary: list[bool] = []  # per carry: updated in place
        self.carry_own: list[int] = []  # per carry: the body slot whose buffer holds its result
        for k in range(n):
            out = self.body.out_slots[k]
            assert out is not None, "a loop body's results are buffers (prepare_loops)"
            own = self.body.root.get(out, out)
            self.stationary.append(k in inplace)
            assert (own == k) == (k in inplace), "a carry's result shares a buffer it must not"
            self.carry_own.append(own)
        assert not self.body.zeroed, "nothing is zero-filled per iteration in a loop body"
        self.body.preset({self.carry_own[k] for k in range(n) if not self.stationary[k]})
        # every buffer the body writes is pooled, a carry's or in place: none is new per call
        assert all(kind != 0 for st in self.body.steps if not isinstance(st, _Alias)
                   for _, kind, _ in st.alloc), "a loop body writes a buffer of no carry"
        self.spare: dict[int, Any] = {}  # carry -> its B buffer, kept across calls
        # the loop's results in the enclosing steps (set by _Steps)
        self.writes: list[int] = []
        self.slots: tuple[str, ...] = ()
        self.alloc: list[tuple[int, int, Any]] = []

    def _buffers(self, bufs: list[Any]) -> list[list[Any]]:
        """Per carry: [A, B] (the result buffer and the loop's own), or the in-place buffer."""
        rt = self.body.rt
        out = []
        for k in range(self.n):
            res = bufs[self.writes[k]]
            if self.stationary[k]:
                out.append([res, res])
                continue
            spare = self.spare.get(k)
            if spare is None:
                spare = self.spare[k] = rt.buffer(self.body.var_of[k].nbytes)
            out.append([res, spare])
        return out

    def _bind(self, bufs: list[Any], pairs: list[list[Any]], parity: list[int], first: bool
              ) -> tuple[list[Any], list[Any]]:
        """Body slots for an iteration that writes each carry's buffer ``parity[k]`` and reads
        the other one (or, on the first iteration, the initial value)."""
        body = self.body
        bb: list[Any] = [None] * body.n_slots
        for k in range(self.n):
            if self.stationary[k]:
                bb[k] = pairs[k][0]
                continue
            bb[k] = bufs[self.ins[k]] if first else pairs[k][1 - parity[k]]
            bb[self.carry_own[k]] = pairs[k][parity[k]]
        for j, s in enumerate(self.ins[self.n:]):
            bb[self.n + j] = bufs[s]
        return bb, [None if b is None else b.raw for b in bb]

    def run(self, bufs: list[Any], raws: list[Any], sink: Any) -> None:
        pairs = self._buffers(bufs)
        n = self.n
        # the iteration that writes last must write the result buffers (index 0 of each pair):
        # a static loop's last iteration is trips - 1; a while loop always runs an even count
        last = (self.trips - 1) % 2 if self.trips is not None else 1

        def parity(i: int) -> list[int]:
            # iteration i writes pair index (i + last) % 2: the last iteration writes index 0
            return [(i + last) % 2] * n

        def configs() -> list[tuple[list[Any], list[Any]]]:
            # 0: the first iteration; 1: the iterations like the second; 2: like the third
            return [self._bind(bufs, pairs, parity(i), i == 0) for i in range(3)]

        if self.body.has_while:
            # a while loop inside: the body is recorded live, iteration by iteration
            cfgs = configs()

            def one(i: int) -> None:
                bb, br = cfgs[0 if i == 0 else 1 + (i - 1) % 2]
                self.body.walk(list(bb), list(br), sink)
        else:
            lists = []
            for bb, br in configs():
                lst = _ListSink()
                self.body.walk(bb, br, lst)
                lists.append(lst)

            def one(i: int) -> None:
                sink.replay(lists[0 if i == 0 else 1 + (i - 1) % 2])

        if self.trips is not None:
            for i in range(self.trips):
                one(i)
            return
        flag = pairs[cast(int, self.flag)][0]  # written by every odd iteration
        assert isinstance(sink, _Recorder), "a while loop is recorded live"
        i = 0
        chunk = 2
        cap = while_chunk_max()
        while True:
            for _ in range(chunk):
                one(i)
                i += 1
            if not sink.read_flag(flag.raw):
                return
            chunk = min(2 * chunk, cap)


class GpuExecutable(_Steps):
    """A lowered program bound to compiled pipelines: run() encodes, submits and returns."""

    def __init__(self, rt: Runtime, prog: Program, kernels: Sequence[Any]) -> None:
        super().__init__(rt, prog, iter(kernels))
        self.destroyed = rt.destroyed
        self._cuts: dict[tuple[int, int, bool], list[int]] = {}
        self._plan()
        self._native: Optional[_NativePlan] = None  # _record_native's lists, made at its first

    def _drop_bind_groups(self) -> None:
        self.drop_bind_groups()
        if self._native is not None:
            self._native.raws = None  # its bind groups are no longer the cached ones
        self.destroyed = self.rt.destroyed

    def _zeroed_raws(self) -> list[Any]:
        """The pooled buffers a call clears to zeros first (allocated on the first call)."""
        raws = []
        for z in self.zeroed:
            b = self.pool.get(z)
            if b is None:
                b = self.pool[z] = self.rt.buffer(self.pool_sizes[z])
            raws.append(b.raw)
        return raws

    def _plan(self) -> None:
        """Per-call work decided once: what each output is."""
        self.out_plan: list[tuple[int, Any]] = []
        for s, out_atom in zip(self.out_slots, self.prog.outputs):
            if s is None:
                assert isinstance(out_atom, Lit)
                self.out_plan.append((0, out_atom))
            elif s < self.n_inputs:
                self.out_plan.append((1, s))  # an input returned as is
            else:
                self.out_plan.append((2, (s, self.var_of[s].shape, self.var_of[s].dtype)))
        # outputs that view the same buffer as another output or an input (an output returned
        # twice, reshapes): those Arrays get marked shared on every call (see Array._shared)
        root: dict[int, int] = {}
        for st in self.steps:
            if isinstance(st, _Alias):
                root[st.dst] = root.get(st.src, st.src)
        groups: dict[int, list[int]] = {}
        for pos, s in enumerate(self.out_slots):
            if s is not None:
                groups.setdefault(root.get(s, s), []).append(pos)
        self.out_shared: list[tuple[list[int], Optional[int]]] = [
            (poss, r if r < self.n_inputs else None) for r, poss in sorted(groups.items())
            if len(poss) > 1 or r < self.n_inputs and any(
                self.out_plan[p][0] == 2 for p in poss)]
        # the common case, outputs that are all fresh results: (slot, shape, dtype) each
        self.out_fresh: Optional[list[tuple[int, tuple[int, ...], str]]] = (
            [arg for _, arg in self.out_plan] if all(k == 2 for k, _ in self.out_plan) else None)
        # a small call joins the batch (lazy submission); a large one is submitted at once, so
        # that the GPU starts on it while the caller goes on
        launches = [st for st in self.steps if isinstance(st, _Launch)]
        self.batchable = (
            not self.has_loops and BATCH_CALLS > 0
            and len(launches) <= BATCH_MAX_LAUNCHES
            and sum(st.grid[0] * st.grid[1] * st.grid[2] for st in launches)
            <= BATCH_MAX_WORKGROUPS)
        # A large call may be recorded ahead (record_ahead): not one that joins the batch or
        # runs loops. One that writes into a donated input's buffer may: what it binds is the
        # input's buffer, compared object by object at the call like every input's
        fresh_bytes = sum(arg for st in launches for _, kind, arg in st.alloc if kind == 0)
        self.ahead_ok = (not self.batchable and not self.has_loops
                         and fresh_bytes <= AHEAD_MAX_FRESH_BYTES)
        # slots over an input's buffer (its reshapes; a donated input's buffer written, directly
        # or through another slot), (slot, the slot it is), in step order: a call recorded ahead
        # takes them from the call it is submitted for (_run_ahead)
        n_in = self.n_inputs
        self._input_rooted: list[tuple[int, int]] = []
        for st in self.steps:
            if type(st) is _Alias:
                if self.root.get(st.src, st.src) < n_in:
                    self._input_rooted.append((st.dst, st.src))
            elif isinstance(st, _Launch):
                self._input_rooted += [(w, arg) for w, kind, arg in st.alloc if kind == 2 or (
                    kind == 3 and self.root.get(arg, arg) < n_in)]
        self._ahead: Optional[_Ahead] = None
        self._last_in: Optional[list[Any]] = None  # the last call's inputs' wgpu buffers
        self._last_out: list[Any] = []  # ...and its outputs' (ahead_ok executables only)
        # inputs that were the call before's outputs, (input, output) (a loop's carry: a decode
        # step's token); the next call is predicted to take this call's outputs there
        self._fed: list[tuple[int, int]] = []
        self._predicted: Optional[list[Any]] = None  # the next call's inputs' buffers, predicted
        self._repeats = 0  # calls in a row whose inputs' buffers were predicted, less one

    def cuts(self, first: int, growth: int) -> list[int]:
        """Where this executable's calls submit under these settings (submit_cuts), reversed
        (the recording loops pop the next one)."""
        plan = bool(config.get("submit_plan")) and self.rt.target == "gpu"
        key = (first, growth, plan)
        got = self._cuts.get(key)
        if got is None:
            costs = [st.gpu_us for st in self.steps if isinstance(st, _Launch) and st.grid[0]]
            cuts = submit_cuts(costs, first, growth, plan)
            if cuts and config.debug_level() >= 2:
                how = (f"planned; the doubling rule: {submit_cuts(costs, first, growth, False)}"
                       if plan else "the doubling rule")
                config.debug(2, f"{len(costs)} dispatches submitted after {cuts} ({how}; "
                                f"estimated GPU time {sum(costs):.0f} us)")
            got = self._cuts[key] = cuts[::-1]
        return got

    def run(self, inputs: Sequence[Optional[Array]]) -> list[Any]:
        with self.rt.lock:  # recording into the batch is one thread at a time
            return self._run(inputs)

    def _run(self, inputs: Sequence[Optional[Array]]) -> list[Any]:
        # This is the whole per-call cost of a cached jitted call on top of wgpu's own: keep it
        # to list indexing and dict lookups (bench/host_overhead.py measures it).
        rt = self.rt
        n = self.n_slots
        bufs: list[Any] = [None] * n  # DeviceBuffer per slot (they keep the buffers alive)
        raws: list[Any] = [None] * n  # the wgpu buffer per slot
        # host data goes into the buffer a call recorded ahead binds, or the last call's
        pred = self._predicted
        for i, a in enumerate(inputs):
            if a is not None:
                b = a._buffer
                if b is None:
                    # uploads host data; raises if donated
                    b = a.device_buffer(rt, pred[i] if pred is not None else None)
                bufs[i] = b
                raws[i] = b.raw
        if self.destroyed != rt.destroyed:
            self._drop_bind_groups()
        if self.ahead_ok:
            pre = self._ahead_for(raws)
            if pre is not None:
                return self._run_ahead(pre, inputs, bufs)
        if self.has_loops:
            rt.ahead = None
            rt.flush()
            return self._run_loops(inputs, bufs, raws)
        rt.submitted += 1
        sub = rt.submitted
        clears = self._zeroed_raws()
        batched = self.batchable and not rt.profile and rt.kernel_profile is None
        enc: Any = None
        kq = None
        if batched:
            cpass = rt.batch_pass(clears)
        else:
            # the calls recorded before this one go first
            ts = rt.timestamp_writes() if rt.profile else None
            enc, cpass = rt.open_call(clears, ts, wgpu_py=rt.kernel_profile is not None)
            # fusec.profile(): each kernel in a pass of its own, between two timestamps
            if rt.kernel_profile is not None and "timestamp-query" in rt.info.features:
                kq = rt.kernel_queries(len(self.steps))
        timed: list[str] = []
        # a call of many kernels submits its first dispatches early, then after twice as many and
        # so on (or later, where the GPU is estimated to be busy until then: submit_cuts), so that
        # the GPU starts while the host records the rest (FUSEC_SUBMIT_FIRST, FUSEC_SUBMIT_GROWTH,
        # FUSEC_SUBMIT_PLAN; not under the profilers, whose timestamps bracket one pass)
        cuts = [] if batched or rt.profile or kq is not None else list(self.cuts(
            int(config.get("submit_first")), int(config.get("submit_growth"))))
        # ...unless the GPU is still running earlier work: it has work until this call's one
        # submit at its end, and each submit saved is host and GPU time saved (a streamed
        # decode step records while the GPU runs the step before; FUSEC_SUBMIT_BUSY)
        if cuts and int(config.get("submit_busy")) and rt.gpu_busy():
            cuts = []
        if type(cpass) is Pass and kq is None:
            enc, cpass = self._record_native(bufs, raws, enc, cpass, cuts)
        else:
            enc, cpass = self._record(bufs, raws, enc, cpass, cuts, kq, timed)
        if batched:
            rt.batch_calls += 1
            # submitted once it holds BATCH_SECONDS of recording: calls slower than that (a
            # training step) go one by one, so the GPU starts on each at once; tiny ones share
            # one submit among many
            if rt.batch_calls >= BATCH_CALLS or \
                    time.perf_counter() - rt._batch_t0 >= BATCH_SECONDS:
                rt.flush()
            return self._results(inputs, bufs, sub)
        # the next wait may record this executable's next call (record_ahead)
        rt.ahead = (self, self._predict(raws, bufs)) if self.ahead_ok else None
        cpass.end()
        if rt.profile:
            rt.resolve_timestamps(enc)
        if kq is not None and timed:
            enc.resolve_query_set(kq[0], 0, 2 * len(timed), kq[1], 0)
        rt.submit(enc)
        rt.submitted_batch()
        if kq is not None and timed and rt.kernel_profile is not None:
            t = np.frombuffer(rt.read(kq[1], 16 * len(timed)), dtype=np.uint64).astype(np.int64)
            cache.STATS.readbacks -= 1  # the profiler's, not the user's
            rt.kernel_profile.extend(zip(timed, ((t[1::2] - t[0::2]) / 1e3).tolist()))
        return self._results(inputs, bufs, sub)

    def _results(self, inputs: Sequence[Optional[Array]], bufs: list[Any], sub: int
                 ) -> list[Any]:
        """The call's outputs (submission ``sub``) over the slots' buffers."""
        fresh = self.out_fresh
        if fresh is not None and not self.out_shared:
            return [_device_array(shape, dtype, bufs[s], sub, self.rt)
                    for s, shape, dtype in fresh]
        return self._outputs(inputs, bufs, sub)

    # Calls recorded ahead. A large call's recording (and wgpu-native's finish of it) costs the
    # host 5-8 us per dispatch, and the GPU starts only once the first chunk is submitted; each
    # later submit costs the GPU a gap. While the host waits for such a call, it has nothing to
    # do: it records the executable's next call then, for the inputs' buffers it predicts (this
    # call's, or this call's outputs where the last call's outputs were fed back: _predict), into
    # one command buffer it finishes but does not submit. The next call submits that buffer if
    # its inputs are those buffers (the same Arrays, a donated input written in place, host data
    # uploaded into the same pooled buffer), and records afresh otherwise. What the buffer binds
    # is what the call would bind: the inputs' buffers (their contents are read when the GPU
    # runs it), the executable's own pooled buffers, and fresh output buffers taken from the pool
    # when it was recorded (held until the call, so nothing else gets them). A buffer destroyed
    # since voids it.

    def _ahead_for(self, raws: list[Any]) -> Optional[_Ahead]:
        """The call recorded ahead for inputs bound to ``raws``, if there is one and it binds
        them (else it is dropped); counts calls in a row whose inputs' buffers were predicted,
        and where a call's were not, learns which inputs are the last call's outputs."""
        rt = self.rt
        key = raws[:self.n_inputs]
        last, self._last_in = self._last_in, key
        if self._predicted is not None and _same(self._predicted, key):
            self._repeats += 1
        else:
            self._repeats = 0
            self._fed = _fed_back(last, key, self._last_out)
        pre, self._ahead = self._ahead, None
        if pre is None:
            return None
        if (pre.destroyed == rt.destroyed and _same(pre.inputs, key) and not rt.profile
                and rt.kernel_profile is None):
            return pre
        pre.drop()
        config.debug(2, "a call recorded ahead was dropped: its inputs' buffers changed, a "
                        "buffer was destroyed, or a profiler runs")
        return None

    def _run_ahead(self, pre: _Ahead, inputs: Sequence[Optional[Array]], bufs: list[Any]
                   ) -> list[Any]:
        """Submit the call recorded ahead for these inputs: their buffers are bound already."""
        rt = self.rt
        rt.flush()  # calls recorded in the batch come first
        rt.submitted += 1
        sub = rt.submitted
        native = rt.native
        assert native is not None, "calls are recorded ahead only through wgpu-native"
        native.submit_finished(pre.take())
        rt.submitted_batch()
        rt.ahead_used += 1
        n = self.n_inputs
        bufs[n:] = pre.bufs[n:]
        for dst, src in self._input_rooted:  # (over an input's buffer: this call's input)
            bufs[dst] = bufs[src]
        rt.ahead = (self, self._predict(pre.inputs, bufs))
        return self._results(inputs, bufs, sub)

    def _predict(self, inputs: list[Any], bufs: list[Any]) -> list[Any]:
        """The next call's inputs' wgpu buffers, predicted after a call whose inputs were
        ``inputs`` (their wgpu buffers; ``bufs``: the slots' DeviceBuffers): the same, but where
        an input was the call before's output (``_fed``), this call's output. Notes this call's
        outputs' buffers, which the next call's inputs are compared with where not predicted."""
        n = self.n_inputs
        outs = self._last_out = [None if s is None or bufs[s] is None else bufs[s].raw
                                 for s in self.out_slots]
        pred = list(inputs[:n])
        for i, j in self._fed:
            pred[i] = outs[j]
        self._predicted = pred
        return pred

    def wants_ahead(self, idle: bool = False) -> bool:
        """Whether a wait now records this executable's next call (FUSEC_RECORD_AHEAD): never
        under the profilers or without wgpu-native's recorder; only after two calls in a row
        with the same inputs' buffers; with "auto", in every wait that finds the GPU busy, even
        where the recording outlasts the GPU's work (the next call then only submits: a
        recording's time moved into a wait costs the caller no more than it saves the next
        call, and the GPU runs the next call whole, at once; H100, the SmolLM2-shaped decode
        step at batch 1: 1.55-1.59 ms per streamed token against 1.60-1.83 when a wait recorded
        only where the GPU had run on for a recording's time after the call before); with
        "always", also in a wait that finds the GPU done (the tests' setting)."""
        rt = self.rt
        mode = str(config.get("record_ahead"))
        if mode not in _AHEAD_MODES:
            raise FusecError("FUSEC_RECORD_AHEAD must be one of "
                             f"{', '.join(_AHEAD_MODES)}; got {mode!r}")
        if (mode == "off" or rt.native is None or rt.profile or rt.kernel_profile is not None
                or self._repeats < 1 or self._ahead is not None):
            return False
        return mode == "always" or not idle

    def record_ahead(self, inputs: list[Any], idle: bool = False) -> bool:
        """Record (and finish, without submitting) the next call, its inputs bound to the wgpu
        buffers ``inputs`` (see above), if :meth:`wants_ahead` (``idle``: the wait found the
        GPU done already). Whether it did."""
        if not self.wants_ahead(idle):
            return False
        try:
            return self._record_ahead(inputs)
        except Exception as exc:  # noqa: BLE001 - speculative work: the next call records anew
            self.ahead_ok = False
            self._ahead = None
            config.debug(1, f"recording a call ahead failed ({exc!r}); this executable's calls "
                            "are no longer recorded ahead")
            return False

    def _record_ahead(self, inputs: list[Any]) -> bool:
        rt = self.rt
        native = rt.native
        assert native is not None
        with rt.lock:
            if self._ahead is not None:  # (another thread's wait recorded it meanwhile)
                return False
            t0 = time.perf_counter()
            destroyed = rt.destroyed
            if self.destroyed != destroyed:
                self._drop_bind_groups()
            bufs: list[Any] = [None] * self.n_slots
            raws: list[Any] = [None] * self.n_slots
            raws[:self.n_inputs] = inputs
            # the inputs' buffers that lie free in the pool (host data's, uploaded by the call
            # into the same buffer) are kept out of it meanwhile: not the fresh outputs' then
            held = [b for b in map(rt.take_free, filter(None, inputs)) if b is not None]
            enc = native.encoder()
            for raw in self._zeroed_raws():
                enc.clear_buffer(raw)
            cpass = enc.begin_compute_pass()
            enc, cpass = self._record_native(bufs, raws, enc, cpass, [])
            self._ahead = _Ahead(native, enc.finish(), bufs, list(inputs), destroyed)
            del held  # (back to the pool, for the call's uploads)
            rt.ahead_recorded += 1
            config.debug(2, f"recorded the next call ahead while waiting: "
                            f"{1e6 * (time.perf_counter() - t0):.0f} us of the host's time")
            return True

    def _record(self, bufs: list[Any], raws: list[Any], enc: Any, cpass: Any, cuts: list[int],
                kq: Any, timed: list[str]) -> tuple[Any, Any]:
        """``_run``'s loop over the steps through wgpu-py's passes (``FUSEC_NATIVE=0``, the
        profilers): bind the slots' buffers, record each dispatch, submit after the dispatch
        counts in ``cuts`` (submit_cuts, reversed; popped as they pass); under
        ``fusec.profile()`` (``kq``) each kernel in a timed pass of its own, its name appended to
        ``timed``."""
        rt = self.rt
        dispatched = 0
        split = cuts.pop() if cuts else 0
        for st in self.steps:
            if type(st) is _Alias:
                bufs[st.dst] = bufs[st.src]
                raws[st.dst] = raws[st.src]
                continue
            self._take_buffers(st, bufs, raws)
            if st.grid[0] == 0:
                continue
            bound = st.gather(raws)
            bg = st.bind_groups.get(bound)
            if bg is None:
                bg = _bind_group(rt, st, bound)
            if split and dispatched == split:
                enc, cpass = rt.submit_chunk(enc, cpass)
                split = cuts.pop() if cuts else 0
            dispatched += 1
            if kq is not None:
                # each kernel timed alone: submitted on its own once the GPU is idle (timed
                # passes in one command buffer overlapped on the H100, and their intervals did
                # not add up to the call's GPU time)
                cpass.end()
                rt.submit(enc)
                rt.wait_idle()
                enc = rt.device.create_command_encoder()
                k = 2 * len(timed)
                cpass = enc.begin_compute_pass(timestamp_writes={
                    "query_set": kq[0], "beginning_of_pass_write_index": k,
                    "end_of_pass_write_index": k + 1})
                timed.append(st.name)
            cpass.set_pipeline(st.pipeline)
            cpass.set_bind_group(0, bg)
            cpass.dispatch_workgroups(*st.grid)
        return enc, cpass

    def _record_native(self, bufs: list[Any], raws: list[Any], enc: Any, cpass: Pass,
                       cuts: list[int]) -> tuple[Any, Pass]:
        """``_run``'s loop over the steps where the pass is wgpu-native's own (``fusec.native``):
        the same work as :meth:`_record`'s loop, in three plain loops over lists made once
        (:class:`_NativePlan`), because this is most of fusec's own time per call: the slots'
        buffers bound in step order; the bind groups of the dispatches whose slots hold other
        buffers than at the last call looked up (a decode step's donated cache and pooled
        intermediates keep theirs: only its token's and host data's dispatches change); then
        three native calls per dispatch. (The SmolLM2-shaped step at batch 1, 153 dispatches,
        2 of them looked up per call: 499 us of lavapipe's host per call with a lookup per
        dispatch, 320-343 now, 141-207 of it in the native calls; on the H200's host the
        step's call took 0.13-0.15 ms less.)"""
        rt = self.rt
        plan = self._native
        if plan is None:
            plan = self._native = _NativePlan(self.steps)
        pool, sizes = self.pool, self.pool_sizes
        for w, kind, arg in plan.allocs:
            if kind == 1:
                b = pool.get(arg)
                if b is None:
                    b = pool[arg] = rt.buffer(sizes[arg])
            elif kind == 0:
                b = rt.buffer_of_class(arg)
            else:
                # a donated input's buffer (2), or another slot's (3, aliases too): its wgpu
                # buffer from raws (a call recorded ahead has its inputs' wgpu buffers only)
                bufs[w] = bufs[arg]
                raws[w] = raws[arg]
                continue
            bufs[w] = b
            raws[w] = b.raw
        launches, groups, handles = plan.launches, plan.groups, plan.handles
        last = plan.raws
        if last is None:
            todo: Iterable[int] = range(len(launches))
        else:
            users = plan.users
            todo = sorted({i for s in compress(range(len(raws)), map(is_not, raws, last))
                           for i in users.get(s, ())})
        for i in todo:
            st = launches[i]
            bound = st.gather(raws)
            bg = st.bind_groups.get(bound)
            if bg is None:
                bg = _bind_group(rt, st, bound)
            groups[i] = bg  # (held here too: the cache may drop it)
            handles[i] = bg._internal
        plan.raws = list(raws)
        n = cpass.n
        set_pipeline, set_bind_group, dispatch, null = (n.set_pipeline, n.set_bind_group,
                                                        n.dispatch, n.null)
        raw = cpass.raw
        lastp = None
        split = cuts.pop() if cuts else 0
        for i, (pipe, bgh, grid) in enumerate(zip(plan.pipes, handles, plan.grids)):
            if split and i == split:
                enc, cpass = rt.submit_chunk(enc, cpass)
                raw = cpass.raw
                lastp = None
                split = cuts.pop() if cuts else 0
            if pipe is not lastp:
                set_pipeline(raw, pipe)
                lastp = pipe
            set_bind_group(raw, 0, bgh, 0, null)
            dispatch(raw, grid[0], grid[1], grid[2])
        return enc, cpass

    def _run_loops(self, inputs: Sequence[Optional[Array]], bufs: list[Any], raws: list[Any]
                   ) -> list[Any]:
        """run() for a program with loops: the steps are walked (loops replay their bodies'
        dispatches); a while loop submits once per chunk of iterations."""
        rt = self.rt
        zeroed = self._zeroed_raws()
        # timestamps bracket one pass: only a program without a while loop has a single one
        ts = rt.timestamp_writes() if rt.profile and not self.has_while else None
        rec = _Recorder(rt, zeroed, ts)
        self.walk(bufs, raws, rec)
        rec.finish()
        rt.submitted += 1
        return self._outputs(inputs, bufs, rt.submitted)

    def _outputs(self, inputs: Sequence[Optional[Array]], bufs: list[Any], sub: int
                 ) -> list[Any]:
        """The call's outputs as Arrays over their buffers (those sharing one marked so)."""
        outs: list[Any] = []
        for kind, arg in self.out_plan:
            if kind == 2:
                s, shape, dtype = arg
                outs.append(_device_array(shape, dtype, bufs[s], sub, self.rt))
            elif kind == 1:
                outs.append(inputs[arg])
            else:
                outs.append(Array((), arg.dtype, host=np.asarray(arg.value, dtype=arg.dtype)))
        for poss, inp in self.out_shared:
            for p in poss:
                if isinstance(outs[p], Array):
                    outs[p]._shared = True
            if inp is not None and isinstance(inputs[inp], Array):
                inputs[inp]._shared = True  # type: ignore[union-attr]
        return outs


# fusec.profile() with the interpreter as the backend: the list its calls' equations are timed
# into (None: not profiling)
_CPU_PROFILE: list[Optional[list[tuple[str, float]]]] = [None]


class CpuExecutable:
    """The numpy interpreter as the backend: it runs the traced program after the passes of
    ``passes.INTERPRETER_PASSES`` (not the lowered one: see there)."""

    def __init__(self, traced: Program, donated: Sequence[int] = ()) -> None:
        self.prog = run_interpreter_pipeline(traced)
        # inputs this program reads; the others are passed as None and never converted
        self.used = used_inputs(self.prog)
        self.donated = sorted(donated)

    def run(self, inputs: Sequence[Optional[Array]]) -> list[Any]:
        args = [np.zeros(v.shape, v.dtype) if a is None else np.asarray(a)
                for v, a in zip(self.prog.inputs, inputs)]
        # a donated input's array is the interpreter's to write into (the window of a decode
        # step's cache, in place: evaluate's ``donated``): the caller's Array is dead after the
        # call, and one that shares its array with another Array was given a copy to donate
        # (only arrays this backend made: a user's own numpy array is never written)
        donated = [i for i in self.donated if inputs[i] is not None
                   and _CPU_RESULTS.get(id(args[i])) is args[i] and args[i].base is None]
        for i in donated:
            args[i].flags.writeable = True  # (a result owns its memory)
        try:
            outs = evaluate(self.prog, args, _CPU_PROFILE[0], donated)
        finally:
            for i in donated:  # read-only again, whether it became an output or not
                args[i].flags.writeable = False
        seen = Counter(map(id, outs))
        for o in outs:
            o.flags.writeable = False  # as an Array read back from a device: immutable
            if seen[id(o)] == 1:  # (an array two outputs share is never written into)
                _CPU_RESULTS[id(o)] = o
            else:
                _CPU_RESULTS.pop(id(o), None)
        return [Array(o.shape, str(o.dtype), host=o) for o in outs]


# The interpreter backend's results, by id, while they live: a donated one may be written into
_CPU_RESULTS: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


class profile:
    """Device time of every kernel that jitted calls run inside ``with fusec.profile():``.

    Each kernel runs alone: in a compute pass and a submit of its own, between two timestamp
    queries, once the GPU has finished the kernels before it (so the kernels' sum exceeds a
    normal call's GPU time by what overlaps there, and by a few microseconds per kernel), and
    each call waits for its result. On leaving the block, a table of kernels by total time
    is printed (``print_report=False`` keeps it quiet) and kept as ``.rows`` (kernel name, calls,
    total and mean microseconds), with the block's wall time in ``.wall_ms``. Needs an adapter with
    timestamp queries (``fusec.default_device().features``); calls with compiled loops are timed
    as a whole, not per kernel. With the numpy interpreter as the backend the rows are its
    operations (op and result type, such as ``matmul f32[64,48]``) timed on the host.

        with fusec.profile():
            step(params, x)
    """

    def __init__(self, print_report: bool = True) -> None:
        self.print_report = print_report
        self.kernels: list[tuple[str, float]] = []
        self.rows: list[tuple[str, int, float, float]] = []
        self.wall_ms = 0.0
        self.where = "GPU"

    def __enter__(self) -> profile:
        rt = get_runtime()
        if rt is None:
            self.where = "numpy"
            _CPU_PROFILE[0] = []
        elif "timestamp-query" not in rt.info.features:
            raise FusecError("fusec.profile needs a GPU adapter with timestamp queries; this one "
                             f"has none ({default_device()})")
        else:
            rt.sync()
            rt.kernel_profile = []
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        rt = get_runtime()
        if rt is None:
            self.kernels = _CPU_PROFILE[0] or []
            _CPU_PROFILE[0] = None
        else:
            rt.sync()
            self.kernels = rt.kernel_profile or []
            rt.kernel_profile = None
        self.wall_ms = 1e3 * (time.perf_counter() - self._t0)
        totals: dict[str, list[float]] = {}
        for name, us in self.kernels:
            totals.setdefault(name, []).append(us)
        self.rows = sorted(((n, len(v), sum(v), sum(v) / len(v)) for n, v in totals.items()),
                           key=lambda r: -r[2])
        if self.print_report and exc[0] is None:
            print(self.report())

    def report(self) -> str:
        """The table printed on leaving the block."""
        gpu = sum(r[2] for r in self.rows)
        w = self.where
        lines = [f"fusec.profile: {len(self.kernels)} kernel runs, {gpu / 1e3:.3f} ms of {w} "
                 f"time in a block of {self.wall_ms:.3f} ms wall time",
                 f"{w + ' us':>10} {'share':>6} {'calls':>6} {'mean us':>9}  kernel"]
        for name, calls, total, mean in self.rows:
            lines.append(f"{total:10.1f} {100 * total / max(gpu, 1e-9):5.1f}% {calls:6d} "
                         f"{mean:9.1f}  {name}")
        return "\n".join(lines)
