//! `CudaCopyEngine`: restores straight into the pool's device pages, which kv-pool's `CudaStorage` lends
//! (`CudaStorage::enqueue_write`), on a stream of its own, from pinned host staging, with one event per job.
//! `submit` copies a restore's buffers into a pinned staging buffer and queues one host-to-device transfer
//! per page; `poll` queries each job's event and never blocks; a cancelled job is reported only once its
//! event completed, since queued transfers cannot be recalled; `wait_all` synchronizes the stream.
//!
//! It compiles without CUDA, and needs a `CudaStorage` to exist, which fails without a driver
//! (`kv_pool::Error::CudaUnavailable`); every driver call runs under `catch_unwind`, so a failure of the
//! driver or of cudarc's loader is an error value, never a panic. A job whose transfer or event fails is
//! reported `Failed`, after the stream was synchronized, so nothing of it can still write.
#![allow(
    unsafe_code,
    reason = "pinned staging is allocated uninitialized and read by the device after `submit` returned; each \
              block has a SAFETY note"
)]

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream, DriverError, PinnedHostSlice};
use kv_pool::Timestamp;
use kv_pool::{CudaStorage, PageId, PageStorage};

use crate::copy::{CopyCompletion, CopyEngine, CopyJob, CopyJobId, CopyOutcome};
use crate::error::{Error, Result};
use crate::page_buf::PageBuf;

/// Pinned staging buffers kept for reuse once their job completed; more are freed.
const SPARE_STAGING_MAX: usize = 8;

struct CudaJob {
    id: CopyJobId,
    rank: u32,
    /// The job's pool pages.
    pages: Vec<PageId>,
    /// Recorded on the stream after the job's last transfer; `None` when nothing of it is in flight.
    event: Option<CudaEvent>,
    /// The pinned bytes the device reads while the job runs; released only once nothing reads them.
    staging: Option<PinnedHostSlice<u8>>,
    cancelled: bool,
    failure: Option<String>,
}

/// Copies into a `CudaStorage` on a stream of its own.
pub struct CudaCopyEngine {
    storage: Arc<CudaStorage>,
    stream: Arc<CudaStream>,
    /// Pinned staging buffers of completed jobs, for the next restores.
    spare_staging: Vec<PinnedHostSlice<u8>>,
    in_flight: VecDeque<CudaJob>,
    next_job: u64,
}

impl std::fmt::Debug for CudaCopyEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaCopyEngine")
            .field("storage", &self.storage)
            .field("n_in_flight", &self.in_flight.len())
            .field("n_spare_staging", &self.spare_staging.len())
            .finish_non_exhaustive()
    }
}

impl CudaCopyEngine {
    /// Copies into `storage`'s device pages, on a new stream of its context. Errors:
    /// `Error::Unavailable` with the driver's reason when the stream cannot be made.
    pub fn new(storage: Arc<CudaStorage>) -> Result<Self> {
        let context = Arc::clone(storage.context());
        let stream = guarded("creating a stream", || context.new_stream())?;
        Ok(Self {
            storage,
            stream,
            spare_staging: Vec::new(),
            in_flight: VecDeque::new(),
            next_job: 0,
        })
    }

    /// Baseline for benchmarks: the time to upload `pages` of `rank` straight from one pinned page with
    /// `cudaMemcpyAsync`-equivalent calls on the engine's stream, waiting for the last one. Nothing may be
    /// in flight.
    pub fn time_pinned_upload(
        &mut self,
        rank: u32,
        pages: &[PageId],
    ) -> Result<std::time::Duration> {
        if !self.in_flight.is_empty() {
            return Err(Error::Unavailable(format!(
                "{} copies in flight: the upload baseline needs an idle engine",
                self.in_flight.len()
            )));
        }
        let bytes_per_page = self.storage.bytes_per_page();
        let staging = self.take_staging(bytes_per_page)?;
        let stream = Arc::clone(&self.stream);
        guarded("synchronizing", || stream.synchronize())?;
        #[allow(
            clippy::disallowed_methods,
            reason = "measures the pinned upload's wall time for the bandwidth figure"
        )]
        let started = std::time::Instant::now();
        let source = guarded("reading pinned staging", || staging.as_slice())?;
        let mut outcome = Ok(());
        for &page in pages {
            // SAFETY: `staging` is alive and unchanged until the stream is synchronized below.
            outcome = unsafe {
                self.storage
                    .enqueue_write(&stream, rank, page, &source[..bytes_per_page])
            };
            if outcome.is_err() {
                break;
            }
        }
        let synced = guarded("synchronizing", || stream.synchronize());
        let elapsed = started.elapsed();
        self.spare(staging);
        outcome?;
        synced?;
        Ok(elapsed)
    }

    /// A pinned staging buffer of at least `n_bytes` (at least one byte): a spare one, or a new one.
    fn take_staging(&mut self, n_bytes: usize) -> Result<PinnedHostSlice<u8>> {
        let n_bytes = n_bytes.max(1);
        if let Some(idx) = self
            .spare_staging
            .iter()
            .position(|staging| staging.len() >= n_bytes)
        {
            return Ok(self.spare_staging.swap_remove(idx));
        }
        let context = Arc::clone(self.storage.context());
        let len = n_bytes.next_power_of_two();
        // SAFETY: the buffer comes back uninitialized; it is zeroed below through its raw pointer before
        // any slice of it is made.
        let mut staging = guarded("allocating pinned staging", || unsafe {
            context.alloc_pinned_with_flags::<u8>(len, 0)
        })?;
        let ptr = guarded("zeroing pinned staging", || staging.as_mut_ptr())?;
        // SAFETY: `ptr` points to the `len` bytes just allocated, which nothing else uses yet.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(staging)
    }

    /// Keeps a staging buffer nothing reads any more for reuse, freeing the smallest beyond the limit.
    fn spare(&mut self, staging: PinnedHostSlice<u8>) {
        self.spare_staging.push(staging);
        if self.spare_staging.len() > SPARE_STAGING_MAX
            && let Some((idx, _)) = self
                .spare_staging
                .iter()
                .enumerate()
                .min_by_key(|(_, staging)| staging.len())
        {
            drop(self.spare_staging.swap_remove(idx));
        }
    }

    /// Copies a restore's buffers into pinned staging and queues one transfer per page into the storage;
    /// the staging goes into `job`, which keeps it until its event completed. The first error stops it.
    fn enqueue_restore(
        &mut self,
        rank: u32,
        pages: &[(PageBuf, PageId)],
        job: &mut CudaJob,
    ) -> Result<(), String> {
        let bytes_per_page = self.storage.bytes_per_page();
        if let Some((bytes, page)) = pages.iter().find(|(b, _)| b.len() != bytes_per_page) {
            return Err(format!(
                "the restore buffer of page {} holds {} bytes, pages hold {bytes_per_page}",
                page.0,
                bytes.len()
            ));
        }
        let mut staging = self
            .take_staging(pages.len() * bytes_per_page)
            .map_err(|e| e.to_string())?;
        let filled = guarded_str("filling pinned staging", || {
            let host = staging.as_mut_slice()?;
            for ((bytes, _), chunk) in pages.iter().zip(host.chunks_exact_mut(bytes_per_page)) {
                chunk.copy_from_slice(bytes);
            }
            Ok(())
        });
        let source =
            filled.and_then(|()| guarded_str("reading pinned staging", || staging.as_slice()));
        let source = match source {
            Ok(source) => source,
            Err(reason) => {
                self.spare(staging);
                return Err(reason);
            }
        };
        let mut outcome = Ok(());
        for ((_, page), chunk) in pages.iter().zip(source.chunks_exact(bytes_per_page)) {
            // SAFETY: `chunk` lies in `staging`, which moves into `job` below and is released (spared or
            // freed) only once the job's event completed or the stream was synchronized (`finish`, `Drop`).
            // Moving the `PinnedHostSlice` does not move the page-locked memory it points to.
            let queued = unsafe { self.storage.enqueue_write(&self.stream, rank, *page, chunk) };
            if let Err(error) = queued {
                outcome = Err(error.to_string());
                break;
            }
        }
        job.staging = Some(staging);
        outcome
    }

    /// Whether `job` can no longer touch its pages, querying its event without blocking. A failed query
    /// synchronizes the stream first and fails the job.
    fn finished(&self, job: &mut CudaJob) -> bool {
        let Some(event) = &job.event else {
            return true;
        };
        match guarded_str("querying a copy's event", || event.try_is_complete()) {
            Ok(done) => done,
            Err(reason) => {
                let synced = guarded_str("synchronizing after a failed query", || {
                    self.stream.synchronize()
                });
                job.failure.get_or_insert(
                    synced
                        .err()
                        .map_or(reason.clone(), |s| format!("{reason}; {s}")),
                );
                true
            }
        }
    }

    /// Reports a job that can no longer touch its pages, sparing its staging.
    fn finish(&mut self, mut job: CudaJob) -> CopyCompletion {
        if let Some(staging) = job.staging.take() {
            self.spare(staging);
        }
        let outcome = if let Some(reason) = job.failure {
            CopyOutcome::Failed { reason }
        } else if job.cancelled {
            CopyOutcome::Cancelled
        } else {
            CopyOutcome::Done
        };
        CopyCompletion {
            job: job.id,
            rank: job.rank,
            outcome,
            invalidated: Vec::new(),
        }
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
        let mut record = CudaJob {
            id,
            rank: job.rank,
            pages: job.pool_pages(),
            event: None,
            staging: None,
            cancelled: false,
            failure: None,
        };
        record.failure = self
            .enqueue_restore(job.rank, &job.pages, &mut record)
            .err();
        let stream = &self.stream;
        let no_timing = Some(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        match guarded_str("recording an event", || stream.record_event(no_timing)) {
            Ok(event) => record.event = Some(event),
            Err(reason) => {
                // No event: wait for the stream, so nothing of the job can write once it is reported.
                let synced = guarded_str("synchronizing", || stream.synchronize());
                let reason = synced
                    .err()
                    .map_or(reason.clone(), |s| format!("{reason}; {s}"));
                record.failure.get_or_insert(reason);
            }
        }
        self.in_flight.push_back(record);
        Ok(id)
    }

    fn poll(&mut self, _now: Timestamp) -> Vec<CopyCompletion> {
        let mut completions = Vec::new();
        let mut waiting = VecDeque::with_capacity(self.in_flight.len());
        while let Some(mut job) = self.in_flight.pop_front() {
            if self.finished(&mut job) {
                completions.push(self.finish(job));
            } else {
                waiting.push_back(job);
            }
        }
        self.in_flight = waiting;
        completions
    }

    fn cancel(&mut self, job: CopyJobId) {
        // Queued transfers cannot be recalled: the job is reported `Cancelled` once its event completed.
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
        let jobs: Vec<CudaJob> = self.in_flight.drain(..).collect();
        jobs.into_iter().map(|job| self.finish(job)).collect()
    }
}

impl Drop for CudaCopyEngine {
    fn drop(&mut self) {
        // The staging buffers of jobs in flight are freed after this: the device must be done reading them.
        let stream = &self.stream;
        if let Err(reason) = guarded_str("synchronizing at drop", || stream.synchronize()) {
            tracing::warn!(%reason, "cuda copy engine dropped with a failed stream");
        }
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
