//! `CudaStorage`: page bytes in device memory through cudarc, one contiguous device allocation (arena) per
//! rank, libcuda loaded at run time. It compiles on machines without CUDA; asking for it there is the error
//! `CudaUnavailable`, never a panic: `cuda_available` probes for libcuda before any driver call (cudarc's
//! loader panics when the library or a symbol is missing), and every driver call runs under `catch_unwind`.
#![allow(
    unsafe_code,
    reason = "probing for libcuda goes through cudarc's unsafe loader check; each block has a SAFETY note"
)]

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};

use super::{PageStorage, Shape};
use crate::error::{Error, Result};
use crate::page::PageId;

/// Whether CUDA storage can be used here: `Ok`, or why not (no libcuda, no device, the driver failed to
/// initialize). Probed once per process; never panics.
pub fn cuda_available() -> std::result::Result<(), String> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(probe).clone()
}

/// Page bytes in device memory: per rank one device allocation of `n_pages * bytes_per_page` bytes.
/// Transfers run on one stream and are complete when a call returns.
pub struct CudaStorage {
    shape: Shape,
    device_ordinal: usize,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Rank `r`'s arena; page `p` at byte offset `p * bytes_per_page`.
    shards: Vec<RwLock<CudaSlice<u8>>>,
}

impl std::fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStorage")
            .field("device_ordinal", &self.device_ordinal)
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

impl CudaStorage {
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
        let stream = context.default_stream();
        let mut shards = Vec::with_capacity(n_ranks as usize);
        for _ in 0..n_ranks {
            let arena = guarded("allocating a shard", || {
                stream.alloc_zeros::<u8>(shape.bytes_per_shard())
            })
            .map_err(|reason| Error::CudaFailed {
                operation: "allocate",
                reason,
            })?;
            shards.push(RwLock::new(arena));
        }
        guarded("synchronizing", || stream.synchronize()).map_err(|reason| Error::CudaFailed {
            operation: "allocate",
            reason,
        })?;
        Ok(CudaStorage {
            shape,
            device_ordinal,
            context,
            stream,
            shards,
        })
    }

    /// The CUDA context the pages live in: a copy engine makes its stream and pinned staging here.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Queues a copy of `src` (exactly `bytes_per_page` long) into page `page` of `rank` on `stream`, a
    /// stream of this storage's context, and returns without waiting for it: the copy has happened once
    /// work recorded on `stream` after this call has completed (an event). It runs after every earlier use
    /// of the shard on any stream. Errors: a bad page, rank or length, the null page, a stream of another
    /// context (nothing queued), or the driver's refusal (`CudaFailed`).
    ///
    /// # Safety
    ///
    /// `src` must stay allocated and unchanged until the copy has completed: from page-locked (pinned)
    /// memory the device reads it asynchronously, after this call returned. (From pageable memory the driver
    /// stages it before returning, but the caller cannot tell the two apart by type.)
    pub unsafe fn enqueue_write(
        &self,
        stream: &Arc<CudaStream>,
        rank: u32,
        page: PageId,
        src: &[u8],
    ) -> Result<()> {
        self.shape.check_len(src.len())?;
        self.shape.check_writable(rank, page)?;
        if **stream.context() != *self.context {
            return Err(Error::CudaFailed {
                operation: "enqueue a write",
                reason: "the stream belongs to another CUDA context than the storage".to_string(),
            });
        }
        let mut shard = self.shards[rank as usize]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut view = shard.slice_mut(self.page_range(page));
        guarded("enqueue a write", || stream.memcpy_htod(src, &mut view)).map_err(|reason| {
            Error::CudaFailed {
                operation: "enqueue a write",
                reason,
            }
        })
    }

    fn page_range(&self, page: PageId) -> Range<usize> {
        let start = page.idx() * self.shape.bytes_per_page;
        start..start + self.shape.bytes_per_page
    }
}

impl PageStorage for CudaStorage {
    fn n_ranks(&self) -> u32 {
        self.shape.n_ranks
    }

    fn n_pages(&self) -> u32 {
        self.shape.n_pages
    }

    fn bytes_per_page(&self) -> usize {
        self.shape.bytes_per_page
    }

    fn read(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()> {
        self.shape.check_len(dst.len())?;
        self.shape.check_page(rank, page)?;
        let shard = self.shards[rank as usize]
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let view = shard.slice(self.page_range(page));
        guarded("read", || {
            self.stream.memcpy_dtoh(&view, dst)?;
            self.stream.synchronize()
        })
        .map_err(|reason| Error::CudaFailed {
            operation: "read",
            reason,
        })
    }

    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        self.shape.check_len(src.len())?;
        self.shape.check_writable(rank, page)?;
        let mut shard = self.shards[rank as usize]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let mut view = shard.slice_mut(self.page_range(page));
        guarded("write", || {
            self.stream.memcpy_htod(src, &mut view)?;
            self.stream.synchronize()
        })
        .map_err(|reason| Error::CudaFailed {
            operation: "write",
            reason,
        })
    }

    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> Result<()> {
        self.shape.check_page(rank, src)?;
        self.shape.check_writable(rank, dst)?;
        if src == dst {
            return Ok(());
        }
        let bytes_per_page = self.shape.bytes_per_page;
        let src_range = self.page_range(src);
        let dst_range = self.page_range(dst);
        let mut shard = self.shards[rank as usize]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        // Split the arena between the two pages so one half is read and the other written.
        let split_at = src_range.start.max(dst_range.start);
        let (low, mut high) = shard.split_at_mut(split_at);
        let outcome = if src < dst {
            let from = low.slice(src_range);
            let mut to = high.slice_mut(0..bytes_per_page);
            guarded("copy", || {
                self.stream.memcpy_dtod(&from, &mut to)?;
                self.stream.synchronize()
            })
        } else {
            let mut low = low;
            let from = high.slice(0..bytes_per_page);
            let mut to = low.slice_mut(dst_range);
            guarded("copy", || {
                self.stream.memcpy_dtod(&from, &mut to)?;
                self.stream.synchronize()
            })
        };
        outcome.map_err(|reason| Error::CudaFailed {
            operation: "copy",
            reason,
        })
    }
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
