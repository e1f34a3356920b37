//! `CudaCopyEngine`: restores and captures between host buffers and device page arenas through cudarc, on a
//! dedicated stream, through a ring of pinned host staging pages, with one event per job for completion.
//! It compiles without CUDA; `new` without a driver is `Error::Unavailable` with the reason, never a panic:
//! it checks `kv_pool::cuda_available()` before any driver call, and every driver call runs under
//! `catch_unwind`. The engine owns its device arenas (one per rank, `n_pages * bytes_per_page`), since
//! kv-pool's `CudaStorage` does not lend its device memory; `read_page` reads a page back.
#![allow(
    unsafe_code,
    reason = "pinned host staging is allocated uninitialized by cudarc; each block has a SAFETY note"
)]

use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError, PinnedHostSlice};
use kv_pool::PageId;
use kv_pool::Timestamp;

use crate::copy::{CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome, CopyWork};
use crate::error::{Error, Result};
use crate::page_buf::PageBuf;

/// Pinned staging pages in the ring: copies into staging page `k + STAGING_PAGES` wait for the DMA out of
/// staging page `k`, so host copies overlap device transfers.
const STAGING_PAGES: usize = 4;

struct CudaJob {
    id: CopyJobId,
    rank: u32,
    /// The job's pool pages.
    pages: Vec<PageId>,
    /// Recorded after the job's last transfer; `None` when nothing was enqueued.
    event: Option<CudaEvent>,
    cancelled: bool,
    failure: Option<String>,
    captured: Vec<PageBuf>,
}

/// Copies through a dedicated CUDA stream.
pub struct CudaCopyEngine {
    stream: Arc<CudaStream>,
    arenas: Vec<CudaSlice<u8>>,
    staging: Vec<PinnedHostSlice<u8>>,
    next_staging: usize,
    bytes_per_page: usize,
    n_pages: u32,
    in_flight: VecDeque<CudaJob>,
    next_job: u64,
}

impl std::fmt::Debug for CudaCopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCopyEngine")
            .field("n_ranks", &self.arenas.len())
            .field("n_pages", &self.n_pages)
            .field("bytes_per_page", &self.bytes_per_page)
            .field("n_in_flight", &self.in_flight.len())
            .finish_non_exhaustive()
    }
}

impl CudaCopyEngine {
    /// Device arenas of `n_ranks` x `n_pages` pages of `bytes_per_page` on device `device_ordinal`, a new
    /// stream and pinned staging. `Error::Unavailable` (with the reason) without a driver or device.
    pub fn new(
        device_ordinal: usize,
        n_ranks: u32,
        n_pages: u32,
        bytes_per_page: usize,
    ) -> Result<Self> {
        kv_pool::cuda_available().map_err(Error::Unavailable)?;
        let context = guarded("creating a context", || CudaContext::new(device_ordinal))?;
        let stream = guarded("creating a stream", || context.new_stream())?;
        let arena_bytes = n_pages as usize * bytes_per_page;
        let mut arenas = Vec::with_capacity(n_ranks as usize);
        for _ in 0..n_ranks {
            arenas.push(guarded("allocating a device arena", || {
                stream.alloc_zeros::<u8>(arena_bytes)
            })?);
        }
        let mut staging = Vec::with_capacity(STAGING_PAGES);
        for _ in 0..STAGING_PAGES {
            // SAFETY: the staging page is uninitialized; it is only read by a transfer after a full page
            // was copied into it (restore), or only written by a transfer before it is read (capture).
            let page = guarded("allocating pinned staging", || unsafe {
                context.alloc_pinned_with_flags::<u8>(bytes_per_page, 0)
            })?;
            staging.push(page);
        }
        guarded("synchronizing", || stream.synchronize())?;
        Ok(Self {
            stream,
            arenas,
            staging,
            next_staging: 0,
            bytes_per_page,
            n_pages,
            in_flight: VecDeque::new(),
            next_job: 0,
        })
    }

    /// Reads page `page` of `rank` back from the device (waits for the stream).
    pub fn read_page(&mut self, rank: u32, page: PageId) -> Result<Vec<u8>> {
        let range = self.page_range(rank, page)?;
        let arena = &self.arenas[rank as usize];
        let stream = &self.stream;
        guarded("reading a page", || {
            let view = arena.slice(range);
            let bytes = stream.clone_dtoh(&view)?;
            stream.synchronize()?;
            Ok(bytes)
        })
    }

    /// Baseline for benchmarks: the time to upload `pages` of `rank` straight from one pinned staging page
    /// with `cudaMemcpyAsync`-equivalent calls on the engine's stream, waiting for the last one.
    pub fn time_pinned_upload(
        &mut self,
        rank: u32,
        pages: &[PageId],
    ) -> Result<std::time::Duration> {
        let ranges: Vec<Range<usize>> = pages
            .iter()
            .map(|&page| self.page_range(rank, page))
            .collect::<Result<_>>()?;
        let staging = &self.staging[0];
        let arena = &mut self.arenas[rank as usize];
        let stream = &self.stream;
        guarded("pinned upload", || {
            stream.synchronize()?;
            #[allow(
                clippy::disallowed_methods,
                reason = "measures the pinned upload's wall time for the bandwidth figure"
            )]
            let started = std::time::Instant::now();
            for range in ranges {
                let mut view = arena.slice_mut(range);
                stream.memcpy_htod(staging, &mut view)?;
            }
            stream.synchronize()?;
            Ok(started.elapsed())
        })
    }

    fn page_range(&self, rank: u32, page: PageId) -> Result<Range<usize>> {
        if rank as usize >= self.arenas.len() || page.0 >= self.n_pages || page.is_null() {
            return Err(Error::Unavailable(format!(
                "page {} of rank {rank} is outside the device arena ({} ranks, {} pages)",
                page.0,
                self.arenas.len(),
                self.n_pages
            )));
        }
        let start = page.idx() * self.bytes_per_page;
        Ok(start..start + self.bytes_per_page)
    }

    /// Enqueues every transfer of `job`; the first error stops it.
    fn enqueue(&mut self, job: &CopyJob, captured: &mut Vec<PageBuf>) -> Result<(), String> {
        let rank = job.rank;
        match &job.work {
            CopyWork::Restore { pages } => {
                for (bytes, page) in pages {
                    let range = self.page_range(rank, *page).map_err(|e| e.to_string())?;
                    if bytes.len() != self.bytes_per_page {
                        return Err(format!(
                            "restore buffer of {} bytes, pages are {}",
                            bytes.len(),
                            self.bytes_per_page
                        ));
                    }
                    let staging = &mut self.staging[self.next_staging];
                    self.next_staging = (self.next_staging + 1) % STAGING_PAGES;
                    let arena = &mut self.arenas[rank as usize];
                    let stream = &self.stream;
                    guarded_str("restoring a page", || {
                        // Waits for the previous transfer out of this staging page, then fills it.
                        staging.as_mut_slice()?.copy_from_slice(bytes);
                        let mut view = arena.slice_mut(range);
                        stream.memcpy_htod(&*staging, &mut view)
                    })?;
                }
            }
            CopyWork::Capture { pages } => {
                for page in pages {
                    let range = self.page_range(rank, *page).map_err(|e| e.to_string())?;
                    let staging = &mut self.staging[self.next_staging];
                    self.next_staging = (self.next_staging + 1) % STAGING_PAGES;
                    let arena = &self.arenas[rank as usize];
                    let stream = &self.stream;
                    let bytes = guarded_str("capturing a page", || {
                        let view = arena.slice(range);
                        stream.memcpy_dtoh(&view, staging)?;
                        Ok(PageBuf::from(staging.as_slice()?))
                    })?;
                    captured.push(bytes);
                }
            }
        }
        Ok(())
    }
}

impl CopyEngine for CudaCopyEngine {
    fn in_flight_pages(&self) -> Vec<PageId> {
        self.in_flight
            .iter()
            .flat_map(|job| job.pages.iter().copied())
            .collect()
    }

    fn submit(&mut self, job: CopyJob, _now: Timestamp) -> Result<CopyJobId> {
        let id = CopyJobId(self.next_job);
        self.next_job += 1;
        let mut captured = Vec::new();
        let failure = self.enqueue(&job, &mut captured).err();
        let stream = &self.stream;
        let event = match guarded_str("recording an event", || stream.record_event(None)) {
            Ok(event) => Some(event),
            Err(reason) => {
                // No event: wait for the stream so nothing can still write when the job is reported.
                let _synced = guarded_str("synchronizing", || stream.synchronize());
                return self.push_finished(id, job.rank, Some(failure.unwrap_or(reason)), captured);
            }
        };
        self.in_flight.push_back(CudaJob {
            id,
            rank: job.rank,
            pages: job.pool_pages(),
            event,
            cancelled: false,
            failure,
            captured,
        });
        Ok(id)
    }

    fn poll(&mut self, _now: Timestamp) -> Vec<CopyCompletion> {
        let mut completions = Vec::new();
        // One stream: jobs complete in submission order.
        while let Some(job) = self.in_flight.front() {
            let done = job.event.as_ref().is_none_or(CudaEvent::is_complete);
            if !done {
                break;
            }
            let job = self.in_flight.pop_front().expect("front exists");
            completions.push(completion_of(job));
        }
        completions
    }

    fn cancel(&mut self, job: CopyJobId) {
        // Enqueued transfers cannot be recalled: the job is reported `Cancelled` once its event completed.
        if let Some(job) = self.in_flight.iter_mut().find(|j| j.id == job) {
            job.cancelled = true;
        }
    }

    fn n_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn wait_all(&mut self) -> Vec<CopyCompletion> {
        let stream = &self.stream;
        if let Err(reason) = guarded_str("synchronizing", || stream.synchronize()) {
            for job in &mut self.in_flight {
                job.failure.get_or_insert_with(|| reason.clone());
            }
        }
        self.in_flight.drain(..).map(completion_of).collect()
    }
}

impl CudaCopyEngine {
    fn push_finished(
        &mut self,
        id: CopyJobId,
        rank: u32,
        failure: Option<String>,
        captured: Vec<PageBuf>,
    ) -> Result<CopyJobId> {
        // The stream was synchronized: nothing of this job can still touch a page.
        self.in_flight.push_back(CudaJob {
            id,
            rank,
            pages: Vec::new(),
            event: None,
            cancelled: false,
            failure,
            captured,
        });
        Ok(id)
    }
}

fn completion_of(job: CudaJob) -> CopyCompletion {
    let outcome = if let Some(reason) = job.failure {
        CopyOutcome::Failed { reason }
    } else if job.cancelled {
        CopyOutcome::Cancelled
    } else {
        CopyOutcome::Done {
            captured: job.captured,
        }
    };
    CopyCompletion {
        job: job.id,
        rank: job.rank,
        outcome,
        invalidated: Vec::new(),
    }
}

fn guarded<T>(what: &str, call: impl FnOnce() -> Result<T, DriverError>) -> Result<T> {
    guarded_str(what, call).map_err(Error::Unavailable)
}

/// Runs a driver call, turning its error or a panic of cudarc's loader into a message.
fn guarded_str<T>(what: &str, call: impl FnOnce() -> Result<T, DriverError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(format!("{what}: {error}")),
        Err(_) => Err(format!("{what}: the cuda driver loader panicked")),
    }
}
