//! `CudaStorage`: page bytes in device memory through cudarc (`DeviceStorage` over `CudaDriver`), one
//! contiguous device allocation (arena) and one copy stream per rank, libcuda loaded at run time. It compiles on machines without CUDA; asking for it there is the error
//! `CudaUnavailable`, never a panic: `cuda_available` probes for libcuda before any driver call (cudarc's
//! loader panics when the library or a symbol is missing), and every driver call runs under `catch_unwind`.
#![allow(
    unsafe_code,
    reason = "raw driver copies, pinned staging and the loader probe; each block has a SAFETY note"
)]

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::{CUdeviceptr, CUevent_flags, CUstream};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DriverError, PinnedHostSlice, result,
};

use super::Shape;
use super::device::{Device, DeviceStorage, Gate, StreamHold};
use crate::error::{Error, Result};

/// Whether CUDA storage can be used here: `Ok`, or why not (no libcuda, no device, the driver failed to
/// initialize). Probed once per process; never panics.
pub fn cuda_available() -> std::result::Result<(), String> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(probe).clone()
}

/// Page bytes in CUDA device memory: per rank one device allocation of `n_pages * bytes_per_page` bytes and
/// one copy stream. Copy engines queue restores on the rank's stream (`DeviceStorage::enqueue_run`); reads,
/// writes and copies through `PageStorage` run on the calling thread's per-thread stream after the events of
/// the transfers queued into the pages they touch, and are complete when the call returns.
pub type CudaStorage = DeviceStorage<CudaDriver>;

/// The real driver behind `Device`: a CUDA context with cudarc's per-allocation event tracking turned off
/// (this crate orders accesses by page events instead), one non-blocking copy stream and one arena per rank.
pub struct CudaDriver {
    device_ordinal: usize,
    context: Arc<CudaContext>,
    /// Rank `r`'s copy stream.
    streams: Vec<Arc<CudaStream>>,
    /// The per-thread default stream: each thread's synchronous accesses wait only for their own work.
    access: Arc<CudaStream>,
    /// Rank `r`'s arena and its device address; page `p` at byte offset `p * bytes_per_page`.
    arenas: Vec<(CudaSlice<u8>, CUdeviceptr)>,
}

/// Pinned host memory and its address, fixed for its lifetime.
#[derive(Debug)]
pub struct CudaPinned {
    slice: PinnedHostSlice<u8>,
    ptr: *mut u8,
}

// SAFETY: `ptr` is the address of `slice`'s page-locked allocation, which `PinnedHostSlice` (itself `Send`)
// owns; the pointer is only dereferenced through `&CudaPinned` / `&mut CudaPinned` borrows.
unsafe impl Send for CudaPinned {}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver")
            .field("device_ordinal", &self.device_ordinal)
            .finish_non_exhaustive()
    }
}

impl DeviceStorage<CudaDriver> {
    /// Zeroed device storage of `n_ranks` shards of `n_pages` pages (the null page included) of
    /// `bytes_per_page` bytes on device `device_ordinal`. Errors: `CudaUnavailable` without a driver or
    /// device, `CudaFailed` when allocation fails, `EmptyStorage` / `StorageTooLarge` for a bad shape.
    pub fn new(
        device_ordinal: usize,
        n_ranks: u32,
        n_pages: u32,
        bytes_per_page: usize,
    ) -> Result<CudaStorage> {
        let shape = Shape::new(n_ranks, n_pages, bytes_per_page)?;
        let driver = CudaDriver::new(device_ordinal, shape)?;
        Ok(DeviceStorage::from_device(shape, driver))
    }

    /// The CUDA context the pages live in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.device().context
    }
}

impl CudaDriver {
    fn new(device_ordinal: usize, shape: Shape) -> Result<CudaDriver> {
        cuda_available().map_err(|reason| Error::CudaUnavailable { reason })?;
        let unavailable = |reason| Error::CudaUnavailable { reason };
        let n_devices =
            guarded("counting devices", CudaContext::device_count).map_err(unavailable)?;
        if device_ordinal >= n_devices.max(0) as usize {
            return Err(Error::CudaUnavailable {
                reason: format!(
                    "device ordinal {device_ordinal} is not present: the driver reports {n_devices} devices"
                ),
            });
        }
        let context = guarded("creating a context", || CudaContext::new(device_ordinal))
            .map_err(unavailable)?;
        // SAFETY: the storage orders every use of its arenas itself: transfers on a rank's copy stream are
        // marked by events per page, accesses wait for those events and synchronize before returning, and
        // `Drop` synchronizes every copy stream before the arenas are freed.
        unsafe { context.disable_event_tracking() };
        let alloc_failed = |reason| Error::CudaFailed {
            operation: "allocate",
            reason,
        };
        let mut streams = Vec::with_capacity(shape.n_ranks as usize);
        let mut arenas = Vec::with_capacity(shape.n_ranks as usize);
        for _ in 0..shape.n_ranks {
            let stream =
                guarded("creating a copy stream", || context.new_stream()).map_err(alloc_failed)?;
            let arena = guarded("allocating a shard", || {
                let arena = stream.alloc_zeros::<u8>(shape.bytes_per_shard())?;
                stream.synchronize()?;
                Ok(arena)
            })
            .map_err(alloc_failed)?;
            let ptr = arena.device_ptr(&stream).0;
            arenas.push((arena, ptr));
            streams.push(stream);
        }
        let access = context.per_thread_stream();
        Ok(CudaDriver {
            device_ordinal,
            context,
            streams,
            access,
            arenas,
        })
    }

    fn stream(&self, rank: u32) -> Result<&Arc<CudaStream>, String> {
        self.streams
            .get(rank as usize)
            .ok_or_else(|| format!("no copy stream for rank {rank}"))
    }

    /// The device address of `n_bytes` at `offset` of `rank`'s arena, checked against its length.
    fn address(&self, rank: u32, offset: usize, n_bytes: usize) -> Result<CUdeviceptr, String> {
        let (arena, base) = self
            .arenas
            .get(rank as usize)
            .ok_or_else(|| format!("no arena for rank {rank}"))?;
        let end = offset
            .checked_add(n_bytes)
            .filter(|&end| end <= arena.len());
        end.ok_or_else(|| {
            format!(
                "bytes {offset}..+{n_bytes} outside an arena of {}",
                arena.len()
            )
        })?;
        Ok(base + offset as CUdeviceptr)
    }

    /// Runs `queue` (async calls on the per-thread stream), then waits for that stream.
    fn on_access_stream(
        &self,
        what: &str,
        queue: impl FnOnce(CUstream) -> std::result::Result<(), DriverError>,
    ) -> std::result::Result<(), String> {
        let access = &self.access;
        guarded(what, || {
            self.context.bind_to_thread()?;
            queue(access.cu_stream())?;
            access.synchronize()
        })
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // The arenas are freed after this: nothing queued may still write them.
        for stream in &self.streams {
            if let Err(reason) = guarded("synchronizing at drop", || stream.synchronize()) {
                tracing::warn!(%reason, "cuda storage dropped with a failed copy stream");
            }
        }
    }
}

impl Device for CudaDriver {
    type Pinned = CudaPinned;
    type Event = CudaEvent;

    fn alloc_pinned(&self, n_bytes: usize) -> std::result::Result<CudaPinned, String> {
        let n_bytes = n_bytes.max(1);
        let context = &self.context;
        // SAFETY: the buffer comes back uninitialized; it is zeroed below through its pointer before any
        // slice of it is made.
        let mut slice = guarded("allocating pinned staging", || unsafe {
            context.alloc_pinned_with_flags::<u8>(n_bytes, 0)
        })?;
        let ptr = guarded("addressing pinned staging", || slice.as_mut_ptr())?;
        // SAFETY: `ptr` points to the `n_bytes` just allocated, which nothing else uses yet.
        unsafe { std::ptr::write_bytes(ptr, 0, n_bytes) };
        Ok(CudaPinned { slice, ptr })
    }

    fn pinned_len(&self, pinned: &CudaPinned) -> usize {
        pinned.slice.len()
    }

    fn fill_pinned(
        &self,
        pinned: &mut CudaPinned,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> std::result::Result<(), String> {
        // SAFETY: `ptr` addresses `slice.len()` initialized bytes owned by `pinned`, borrowed mutably here;
        // the caller guarantees no queued transfer still reads them (`Device::fill_pinned`).
        let bytes = unsafe { std::slice::from_raw_parts_mut(pinned.ptr, pinned.slice.len()) };
        fill(bytes);
        Ok(())
    }

    unsafe fn enqueue_htod(
        &self,
        rank: u32,
        dst_offset: usize,
        pinned: &CudaPinned,
        src: Range<usize>,
    ) -> std::result::Result<(), String> {
        let n_bytes = src.end.saturating_sub(src.start);
        if src.start > src.end || src.end > pinned.slice.len() {
            return Err(format!(
                "staging bytes {src:?} outside {} bytes",
                pinned.slice.len()
            ));
        }
        let dst = self.address(rank, dst_offset, n_bytes)?;
        let stream = self.stream(rank)?;
        // SAFETY: `src` lies inside the pinned allocation (checked above); the caller keeps it alive and
        // unchanged until the transfer completed.
        let source = unsafe { std::slice::from_raw_parts(pinned.ptr.add(src.start), n_bytes) };
        guarded("queueing a host-to-device copy", || {
            self.context.bind_to_thread()?;
            // SAFETY: `dst` addresses `n_bytes` inside the rank's arena (checked by `address`), which lives
            // until `Drop` synchronized this stream.
            unsafe { result::memcpy_htod_async(dst, source, stream.cu_stream()) }
        })
    }

    fn record(&self, rank: u32) -> std::result::Result<CudaEvent, String> {
        let stream = self.stream(rank)?;
        let no_timing = Some(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        guarded("recording an event", || stream.record_event(no_timing))
    }

    /// A host function queued with `cuLaunchHostFunc` that blocks the stream until the hold is dropped.
    fn hold_stream(&self, rank: u32) -> std::result::Result<StreamHold, String> {
        let stream = self.stream(rank)?;
        let (hold, gate) = StreamHold::new();
        let user_data = Arc::into_raw(gate).cast_mut().cast::<std::ffi::c_void>();
        let queued = guarded("queueing a stream hold", || {
            self.context.bind_to_thread()?;
            // SAFETY: `pass_gate` takes `user_data` back as the `Arc<Gate>` it is, once, when the stream
            // reaches it; it calls no CUDA function.
            unsafe {
                result::stream::launch_host_function(stream.cu_stream(), pass_gate, user_data)
            }
        });
        if queued.is_err() {
            // SAFETY: not queued, so `pass_gate` never runs: the reference is still ours to drop.
            drop(unsafe { Arc::from_raw(user_data.cast_const().cast::<Gate>()) });
        }
        queued.map(|()| hold)
    }

    fn query(&self, event: &CudaEvent) -> std::result::Result<bool, String> {
        guarded("querying an event", || event.try_is_complete())
    }

    fn wait(&self, event: &CudaEvent) -> std::result::Result<(), String> {
        guarded("waiting for an event", || event.synchronize())
    }

    fn synchronize(&self, rank: u32) -> std::result::Result<(), String> {
        let stream = self.stream(rank)?;
        guarded("synchronizing a copy stream", || stream.synchronize())
    }

    fn read(&self, rank: u32, offset: usize, dst: &mut [u8]) -> std::result::Result<(), String> {
        let src = self.address(rank, offset, dst.len())?;
        // SAFETY: `src` addresses `dst.len()` bytes of the arena; `dst` outlives the synchronization.
        self.on_access_stream("read", |stream| unsafe {
            result::memcpy_dtoh_async(dst, src, stream)
        })
    }

    fn write(&self, rank: u32, offset: usize, src: &[u8]) -> std::result::Result<(), String> {
        let dst = self.address(rank, offset, src.len())?;
        // SAFETY: `dst` addresses `src.len()` bytes of the arena; `src` outlives the synchronization.
        self.on_access_stream("write", |stream| unsafe {
            result::memcpy_htod_async(dst, src, stream)
        })
    }

    fn write_padded(
        &self,
        rank: u32,
        offset: usize,
        src: &[u8],
        n_bytes: usize,
    ) -> std::result::Result<(), String> {
        let tail = n_bytes
            .checked_sub(src.len())
            .ok_or_else(|| format!("{} bytes padded to {n_bytes}", src.len()))?;
        let dst = self.address(rank, offset, n_bytes)?;
        let tail_dst = dst + src.len() as CUdeviceptr;
        // SAFETY: `dst` addresses `n_bytes` of the arena (checked by `address`): `src` at its start, the
        // zeroed tail after it; `src` outlives the synchronization.
        self.on_access_stream("write", |stream| unsafe {
            result::memcpy_htod_async(dst, src, stream)?;
            if tail > 0 {
                result::memset_d8_async(tail_dst, 0, tail, stream)?;
            }
            Ok(())
        })
    }

    fn copy_within(
        &self,
        rank: u32,
        src_offset: usize,
        dst_offset: usize,
        n_bytes: usize,
    ) -> std::result::Result<(), String> {
        let src = self.address(rank, src_offset, n_bytes)?;
        let dst = self.address(rank, dst_offset, n_bytes)?;
        // SAFETY: both ranges lie in the arena (checked by `address`) and do not overlap (distinct pages).
        self.on_access_stream("copy", |stream| unsafe {
            result::memcpy_dtod_async(dst, src, n_bytes, stream)
        })
    }
}

/// The host function of a stream hold: blocks the stream until the gate opens, then drops its reference.
///
/// # Safety
///
/// `user_data` is an `Arc<Gate>` turned into a raw pointer by `hold_stream`, passed here once.
unsafe extern "C" fn pass_gate(user_data: *mut std::ffi::c_void) {
    // SAFETY: as the function's contract says.
    let gate = unsafe { Arc::from_raw(user_data.cast_const().cast::<Gate>()) };
    // Nothing may unwind into the driver.
    let _passed = catch_unwind(AssertUnwindSafe(|| gate.pass()));
}

/// Find libcuda, then count devices; any failure or loader panic becomes the reason.
fn probe() -> std::result::Result<(), String> {
    // SAFETY: `is_culib_present` only opens each candidate libcuda name with `libloading` and drops what it
    // opened; it calls no driver function. Loading the driver library runs its initializers, which NVIDIA
    // supports in any process.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return Err(
            "libcuda could not be loaded: no NVIDIA driver is installed here (or it is not on \
                    LD_LIBRARY_PATH)"
                .to_string(),
        );
    }
    let n_devices = guarded("initializing the driver", CudaContext::device_count)?;
    if n_devices <= 0 {
        return Err("the driver reports no CUDA device".to_string());
    }
    Ok(())
}

/// Run a driver call, turning its error or a panic of cudarc's loader (a missing symbol) into a reason.
fn guarded<T>(
    what: &str,
    call: impl FnOnce() -> std::result::Result<T, DriverError>,
) -> std::result::Result<T, String> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(format!("{what}: {error}")),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(format!("{what}: the cuda loader panicked: {message}"))
        }
    }
}
