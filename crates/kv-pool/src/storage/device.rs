//! `DeviceStorage`: page bytes in a device's memory behind the `Device` trait, the driver calls the CUDA path
//! makes: pinned host staging, one copy stream per rank with transfers queued on it and events recorded after
//! them, and synchronous reads, writes and copies on a separate access path. `CudaDriver` is the real driver
//! (cudarc), `FakeDevice` a host-backed stand-in that runs the same logic in CI with injected delays and
//! failures. The storage remembers, per page, the event recorded after the last transfer queued into it: a
//! read, write or copy of that page waits for that event first, and for nothing else, so an executor's or a
//! verifier's access is ordered after the restores of the pages it touches, not after every copy queued.
#![allow(
    unsafe_code,
    reason = "queued transfers read pinned host memory after the call returns; each block has a SAFETY note"
)]

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use super::{PageStorage, Shape};
use crate::error::{Error, Result};
use crate::page::PageId;

/// The driver calls of the CUDA path. Rank `r` owns one device allocation (arena) of the storage's shard size
/// and one copy stream; offsets are bytes into the arena. Callers check ranges: an implementation refuses
/// (never panics on) one out of bounds. Every error is the driver's reason.
pub trait Device: Send + Sync + 'static {
    /// Page-locked host memory the device reads asynchronously.
    type Pinned: Send + 'static;
    /// A marker recorded on a copy stream: complete once everything queued before it is.
    type Event: Send + Sync + 'static;

    /// Zeroed pinned host memory of `n_bytes`.
    fn alloc_pinned(&self, n_bytes: usize) -> Result<Self::Pinned, String>;
    /// Bytes in `pinned`.
    fn pinned_len(&self, pinned: &Self::Pinned) -> usize;
    /// Lets `fill` write `pinned`'s bytes. No queued transfer may still read them (the stand-in checks).
    fn fill_pinned(
        &self,
        pinned: &mut Self::Pinned,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), String>;
    /// Queues on `rank`'s copy stream a copy of `pinned[src]` to byte `dst_offset` of `rank`'s arena.
    ///
    /// # Safety
    ///
    /// `pinned` must stay allocated and its `src` bytes unchanged until an event recorded on `rank`'s
    /// stream after this call completed (or the stream was synchronized): the device reads them later.
    unsafe fn enqueue_htod(
        &self,
        rank: u32,
        dst_offset: usize,
        pinned: &Self::Pinned,
        src: Range<usize>,
    ) -> Result<(), String>;
    /// Records an event after everything queued on `rank`'s copy stream so far.
    fn record(&self, rank: u32) -> Result<Self::Event, String>;
    /// Whether `event` completed, without blocking; an error means the device cannot say.
    fn query(&self, event: &Self::Event) -> Result<bool, String>;
    /// Blocks until `event` completed.
    fn wait(&self, event: &Self::Event) -> Result<(), String>;
    /// Blocks until everything queued on `rank`'s copy stream completed.
    fn synchronize(&self, rank: u32) -> Result<(), String>;
    /// Queues on `rank`'s copy stream a step that ends only when the returned hold is dropped: everything
    /// queued after it stays queued until then (tests hold copies in flight with it). Drop the hold before
    /// anything waits for those transfers on the same thread, and before the device.
    fn hold_stream(&self, rank: u32) -> Result<StreamHold, String>;
    /// Copies `dst.len()` bytes at `offset` of `rank`'s arena into `dst`; complete on return.
    fn read(&self, rank: u32, offset: usize, dst: &mut [u8]) -> Result<(), String>;
    /// Copies `src` to `offset` of `rank`'s arena; complete on return.
    fn write(&self, rank: u32, offset: usize, src: &[u8]) -> Result<(), String>;
    /// Copies `src` to `offset` of `rank`'s arena and zeroes the `n_bytes - src.len()` bytes after it on
    /// the device (only `src` crosses to it); complete on return. `n_bytes` is at least `src.len()`.
    fn write_padded(
        &self,
        rank: u32,
        offset: usize,
        src: &[u8],
        n_bytes: usize,
    ) -> Result<(), String>;
    /// Copies `n_bytes` within `rank`'s arena (the ranges do not overlap); complete on return.
    fn copy_within(
        &self,
        rank: u32,
        src_offset: usize,
        dst_offset: usize,
        n_bytes: usize,
    ) -> Result<(), String>;
}

/// A copy stream held by `Device::hold_stream`: released when dropped.
#[derive(Debug)]
pub struct StreamHold {
    gate: Arc<Gate>,
}

impl StreamHold {
    /// A hold and the gate the stream waits at.
    pub(crate) fn new() -> (StreamHold, Arc<Gate>) {
        let gate = Arc::new(Gate::default());
        (
            StreamHold {
                gate: Arc::clone(&gate),
            },
            gate,
        )
    }
}

impl Drop for StreamHold {
    fn drop(&mut self) {
        self.gate.open();
    }
}

/// Where a held stream waits: open once its hold is dropped (or its device shut down).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    pub(crate) fn open(&self) {
        *self.open.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.opened.notify_all();
    }

    /// Blocks until the gate is open.
    pub(crate) fn pass(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        while !*open {
            open = self
                .opened
                .wait(open)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Page bytes in a device's memory (`CudaStorage` is `DeviceStorage<CudaDriver>`). Synchronous accesses
/// (`PageStorage`) wait for the queued transfers into the pages they touch; copy engines queue transfers
/// with `enqueue_run` and mark them with `record`.
pub struct DeviceStorage<D: Device> {
    shape: Shape,
    device: D,
    /// Per rank: page -> the event after the last transfer queued into it, until it is known complete.
    pending: Vec<Mutex<HashMap<u32, Arc<D::Event>>>>,
}

impl<D: Device> std::fmt::Debug for DeviceStorage<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStorage")
            .field("shape", &self.shape)
            .finish_non_exhaustive()
    }
}

impl<D: Device> DeviceStorage<D> {
    /// Storage of `shape` on `device`, whose arenas already have the shape's size.
    pub(crate) fn from_device(shape: Shape, device: D) -> Self {
        let pending = (0..shape.n_ranks)
            .map(|_| Mutex::new(HashMap::new()))
            .collect();
        DeviceStorage {
            shape,
            device,
            pending,
        }
    }

    /// The device: copy engines allocate pinned staging and query events through it.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// Queues a transfer of `n_pages` pages from `pinned` at byte `src_offset` into pages `first`,
    /// `first + 1`, ... of `rank`, on `rank`'s copy stream, and returns without waiting. Errors: a bad rank,
    /// a page out of range or the null page, a source range outside `pinned` (nothing queued), or the
    /// driver's refusal (`CudaFailed`).
    ///
    /// # Safety
    ///
    /// As `Device::enqueue_htod`: the source bytes stay allocated and unchanged until an event recorded on
    /// `rank` after this call (`record`) completed or the rank's stream was synchronized.
    pub unsafe fn enqueue_run(
        &self,
        rank: u32,
        first: PageId,
        n_pages: u32,
        pinned: &D::Pinned,
        src_offset: usize,
    ) -> Result<()> {
        let last = first.0.checked_add(n_pages.saturating_sub(1));
        let last = last.ok_or(Error::PageOutOfRange {
            page: u32::MAX,
            n_pages: self.shape.n_pages,
        })?;
        self.shape.check_writable(rank, first)?;
        self.shape.check_writable(rank, PageId(last))?;
        let n_bytes = n_pages as usize * self.shape.bytes_per_page;
        let src = src_offset..src_offset.saturating_add(n_bytes);
        if n_pages == 0 || src.end > self.device.pinned_len(pinned) {
            return Err(failed(
                "enqueue a write",
                format!(
                    "a run of {n_pages} pages from staging bytes {src:?} does not fit staging of {} bytes",
                    self.device.pinned_len(pinned)
                ),
            ));
        }
        let dst_offset = first.idx() * self.shape.bytes_per_page;
        // SAFETY: the caller keeps `pinned`'s bytes alive and unchanged until the transfer completed.
        unsafe { self.device.enqueue_htod(rank, dst_offset, pinned, src) }
            .map_err(|reason| failed("enqueue a write", reason))
    }

    /// Records an event after every transfer queued on `rank` so far and marks `pages` as written until it
    /// completed: an access to one of them waits for it first. Errors: a bad rank or the driver's refusal.
    pub fn record(&self, rank: u32, pages: &[PageId]) -> Result<Arc<D::Event>> {
        self.shape.check_page(rank, PageId(0))?;
        let event = self
            .device
            .record(rank)
            .map_err(|reason| failed("record an event", reason))?;
        let event = Arc::new(event);
        let mut pending = self.pending_of(rank)?;
        for page in pages {
            pending.insert(page.0, Arc::clone(&event));
        }
        Ok(event)
    }

    /// Forgets `event` on `pages` of `rank` once it completed (a later event stays).
    pub fn settle(&self, rank: u32, pages: &[PageId], event: &Arc<D::Event>) {
        if let Ok(mut pending) = self.pending_of(rank) {
            for page in pages {
                if pending.get(&page.0).is_some_and(|e| Arc::ptr_eq(e, event)) {
                    pending.remove(&page.0);
                }
            }
        }
    }

    /// Pages of `rank` still marked written by a transfer whose event is not known complete.
    pub fn n_pending_pages(&self, rank: u32) -> usize {
        self.pending_of(rank).map_or(0, |pending| pending.len())
    }

    /// Pages of `rank` a queued transfer still writes, as the device says now: pages marked written whose
    /// event it reports not complete (what tests assert to show copies are in flight). Errors: a bad rank,
    /// or a query the device cannot answer (`CudaFailed`).
    pub fn n_pages_in_flight(&self, rank: u32) -> Result<usize> {
        let marked: Vec<Arc<D::Event>> = self.pending_of(rank)?.values().cloned().collect();
        let mut n_pages = 0;
        let mut answers: Vec<(Arc<D::Event>, bool)> = Vec::new();
        for event in marked {
            let known = answers.iter().find(|(e, _)| Arc::ptr_eq(e, &event));
            let complete = match known {
                Some(&(_, complete)) => complete,
                None => {
                    let complete = self
                        .device
                        .query(&event)
                        .map_err(|reason| failed("query an event", reason))?;
                    answers.push((event, complete));
                    complete
                }
            };
            n_pages += usize::from(!complete);
        }
        Ok(n_pages)
    }

    fn pending_of(
        &self,
        rank: u32,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<u32, Arc<D::Event>>>> {
        let pending = self
            .pending
            .get(rank as usize)
            .ok_or(Error::RankOutOfRange {
                rank,
                n_ranks: self.shape.n_ranks,
            })?;
        Ok(pending.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Waits for the transfers queued into `pages` of `rank` (only theirs). A failed wait leaves the mark.
    fn await_pages(
        &self,
        rank: u32,
        pages: impl IntoIterator<Item = PageId>,
        operation: &'static str,
    ) -> Result<()> {
        for page in pages {
            let event = self.pending_of(rank)?.get(&page.0).cloned();
            let Some(event) = event else { continue };
            let done = self
                .device
                .query(&event)
                .map_err(|reason| failed(operation, reason))?;
            if !done {
                self.device
                    .wait(&event)
                    .map_err(|reason| failed(operation, reason))?;
            }
            self.settle(rank, &[page], &event);
        }
        Ok(())
    }

    fn offset(&self, page: PageId) -> usize {
        page.idx() * self.shape.bytes_per_page
    }
}

impl<D: Device> PageStorage for DeviceStorage<D> {
    fn read_prefix(&self, rank: u32, page: PageId, dst: &mut [u8]) -> Result<()> {
        super::check_prefix_len(dst.len(), self.shape.bytes_per_page)?;
        self.shape.check_page(rank, page)?;
        self.await_pages(rank, [page], "read")?;
        self.device
            .read(rank, self.offset(page), dst)
            .map_err(|reason| failed("read", reason))
    }

    /// One device transfer for the whole run, after the queued transfers into its pages.
    fn read_run(&self, rank: u32, first: PageId, dst: &mut [u8]) -> Result<()> {
        let n_pages = super::run_pages(first, dst.len(), self.shape.bytes_per_page)?;
        let last = PageId(first.0 + (n_pages - 1));
        self.shape.check_page(rank, first)?;
        self.shape.check_page(rank, last)?;
        self.await_pages(rank, (first.0..=last.0).map(PageId), "read")?;
        self.device
            .read(rank, self.offset(first), dst)
            .map_err(|reason| failed("read", reason))
    }

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
        self.await_pages(rank, [page], "read")?;
        self.device
            .read(rank, self.offset(page), dst)
            .map_err(|reason| failed("read", reason))
    }

    fn write(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        self.shape.check_len(src.len())?;
        self.shape.check_writable(rank, page)?;
        self.await_pages(rank, [page], "write")?;
        self.device
            .write(rank, self.offset(page), src)
            .map_err(|reason| failed("write", reason))
    }

    /// One transfer of the prefix; the rest of the page is zeroed on the device.
    fn write_prefix(&self, rank: u32, page: PageId, src: &[u8]) -> Result<()> {
        super::check_prefix_len(src.len(), self.shape.bytes_per_page)?;
        self.shape.check_writable(rank, page)?;
        self.await_pages(rank, [page], "write")?;
        self.device
            .write_padded(rank, self.offset(page), src, self.shape.bytes_per_page)
            .map_err(|reason| failed("write", reason))
    }

    fn copy(&self, rank: u32, src: PageId, dst: PageId) -> Result<()> {
        self.shape.check_page(rank, src)?;
        self.shape.check_writable(rank, dst)?;
        if src == dst {
            return Ok(());
        }
        self.await_pages(rank, [src, dst], "copy")?;
        let n_bytes = self.shape.bytes_per_page;
        self.device
            .copy_within(rank, self.offset(src), self.offset(dst), n_bytes)
            .map_err(|reason| failed("copy", reason))
    }
}

fn failed(operation: &'static str, reason: String) -> Error {
    Error::CudaFailed { operation, reason }
}
