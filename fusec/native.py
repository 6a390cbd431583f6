"""Command recording and submission through wgpu-native's C functions, below wgpu-py's wrappers:
what every jitted call does, so its cost is paid per call.

wgpu-py builds a descriptor struct and a Python wrapper object for every command encoder, pass
and command buffer, and wraps every call in its error capture. Here the descriptors are made once,
the handles are plain cffi pointers released by hand, and the recording calls (pass, pipeline,
bind group, dispatch, clear, copy) go straight to the library. ``finish`` and ``submit``, where
wgpu-native reports an invalid encoder or a destroyed buffer, still go through wgpu-py's error
capture, so such an error is raised as before, never only logged. Measured on the H100
(``bench/round_trip_floor.py``): one dispatch submitted and waited for, 79 us through wgpu-py,
49 us this way.

The classes mirror the wgpu-py methods the runtime calls (``begin_compute_pass``,
``set_pipeline``, ``set_bind_group``, ``dispatch_workgroups``, ``end``, ``clear_buffer``,
``copy_buffer_to_buffer``) and take wgpu-py objects, whose handles they use. :func:`open_native`
gives None where wgpu-py's wgpu-native backend is not the one in use; the runtime then records
through wgpu-py (``FUSEC_NATIVE=0`` forces that).
"""

from __future__ import annotations

from typing import Any, Optional


class Native:
    """wgpu-native's functions and the reusable descriptors of one device."""

    def __init__(self, device: Any) -> None:
        from wgpu.backends.wgpu_native._api import ffi, lib, libf

        self.ffi = ffi
        self.lib = lib
        self.device = device._internal
        self.queue = device.queue._internal
        self.null = ffi.NULL
        self.whole = lib.WGPU_WHOLE_SIZE
        # zeroed descriptors: no label, no chained struct, no timestamp writes
        self.enc_desc = ffi.new("WGPUCommandEncoderDescriptor *")
        self.pass_desc = ffi.new("WGPUComputePassDescriptor *")
        self.cb_desc = ffi.new("WGPUCommandBufferDescriptor *")
        self.cbs = ffi.new("WGPUCommandBuffer[1]")
        self.create_encoder = lib.wgpuDeviceCreateCommandEncoder
        self.begin = lib.wgpuCommandEncoderBeginComputePass
        self.set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        self.set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
        self.dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
        self.end = lib.wgpuComputePassEncoderEnd
        self.release_pass = lib.wgpuComputePassEncoderRelease
        self.release_encoder = lib.wgpuCommandEncoderRelease
        self.release_cb = lib.wgpuCommandBufferRelease
        self.clear = lib.wgpuCommandEncoderClearBuffer
        self.copy = lib.wgpuCommandEncoderCopyBufferToBuffer
        self.write_buffer = lib.wgpuQueueWriteBuffer
        # mapping a staging buffer for reading, its callback setting a flag (map_read)
        self.map_async = lib.wgpuBufferMapAsync
        self.mapped_range = lib.wgpuBufferGetConstMappedRange
        self.unmap = lib.wgpuBufferUnmap
        self.map_mode_read = lib.WGPUMapMode_Read
        self.callback_mode = lib.WGPUCallbackMode_AllowProcessEvents
        success = lib.WGPUMapAsyncStatus_Success

        def on_mapped(status: int, message: Any, flag: Any, unused: Any) -> None:
            ffi.cast("int32_t *", flag)[0] = 1 if status == success else 2

        # (kept alive with this object: wgpu-native calls it during a device poll)
        self.on_mapped = ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)",
                                      on_mapped)
        # error-captured (wgpu-py raises what wgpu-native reports during the call)
        self.finish = libf.wgpuCommandEncoderFinish
        self.submit = libf.wgpuQueueSubmit

    def encoder(self) -> Encoder:
        return Encoder(self)

    def write(self, buffer: Any, data: Any) -> None:
        """Queue ``data`` (a contiguous numpy array) for ``buffer`` (a wgpu-py buffer at least
        that large) at offset 0, as wgpu-py's ``queue.write_buffer`` does, without its checks and
        error capture (the runtime's pooled buffers are live and sized for the data): the call's
        uploads of host data (a decode step's position, RoPE rows and mask) come before its
        submit. wgpu-native copies the data during the call."""
        self.write_buffer(self.queue, buffer._internal, 0, self.ffi.from_buffer(data), data.nbytes)

    def map_read(self, buffer: Any, nbytes: int) -> Any:
        """Ask for ``buffer`` (a wgpu-py buffer with MAP_READ usage) to be mapped for reading
        once the GPU is done with it. Returns a cffi ``int32_t *`` flag that a device poll sets
        to 1 once mapped (2: it failed); the caller keeps it alive until it is set. wgpu-py's
        own buffer state stays "unmapped": the buffer is read and unmapped here
        (:meth:`take_mapped`), never through wgpu-py."""
        flag = self.ffi.new("int32_t *")
        info = self.ffi.new("WGPUBufferMapCallbackInfo *")
        info.mode = self.callback_mode
        info.callback = self.on_mapped
        info.userdata1 = flag
        self.map_async(buffer._internal, self.map_mode_read, 0, nbytes, info[0])
        return flag

    def take_mapped(self, buffer: Any, nbytes: int) -> bytes:
        """A copy of the first ``nbytes`` of a buffer mapped by :meth:`map_read`; unmaps it."""
        ptr = self.mapped_range(buffer._internal, 0, nbytes)
        try:
            return bytes(self.ffi.buffer(ptr, nbytes))
        finally:
            self.unmap(buffer._internal)

    def submit_finished(self, cb: Any) -> None:
        """Submit a command buffer from :meth:`Encoder.finish` and release it."""
        try:
            self.cbs[0] = cb
            self.submit(self.queue, 1, self.cbs)
        finally:
            self.release_cb(cb)


class Pass:
    """An open compute pass of an :class:`Encoder`."""

    __slots__ = ("n", "raw")

    def __init__(self, n: Native, raw: Any) -> None:
        self.n = n
        self.raw = raw

    def set_pipeline(self, pipeline: Any) -> None:
        self.n.set_pipeline(self.raw, pipeline._internal)

    def set_bind_group(self, index: int, bind_group: Any) -> None:
        n = self.n
        n.set_bind_group(self.raw, index, bind_group._internal, 0, n.null)

    def dispatch_workgroups(self, x: int, y: int = 1, z: int = 1) -> None:
        self.n.dispatch(self.raw, x, y, z)

    def end(self) -> None:
        raw, self.raw = self.raw, None
        if raw is not None:
            self.n.end(raw)
            self.n.release_pass(raw)


class Encoder:
    """A command encoder; :meth:`submit` finishes and submits it (once)."""

    __slots__ = ("n", "raw", "cpass")

    def __init__(self, n: Native) -> None:
        self.n = n
        self.raw = n.create_encoder(n.device, n.enc_desc)
        self.cpass: Optional[Pass] = None

    def begin_compute_pass(self) -> Pass:
        self.cpass = Pass(self.n, self.n.begin(self.raw, self.n.pass_desc))
        return self.cpass

    def clear_buffer(self, buffer: Any) -> None:
        self.n.clear(self.raw, buffer._internal, 0, self.n.whole)

    def copy_buffer_to_buffer(self, src: Any, src_offset: int, dst: Any, dst_offset: int,
                              size: int) -> None:
        self.n.copy(self.raw, src._internal, src_offset, dst._internal, dst_offset, size)

    def finish(self) -> Any:
        """Finish (ending a pass left open): the command buffer's handle, for
        :meth:`Native.submit_finished` now or later (a call recorded ahead), or for
        ``release_cb`` where it is never submitted. The encoder's handle is released."""
        n = self.n
        if self.cpass is not None:
            self.cpass.end()
            self.cpass = None
        raw, self.raw = self.raw, None
        try:
            return n.finish(raw, n.cb_desc)
        finally:
            n.release_encoder(raw)

    def submit(self) -> None:
        """Finish (ending a pass left open) and submit; the handles are released."""
        self.n.submit_finished(self.finish())

    def __del__(self) -> None:
        # an encoder dropped unsubmitted (an error while recording): release its handles
        try:
            if self.cpass is not None:
                self.cpass.end()
            if self.raw is not None:
                self.n.release_encoder(self.raw)
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to release
            pass


def poll_function() -> Optional[tuple[Any, Any]]:
    """wgpu-native's ``wgpuDevicePoll`` and NULL, for a wait that polls in a tight loop (None
    where wgpu-py's wgpu-native backend does not expose it: waits then block). Its result is a C
    ``bool`` that cffi reads as the 32-bit ``WGPUBool``: only the low byte is the answer."""
    try:
        from wgpu.backends.wgpu_native._api import ffi, lib

        return lib.wgpuDevicePoll, ffi.NULL
    except Exception:  # noqa: BLE001 - another backend or a changed wgpu-py: block instead
        return None


def open_native(device: Any) -> Optional[Native]:
    """The native recorder for ``device``, or None where wgpu-py's wgpu-native backend does not
    expose what it needs."""
    try:
        return Native(device)
    except Exception:  # noqa: BLE001 - another backend or a changed wgpu-py: record via wgpu-py
        return None
